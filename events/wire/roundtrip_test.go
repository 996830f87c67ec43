package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"pgregory.net/rapid"
)

// optString draws "" or a string: one of the wire constants, a repeated
// literal, or arbitrary text.
func optString(t *rapid.T, label string) string {
	return rapid.OneOf(
		rapid.Just(""),
		rapid.SampledFrom([]string{"GPU", "CPU", "CPU_PINNED", "DISK", "LOCAL", "REMOTE", "full_attention", "mamba"}),
		rapid.String(),
		rapid.StringN(32, 300, -1), // str8/str16 headers
	).Draw(t, label)
}

// genExtraKeys draws a msgpack extra_keys value (or nothing): a list with one
// entry per block, each nil or a tuple of strings, ints and (str, int) pairs,
// sometimes with a Dynamo cache salt.
func genExtraKeys(t *rapid.T) []byte {
	if rapid.Bool().Draw(t, "no_extra_keys") {
		return nil
	}
	n := rapid.IntRange(0, 4).Draw(t, "extra_blocks")
	var items []any
	for i := 0; i < n; i++ {
		if rapid.Bool().Draw(t, "block_nil") {
			items = append(items, nil)
			continue
		}
		var tuple []any
		m := rapid.IntRange(0, 3).Draw(t, "tuple_len")
		for j := 0; j < m; j++ {
			switch rapid.IntRange(0, 3).Draw(t, "item_kind") {
			case 0:
				tuple = append(tuple, rapid.String().Draw(t, "item_str"))
			case 1:
				tuple = append(tuple, CacheSaltPrefix+rapid.String().Draw(t, "salt"))
			case 2:
				tuple = append(tuple, rapid.Int64().Draw(t, "item_int"))
			default:
				tuple = append(tuple, []any{rapid.String().Draw(t, "mm"), rapid.IntRange(0, 1<<20).Draw(t, "off")})
			}
		}
		items = append(items, tuple)
	}
	return mp(items)
}

type layout struct {
	name string
	enc  Encoder
}

var layouts = []layout{
	{"map/int", Encoder{}},
	{"map/bytes", Encoder{Hash: HashBytes}},
	{"map/signed", Encoder{Hash: HashSigned}},
	{"map/int/map16", Encoder{Map16: true}},
	{"array8/int", Encoder{Era: EraArray}},
	{"array8/bytes", Encoder{Era: EraArray, Hash: HashBytes}},
	{"array12/int", Encoder{Era: EraArray, Wide: true}},
	{"array12/signed", Encoder{Era: EraArray, Wide: true, Hash: HashSigned}},
	{"array12/bytes", Encoder{Era: EraArray, Wide: true, Hash: HashBytes}},
}

