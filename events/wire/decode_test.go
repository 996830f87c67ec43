package wire

import (
	"bytes"
	"errors"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

const ts15 = 1.5

func batchOf(rank int32, hasRank bool, evs ...Event) *Batch {
	b := &Batch{TS: ts15, DPRank: rank, HasDPRank: hasRank, Events: evs}
	for _, ev := range evs {
		if ev.Kind == KindUnknown {
			b.Unknown++
		}
	}
	return b
}

// TestDecodeVariants covers the accepted shapes no golden vector shows
// (docs/wire.md, "Payload"): 2- and 4-element envelopes, unknown keys and
// tags, map16 headers, map envelopes, the Dynamo mocker's compact arrays.
func TestDecodeVariants(t *testing.T) {
	removedH := Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, Medium: "GPU"}
	cleared := Event{Kind: KindAllBlocksCleared, Tag: TagAllBlocksCleared}
	withSession := stored91()
	withSession.SessionID = "sess-1"
	mocker := stored91()
	mocker.GroupIdx, mocker.HasGroupIdx = 0, true
	mockerShort := stored91()
	mockerShort.Medium = ""
	mockerShort.HasParent, mockerShort.ParentHash = true, 7
	wide := stored91()
	wide.LoraID, wide.HasLoraID = 3, true
	wide.LoraName = "adapter-a"
	wide.ExtraKeysRaw = mp([]any{[]any{"adapter-a", "mm0", CacheSaltPrefix + "tenant-a"}})
	wide.CacheSalt = "tenant-a"
	wide.GroupIdx, wide.HasGroupIdx = 1, true
	wide.KVCacheSpecKind = "sliding_window"
	wide.SlidingWindow, wide.HasSlidingWindow = 128, true
	sglang := stored91()
	sglang.CacheSalt = "explicit"
	sglang.ExtraKeysRaw = mp([]any{[]any{CacheSaltPrefix + "implied"}})
	sglang.Locality, sglang.Ownership, sglang.EventVersion = "REMOTE", "tier2", 2
	removedFull := Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{1, 2}, Medium: "CPU",
		GroupIdx: 2, HasGroupIdx: true, Locality: "LOCAL", Ownership: "own"}

	body91 := mustHex(loadVectorsHex(t, 0))
	// body91[11] is the event's fixmap(8) header: 93 cb<8> 91 88 …
	if body91[11] != 0x88 {
		t.Fatalf("unexpected 9.1 layout %x", body91[:12])
	}
	withHeader := func(hdr ...byte) []byte {
		return append(append(append([]byte{}, body91[:11]...), hdr...), body91[12:]...)
	}

	tests := []struct {
		name    string
		payload []byte
		want    *Batch
	}{
		{"2-element envelope (before PR #18925)",
			mp([]any{ts15, []any{map91()}}), batchOf(0, false, stored91())},
		{"4-element envelope, extra element skipped",
			mp([]any{ts15, []any{map91()}, 0, kvs{"future", []any{1, "x"}}}), batchOf(0, true, stored91())},
		{"rank nil", mp([]any{ts15, []any{map91()}, nil}), batchOf(0, false, stored91())},
		{"rank 1", mp([]any{ts15, []any{map91()}, 1}), batchOf(1, true, stored91())},
		{"rank -1 (signed)", mp([]any{ts15, []any{map91()}, -1}), batchOf(-1, true, stored91())},
		{"ts float32", mp([]any{float32(1.5), []any{}, 0}), batchOf(0, true)},
		{"ts int", mp([]any{2, []any{}, 0}), &Batch{TS: 2, HasDPRank: true}},
		{"ts negative int", mp([]any{-3, []any{}, 0}), &Batch{TS: -3, HasDPRank: true}},
		{"ts uint64", mp([]any{uint64(1 << 63), []any{}, 0}), &Batch{TS: 1 << 63, HasDPRank: true}},
		{"empty events", mp([]any{ts15, []any{}, 0}), batchOf(0, true)},
		{"array16 envelope", append([]byte{0xdc, 0, 3}, body91[1:]...), batchOf(0, true, stored91())},
		{"map16 header around the 9.1 body", withHeader(0xde, 0x00, 0x08), batchOf(0, true, stored91())},
		{"map32 header around the 9.1 body", withHeader(0xdf, 0, 0, 0, 0x08), batchOf(0, true, stored91())},
		{"unknown extra map key skipped",
			mp([]any{ts15, []any{append(map91(), "future_field", kvs{"a", []any{1.5, true}}, "session_id", "sess-1")}, 0}),
			batchOf(0, true, withSession)},
		{"non-string map key skipped",
			mp([]any{ts15, []any{append(kvs{7, "x", []byte("k"), 1}, map91()...)}, 0}), batchOf(0, true, stored91())},
		{"type last",
			mp([]any{ts15, []any{append(map91()[2:], "type", "BlockStored")}, 0}), batchOf(0, true, stored91())},
		{"type in the middle",
			mp([]any{ts15, []any{append(append(kvs{}, map91()[2:6]...), append(kvs{"type", "BlockStored"}, map91()[6:]...)...)}, 0}),
			batchOf(0, true, stored91())},
		{"unknown tags skipped, rest decoded",
			mp([]any{ts15, []any{
				kvs{"x", []any{1, 2}, "type", "BlockMoved", "block_hashes", []any{1.5}},
				map91(),
				[]any{"BlockMoved", []any{1.5}, kvs{"k", nil}},
				[]any{"BlockRemoved", []any{H}, "GPU"},
			}, 0}),
			batchOf(0, true, Event{Kind: KindUnknown, Tag: "BlockMoved"}, stored91(),
				Event{Kind: KindUnknown, Tag: "BlockMoved"}, removedH)},
		{"array and map events mixed",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", nil}, map91(),
				kvs{"type", "AllBlocksCleared"}, []any{"AllBlocksCleared"}}, 0}),
			batchOf(0, true, stored91(), stored91(), cleared, cleared)},
		{"AllBlocksCleared with extra fields skipped",
			mp([]any{ts15, []any{kvs{"type", "AllBlocksCleared", "medium", 5}, []any{"AllBlocksCleared", 1, 2}}, 0}),
			batchOf(0, true, cleared, cleared)},
		{"v0.9.0 6-element BlockStored, lora_id int",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, 0}}}),
			batchOf(0, false, func() Event { e := stored91(); e.Medium = ""; e.HasLoraID = true; return e }())},
		{"v0.9.0 2-element BlockRemoved", mp([]any{ts15, []any{[]any{"BlockRemoved", []any{H}}}}),
			batchOf(0, false, Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}})},
		{"Dynamo mocker: medium then group_idx",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, "GPU", 0}}, 0}),
			batchOf(0, true, mocker)},
		{"Dynamo mocker: medium only",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, "GPU"}}, 0}),
			batchOf(0, true, stored91())},
		{"Dynamo mocker: 5-element BlockStored",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, 7, []any{1, 2, 3, 4}, 4}}, 0}),
			batchOf(0, true, mockerShort)},
		{"Dynamo mocker: 2-element BlockRemoved",
			mp([]any{ts15, []any{[]any{"BlockRemoved", []any{H}}}, 0}),
			batchOf(0, true, Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}})},
		{"Dynamo mocker: BlockRemoved with group_idx, no medium",
			mp([]any{ts15, []any{[]any{"BlockRemoved", []any{H}, 3}}, 0}),
			batchOf(0, true, Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, GroupIdx: 3, HasGroupIdx: true})},
		{"array era 12 elements, cache salt from extra_keys, extra elements skipped",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, 3, "GPU", "adapter-a",
				[]any{[]any{"adapter-a", "mm0", CacheSaltPrefix + "tenant-a"}}, 1, "sliding_window", 128, "future", 9}}, 0}),
			batchOf(0, true, wide)},
		{"array era BlockRemoved 4 elements",
			mp([]any{ts15, []any{[]any{"BlockRemoved", []any{1, 2}, "CPU", 2}}, 0}),
			batchOf(0, true, Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{1, 2}, Medium: "CPU", GroupIdx: 2, HasGroupIdx: true})},
		{"map BlockRemoved with optional fields; BlockStored-only keys skipped",
			mp([]any{ts15, []any{kvs{"type", "BlockRemoved", "block_hashes", []any{1, 2}, "medium", "CPU", "group_idx", 2,
				"locality", "LOCAL", "ownership", "own", "token_ids", []any{1}, "parent_block_hash", 5}}, 0}),
			batchOf(0, true, removedFull)},
		{"SGLang cache_salt wins over extra_keys; locality, ownership, event_version",
			mp([]any{ts15, []any{append(map91(), "cache_salt", "explicit", "extra_keys", []any{[]any{CacheSaltPrefix + "implied"}},
				"locality", "REMOTE", "ownership", "tier2", "event_version", 2)}, 0}),
			batchOf(0, true, sglang)},
		{"nil optional fields are absent",
			mp([]any{ts15, []any{append(map91(), "extra_keys", nil, "group_idx", nil, "kv_cache_spec_kind", nil,
				"kv_cache_spec_sliding_window", nil, "locality", nil, "cache_salt", nil, "event_version", nil)}, 0}),
			batchOf(0, true, stored91())},
		{"duplicate keys: last wins",
			mp([]any{ts15, []any{append(kvs{"block_hashes", []any{1, 2, 3}, "parent_block_hash", 9, "type", "BlockStored", "type", "Ignored"}, map91()[2:]...)}, 0}),
			batchOf(0, true, stored91())},
		{"map envelope",
			mp(kvs{"ts", ts15, "events", []any{map91()}, "data_parallel_rank", 1}), batchOf(1, true, stored91())},
		{"map envelope: events first, dp_rank alias, unknown key",
			mp(kvs{"events", []any{map91()}, "other", kvs{"x", 1}, "dp_rank", 2, "ts", ts15}), batchOf(2, true, stored91())},
		{"map envelope: attn_dp_rank alias",
			mp(kvs{"ts", ts15, "events", []any{}, "attn_dp_rank", 3}), batchOf(3, true)},
		{"map envelope: rank nil, no ts",
			mp(kvs{"events", []any{}, "data_parallel_rank", nil}), &Batch{}},
		{"token ids of every width",
			mp([]any{ts15, []any{kvs{"type", "BlockStored", "token_ids", []any{0, 127, 128, 255, 256, 65535, 65536, int64(math.MaxUint32), raw{0xd0, 5}, raw{0xd3, 0, 0, 0, 0, 0, 0, 0, 9}}}}, 0}),
			batchOf(0, true, Event{Kind: KindBlockStored, Tag: TagBlockStored, TokenIDs: []uint32{0, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, 5, 9}})},
		{"cache salt from a bare-string first entry; later blocks ignored",
			mp([]any{ts15, []any{append(map91(), "extra_keys", []any{CacheSaltPrefix + "bare", []any{CacheSaltPrefix + "second"}})}, 0}),
			batchOf(0, true, func() Event {
				e := stored91()
				e.ExtraKeysRaw = mp([]any{CacheSaltPrefix + "bare", []any{CacheSaltPrefix + "second"}})
				e.CacheSalt = "bare"
				return e
			}())},
		{"no cache salt: first block nil, non-prefixed strings, ints and tuples skipped",
			mp([]any{ts15, []any{
				append(map91(), "extra_keys", []any{nil, []any{CacheSaltPrefix + "second"}}),
				append(map91(), "extra_keys", []any{[]any{1, []any{"mm", 3}, "adapter", "dynamo-cache-salt"}}),
			}, 0}),
			batchOf(0, true,
				func() Event {
					e := stored91()
					e.ExtraKeysRaw = mp([]any{nil, []any{CacheSaltPrefix + "second"}})
					return e
				}(),
				func() Event {
					e := stored91()
					e.ExtraKeysRaw = mp([]any{[]any{1, []any{"mm", 3}, "adapter", "dynamo-cache-salt"}})
					return e
				}())},
		{"SGLang positional BlockStored, 7 elements, signed hash, attn_dp_rank",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{raw{0xd3, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU"}}, 2}),
			batchOf(2, true, stored91())},
		{"SGLang BlockStoredWithMetadata: a metadata map at position 7 is not lora_name",
			mp([]any{ts15, []any{
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", kvs{"cache_salt", "tenant-a"}},
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", kvs{"session_id", "s-1", "cache_salt", "tenant-b", "future", []any{1, kvs{"x", 2}}}},
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", kvs{"cache_salt", nil}},
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", kvs{}},
			}, 0}),
			batchOf(0, true,
				func() Event { e := stored91(); e.CacheSalt = "tenant-a"; return e }(),
				func() Event { e := stored91(); e.CacheSalt, e.SessionID = "tenant-b", "s-1"; return e }(),
				stored91(), stored91())},
		{"SGLang metadata salt wins over extra_keys; a string at position 7 is still lora_name",
			mp([]any{ts15, []any{
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", kvs{"cache_salt", "explicit"},
					[]any{[]any{CacheSaltPrefix + "implied"}}},
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", "adapter-a"},
			}, 0}),
			batchOf(0, true,
				func() Event {
					e := stored91()
					e.CacheSalt = "explicit"
					e.ExtraKeysRaw = mp([]any{[]any{CacheSaltPrefix + "implied"}})
					return e
				}(),
				func() Event { e := stored91(); e.LoraName = "adapter-a"; return e }())},
		{"SGLang 15-element variant: vLLM's 12 positions, locality, ownership, metadata; 8-element remove; clear with a nil",
			mp([]any{ts15, []any{
				[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", nil,
					[]any{[]any{CacheSaltPrefix + "tenant-a"}}, nil, nil, nil, nil, nil, kvs{"cache_salt", "tenant-a"}},
				[]any{"BlockRemoved", []any{H}, "GPU", nil, nil, nil, nil, nil},
				[]any{"AllBlocksCleared", nil},
			}, 0}),
			batchOf(0, true,
				func() Event {
					e := stored91()
					e.ExtraKeysRaw = mp([]any{[]any{CacheSaltPrefix + "tenant-a"}})
					e.CacheSalt = "tenant-a"
					return e
				}(), removedH, cleared)},
		{"SGLang media and 3-element BlockRemoved",
			mp([]any{ts15, []any{
				[]any{"BlockRemoved", []any{H}, "CPU_PINNED"}, []any{"BlockRemoved", []any{H}, "DISK"},
				[]any{"BlockRemoved", []any{H}, "EXTERNAL"}, []any{"BlockRemoved", []any{H}, nil},
			}, 1}),
			batchOf(1, true,
				Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, Medium: "CPU_PINNED"},
				Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, Medium: "DISK"},
				Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, Medium: "EXTERNAL"},
				Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}})},
		{"nil lists read as empty",
			mp([]any{ts15, []any{kvs{"type", "BlockStored", "block_hashes", nil, "token_ids", nil}}, 0}),
			batchOf(0, true, Event{Kind: KindBlockStored, Tag: TagBlockStored})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			var got Batch
			if err := d.Decode(tc.payload, &got); err != nil {
				t.Fatalf("Decode(%x): %v", tc.payload, err)
			}
			if diff := diffBatch(tc.want, &got); diff != "" {
				t.Fatalf("%s\npayload %x", diff, tc.payload)
			}
		})
	}
}

