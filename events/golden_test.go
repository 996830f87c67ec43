package events

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// TestGoldenDecode decodes every msgspec payload vector and checks every
// field against the meaning recorded in testdata/vectors.json.
func TestGoldenDecode(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			var d Decoder
			var got Batch
			if err := d.Decode(v.payload(t), &got); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := diffBatch(v.want(t), &got); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}

// TestGoldenConstants pins the vectors' spelled-out expectations (hashes,
// parents, ranks, ts) independently of the JSON file, so a wrong expectation
// there cannot hide a decoder bug.
func TestGoldenConstants(t *testing.T) {
	vs := loadVectors(t)
	dec := func(i int) *Batch {
		var d Decoder
		var b Batch
		if err := d.Decode(vs[i].payload(t), &b); err != nil {
			t.Fatalf("%s: %v", vs[i].Name, err)
		}
		return &b
	}
	if b := dec(0); b.Events[0].BlockHashes[0] != 0xFEDCBA9876543210 || b.Events[0].HasParent ||
		!b.HasDPRank || b.DPRank != 0 || b.TS != 1.5 {
		t.Errorf("9.1: %+v", b)
	}
	if b := dec(1); !b.Events[0].HasParent || b.Events[0].ParentHash != 7 ||
		!bytes.Equal(b.Events[0].ExtraKeysRaw, []byte{0x91, 0xc0}) || !b.Events[0].HasGroupIdx ||
		b.Events[0].KVCacheSpecKind != "full_attention" {
		t.Errorf("9.2: %+v", b.Events[0])
	}
	if b := dec(2); b.DPRank != 1 || !b.HasDPRank || b.Events[0].Kind != KindBlockRemoved || b.Events[0].Medium != "GPU" {
		t.Errorf("9.3 BlockRemoved rank 1: %+v", b)
	}
	if b := dec(3); b.Events[0].Kind != KindAllBlocksCleared || !b.HasDPRank || b.DPRank != 0 {
		t.Errorf("9.3 AllBlocksCleared rank 0: %+v", b)
	}
	if b := dec(4); b.Events[0].Kind != KindAllBlocksCleared || b.HasDPRank {
		t.Errorf("9.3 AllBlocksCleared rank None: %+v", b)
	}
	if b := dec(5); b.Events[0].BlockHashes[0] != 0x18191a1b1c1d1e1f {
		t.Errorf("9.3 bytes hash: %#x", b.Events[0].BlockHashes[0])
	}
	if b := dec(6); b.Events[0].BlockHashes[0] != 0xFFFFFFFFFFFFFFFE || b.Events[0].Medium != "" {
		t.Errorf("9.3 negative hash: %#x %q", b.Events[0].BlockHashes[0], b.Events[0].Medium)
	}
}

// TestGoldenEncode re-encodes the decoded meaning of every vector that the
// Encoder can reproduce and compares byte for byte.
func TestGoldenEncode(t *testing.T) {
	encoded := 0
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			if v.Encode == nil {
				if v.EncodeNote == "" {
					t.Fatal("vector is not encodable but has no encode_note")
				}
				// Decode-only (see encode_note). Still check that our
				// bytes-mode encoding of the same meaning decodes back.
				e := Encoder{Hash: HashBytes}
				var b Batch
				var d Decoder
				if err := d.Decode(mustEncode(t, e, v.want(t)), &b); err != nil {
					t.Fatal(err)
				}
				if diff := diffBatch(v.want(t), &b); diff != "" {
					t.Fatal(diff)
				}
				return
			}
			encoded++
			e := v.encoder(t)
			got := mustEncode(t, e, v.want(t))
			if want := v.payload(t); !bytes.Equal(got, want) {
				t.Fatalf("encoding differs\n got %s\nwant %s", hex.EncodeToString(got), v.Hex)
			}
			// Also from the decoded Batch (not only the JSON meaning).
			var b Batch
			var d Decoder
			if err := d.Decode(v.payload(t), &b); err != nil {
				t.Fatal(err)
			}
			if got := mustEncode(t, e, &b); !bytes.Equal(got, v.payload(t)) {
				t.Fatalf("re-encoding the decoded batch differs\n got %x\nwant %s", got, v.Hex)
			}
		})
	}
	if encoded != 9 {
		t.Fatalf("%d vectors encoded byte for byte, want 9 (all but the 00..1f digest)", encoded)
	}
}

// TestGoldenEquivalence: the array-era and map-era encodings of the same
// events (the BlockStored and the rank-1 BlockRemoved vectors) decode
// identically.
func TestGoldenEquivalence(t *testing.T) {
	vs := loadVectors(t)
	byName := map[string]vector{}
	for _, v := range vs {
		byName[v.Name] = v
	}
	pairs := [][2]string{
		{"9.1 map-era minimal BlockStored, rank 0", "9.4 array-era BlockStored, rank 0"},
		{"9.3 map-era BlockRemoved, rank 1", "9.4 array-era BlockRemoved, rank 1"},
		{"9.3 map-era AllBlocksCleared, rank 0", "9.4 array-era AllBlocksCleared, rank 0"},
	}
	for _, p := range pairs {
		a, ok1 := byName[p[0]]
		b, ok2 := byName[p[1]]
		if !ok1 || !ok2 {
			t.Fatalf("missing vector %q or %q", p[0], p[1])
		}
		var d Decoder
		var ba, bb Batch
		if err := d.Decode(a.payload(t), &ba); err != nil {
			t.Fatal(err)
		}
		if err := d.Decode(b.payload(t), &bb); err != nil {
			t.Fatal(err)
		}
		if diff := diffBatch(&ba, &bb); diff != "" {
			t.Errorf("%s vs %s: %s", p[0], p[1], diff)
		}
	}
}