// genEvent draws an Event the layout can carry, in the canonical form Decode
// produces (Tag set, CacheSalt derived from extra_keys when not explicit).
func genEvent(t *rapid.T, enc Encoder) Event {
	mapEra := enc.Era == EraMap
	wide := mapEra || enc.Wide
	var ev Event
	ev.Kind = rapid.SampledFrom([]Kind{KindBlockStored, KindBlockStored, KindBlockRemoved, KindAllBlocksCleared, KindUnknown}).Draw(t, "kind")
	ev.Tag = ev.Kind.String()
	hashes := rapid.SliceOfN(rapid.OneOf(rapid.Uint64(), rapid.Uint64Range(0, 300)), 0, 20)
	switch ev.Kind {
	case KindUnknown:
		ev.Tag = rapid.String().Filter(func(s string) bool { return kindOf([]byte(s)) == KindUnknown }).Draw(t, "tag")
	case KindBlockStored:
		ev.BlockHashes = hashes.Draw(t, "hashes")
		if ev.HasParent = rapid.Bool().Draw(t, "has_parent"); ev.HasParent {
			ev.ParentHash = rapid.Uint64().Draw(t, "parent")
		}
		ev.TokenIDs = rapid.SliceOfN(rapid.Uint32(), 0, 64).Draw(t, "tokens")
		ev.BlockSize = rapid.Int().Draw(t, "block_size")
		if ev.HasLoraID = rapid.Bool().Draw(t, "has_lora_id"); ev.HasLoraID {
			ev.LoraID = rapid.Int64().Draw(t, "lora_id")
		}
		ev.Medium = optString(t, "medium")
		ev.LoraName = optString(t, "lora_name")
		if wide {
			ev.ExtraKeysRaw = genExtraKeys(t)
			if ev.HasGroupIdx = rapid.Bool().Draw(t, "has_group"); ev.HasGroupIdx {
				ev.GroupIdx = rapid.Int().Draw(t, "group")
			}
			ev.KVCacheSpecKind = optString(t, "kind")
			if ev.HasSlidingWindow = rapid.Bool().Draw(t, "has_window"); ev.HasSlidingWindow {
				ev.SlidingWindow = rapid.Int().Draw(t, "window")
			}
		}
		if mapEra {
			ev.Locality = optString(t, "locality")
			ev.Ownership = optString(t, "ownership")
			ev.SessionID = optString(t, "session")
			ev.EventVersion = rapid.IntRange(0, 3).Draw(t, "version")
			ev.CacheSalt = optString(t, "cache_salt")
		}
		if s, ok := extraKeysSalt(ev.ExtraKeysRaw); ok && ev.CacheSalt == "" {
			ev.CacheSalt = string(s)
		}
	case KindBlockRemoved:
		ev.BlockHashes = hashes.Draw(t, "hashes")
		ev.Medium = optString(t, "medium")
		if wide {
			if ev.HasGroupIdx = rapid.Bool().Draw(t, "has_group"); ev.HasGroupIdx {
				ev.GroupIdx = rapid.Int().Draw(t, "group")
			}
		}
		if mapEra {
			ev.KVCacheSpecKind = optString(t, "kind")
			if ev.HasSlidingWindow = rapid.Bool().Draw(t, "has_window"); ev.HasSlidingWindow {
				ev.SlidingWindow = rapid.Int().Draw(t, "window")
			}
			ev.Locality = optString(t, "locality")
			ev.Ownership = optString(t, "ownership")
			ev.SessionID = optString(t, "session")
			ev.EventVersion = rapid.IntRange(0, 3).Draw(t, "version")
		}
	}
	return ev
}

func genBatch(t *rapid.T, enc Encoder) *Batch {
	b := &Batch{TS: rapid.Float64().Draw(t, "ts")}
	if b.HasDPRank = rapid.Bool().Draw(t, "has_rank"); b.HasDPRank {
		b.DPRank = rapid.Int32().Draw(t, "rank")
	}
	n := rapid.IntRange(0, 6).Draw(t, "events")
	for i := 0; i < n; i++ {
		ev := genEvent(t, enc)
		if ev.Kind == KindUnknown {
			b.Unknown++
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// TestRoundTrip: for every era, hash type and layout option, random batches
// survive encode → decode unchanged, and re-encoding is byte-stable. The
// Decoder and Batch are reused across cases, which also exercises the reset
// of recycled Event slots.
func TestRoundTrip(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			var d Decoder
			var got Batch
			rapid.Check(t, func(t *rapid.T) {
				want := genBatch(t, l.enc)
				p, err := l.enc.AppendBatch(nil, want)
				if err != nil {
					t.Fatalf("encode: %v", err)
				}
				if err := d.Decode(p, &got); err != nil {
					t.Fatalf("decode %x: %v", p, err)
				}
				if diff := diffBatch(want, &got); diff != "" {
					t.Fatalf("%s\npayload %x", diff, p)
				}
				p2, err := l.enc.AppendBatch(nil, &got)
				if err != nil {
					t.Fatalf("re-encode: %v", err)
				}
				// Decode drops unknown events, so compare with the encoding
				// of the batch without them.
				p3, err := l.enc.AppendBatch(nil, knownOnly(want))
				if err != nil {
					t.Fatalf("encode known events: %v", err)
				}
				if !bytes.Equal(p3, p2) {
					t.Fatalf("re-encoding differs\n%x\n%x", p3, p2)
				}
			})
		})
	}
}