func loadVectorsHex(t *testing.T, i int) string { return loadVectors(t)[i].Hex }

// TestDecodeHashEncodings: normalisation of every msgpack form of a hash to
// uint64 (docs/wire.md, "Block hashes"), both as a block hash and as a
// parent, through the full decoder.
func TestDecodeHashEncodings(t *testing.T) {
	digest := make([]byte, 32)
	for i := range digest {
		digest[i] = byte(i)
	}
	tests := []struct {
		name string
		enc  raw
		want uint64
	}{
		{"positive fixint", raw{0x05}, 5},
		{"cc u8", raw{0xcc, 0xfa}, 0xfa},
		{"cd u16", raw{0xcd, 0xfe, 0xdc}, 0xfedc},
		{"ce u32", raw{0xce, 0xfe, 0xdc, 0xba, 0x98}, 0xfedcba98},
		{"cf u64 (H)", raw{0xcf, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}, H},
		{"negative fixint -2", raw{0xfe}, 0xFFFFFFFFFFFFFFFE},
		{"negative fixint -32", raw{0xe0}, uint64(1<<64 - 32)},
		{"d0 i8 -128", raw{0xd0, 0x80}, uint64(1<<64 - 128)},
		{"d0 i8 positive", raw{0xd0, 0x05}, 5},
		{"d1 i16 -2", raw{0xd1, 0xff, 0xfe}, 0xFFFFFFFFFFFFFFFE},
		{"d2 i32 -2", raw{0xd2, 0xff, 0xff, 0xff, 0xfe}, 0xFFFFFFFFFFFFFFFE},
		{"d3 i64 (H as int64)", raw{0xd3, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}, H},
		{"c4 bin8 4 bytes", raw{0xc4, 4, 0xde, 0xad, 0xbe, 0xef}, 0xdeadbeef},
		{"c4 bin8 0 bytes", raw{0xc4, 0}, 0},
		{"c4 bin8 8 bytes", raw{0xc4, 8, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}, H},
		{"c4 bin8 32-byte digest", raw(msgp.AppendBytes(nil, digest)), 0x18191a1b1c1d1e1f},
		{"c5 bin16 32 bytes", append(raw{0xc5, 0, 32}, digest...), 0x18191a1b1c1d1e1f},
		{"c6 bin32 32 bytes", append(raw{0xc6, 0, 0, 0, 32}, digest...), 0x18191a1b1c1d1e1f},
		{"str 8 bytes (defensive)", raw{0xa8, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}, H},
		{"str 2 bytes (defensive)", raw{0xa2, 0x01, 0x02}, 0x0102},
		{"str8 32 bytes (defensive)", append(raw{0xd9, 32}, digest...), 0x18191a1b1c1d1e1f},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mp([]any{ts15, []any{
				kvs{"type", "BlockStored", "block_hashes", []any{tc.enc, 1}, "parent_block_hash", tc.enc},
				[]any{"BlockRemoved", []any{tc.enc}},
			}, 0})
			var d Decoder
			var b Batch
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
			if got := b.Events[0].BlockHashes; len(got) != 2 || got[0] != tc.want || got[1] != 1 {
				t.Errorf("block_hashes = %#x, want [%#x 0x1]", got, tc.want)
			}
			if ev := b.Events[0]; !ev.HasParent || ev.ParentHash != tc.want {
				t.Errorf("parent = %#x/%v, want %#x", ev.ParentHash, ev.HasParent, tc.want)
			}
			if got := b.Events[1].BlockHashes; len(got) != 1 || got[0] != tc.want {
				t.Errorf("removed = %#x, want %#x", got, tc.want)
			}
		})
	}
}

