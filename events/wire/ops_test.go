package wire

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
		{Kind: KindBlockStored, BlockHashes: []uint64{6}, KVCacheSpecKind: "sliding_window", SlidingWindow: 128, HasSlidingWindow: true},
		{Kind: KindBlockStored, BlockHashes: []uint64{7}, KVCacheSpecKind: "mla_attention", GroupIdx: 0, HasGroupIdx: true},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{8}, Medium: "STORAGE"},
		{Kind: KindBlockStored, BlockHashes: []uint64{10}, KVCacheSpecKind: "full_attention", GroupIdx: 5, HasGroupIdx: true},
		{Kind: KindBlockStored, BlockHashes: []uint64{11}, KVCacheSpecKind: "chunked_local_attention", GroupIdx: 2, HasGroupIdx: true},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{12}, GroupIdx: 3, HasGroupIdx: true, KVCacheSpecKind: "full_attention"},
	}}
	var filtered [NumFilters]uint64
	ops := AppendOps(nil, b, &filtered)
	if len(ops) != 10 {
		t.Fatalf("%d ops, want 10: %+v", len(ops), ops)
	}
	st := ops[0].Store
	if ops[0].Kind != indexer.OpStore || st.Parent != 9 || !st.HasParent || st.BlockSize != 2 || len(st.Tokens) != 4 ||
		st.Tier != indexer.TierDevice || st.Seed != indexer.Seed("l", "s") || len(st.Hashes) != 2 || ops[0].Group != (indexer.Group{}) {
		t.Fatalf("store op %+v", ops[0])
	}
	if ops[1].Kind != indexer.OpRemove || ops[1].Remove.Tier != indexer.TierHost || ops[1].Remove.Hashes[0] != 2 {
		t.Fatalf("remove op %+v", ops[1])
	}
	if ops[2].Kind != indexer.OpClear {
		t.Fatalf("clear op %+v", ops[2])
	}
	for i, want := range []struct {
		hash  uint64
		group indexer.Group
	}{
		// group_idx without a kind in another group than 0: a rule the
		// index does not model.
		{5, indexer.Group{Idx: 1, Attention: indexer.AttentionOther}},
		{6, indexer.Group{Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 128}},
		{7, indexer.Group{Kind: "mla_attention"}},
	} {
		op := ops[3+i]
		if op.Kind != indexer.OpStore || op.Store.Hashes[0] != want.hash || op.Group != want.group {
			t.Fatalf("store op %d: %+v, want hash %d group %+v", 3+i, op, want.hash, want.group)
		}
	}
	if ops[6].Kind != indexer.OpRemove || ops[6].Remove.Tier != indexer.TierDisk {
		t.Fatalf("disk remove op %+v", ops[6])
	}
	if g := ops[7].Group; ops[7].Kind != indexer.OpStore || g != (indexer.Group{Idx: 5, Kind: "full_attention"}) {
		t.Fatalf("full-attention store of group 5: %+v", ops[7])
	}
	if g := ops[8].Group; g != (indexer.Group{Idx: 2, Attention: indexer.AttentionOther, Kind: "chunked_local_attention"}) {
		t.Fatalf("chunked local store: %+v", ops[8])
	}
	if g := ops[9].Group; ops[9].Kind != indexer.OpRemove || g != (indexer.Group{Idx: 3}) {
		t.Fatalf("a remove is routed by its group_idx alone: %+v", ops[9])
	}
	want := [NumFilters]uint64{FilterUnknownMedium: 1, FilterRemote: 1}
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
	full := indexer.Group{Kind: "full_attention"}
	ops := []indexer.Op{
		{Kind: indexer.OpStore, Group: full, Store: indexer.Stored{Parent: 3, HasParent: true, Hashes: []uint64{4, 5}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, Tier: indexer.TierDevice, Seed: indexer.BaseSeed}},
		{Kind: indexer.OpStore, Group: indexer.Group{Idx: 1, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 7},
			Store: indexer.Stored{Hashes: []uint64{6}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, Tier: indexer.TierDevice, Seed: indexer.BaseSeed}},
		{Kind: indexer.OpStore, Group: indexer.Group{Idx: 4, Kind: "full_attention"},
			Store: indexer.Stored{Hashes: []uint64{8}, Tokens: []uint32{1, 2}, BlockSize: 2, Tier: indexer.TierHost, Seed: indexer.BaseSeed}},
		{Kind: indexer.OpClear},
		{Kind: indexer.OpRemove, Group: indexer.Group{Idx: 1}, Remove: indexer.Removed{Hashes: []uint64{6}}},
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

// TestAppendOpsHybridLayout: a batch as vLLM publishes it for a model
// whose first layer is sliding-window (group 0) indexes the full-attention
// group 1, and the sliding-window group's removes shorten the grant, not
// the main group's blocks. (Filtering every group but 0 left this index
// empty.)
func TestAppendOpsHybridLayout(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	hashes := []uint64{11, 12, 13, 14}
	b := &Batch{Events: []Event{
		{Kind: KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 2, Medium: "GPU",
			GroupIdx: 0, HasGroupIdx: true, KVCacheSpecKind: "sliding_window", SlidingWindow: 3, HasSlidingWindow: true},
		{Kind: KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 2, Medium: "GPU",
			GroupIdx: 1, HasGroupIdx: true, KVCacheSpecKind: "full_attention"},
		// The sliding-window group evicts block 3; its window (3 tokens:
		// the 1 block before a hit's end) then serves 3 blocks.
		{Kind: KindBlockRemoved, BlockHashes: hashes[3:], Medium: "GPU", GroupIdx: 0, HasGroupIdx: true},
	}}
	ix := indexer.New(indexer.Options{})
	k := indexer.PartitionKey{Model: "gemma", Group: "g"}
	r := indexer.Rank{WorkerID: 1}
	if err := ix.AddPartition(k, 2); err != nil {
		t.Fatal(err)
	}
	var filtered [NumFilters]uint64
	res, err := ix.Apply(k, r, 0, AppendOps(nil, b, &filtered))
	if err != nil || len(res.Errs) > 0 || filtered != ([NumFilters]uint64{}) {
		t.Fatalf("apply: %v %v, filtered %v", err, res.Errs, filtered)
	}
	ov, err := ix.MatchTokens(k, tokens, indexer.BaseSeed, nil)
	if err != nil || len(ov) != 1 || ov[0].Device != 3 || ov[0].Upper != 4 {
		t.Fatalf("match %+v %v, want 3 blocks granted of the main group's 4", ov, err)
	}
	gs, _ := ix.Groups(k, r)
	if len(gs) != 2 || gs[0].Idx != 0 || gs[0].Main || gs[0].Blocks != 3 || gs[1].Idx != 1 || !gs[1].Main || gs[1].Blocks != 4 {
		t.Fatalf("groups %+v", gs)
	}
}