// TestRoundTripAcrossEras: whatever an array-era encoder writes decodes to
// the same Batch as the map-era encoding of that Batch.
func TestRoundTripAcrossEras(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		enc := rapid.SampledFrom([]Encoder{{Era: EraArray}, {Era: EraArray, Wide: true}}).Draw(t, "enc")
		b := genBatch(t, enc)
		var d Decoder
		var fromArray, fromMap Batch
		if err := d.Decode(mustEncodeR(t, enc, b), &fromArray); err != nil {
			t.Fatal(err)
		}
		if err := d.Decode(mustEncodeR(t, Encoder{}, b), &fromMap); err != nil {
			t.Fatal(err)
		}
		if diff := diffBatch(&fromArray, &fromMap); diff != "" {
			t.Fatal(diff)
		}
	})
}

func mustEncodeR(t *rapid.T, e Encoder, b *Batch) []byte {
	p, err := e.AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHashNormalisationProperty: every msgpack form of a hash value
// normalises to the same uint64 (docs/wire.md, "Block hashes").
func TestHashNormalisationProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := rapid.OneOf(rapid.Uint64(), rapid.Uint64Range(0, 1<<16), rapid.Uint64Range(1<<64-1<<16, 1<<64-1)).Draw(t, "h")
		prefix := rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "digest_prefix")
		be := binary.BigEndian.AppendUint64(nil, h)
		forms := map[string][]byte{
			"uint":             msgp.AppendUint64(nil, h),
			"int64 (signed)":   msgp.AppendInt64(nil, int64(h)),
			"appendInt signed": appendInt(nil, int64(h)),
			"u64 wide":         append([]byte{0xcf}, be...),
			"i64 wide":         append([]byte{0xd3}, be...),
			"bin digest":       msgp.AppendBytes(nil, append(append([]byte{}, prefix...), be...)),
			"str digest":       msgp.AppendStringFromBytes(nil, append(append([]byte{}, prefix...), be...)),
		}
		for name, enc := range forms {
			got, rest, err := readHash(append(enc, 0xc0))
			if err != nil || len(rest) != 1 || got != h {
				t.Fatalf("%s %x: got %#x, rest %x, err %v; want %#x", name, enc, got, rest, err, h)
			}
		}
		// A short bin is its big-endian value.
		n := rapid.IntRange(0, 7).Draw(t, "short")
		short := be[8-n:]
		want := h
		if n < 8 {
			want = h & (1<<(8*uint(n)) - 1)
		}
		if got, _, _ := readHash(msgp.AppendBytes(nil, short)); got != want {
			t.Fatalf("bin %x: got %#x want %#x", short, got, want)
		}
	})
}

// TestDecodeArbitraryNeverPanics: random byte strings and random mutations
// of valid payloads either decode or fail with a typed error.
func TestDecodeArbitraryNeverPanics(t *testing.T) {
	seeds := [][]byte{mustEncode(t, Encoder{}, typicalBatch())}
	for _, v := range loadVectors(t) {
		seeds = append(seeds, v.payload(t))
	}
	var d Decoder
	var b Batch
	rapid.Check(t, func(t *rapid.T) {
		var p []byte
		if rapid.Bool().Draw(t, "random") {
			p = rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(t, "bytes")
		} else {
			p = append([]byte{}, rapid.SampledFrom(seeds).Draw(t, "seed")...)
			for i, n := 0, rapid.IntRange(1, 4).Draw(t, "mutations"); i < n; i++ {
				p[rapid.IntRange(0, len(p)-1).Draw(t, "at")] = rapid.Byte().Draw(t, "b")
			}
		}
		if err := d.Decode(p, &b); err != nil {
			var de *DecodeError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) || de.Offset < 0 || de.Offset > len(p) {
				t.Fatalf("untyped error or bad offset: %v", err)
			}
			return
		}
		checkReencode(t, &b)
	})
}

// checkReencode: a decoded batch re-encodes (map era) and decodes to itself.
func checkReencode(t interface{ Fatalf(string, ...any) }, b *Batch) {
	p, err := (&Encoder{}).AppendBatch(nil, b)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	var d Decoder
	var b2 Batch
	if err := d.Decode(p, &b2); err != nil {
		t.Fatalf("decode re-encoded %x: %v", p, err)
	}
	// Decode dropped b's unknown events, so the re-encoding has none.
	want := *b
	want.Unknown, want.UnknownTag = 0, ""
	if diff := diffBatch(&want, &b2); diff != "" {
		t.Fatalf("re-encode round trip: %s", diff)
	}
}