func TestHashFromBytes(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want uint64
	}{
		{nil, 0},
		{[]byte{1}, 1},
		{[]byte{1, 2, 3, 4, 5, 6, 7}, 0x01020304050607},
		{[]byte{1, 2, 3, 4, 5, 6, 7, 8}, 0x0102030405060708},
		{[]byte{9, 1, 2, 3, 4, 5, 6, 7, 8}, 0x0102030405060708},
	} {
		if got := HashFromBytes(tc.in); got != tc.want {
			t.Errorf("HashFromBytes(%x) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
}

// TestDecodeErrors: damage outside the events (envelope, ts, rank,
// trailing bytes) and damage that leaves an event's end unknown (invalid
// msgpack) fail the whole batch with a typed error naming the reason and
// the offset of the offending element.
func TestDecodeErrors(t *testing.T) {
	stored := func(kv ...any) []byte {
		return mp([]any{ts15, []any{append(kvs{"type", "BlockStored"}, kv...)}, 0})
	}
	tests := []struct {
		name    string
		payload []byte
		reason  string
		offset  int // -1: not checked
	}{
		{"empty payload", nil, ReasonTruncated, 0},
		{"envelope is an int", mp(5), ReasonEnvelope, 0},
		{"envelope is a string", mp("x"), ReasonEnvelope, 0},
		{"envelope array of 1", mp([]any{ts15}), ReasonEnvelope, 0},
		{"envelope array of 0", mp([]any{}), ReasonEnvelope, 0},
		{"ts is a string", mp([]any{"1.5", []any{}}), ReasonEnvelope, 1},
		{"ts is nil", mp([]any{nil, []any{}}), ReasonEnvelope, 1},
		{"events is a map", mp([]any{ts15, kvs{}, 0}), ReasonEnvelope, 10},
		{"events is nil", mp([]any{ts15, nil, 0}), ReasonEnvelope, 10},
		{"rank is a string", mp([]any{ts15, []any{}, "0"}), ReasonEnvelope, 11},
		{"rank is a float", mp([]any{ts15, []any{}, 1.0}), ReasonEnvelope, 11},
		{"rank overflows int32", mp([]any{ts15, []any{}, int64(1 << 31)}), ReasonEnvelope, 11},
		{"rank overflows int64", mp([]any{ts15, []any{}, uint64(1 << 63)}), ReasonEnvelope, 11},
		{"map envelope without events", mp(kvs{"ts", ts15}), ReasonEnvelope, 0},
		{"trailing bytes", append(mp([]any{ts15, []any{}, 0}), 0xc0), ReasonTrailing, 12},
		{"invalid msgpack byte in skipped value", stored("future", raw{0xc1}), ReasonEvent, 36},
		{"invalid msgpack byte in extra_keys", stored("extra_keys", []any{raw{0xc1}}), ReasonEvent, 41},
		{"invalid msgpack byte after a bad field",
			stored("medium", 1, "future", raw{0xc1}), ReasonEvent, 44},
		{"invalid msgpack byte in an event after a skipped one",
			mp([]any{ts15, []any{kvs{"type", "BlockStored", "medium", 1}, kvs{"type", "BlockStored", "medium", 2, "x", raw{0xc1}}}, 0}),
			ReasonEvent, 65},
		{"rank is a string after a skipped event",
			mp([]any{ts15, []any{kvs{"type", "BlockStored", "medium", 1}}, "0"}), ReasonEnvelope, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			b := cloneBatch(typicalBatch()) // dirty, to check it is emptied
			de := decodeErr(t, d.Decode(tc.payload, b))
			if de.Reason != tc.reason {
				t.Errorf("reason %q, want %q (%v)", de.Reason, tc.reason, de)
			}
			if tc.offset >= 0 && de.Offset != tc.offset {
				t.Errorf("offset %d, want %d (%v; payload %x)", de.Offset, tc.offset, de, tc.payload)
			}
			if de.Offset < 0 || de.Offset > len(tc.payload) {
				t.Errorf("offset %d outside the payload", de.Offset)
			}
			if !strings.Contains(de.Error(), de.Reason) {
				t.Errorf("Error() %q does not name the reason", de.Error())
			}
			if len(b.Events) != 0 || b.TS != 0 || b.HasDPRank || b.Unknown != 0 || b.Skipped.Total() != 0 || b.Skipped.First != nil {
				t.Errorf("batch not emptied after an error: %+v", b)
			}
		})
	}
}

// TestDecodeSkips: an event that is well-formed msgpack but cannot be
// decoded is skipped and counted by kind and reason, the rest of the batch
// decodes, and Skips.Lossy tells whether the skipped event could have been
// a remove.
func TestDecodeSkips(t *testing.T) {
	stored := func(kv ...any) any { return append(kvs{"type", "BlockStored"}, kv...) }
	removedH := Event{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{H}, Medium: "GPU"}
	tests := []struct {
		name   string
		event  any // decoded alone, then between two good events
		kind   SkipKind
		reason string
		offset int // of the error in the payload [ts, [event], 0]; -1: not checked
	}{
		{"event is an int", 5, SkipUntagged, ReasonEvent, 11},
		{"event is nil", nil, SkipUntagged, ReasonEvent, 11},
		{"event is a string", "BlockRemoved", SkipUntagged, ReasonEvent, 11},
		{"empty event array", []any{}, SkipUntagged, ReasonEvent, 11},
		{"event tag is an int", []any{1, 2}, SkipUntagged, ReasonEvent, 12},
		{"map event without type", kvs{"block_hashes", []any{}}, SkipUntagged, ReasonEvent, 11},
		{"map event type is nil", kvs{"type", nil}, SkipUntagged, ReasonEvent, 17},
		{"BlockStored array too short", []any{"BlockStored", []any{H}, nil, []any{}}, SkipStored, ReasonEvent, 11},
		{"BlockRemoved array too short", []any{"BlockRemoved"}, SkipRemoved, ReasonEvent, 11},
		{"float hash", stored("block_hashes", []any{1.5}), SkipStored, ReasonHash, 43},
		{"float32 hash", stored("block_hashes", []any{float32(1.5)}), SkipStored, ReasonHash, 43},
		{"bool hash", stored("block_hashes", []any{true}), SkipStored, ReasonHash, 43},
		{"nil in block_hashes", stored("block_hashes", []any{nil}), SkipStored, ReasonHash, 43},
		{"array hash", stored("block_hashes", []any{[]any{1}}), SkipStored, ReasonHash, 43},
		{"map hash", stored("block_hashes", []any{kvs{}}), SkipStored, ReasonHash, 43},
		{"ext hash", stored("block_hashes", []any{raw{0xd4, 1, 1}}), SkipStored, ReasonHash, 43},
		{"float parent", stored("parent_block_hash", 2.5), SkipStored, ReasonHash, 47},
		{"block_hashes not a list", stored("block_hashes", 5), SkipStored, ReasonField, 42},
		{"negative token", stored("token_ids", []any{1, -1}), SkipStored, ReasonToken, 41},
		{"token > 2^32-1", stored("token_ids", []any{int64(math.MaxUint32) + 1}), SkipStored, ReasonToken, 40},
		{"float token", stored("token_ids", []any{1.0}), SkipStored, ReasonToken, 40},
		{"EAGLE bigram token", stored("token_ids", []any{[]any{1, 2}}), SkipStored, ReasonToken, 40},
		{"medium is an int", stored("medium", 1), SkipStored, ReasonField, 36},
		{"block_size is a string", stored("block_size", "16"), SkipStored, ReasonField, 40},
		{"lora_id overflows int64", stored("lora_id", uint64(1<<63)), SkipStored, ReasonField, 37},
		{"group_idx is a float", stored("group_idx", 0.0), SkipStored, ReasonField, 39},
		{"mocker layout, group_idx is a string",
			[]any{"BlockStored", []any{H}, nil, []any{}, 4, "GPU", "x"}, SkipStored, ReasonField, -1},
		{"vLLM layout, medium is an int",
			[]any{"BlockStored", []any{H}, nil, []any{}, 4, nil, 5}, SkipStored, ReasonField, -1},
		{"SGLang metadata, cache_salt is an int",
			[]any{"BlockStored", []any{H}, nil, []any{}, 4, nil, "GPU", kvs{"cache_salt", 5}}, SkipStored, ReasonField, -1},
		{"position 7 is an int", []any{"BlockStored", []any{H}, nil, []any{}, 4, nil, "GPU", 7}, SkipStored, ReasonField, -1},
		{"BlockRemoved medium is an int", []any{"BlockRemoved", []any{H}, 5.5}, SkipRemoved, ReasonField, -1},
		{"BlockRemoved float hash", kvs{"type", "BlockRemoved", "block_hashes", []any{1.5}}, SkipRemoved, ReasonHash, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check := func(b *Batch, p []byte) {
				t.Helper()
				if got := b.Skipped.N[tc.kind][slices.Index(SkipReasons[:], tc.reason)]; got != 1 || b.Skipped.Total() != 1 {
					t.Fatalf("skips %+v, want one %v/%s", b.Skipped.N, tc.kind, tc.reason)
				}
				if want := tc.kind != SkipStored; b.Skipped.Lossy() != want {
					t.Errorf("Lossy() = %v, want %v", b.Skipped.Lossy(), want)
				}
				f := b.Skipped.First
				if f == nil || f.Reason != tc.reason || !errors.Is(f, ErrMalformed) || f.Offset < 0 || f.Offset > len(p) {
					t.Fatalf("First = %v, want reason %s", f, tc.reason)
				}
			}
			var d Decoder
			alone := mp([]any{ts15, []any{tc.event}, 0})
			b := cloneBatch(typicalBatch())
			if err := d.Decode(alone, b); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			check(b, alone)
			if tc.offset >= 0 && b.Skipped.First.Offset != tc.offset {
				t.Errorf("offset %d, want %d (%v; payload %x)", b.Skipped.First.Offset, tc.offset, b.Skipped.First, alone)
			}
			if len(b.Events) != 0 || !b.HasDPRank {
				t.Errorf("batch %+v", b)
			}
			// Between good events of both eras, twice: the rest decodes.
			mixed := mp([]any{ts15, []any{map91(), tc.event, []any{"BlockRemoved", []any{H}, "GPU"}}, 1})
			for range 2 {
				if err := d.Decode(mixed, b); err != nil {
					t.Fatalf("Decode: %v", err)
				}
				check(b, mixed)
				if diff := diffBatch(batchOf(1, true, stored91(), removedH), b); diff != "" {
					t.Fatal(diff)
				}
			}
			// A clean batch after it reports nothing skipped.
			if err := d.Decode(mp([]any{ts15, []any{map91()}, 0}), b); err != nil || b.Skipped.Total() != 0 || b.Skipped.First != nil {
				t.Fatalf("clean batch after a skip: %v %+v", err, b.Skipped)
			}
		})
	}
}

