package wire

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

func TestEncodeErrors(t *testing.T) {
	stored := func(f func(*Event)) *Batch {
		ev := stored91()
		f(&ev)
		return &Batch{Events: []Event{ev}}
	}
	removed := func(f func(*Event)) *Batch {
		ev := Event{Kind: KindBlockRemoved, BlockHashes: []uint64{1}}
		f(&ev)
		return &Batch{Events: []Event{ev}}
	}
	arr := Encoder{Era: EraArray}
	wide := Encoder{Era: EraArray, Wide: true}
	tests := []struct {
		name string
		enc  Encoder
		b    *Batch
		want string // substring of the error
	}{
		{"invalid era", Encoder{Era: 7}, &Batch{}, "Era(7)"},
		{"invalid hash type", Encoder{Hash: 9}, &Batch{}, "HashType(9)"},
		{"zero kind", Encoder{}, &Batch{Events: []Event{{}}}, "Kind(0)"},
		{"zero kind, array", arr, &Batch{Events: []Event{{}}}, "Kind(0)"},
		{"unknown kind with a known tag", Encoder{}, &Batch{Events: []Event{{Kind: KindUnknown, Tag: TagBlockStored}}}, "known tag"},
		{"unknown kind with a known tag, array", arr, &Batch{Events: []Event{{Kind: KindUnknown, Tag: TagAllBlocksCleared}}}, "known tag"},
		{"extra_keys not one element", Encoder{}, stored(func(e *Event) { e.ExtraKeysRaw = []byte{0xc0, 0xc0} }), "ExtraKeysRaw"},
		{"extra_keys truncated", wide, stored(func(e *Event) { e.ExtraKeysRaw = []byte{0x92, 0xc0} }), "ExtraKeysRaw"},
		{"array: extra_keys without Wide", arr, stored(func(e *Event) { e.ExtraKeysRaw = []byte{0x90} }), "extra_keys"},
		{"array: group_idx without Wide", arr, stored(func(e *Event) { e.HasGroupIdx = true }), "group_idx"},
		{"array: kind without Wide", arr, stored(func(e *Event) { e.KVCacheSpecKind = "mamba" }), "kv_cache_spec_kind"},
		{"array: window without Wide", arr, stored(func(e *Event) { e.HasSlidingWindow = true }), "kv_cache_spec_sliding_window"},
		{"array: locality", wide, stored(func(e *Event) { e.Locality = "LOCAL" }), "locality"},
		{"array: ownership", wide, stored(func(e *Event) { e.Ownership = "o" }), "ownership"},
		{"array: session_id", wide, stored(func(e *Event) { e.SessionID = "s" }), "session_id"},
		{"array: event_version", wide, stored(func(e *Event) { e.EventVersion = 2 }), "event_version"},
		{"array: explicit cache_salt", wide, stored(func(e *Event) { e.CacheSalt = "s" }), "cache_salt"},
		{"array: removed group_idx without Wide", arr, removed(func(e *Event) { e.HasGroupIdx = true }), "group_idx"},
		{"array: removed kind even with Wide", wide, removed(func(e *Event) { e.KVCacheSpecKind = "mamba" }), "kv_cache_spec_kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("prefix")
			out, err := tc.enc.AppendBatch(prefix, tc.b)
			if err == nil {
				t.Fatalf("no error; encoded %x", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if !bytes.Equal(out, []byte("prefix")) {
				t.Errorf("dst modified on error: %q", out)
			}
		})
	}
	// Representable: a salt implied by extra_keys is fine in the array era.
	ok := stored(func(e *Event) {
		e.ExtraKeysRaw = mp([]any{[]any{CacheSaltPrefix + "s"}})
		e.CacheSalt = "s"
	})
	if _, err := wide.AppendBatch(nil, ok); err != nil {
		t.Errorf("implied cache salt: %v", err)
	}
	// Fields a kind does not have are ignored.
	ign := &Batch{Events: []Event{{Kind: KindAllBlocksCleared, BlockHashes: []uint64{1}, Locality: "x"},
		{Kind: KindBlockRemoved, TokenIDs: []uint32{1}, LoraName: "x", ExtraKeysRaw: []byte{0xc1}}}}
	for _, e := range []Encoder{{}, arr} {
		if _, err := e.AppendBatch(nil, ign); err != nil {
			t.Errorf("%v: %v", e.Era, err)
		}
	}
}

// TestEncodeForms pins the exact bytes of the encoder's choices.
func TestEncodeForms(t *testing.T) {
	vs := loadVectors(t)
	body91 := vs[0].payload(t)
	map16 := append(append(append([]byte{}, body91[:11]...), 0xde, 0x00, 0x08), body91[12:]...)

	allFields := stored91()
	allFields.EventVersion = 2
	allFields.ExtraKeysRaw = []byte{0x91, 0xc0}
	allFields.HasGroupIdx = true
	allFields.KVCacheSpecKind = "full_attention"
	allFields.SlidingWindow, allFields.HasSlidingWindow = 4, true
	allFields.Locality, allFields.Ownership, allFields.SessionID, allFields.CacheSalt = "LOCAL", "o", "s", "c"

	tests := []struct {
		name string
		enc  Encoder
		b    *Batch
		want string // hex; "…" marks a substring check
	}{
		{"Map16 around the 9.1 body", Encoder{Map16: true}, &Batch{TS: 1.5, HasDPRank: true, Events: []Event{stored91()}},
			hex.EncodeToString(map16)},
		{"17 entries get map16 without the option", Encoder{}, &Batch{Events: []Event{allFields}}, "…91de0011a474797065"},
		{"HashBytes layout", Encoder{Hash: HashBytes}, &Batch{Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{H}}}},
			"…91c420000000000000000000000000000000000000000000000000fedcba9876543210a66d656469756dc0"},
		{"HashSigned H", Encoder{Hash: HashSigned}, &Batch{Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{H, 5}}}},
			"…92d3fedcba987654321005a6"},
		{"HashInt widths", Encoder{}, &Batch{Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{5, 200, 300, 70000, 1 << 40}}}},
			"…9505ccc8cd012cce00011170cf0000010000000000a6"},
		{"non-negative ints unsigned (msgspec), negative signed", Encoder{Era: EraArray},
			&Batch{DPRank: 300, HasDPRank: true, Events: []Event{{Kind: KindBlockStored, BlockSize: 200, LoraID: -1, HasLoraID: true}}},
			"93cb00000000000000009198ab426c6f636b53746f72656490c090ccc8ffc0c0cd012c"},
		{"ts always float64", Encoder{}, &Batch{TS: 2}, "93cb400000000000000090c0"},
		{"unknown tag", Encoder{}, &Batch{Events: []Event{{Kind: KindUnknown, Tag: "BlockMoved"}}}, "…9181a474797065aa426c6f636b4d6f766564c0"},
		{"unknown tag, array", Encoder{Era: EraArray}, &Batch{Events: []Event{{Kind: KindUnknown, Tag: "BlockMoved"}}}, "…9191aa426c6f636b4d6f766564c0"},
		{"wide array BlockRemoved", Encoder{Era: EraArray, Wide: true},
			&Batch{Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, GroupIdx: 0, HasGroupIdx: true}}},
			"…9194ac426c6f636b52656d6f7665649101c000c0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte{0xaa}
			out, err := tc.enc.AppendBatch(prefix, tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != 0xaa {
				t.Fatal("prefix lost")
			}
			got := hex.EncodeToString(out[1:])
			if sub, ok := strings.CutPrefix(tc.want, "…"); ok {
				if !strings.Contains(got, sub) {
					t.Fatalf("got %s, want it to contain %s", got, sub)
				}
			} else if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			var d Decoder
			var b Batch
			if err := d.Decode(out[1:], &b); err != nil {
				t.Fatal(err)
			}
			want := cloneBatch(tc.b)
			for i := range want.Events {
				if want.Events[i].Tag == "" {
					want.Events[i].Tag = want.Events[i].Kind.String()
				}
				if want.Events[i].Kind == KindUnknown {
					want.Unknown++
				}
			}
			if diff := diffBatch(want, &b); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}
