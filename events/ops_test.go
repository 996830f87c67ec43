package events

import (
	"fmt"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/tinylib/msgp/msgp"
)

// TestUnknownEventsAreCountedNotKept: a payload of many tiny unknown events
// is counted without growing Events (each slot is hundreds of bytes).
func TestUnknownEventsAreCountedNotKept(t *testing.T) {
	const n = 100000
	p := msgp.AppendArrayHeader(nil, 3)
	p = msgp.AppendFloat64(p, 1.5)
	p = msgp.AppendArrayHeader(p, n)
	for i := 0; i < n; i++ {
		p = msgp.AppendArrayHeader(p, 1)
		p = msgp.AppendString(p, "X")
	}
	p = msgp.AppendNil(p)
	var d Decoder
	var b Batch
	if err := d.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	if b.Unknown != n || b.UnknownTag != "X" || len(b.Events) != 0 || cap(b.Events) > 1 {
		t.Fatalf("Unknown %d tag %q, len(Events) %d cap %d; want %d unknown, none kept", b.Unknown, b.UnknownTag, len(b.Events), cap(b.Events), n)
	}
}

func TestAppendOps(t *testing.T) {
	stored := Event{Kind: KindBlockStored, BlockHashes: []uint64{1, 2}, ParentHash: 9, HasParent: true,
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU", LoraName: "l", CacheSalt: "s"}
	b := &Batch{Events: []Event{
		stored,
		{Kind: KindBlockRemoved, BlockHashes: []uint64{2}, Medium: "CPU_PINNED"},
		{Kind: KindAllBlocksCleared},
		{Kind: KindBlockStored, BlockHashes: []uint64{3}, Medium: "TAPE"},
		{Kind: KindBlockStored, BlockHashes: []uint64{4}, Locality: "REMOTE"},
		{Kind: KindBlockStored, BlockHashes: []uint64{5}, GroupIdx: 1, HasGroupIdx: true},
		{Kind: KindBlockStored, BlockHashes: []uint64{6}, KVCacheSpecKind: "sliding_window"},
		{Kind: KindBlockStored, BlockHashes: []uint64{7}, KVCacheSpecKind: "mla_attention", GroupIdx: 0, HasGroupIdx: true},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{8}, Medium: "STORAGE"},
	}}
	var filtered [NumFilters]uint64
	ops := AppendOps(nil, b, &filtered)
	if len(ops) != 5 {
		t.Fatalf("%d ops, want 5: %+v", len(ops), ops)
	}
	st := ops[0].Store
	if ops[0].Kind != indexer.OpStore || st.Parent != 9 || !st.HasParent || st.BlockSize != 2 || len(st.Tokens) != 4 ||
		st.Tier != indexer.TierDevice || st.Seed != indexer.Seed("l", "s") || len(st.Hashes) != 2 {
		t.Fatalf("store op %+v", ops[0])
	}
	if ops[1].Kind != indexer.OpRemove || ops[1].Remove.Tier != indexer.TierHost || ops[1].Remove.Hashes[0] != 2 {
		t.Fatalf("remove op %+v", ops[1])
	}
	if ops[2].Kind != indexer.OpClear {
		t.Fatalf("clear op %+v", ops[2])
	}
	if ops[3].Kind != indexer.OpStore || ops[3].Store.Hashes[0] != 7 {
		t.Fatalf("main-attention store op %+v", ops[3])
	}
	if ops[4].Kind != indexer.OpRemove || ops[4].Remove.Tier != indexer.TierDisk {
		t.Fatalf("disk remove op %+v", ops[4])
	}
	want := [NumFilters]uint64{FilterUnknownMedium: 1, FilterRemote: 1, FilterGroup: 1, FilterKind: 1}
	if filtered != want {
		t.Fatalf("filtered %v, want %v", filtered, want)
	}
	for f := Filter(0); f < NumFilters; f++ {
		if f.String() == "" {
			t.Fatalf("filter %d has no name", f)
		}
	}
}

// TestDecodedVectorsApply runs the golden BlockStored vectors of both
// eras through decode → AppendOps → a tree: each indexes the block under
// engine hash H and matches tokens 1..4.
func TestDecodedVectorsApply(t *testing.T) {
	vectors := loadVectors(t)
	byName := map[string][]byte{}
	for _, v := range vectors {
		byName[v.Name] = v.payload(t)
	}
	for _, era := range []string{"9.1 map-era minimal BlockStored, rank 0", "9.4 array-era BlockStored, rank 0"} {
		p, ok := byName[era]
		if !ok {
			t.Fatalf("vector %q not in testdata", era)
		}
		var d Decoder
		var b Batch
		if err := d.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
		tr := indexer.NewTree(4)
		r := indexer.Rank{WorkerID: 1, DPRank: uint32(b.DPRank)}
		for _, op := range AppendOps(nil, &b, nil) {
			if err := tr.Apply(r, op); err != nil {
				t.Fatal(err)
			}
		}
		q := indexer.HashBlocks(nil, []uint32{1, 2, 3, 4}, 4, indexer.BaseSeed)
		got := tr.Match(q, nil)
		if len(got) != 1 || got[0].Device != 1 {
			t.Fatalf("%s: match %+v", era, got)
		}
		if c, ok := tr.Holds(r, 0xFEDCBA9876543210); !ok || c[indexer.TierDevice] != 1 {
			t.Fatalf("%s: engine hash H not held: %v", era, c)
		}
	}
}

// TestEventFromOpRoundTrip: AppendOps(EventFromOp(op)) gives op back, for
// every kind and tier.
func TestEventFromOpRoundTrip(t *testing.T) {
	ops := []indexer.Op{
		{Kind: indexer.OpStore, Store: indexer.Stored{Parent: 3, HasParent: true, Hashes: []uint64{4, 5}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, Tier: indexer.TierDevice, Seed: indexer.BaseSeed}},
		{Kind: indexer.OpClear},
	}
	for tier := indexer.Tier(0); tier < indexer.NumTiers; tier++ {
		ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{9}, Tier: tier}})
	}
	for _, op := range ops {
		b := &Batch{Events: []Event{EventFromOp(op)}}
		got := AppendOps(nil, b, nil)
		if len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(op) {
			t.Fatalf("round trip of %+v gave %+v", op, got)
		}
	}
}