// TestDecodeSkipsCounted: several skipped events of every kind in one batch
// are all counted, the first one's error kept; unknown tags are counted
// apart (Unknown) and do not make a batch lossy.
func TestDecodeSkipsCounted(t *testing.T) {
	p := mp([]any{ts15, []any{
		kvs{"type", "BlockStored", "token_ids", []any{-1}},
		map91(),
		kvs{"type", "BlockStored", "medium", 1},
		[]any{"BlockMoved", 1},
		kvs{"type", "BlockStored", "block_hashes", []any{1.5}},
	}, 0})
	var d Decoder
	var b Batch
	if err := d.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	want := Skips{}
	want.N[SkipStored][2] = 1 // token
	want.N[SkipStored][3] = 1 // field
	want.N[SkipStored][1] = 1 // hash
	if b.Skipped.N != want.N || b.Skipped.Lossy() || b.Skipped.First.Reason != ReasonToken || len(b.Events) != 1 || b.Unknown != 1 {
		t.Fatalf("batch %+v skips %+v first %v", b, b.Skipped.N, b.Skipped.First)
	}
	p = mp([]any{ts15, []any{kvs{"type", "BlockRemoved", "block_hashes", 1}, []any{"AllBlocksCleared"}, 7, map91(), []any{"AllBlocksCleared"}}, 0})
	if err := d.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	if b.Skipped.Kind(SkipRemoved) != 1 || b.Skipped.Kind(SkipUntagged) != 1 || !b.Skipped.Lossy() || len(b.Events) != 3 {
		t.Fatalf("batch %+v skips %+v", b, b.Skipped.N)
	}
	if SkipStored.String() != "stored" || SkipUntagged.String() != "untagged" || SkipKind(9).String() != "SkipKind(9)" {
		t.Error("SkipKind.String")
	}
}

