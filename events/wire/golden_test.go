package wire

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

// TestGoldenConstantsProducers pins the SGLang and TensorRT-LLM vectors'
// key expectations (salts, signed hashes, ranks, media) independently of
// the JSON file.
func TestGoldenConstantsProducers(t *testing.T) {
	byName := map[string]*Batch{}
	for _, v := range loadVectors(t) {
		var d Decoder
		var b Batch
		if err := d.Decode(v.payload(t), &b); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if b.Skipped.Total() != 0 || b.Unknown != 0 {
			t.Errorf("%s: skipped %+v, unknown %d", v.Name, b.Skipped.N, b.Unknown)
		}
		byName[v.Name] = &b
	}
	get := func(name string) *Batch {
		b, ok := byName[name]
		if !ok {
			t.Fatalf("no vector %q", name)
		}
		return b
	}
	if b := get("SGLang positional BlockStored, unsalted (7 elements), attn_dp_rank 0"); b.Events[0].BlockHashes[0] != H || b.Events[0].CacheSalt != "" || b.Events[0].LoraName != "" {
		t.Errorf("SGLang unsalted: %+v", b.Events[0])
	}
	if b := get("SGLang BlockStoredWithMetadata, salted (8 elements, metadata map), attn_dp_rank 1"); b.DPRank != 1 ||
		b.Events[0].CacheSalt != "tenant-a" || b.Events[0].LoraName != "" || b.Events[0].ParentHash != 0xFFFFFFFFFFFFFFF9 {
		t.Errorf("SGLang salted: rank %d %+v", b.DPRank, b.Events[0])
	}
	if b := get("SGLang BlockRemoved (3 elements) on every medium, AllBlocksCleared, attn_dp_rank 2"); b.DPRank != 2 || len(b.Events) != 4 ||
		b.Events[0].Medium != "CPU_PINNED" || b.Events[1].Medium != "DISK" || b.Events[2].Medium != "EXTERNAL" || b.Events[3].Kind != KindAllBlocksCleared {
		t.Errorf("SGLang removes: %+v", b)
	}
	if b := get("SGLang mixed batch: unsalted store, salted store with session_id, remove, attn_dp_rank 3"); b.DPRank != 3 ||
		b.Events[0].CacheSalt != "" || b.Events[1].CacheSalt != "tenant-b" || b.Events[1].SessionID != "sess-1" || b.Events[1].ParentHash != H {
		t.Errorf("SGLang mixed: %+v", b)
	}
	if b := get("SGLang map-tagged BlockStored with cache_salt and session_id, rank 0"); b.Events[0].CacheSalt != "tenant-a" || b.Events[0].BlockHashes[0] != H {
		t.Errorf("SGLang map: %+v", b.Events[0])
	}
	if b := get("TensorRT-LLM coalesced BlockStored with parent, BlockRemoved, data_parallel_rank 1"); b.DPRank != 1 ||
		b.Events[0].BlockHashes[1] != 0x9999aaaabbbbcccc || b.Events[0].ParentHash != 0x7777 || b.Events[1].BlockHashes[0] != H {
		t.Errorf("TensorRT-LLM coalesced: %+v", b)
	}
	if b := get("TensorRT-LLM BlockStored with mm_keys, data_parallel_rank 0"); len(b.Events) != 1 || b.Events[0].BlockHashes[0] != 5 {
		t.Errorf("TensorRT-LLM mm_keys: %+v", b)
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
	if encoded != 12 {
		t.Fatalf("%d vectors encoded byte for byte, want 12 (9 of vLLM: all but the 00..1f digest; SGLang's removes; TensorRT-LLM's two without mm_keys)", encoded)
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
		// SGLang's 7-element store (signed hash, no lora_name) is vLLM's
		// array-era store; TensorRT-LLM's map (signed hash) is vLLM's map.
		{"9.4 array-era BlockStored, rank 0", "SGLang positional BlockStored, unsalted (7 elements), attn_dp_rank 0"},
		{"9.1 map-era minimal BlockStored, rank 0", "TensorRT-LLM BlockStored (map, signed 64-bit hash), data_parallel_rank 0"},
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