// TestDecodeTruncated: every strict prefix of every vector (and of a large
// batch) is rejected as truncated, never a panic or a success.
func TestDecodeTruncated(t *testing.T) {
	payloads := [][]byte{mustEncode(t, Encoder{}, typicalBatch()), mustEncode(t, Encoder{Era: EraArray, Wide: true}, typicalBatch())}
	for _, v := range loadVectors(t) {
		payloads = append(payloads, v.payload(t))
	}
	var d Decoder
	var b Batch
	for _, p := range payloads {
		if err := d.Decode(p, &b); err != nil {
			t.Fatalf("full payload: %v", err)
		}
		for n := 0; n < len(p); n++ {
			err := d.Decode(p[:n], &b)
			de := decodeErr(t, err)
			if de.Reason != ReasonTruncated || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("prefix %d of %x: %v, want truncated", n, p, err)
			}
		}
	}
}

// measure returns the bytes allocated per call of f.
func measure(runs int, f func()) uint64 {
	f()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < runs; i++ {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// TestDecodeHostile: headers claiming 2^32-1 elements, and deep nesting, fail
// fast without allocating in proportion to the claim.
func TestDecodeHostile(t *testing.T) {
	env := []byte{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}
	huge32 := []byte{0xff, 0xff, 0xff, 0xff}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	deep := cat(env, []byte{0x91}, mp(kvs{"type", "BlockStored", "x", raw(bytes.Repeat([]byte{0x91}, 200_000))}))
	tests := []struct {
		name    string
		payload []byte
		reason  string
	}{
		{"array32 claiming 2^32-1 events", cat(env, []byte{0xdd}, huge32), ReasonTruncated},
		{"array32 envelope claiming 2^32-1 elements", cat([]byte{0xdd}, huge32, env[1:]), ReasonTruncated},
		{"map32 envelope claiming 2^32-1 entries", cat([]byte{0xdf}, huge32), ReasonTruncated},
		{"array32 claiming 2^32-1 block hashes",
			cat(env, []byte{0x91, 0x95}, mp("BlockStored"), []byte{0xdd}, huge32, []byte{1, 2, 3}), ReasonTruncated},
		{"array32 claiming 2^32-1 token ids",
			cat(env, []byte{0x91}, mp(kvs{"type", "BlockStored", "token_ids", raw(cat([]byte{0xdd}, huge32, []byte{1, 2, 3}))})), ReasonTruncated},
		{"map32 event claiming 2^32-1 entries", cat(env, []byte{0x91, 0xdf}, huge32, mp("type", "BlockMoved")), ReasonTruncated},
		{"skipped value: array32 of 2^32-1", cat(env, []byte{0x91}, mp(kvs{"type", "BlockMoved", "x", raw(cat([]byte{0xdd}, huge32))})), ReasonTruncated},
		{"skipped value: nested map32s", cat(env, []byte{0x91}, mp(kvs{"type", "BlockStored", "x", raw(bytes.Repeat(cat([]byte{0xdf}, huge32), 1000))})), ReasonTruncated},
		{"bin32 claiming 4 GiB hash", cat(env, []byte{0x91, 0x95}, mp("BlockStored"), []byte{0x91, 0xc6}, huge32), ReasonTruncated},
		{"200k-deep nesting in a skipped value", deep, ReasonTruncated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			var b Batch
			de := decodeErr(t, d.Decode(tc.payload, &b))
			if de.Reason != tc.reason {
				t.Errorf("reason %q, want %q (%v)", de.Reason, tc.reason, de)
			}
			const limit = 64 << 10
			n := measure(20, func() { _ = d.Decode(tc.payload, &b) })
			if n > limit {
				t.Errorf("allocated %d bytes per decode, limit %d", n, limit)
			}
			t.Logf("%d-byte payload: %v, %d bytes allocated per decode", len(tc.payload), de, n)
		})
	}
	// A valid 200k-deep value in a skipped key decodes without recursion.
	ok := cat(env[:1], mp(ts15), []byte{0x91}, mp(kvs{"type", "BlockStored", "x", raw(cat(bytes.Repeat([]byte{0x91}, 200_000), []byte{0xc0}))}), []byte{0})
	var d Decoder
	var b Batch
	if err := d.Decode(ok, &b); err != nil {
		t.Fatal(err)
	}
	// The bound leaves room for the race detector's own allocations; a
	// per-level allocation would be hundreds of kilobytes.
	if n := measure(5, func() { _ = d.Decode(ok, &b) }); n > 4<<10 {
		t.Errorf("deep skip allocated %d bytes per decode", n)
	}
}

// TestDecodeHostileSkips: a batch of 100,000 tiny undecodable events of
// every kind is skipped event by event at a cost that does not grow with
// their number: only the first one's error is built.
func TestDecodeHostileSkips(t *testing.T) {
	const n = 100_000
	var evs bytes.Buffer
	bad := [][]byte{
		{0x05},                    // not an array or map
		{0x90},                    // empty array
		{0x91, 0x07},              // tag not a string
		{0x80},                    // map without type
		mp([]any{"BlockRemoved"}), // too short
		mp(kvs{"type", "BlockStored", "medium", 1}),
		mp(kvs{"type", "BlockStored", "block_size", "16"}),
		mp(kvs{"type", "BlockStored", "block_hashes", []any{1.5}}),
		mp(kvs{"type", "BlockStored", "token_ids", []any{-1}}),
		mp(kvs{"type", "BlockStored", "token_ids", []any{"x"}}),
		mp([]any{"BlockStored", []any{1}, nil, []any{1}, 4, nil, "GPU", 5}),
	}
	for i := 0; i < n; i++ {
		evs.Write(bad[i%len(bad)])
	}
	p := bytes.Join([][]byte{{0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xdd, 0, 0x01, 0x86, 0xa0}, evs.Bytes(), {0}}, nil)
	var d Decoder
	var b Batch
	if err := d.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	if b.Skipped.Total() != n || !b.Skipped.Lossy() || len(b.Events) != 0 || cap(b.Events) > 1 {
		t.Fatalf("skips %+v, %d events (cap %d)", b.Skipped.N, len(b.Events), cap(b.Events))
	}
	if a := measure(5, func() { _ = d.Decode(p, &b) }); a > 4<<10 {
		t.Errorf("%d bytes allocated per decode of %d skipped events", a, n)
	}
}

// TestDecodeZeroAllocs: decoding typical batches repeatedly into a reused
// Batch allocates nothing, including interned and repeated strings.
func TestDecodeZeroAllocs(t *testing.T) {
	typ := typicalBatch()
	withStrings := cloneBatch(typ)
	for i := range withStrings.Events {
		ev := &withStrings.Events[i]
		ev.LoraName = "my-adapter"
		ev.SessionID = "session-0123456789"
		ev.Ownership = "tier-x"
		ev.Locality = "LOCAL"
		ev.CacheSalt = "tenant-a"
	}
	implied := cloneBatch(typ)
	for i := range implied.Events {
		ev := &implied.Events[i]
		ev.ExtraKeysRaw = mp([]any{[]any{"mm-hash", CacheSaltPrefix + "tenant-" + string(rune('a'+i))}})
		ev.CacheSalt = "tenant-" + string(rune('a'+i))
	}
	mixed := &Batch{TS: 2, HasDPRank: true, Events: []Event{
		{Kind: KindBlockRemoved, Tag: TagBlockRemoved, BlockHashes: []uint64{1, 2, 3}, Medium: "CPU_PINNED"},
		{Kind: KindAllBlocksCleared, Tag: TagAllBlocksCleared},
		{Kind: KindUnknown, Tag: "BlockMoved"},
	}, Unknown: 1}
	for _, tc := range []struct {
		name string
		enc  Encoder
		b    *Batch
	}{
		{"map era", Encoder{}, typ},
		{"array era", Encoder{Era: EraArray, Wide: true}, typ},
		{"map era, bytes hashes", Encoder{Hash: HashBytes}, typ},
		{"map era, repeated non-constant strings", Encoder{}, withStrings},
		{"map era, removed/cleared/unknown", Encoder{}, mixed},
		{"map era, cache salt from extra_keys", Encoder{}, implied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustEncode(t, tc.enc, tc.b)
			var d Decoder
			var b Batch
			allocs := testing.AllocsPerRun(100, func() {
				if err := d.Decode(p, &b); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocs per decode, want 0", allocs)
			}
			if diff := diffBatch(tc.b, &b); diff != "" {
				t.Error(diff)
			}
		})
	}
}

// TestDecodeZeroAllocsSGLang: SGLang's salted positional events (the
// metadata map at position 7) decode into a reused Batch without
// allocating, like the layouts the Encoder writes.
func TestDecodeZeroAllocsSGLang(t *testing.T) {
	var evs []any
	for i := range 4 {
		hashes := make([]any, 16)
		for j := range hashes {
			hashes[j] = int64(i*16 + j - 40) // signed, some negative
		}
		tokens := make([]any, 16*16)
		for j := range tokens {
			tokens[j] = 1000 + j
		}
		var meta any = kvs{"cache_salt", "tenant-" + string(rune('a'+i)), "session_id", "session-0123456789"}
		ev := []any{"BlockStored", hashes, nil, tokens, 16, nil, "GPU", meta}
		if i == 3 {
			ev = ev[:7] // unsalted: the 7-element layout
		}
		evs = append(evs, ev)
	}
	evs = append(evs, []any{"BlockRemoved", []any{1, 2}, "CPU_PINNED"})
	p := mp([]any{ts15, evs, 1})
	var d Decoder
	var b Batch
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per decode, want 0", allocs)
	}
	if b.Events[0].CacheSalt != "tenant-a" || b.Events[2].SessionID != "session-0123456789" || b.Events[3].CacheSalt != "" {
		t.Errorf("events %+v", b.Events)
	}
}

// TestDecodeReuse: a Batch reused across decodes carries nothing over from
// the previous batch.
func TestDecodeReuse(t *testing.T) {
	full := &Batch{TS: 3, DPRank: 2, HasDPRank: true, Events: []Event{{
		Kind: KindBlockStored, Tag: TagBlockStored, BlockHashes: []uint64{1, 2}, ParentHash: 9, HasParent: true,
		TokenIDs: []uint32{5, 6}, BlockSize: 1, LoraID: 4, HasLoraID: true, Medium: "CPU", LoraName: "l",
		ExtraKeysRaw: mp([]any{[]any{CacheSaltPrefix + "s"}, nil}), CacheSalt: "s", GroupIdx: 1, HasGroupIdx: true,
		KVCacheSpecKind: "mamba", SlidingWindow: 3, HasSlidingWindow: true, Locality: "LOCAL", Ownership: "o",
		SessionID: "x", EventVersion: 2,
	}, {Kind: KindUnknown, Tag: "Foo"}}, Unknown: 1}
	minimal := &Batch{TS: 1, Events: []Event{{Kind: KindBlockStored, Tag: TagBlockStored}}}
	var d Decoder
	var b Batch
	for i, want := range []*Batch{full, minimal, full, minimal} {
		if err := d.Decode(mustEncode(t, Encoder{}, want), &b); err != nil {
			t.Fatal(err)
		}
		if diff := diffBatch(want, &b); diff != "" {
			t.Fatalf("decode %d: %s", i, diff)
		}
	}
}

// TestSkipMatchesMsgp: the iterative skip agrees with msgp.Skip on valid
// values and on arbitrary byte strings.
func TestSkipMatchesMsgp(t *testing.T) {
	inputs := [][]byte{
		mp(kvs{"a", []any{1, -1, 1.5, float32(2), true, nil, []byte{1}, "s", uint64(1 << 40), int64(-1 << 40)}}),
		raw{0xd4, 1, 2}, raw{0xd5, 1, 2, 3}, raw{0xd6, 1, 0, 0, 0, 0}, raw{0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		append(raw{0xd8, 1}, make([]byte, 16)...), raw{0xc7, 2, 1, 0, 0}, raw{0xc8, 0, 1, 1, 0}, raw{0xc9, 0, 0, 0, 1, 1, 0},
		raw{0xdc, 0, 1, 0xc0}, raw{0xde, 0, 1, 1, 2}, raw{0xdd, 0, 0, 0, 1, 0xc0}, raw{0xdf, 0, 0, 0, 1, 1, 2},
		raw{0xda, 0, 1, 'x'}, raw{0xdb, 0, 0, 0, 1, 'x'}, raw{0xc5, 0, 1, 1}, raw{0xc6, 0, 0, 0, 1, 1},
	}
	for _, in := range inputs {
		for n := 0; n <= len(in); n++ {
			p := append(in[:n:n], 0xaa) // a trailing byte
			got, err1 := skip(p)
			want, err2 := msgp.Skip(p)
			if (err1 == nil) != (err2 == nil) || (err1 == nil && len(got) != len(want)) {
				t.Errorf("skip(%x) = %x, %v; msgp.Skip = %x, %v", p, got, err1, want, err2)
			}
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindBlockStored: "BlockStored", KindBlockRemoved: "BlockRemoved",
		KindAllBlocksCleared: "AllBlocksCleared", KindUnknown: "Unknown", 0: "Kind(0)"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q", k, k.String())
		}
	}
	if EraArray.String() != "array" || EraMap.String() != "map" || HashBytes.String() != "bytes" || HashType(9).String() != "HashType(9)" {
		t.Error("Era/HashType String")
	}
}
