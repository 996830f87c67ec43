package indexer_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// Named tests mirroring the behaviours Dynamo's radix-tree tests check
// (lib/kv-router/src/indexer: store, match, remove; dp ranks; partial
// removal and long sequences; LoRA and namespaces),
// with explicit expectations. Blocks are written as small ids: block v holds
// tokens v*bs … v*bs+bs-1 (see blockTokens); engine hashes are chosen per
// test, usually 100+i for worker 1 and 200+i for worker 2.

const bs = 4

var (
	w1   = indexer.Rank{WorkerID: 1}
	w1r1 = indexer.Rank{WorkerID: 1, DPRank: 1}
	w2   = indexer.Rank{WorkerID: 2}
	w3   = indexer.Rank{WorkerID: 3}
)

// root returns a device store of blocks ids at the root with engine hashes hs.
func root(hs []uint64, ids ...uint32) indexer.Stored {
	return indexer.Stored{Hashes: hs, Tokens: blockTokens(bs, ids...), BlockSize: bs, Seed: indexer.BaseSeed}
}

// after returns a device store of blocks ids continuing after parent.
func after(parent uint64, hs []uint64, ids ...uint32) indexer.Stored {
	s := root(hs, ids...)
	s.Parent, s.HasParent = parent, true
	return s
}

// q returns the query (local hashes) for blocks ids with the base seed.
func q(ids ...uint32) []uint64 {
	return indexer.HashBlocks(nil, blockTokens(bs, ids...), bs, indexer.BaseSeed)
}

// ids returns first, first+1, …, first+n-1.
func ids(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

func ov(r indexer.Rank, device, host, disk uint32) indexer.Overlap {
	return indexer.Overlap{Rank: r, Device: device, Host: host, Disk: disk, Upper: disk}
}

// dev is an overlap held entirely on the device.
func dev(r indexer.Rank, n uint32) indexer.Overlap { return ov(r, n, n, n) }

func mustStore(t *testing.T, tr *indexer.Tree, r indexer.Rank, s indexer.Stored) {
	t.Helper()
	if err := tr.Store(r, s); err != nil {
		t.Fatalf("Store(%v, %v): %v", r, s.Hashes, err)
	}
}

func mustRemove(t *testing.T, tr *indexer.Tree, r indexer.Rank, tier indexer.Tier, hs ...uint64) {
	t.Helper()
	if err := tr.Remove(r, indexer.Removed{Hashes: hs, Tier: tier}); err != nil {
		t.Fatalf("Remove(%v, %v, %v): %v", r, tier, hs, err)
	}
}

func expectMatch(t *testing.T, tr *indexer.Tree, query []uint64, want ...indexer.Overlap) {
	t.Helper()
	sortOverlaps(want)
	if got := match(tr, query); !sameOverlaps(got, want) {
		t.Fatalf("Match(%d blocks) = %v, want %v", len(query), got, want)
	}
}

func expectOpError(t *testing.T, err error, sentinel error, want indexer.OpError) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v, want one wrapping %v", err, sentinel)
	}
	var oe *indexer.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("error %T %v is not an *OpError", err, err)
	}
	if *oe != want {
		t.Fatalf("OpError %+v, want %+v", *oe, want)
	}
}

func expectStats(t *testing.T, tr *indexer.Tree, entries, blocks int) {
	t.Helper()
	st := tr.Stats()
	if st.Entries != entries || st.Blocks != blocks {
		t.Fatalf("Stats() = %+v, want %d entries and %d blocks", st, entries, blocks)
	}
	if st.Nodes > st.Blocks || (st.Nodes == 0) != (st.Blocks == 0) {
		t.Fatalf("Stats() = %+v: nodes inconsistent with blocks", st)
	}
}

func expectEmpty(t *testing.T, tr *indexer.Tree) {
	t.Helper()
	if st := tr.Stats(); st.Entries != 0 || st.Blocks != 0 || st.Nodes != 0 {
		t.Fatalf("Stats() = %+v, want no entries, blocks or nodes", st)
	}
}

func expectHolds(t *testing.T, tr *indexer.Tree, r indexer.Rank, h uint64, want [indexer.NumTiers]uint32) {
	t.Helper()
	got, ok := tr.Holds(r, h)
	if want == ([indexer.NumTiers]uint32{}) {
		if ok {
			t.Fatalf("Holds(%v, %d) = %v, want not held", r, h, got)
		}
		return
	}
	if !ok || got != want {
		t.Fatalf("Holds(%v, %d) = %v, %v; want %v", r, h, got, ok, want)
	}
}

func expectRanks(t *testing.T, tr *indexer.Tree, want ...indexer.Rank) {
	t.Helper()
	got := tr.Ranks()
	slices.SortFunc(got, cmpRank)
	want = slices.Clone(want)
	slices.SortFunc(want, cmpRank)
	if len(got) != len(want) || (len(got) > 0 && !slices.Equal(got, want)) {
		t.Fatalf("Ranks() = %v, want %v", got, want)
	}
	if n := tr.Stats().Ranks; n != len(want) {
		t.Fatalf("Stats().Ranks = %d, want %d", n, len(want))
	}
}

var (
	onDevice = [indexer.NumTiers]uint32{1, 0, 0, 0}
	notHeld  = [indexer.NumTiers]uint32{}
)

// ---- store, match, remove ----

func TestTreeStoreAndFind(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 4), 1, 2, 3, 4))
	expectMatch(t, tr, q(1, 2, 3, 4), dev(w1, 4))
	expectStats(t, tr, 4, 4)
	if n := tr.Stats().Nodes; n != 1 {
		t.Errorf("a chain stored by one event: %d nodes, want 1", n)
	}
	if n := tr.RankBlocks(w1); n != 4 {
		t.Errorf("RankBlocks = %d, want 4", n)
	}
	for _, h := range hashRange(100, 4) {
		expectHolds(t, tr, w1, h, onDevice)
	}
	expectHolds(t, tr, w2, 100, notHeld)
	expectRanks(t, tr, w1)
}

func TestTreePartialMatch(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 4), 1, 2, 3, 4))
	for _, tc := range []struct {
		name  string
		query []uint64
		want  []indexer.Overlap
	}{
		{"prefix", q(1, 2), []indexer.Overlap{dev(w1, 2)}},
		{"diverges after two", q(1, 2, 9, 4), []indexer.Overlap{dev(w1, 2)}},
		{"longer than stored", q(1, 2, 3, 4, 5, 6), []indexer.Overlap{dev(w1, 4)}},
		{"first block differs", q(9, 2, 3), nil},
		{"suffix only", q(2, 3, 4), nil},
		{"empty", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { expectMatch(t, tr, tc.query, tc.want...) })
	}
}

func TestTreeEmptyAndMissQueries(t *testing.T) {
	tr := indexer.NewTree(bs)
	expectMatch(t, tr, q(1, 2))
	expectMatch(t, tr, nil)
	mustStore(t, tr, w1, root(hashRange(100, 2), 1, 2))
	expectMatch(t, tr, nil)
	expectMatch(t, tr, q(7))
	// Match appends to dst and keeps what was there.
	dst := []indexer.Overlap{dev(w3, 9)}
	if got := tr.Match(q(1), dst); len(got) != 2 || got[0] != dst[0] || got[1] != dev(w1, 1) {
		t.Fatalf("Match appended %v to %v", got, dst)
	}
}

func TestTreeRemove(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustRemove(t, tr, w1, indexer.TierDevice, 102)
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 2))
	expectHolds(t, tr, w1, 102, notHeld)
	mustRemove(t, tr, w1, indexer.TierDevice, 100)
	// The rank still holds block 2, but not the block before it.
	expectMatch(t, tr, q(1, 2, 3))
	if n := tr.RankBlocks(w1); n != 1 {
		t.Fatalf("RankBlocks = %d, want 1", n)
	}
	expectStats(t, tr, 1, 2)
	mustRemove(t, tr, w1, indexer.TierDevice, 101)
	expectEmpty(t, tr)
	expectRanks(t, tr, w1) // removing blocks does not forget the rank
}

func TestTreeMultipleWorkersSharedPrefix(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustStore(t, tr, w2, root(hashRange(200, 3), 1, 2, 4))
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 3), dev(w2, 2))
	expectMatch(t, tr, q(1, 2, 4), dev(w1, 2), dev(w2, 3))
	expectMatch(t, tr, q(1), dev(w1, 1), dev(w2, 1))
	expectStats(t, tr, 6, 4)
	// Prefix-suffix reuse then tail append: w1 continues its chain.
	mustStore(t, tr, w1, after(102, hashRange(103, 2), 5, 6))
	expectMatch(t, tr, q(1, 2, 3, 5, 6), dev(w1, 5), dev(w2, 2))
	expectStats(t, tr, 8, 6)
}

func TestTreeRemoveWorker(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustStore(t, tr, w1r1, root(hashRange(100, 2), 1, 2))
	mustStore(t, tr, w2, root(hashRange(200, 3), 1, 2, 3))
	tr.SetWatermark(w1, 7)
	tr.RemoveWorker(1)
	expectMatch(t, tr, q(1, 2, 3), dev(w2, 3))
	for _, r := range []indexer.Rank{w1, w1r1} {
		if n := tr.RankBlocks(r); n != 0 {
			t.Errorf("RankBlocks(%v) = %d after RemoveWorker", r, n)
		}
		for _, h := range hashRange(100, 3) {
			expectHolds(t, tr, r, h, notHeld)
		}
		if _, ok := tr.Watermark(r); ok {
			t.Errorf("Watermark(%v) kept after RemoveWorker", r)
		}
	}
	expectRanks(t, tr, w2)
	expectStats(t, tr, 3, 3)
	tr.RemoveWorker(42) // unknown worker: harmless
	expectStats(t, tr, 3, 3)
	tr.RemoveWorker(2)
	expectEmpty(t, tr)
	expectRanks(t, tr)
}

// ---- DP ranks ----

func TestTreeMultipleDPRanks(t *testing.T) {
	tr := indexer.NewTree(bs)
	// Both ranks of worker 1 name the blocks alike; they are still
	// independent owners.
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustStore(t, tr, w1r1, root(hashRange(100, 2), 1, 2))
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 3), dev(w1r1, 2))
	mustRemove(t, tr, w1, indexer.TierDevice, 100)
	expectMatch(t, tr, q(1, 2, 3), dev(w1r1, 2))
	expectHolds(t, tr, w1r1, 100, onDevice)
	if err := tr.Remove(w1, indexer.Removed{Hashes: []uint64{100}}); !errors.Is(err, indexer.ErrBlockNotFound) {
		t.Fatalf("second remove of rank 0's block: %v, want ErrBlockNotFound", err)
	}
	expectHolds(t, tr, w1r1, 100, onDevice)
}

func TestTreeRemoveRankOnlyClearsTarget(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustStore(t, tr, w1r1, root(hashRange(100, 3), 1, 2, 3))
	tr.SetWatermark(w1, 5)
	tr.SetWatermark(w1r1, 6)
	tr.RemoveRank(w1)
	expectMatch(t, tr, q(1, 2, 3), dev(w1r1, 3))
	expectRanks(t, tr, w1r1)
	if _, ok := tr.Watermark(w1); ok {
		t.Fatal("RemoveRank kept the watermark")
	}
	if seq, ok := tr.Watermark(w1r1); !ok || seq != 6 {
		t.Fatalf("other rank's watermark = %d, %v; want 6", seq, ok)
	}
	expectStats(t, tr, 3, 3)
	tr.RemoveRank(w3) // unknown rank: harmless
	expectStats(t, tr, 3, 3)
}

func TestTreeClearOnlyTargetRank(t *testing.T) {
	tr := indexer.NewTree(bs)
	for _, r := range []indexer.Rank{w1, w1r1} {
		mustStore(t, tr, r, root(hashRange(100, 4), 1, 2, 3, 4))
		// Copies in every lower tier too.
		for tier := indexer.TierHost; tier < indexer.NumTiers; tier++ {
			mustStore(t, tr, r, indexer.Stored{Hashes: hashRange(100, 4), Tier: tier, BlockSize: bs})
		}
	}
	tr.SetWatermark(w1, 9)
	tr.Clear(w1)
	all := [indexer.NumTiers]uint32{1, 1, 1, 1}
	for _, h := range hashRange(100, 4) {
		expectHolds(t, tr, w1, h, notHeld)
		expectHolds(t, tr, w1r1, h, all)
	}
	expectMatch(t, tr, q(1, 2, 3, 4), dev(w1r1, 4))
	expectStats(t, tr, 4, 4)
	// The cleared rank stays known with its watermark, and is reusable.
	expectRanks(t, tr, w1, w1r1)
	if seq, ok := tr.Watermark(w1); !ok || seq != 9 {
		t.Fatalf("Watermark after Clear = %d, %v; want 9", seq, ok)
	}
	mustStore(t, tr, w1, root(hashRange(100, 2), 1, 2))
	expectHolds(t, tr, w1, 100, onDevice)
	expectMatch(t, tr, q(1, 2, 3, 4), dev(w1, 2), dev(w1r1, 4))
}

// TestTreeClearFreesBranchedChain clears a rank whose blocks span a node
// and its two children (a chain with a fork). Nothing may stay behind, in
// whatever order Clear visits the rank's blocks (map order, hence the
// repetitions).
func TestTreeClearFreesBranchedChain(t *testing.T) {
	for _, clearFn := range []struct {
		name string
		f    func(*indexer.Tree, indexer.Rank)
	}{
		{"Clear", (*indexer.Tree).Clear},
		{"RemoveRank", (*indexer.Tree).RemoveRank},
	} {
		t.Run(clearFn.name, func(t *testing.T) {
			for trial := 0; trial < 100; trial++ {
				tr := indexer.NewTree(bs)
				mustStore(t, tr, w1, root([]uint64{101, 102, 103}, 1, 2, 3))
				mustStore(t, tr, w1, after(102, []uint64{104}, 4))
				clearFn.f(tr, w1)
				if st := tr.Stats(); st.Entries != 0 || st.Blocks != 0 || st.Nodes != 0 {
					t.Fatalf("trial %d: after %s, Stats() = %+v, want no entries, blocks or nodes", trial, clearFn.name, st)
				}
			}
		})
	}
}

// ---- parents, errors ----

func TestTreeParentHashChains(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root([]uint64{100, 101}, 1, 2))
	mustStore(t, tr, w1, after(101, []uint64{102, 103}, 3, 4))
	mustStore(t, tr, w1, after(103, []uint64{104}, 5))
	expectMatch(t, tr, q(1, 2, 3, 4, 5), dev(w1, 5))
	if n := tr.Stats().Nodes; n != 1 {
		t.Errorf("a chain stored by three chained events: %d nodes, want 1", n)
	}
	// A second continuation of block 2 branches.
	mustStore(t, tr, w1, after(101, []uint64{110}, 6))
	expectMatch(t, tr, q(1, 2, 6), dev(w1, 3))
	expectMatch(t, tr, q(1, 2, 3, 4, 5), dev(w1, 5))
	expectStats(t, tr, 6, 6)
}

func TestTreeUnknownParentRejected(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 2), 1, 2))
	mustStore(t, tr, w2, root(hashRange(200, 2), 1, 2))
	err := tr.Store(w1, after(999, []uint64{102, 103}, 3, 4))
	expectOpError(t, err, indexer.ErrParentNotFound, indexer.OpError{Rank: w1, Reason: indexer.ReasonParentNotFound, Hash: 999, Blocks: 2})
	// Parents resolve per rank: w2's block is not w1's parent, even on a
	// shared prefix.
	err = tr.Store(w1, after(201, []uint64{102}, 3))
	expectOpError(t, err, indexer.ErrParentNotFound, indexer.OpError{Rank: w1, Reason: indexer.ReasonParentNotFound, Hash: 201, Blocks: 1})
	expectHolds(t, tr, w1, 102, notHeld)
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 2), dev(w2, 2))
	expectStats(t, tr, 4, 2)
	if got := tr.Counts()[indexer.ReasonParentNotFound]; got != 3 {
		t.Fatalf("Counts()[parent_not_found] = %d, want 3", got)
	}
	// The rejected store is not buffered: the parent arriving later does
	// not apply it.
	mustStore(t, tr, w1, after(101, []uint64{999}, 9))
	expectHolds(t, tr, w1, 102, notHeld)
}

func TestTreeRemoveUnknownBlockContinues(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	err := tr.Remove(w1, indexer.Removed{Hashes: []uint64{102, 999, 101, 998}})
	expectOpError(t, err, indexer.ErrBlockNotFound, indexer.OpError{Rank: w1, Reason: indexer.ReasonBlockNotFound, Hash: 999, Blocks: 2})
	expectHolds(t, tr, w1, 101, notHeld)
	expectHolds(t, tr, w1, 102, notHeld)
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 1))
	// A tier the block is not held in is a miss too, and changes nothing.
	err = tr.Remove(w1, indexer.Removed{Hashes: []uint64{100}, Tier: indexer.TierHost})
	expectOpError(t, err, indexer.ErrBlockNotFound, indexer.OpError{Rank: w1, Reason: indexer.ReasonBlockNotFound, Hash: 100, Blocks: 1})
	expectHolds(t, tr, w1, 100, onDevice)
	// A rank the tree does not know.
	err = tr.Remove(w3, indexer.Removed{Hashes: []uint64{100, 101}})
	expectOpError(t, err, indexer.ErrBlockNotFound, indexer.OpError{Rank: w3, Reason: indexer.ReasonBlockNotFound, Hash: 100, Blocks: 2})
	expectRanks(t, tr, w1)
	if got := tr.Counts()[indexer.ReasonBlockNotFound]; got != 5 {
		t.Fatalf("Counts()[block_not_found] = %d, want 5", got)
	}
}

func TestTreeSelfReferenceRejected(t *testing.T) {
	long := hashRange(100, 20)
	for _, tc := range []struct {
		name string
		s    indexer.Stored
	}{
		{"hash repeated", root([]uint64{100, 101, 100}, 1, 2, 3)},
		{"hash equals parent", after(50, []uint64{101, 50}, 2, 3)},
		{"block is its own parent", after(50, []uint64{50}, 2)},
		{"long event, repeat at the end", root(append(slices.Clone(long), 100), ids(1, 21)...)},
		{"long event, parent inside", after(50, append(slices.Clone(long), 50), ids(1, 21)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := indexer.NewTree(bs)
			mustStore(t, tr, w1, root([]uint64{50}, 50))
			err := tr.Store(w1, tc.s)
			expectOpError(t, err, indexer.ErrSelfReference, indexer.OpError{Rank: w1, Reason: indexer.ReasonSelfReference, Hash: tc.s.Hashes[0], Blocks: len(tc.s.Hashes)})
			expectStats(t, tr, 1, 1)
			expectHolds(t, tr, w1, 50, onDevice)
			if got := tr.Counts()[indexer.ReasonSelfReference]; got != uint64(len(tc.s.Hashes)) {
				t.Fatalf("Counts()[self_reference] = %d, want %d", got, len(tc.s.Hashes))
			}
		})
	}
}

func TestTreeHashConflict(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 2), 1, 2))
	// 100 already names block 1: the store stops there; block 3 applies.
	err := tr.Store(w1, after(101, []uint64{102, 100, 104}, 3, 4, 5))
	expectOpError(t, err, indexer.ErrHashConflict, indexer.OpError{Rank: w1, Reason: indexer.ReasonHashConflict, Hash: 100, Blocks: 2})
	expectMatch(t, tr, q(1, 2, 3, 4, 5), dev(w1, 3))
	expectHolds(t, tr, w1, 100, onDevice)
	expectHolds(t, tr, w1, 104, notHeld)
	// Block 2 is held as 101: another hash for it conflicts, after block 1
	// was counted again.
	err = tr.Store(w1, root([]uint64{100, 555}, 1, 2))
	expectOpError(t, err, indexer.ErrHashConflict, indexer.OpError{Rank: w1, Reason: indexer.ReasonHashConflict, Hash: 555, Blocks: 1})
	expectHolds(t, tr, w1, 100, [indexer.NumTiers]uint32{2, 0, 0, 0})
	expectHolds(t, tr, w1, 555, notHeld)
	// Another rank is free to use the same hashes for anything.
	mustStore(t, tr, w2, root([]uint64{555, 100}, 1, 2))
	expectMatch(t, tr, q(1, 2), dev(w1, 2), dev(w2, 2))
	if got := tr.Counts()[indexer.ReasonHashConflict]; got != 3 {
		t.Fatalf("Counts()[hash_conflict] = %d, want 3", got)
	}
}

// ---- copies and counts ----

// vLLM stores the same block hash again for a physical copy and sends
// BlockRemoved when one copy is evicted while the other is still cached.
func TestTreeDuplicateStoreThenOneRemoveKeepsBlock(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root([]uint64{100, 101}, 1, 2))
	mustStore(t, tr, w1, after(100, []uint64{101}, 2))
	expectHolds(t, tr, w1, 101, [indexer.NumTiers]uint32{2, 0, 0, 0})
	mustRemove(t, tr, w1, indexer.TierDevice, 101)
	expectHolds(t, tr, w1, 101, onDevice)
	expectMatch(t, tr, q(1, 2), dev(w1, 2))
	mustRemove(t, tr, w1, indexer.TierDevice, 101)
	expectMatch(t, tr, q(1, 2), dev(w1, 1))
	expectStats(t, tr, 1, 1)
}

// Applying the same store twice is not idempotent by design: it counts two
// copies, so two removes are needed.
func TestTreeSameStoreTwiceNeedsTwoRemoves(t *testing.T) {
	tr := indexer.NewTree(bs)
	s := root(hashRange(100, 3), 1, 2, 3)
	mustStore(t, tr, w1, s)
	mustStore(t, tr, w1, s)
	expectStats(t, tr, 3, 3)
	mustRemove(t, tr, w1, indexer.TierDevice, hashRange(100, 3)...)
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 3))
	mustRemove(t, tr, w1, indexer.TierDevice, hashRange(100, 3)...)
	expectMatch(t, tr, q(1, 2, 3))
	expectEmpty(t, tr)
}

func TestTreeCopyCountsBeyond255(t *testing.T) {
	tr := indexer.NewTree(bs)
	const n = 300
	for i := 0; i < n; i++ {
		mustStore(t, tr, w1, root([]uint64{100, 101}, 1, 2))
		mustStore(t, tr, w1, indexer.Stored{Hashes: []uint64{101}, Tier: indexer.TierHost, BlockSize: bs})
	}
	expectHolds(t, tr, w1, 101, [indexer.NumTiers]uint32{n, n, 0, 0})
	for i := 0; i < n-1; i++ {
		mustRemove(t, tr, w1, indexer.TierDevice, 101)
	}
	expectHolds(t, tr, w1, 101, [indexer.NumTiers]uint32{1, n, 0, 0})
	expectMatch(t, tr, q(1, 2), dev(w1, 2))
	mustRemove(t, tr, w1, indexer.TierDevice, 101)
	expectMatch(t, tr, q(1, 2), ov(w1, 1, 2, 2))
	for i := 0; i < n; i++ {
		mustRemove(t, tr, w1, indexer.TierHost, 101)
	}
	expectHolds(t, tr, w1, 101, notHeld)
	expectMatch(t, tr, q(1, 2), dev(w1, 1))
	for i := 0; i < n; i++ {
		mustRemove(t, tr, w1, indexer.TierDevice, 100)
	}
	expectEmpty(t, tr)
	if err := tr.Remove(w1, indexer.Removed{Hashes: []uint64{100}}); !errors.Is(err, indexer.ErrBlockNotFound) {
		t.Fatalf("remove after the last copy: %v, want ErrBlockNotFound", err)
	}
	// Clearing a block with many copies forgets all of them.
	for _, drop := range []func(*indexer.Tree, indexer.Rank){(*indexer.Tree).Clear, (*indexer.Tree).RemoveRank} {
		for i := 0; i < n; i++ {
			mustStore(t, tr, w1, root([]uint64{100}, 1))
		}
		drop(tr, w1)
		mustStore(t, tr, w1, root([]uint64{100}, 1))
		expectHolds(t, tr, w1, 100, onDevice)
		mustRemove(t, tr, w1, indexer.TierDevice, 100)
		expectEmpty(t, tr)
	}
}

// More ranks than Match's inline buffer, with staggered prefix lengths.
func TestTreeManyRanks(t *testing.T) {
	tr := indexer.NewTree(bs)
	var want []indexer.Overlap
	for w := uint64(1); w <= 40; w++ {
		for dp := uint32(0); dp < 2; dp++ {
			r := indexer.Rank{WorkerID: w, DPRank: dp}
			n := int(w+uint64(dp))%6 + 1
			mustStore(t, tr, r, root(hashRange(1000*w, n), ids(1, n)...))
			want = append(want, dev(r, uint32(n)))
		}
	}
	expectMatch(t, tr, q(ids(1, 8)...), want...)
	tr.RemoveWorker(7)
	want = slices.DeleteFunc(want, func(o indexer.Overlap) bool { return o.Rank.WorkerID == 7 })
	expectMatch(t, tr, q(ids(1, 8)...), want...)
	entries := 0
	for _, o := range want {
		entries += int(o.Disk)
	}
	expectStats(t, tr, entries, 6)
}

// ---- partial removal, long sequences, shape ----

func TestTreeMidChainRemoval(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 5), 1, 2, 3, 4, 5))
	mustStore(t, tr, w2, root(hashRange(200, 5), 1, 2, 3, 4, 5))
	mustRemove(t, tr, w1, indexer.TierDevice, 102)
	// w1's run ends at the hole; w2 still matches fully.
	expectMatch(t, tr, q(1, 2, 3, 4, 5), dev(w1, 2), dev(w2, 5))
	expectHolds(t, tr, w1, 103, onDevice) // blocks after the hole stay held
	expectStats(t, tr, 9, 5)
	// Storing the block again restores the chain and the compressed shape.
	mustStore(t, tr, w1, after(101, []uint64{102}, 3))
	expectMatch(t, tr, q(1, 2, 3, 4, 5), dev(w1, 5), dev(w2, 5))
	expectStats(t, tr, 10, 5)
	if n := tr.Stats().Nodes; n != 1 {
		t.Errorf("after restoring the hole: %d nodes, want 1 (edges re-merged)", n)
	}
}

func TestTreeHoldersNotSubsetOfParent(t *testing.T) {
	tr := indexer.NewTree(bs)
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	mustStore(t, tr, w2, root(hashRange(200, 3), 1, 2, 3))
	mustRemove(t, tr, w2, indexer.TierDevice, 200) // w2 keeps blocks 2 and 3
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 3))
	mustRemove(t, tr, w1, indexer.TierDevice, 101) // w1 keeps 1 and 3
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 1))
	if a, b := tr.RankBlocks(w1), tr.RankBlocks(w2); a != 2 || b != 2 {
		t.Fatalf("RankBlocks = %d, %d; want 2, 2", a, b)
	}
	expectStats(t, tr, 4, 3)
	mustRemove(t, tr, w1, indexer.TierDevice, 100)
	expectMatch(t, tr, q(1, 2, 3))
	expectStats(t, tr, 3, 3)
}

func TestTreeLongSequence(t *testing.T) {
	const n = 2000
	tm := newTreeAndModel(t, bs)
	doc := ids(1, n)
	// w1 stores the whole document in chained events of 100 blocks.
	for a := 0; a < n; a += 100 {
		s := root(hashRange(100000+uint64(a), 100), doc[a:a+100]...)
		if a > 0 {
			s.Parent, s.HasParent = 100000+uint64(a-1), true
		}
		tm.store(w1, s)
	}
	// w2 stores the first 1000 blocks in one event, then branches off at
	// 500 and at every 250 blocks after it with continuations of its own.
	tm.store(w2, root(hashRange(200000, 1000), doc[:1000]...))
	for i, at := range []int{500, 750, 1000} {
		branch := ids(uint32(10000*(i+1)), 300)
		tm.store(w2, after(200000+uint64(at-1), hashRange(300000+uint64(1000*i), 300), branch...))
	}
	// w3 follows w1 for 1500 blocks.
	tm.store(w3, root(hashRange(400000, 1500), doc[:1500]...))
	full := q(doc...)
	expectMatch(t, tm.tr, full, dev(w1, n), dev(w2, 1000), dev(w3, 1500))
	branch1 := append(q(doc[:750]...), q(ids(20000, 300)...)...)
	expectMatch(t, tm.tr, branch1, dev(w1, 750), dev(w2, 1050), dev(w3, 750))
	expectStats(t, tm.tr, n+1000+900+1500, n+900)
	tm.check(full, branch1)

	// Partial removal: w1's tail, a mid-chain block of w3, the middle of
	// one of w2's branches, in reverse order.
	tail := hashRange(100000+1500, 500)
	slices.Reverse(tail)
	tm.remove(w1, indexer.Removed{Hashes: tail})
	tm.remove(w3, indexer.Removed{Hashes: []uint64{400000 + 700}})
	tm.remove(w2, indexer.Removed{Hashes: hashRange(301000+100, 50)})
	expectMatch(t, tm.tr, full, dev(w1, 1500), dev(w2, 1000), dev(w3, 700))
	expectMatch(t, tm.tr, branch1, dev(w1, 750), dev(w2, 850), dev(w3, 700))
	tm.check(full, branch1)

	for _, r := range []indexer.Rank{w2, w1, w3} {
		tm.tr.RemoveRank(r)
		tm.m.RemoveRank(r)
		tm.check(full, branch1)
	}
	expectEmpty(t, tm.tr)
}

// Stores and removes in cycles must leave nothing behind (Dynamo leaked
// about 1 GB/h because emptied nodes were never detached).
func TestTreeSizeAccountingStable(t *testing.T) {
	tr := indexer.NewTree(bs)
	ranks := []indexer.Rank{w1, w1r1, w2, w3}
	for cycle := 0; cycle < 20; cycle++ {
		var held [][2]uint64 // (rank index, hash)
		for ri, r := range ranks {
			// Each rank stores a chain sharing a prefix with the others,
			// then a branch off its middle.
			base := uint64(1000*(ri+1) + 100000*cycle)
			n := 6 + ri + cycle%3
			chain := append(ids(1, 3), ids(uint32(10+ri%2), n-3)...)
			mustStore(t, tr, r, root(hashRange(base, n), chain...))
			mustStore(t, tr, r, after(base+2, hashRange(base+500, 3), ids(uint32(50+cycle%2), 3)...))
			for _, h := range append(hashRange(base, n), hashRange(base+500, 3)...) {
				held = append(held, [2]uint64{uint64(ri), h})
			}
		}
		if st := tr.Stats(); st.Entries != len(held) {
			t.Fatalf("cycle %d: %d entries, want %d", cycle, st.Entries, len(held))
		}
		// Remove in an order that differs per cycle: parents first,
		// children first, interleaved across ranks.
		switch cycle % 3 {
		case 1:
			slices.Reverse(held)
		case 2:
			slices.SortStableFunc(held, func(a, b [2]uint64) int { return int(a[1]%7) - int(b[1]%7) })
		}
		for _, rh := range held {
			mustRemove(t, tr, ranks[rh[0]], indexer.TierDevice, rh[1])
		}
		expectEmpty(t, tr)
	}
	expectRanks(t, tr, ranks...)
}

// ---- block size, short tokens ----

func TestTreeBlockSizeMismatchDropsEvent(t *testing.T) {
	tr := indexer.NewTree(bs)
	s := root(hashRange(100, 2), 1, 2)
	s.BlockSize = 2 * bs
	err := tr.Store(w1, s)
	expectOpError(t, err, indexer.ErrBlockSize, indexer.OpError{Rank: w1, Reason: indexer.ReasonBlockSize, Hash: 100, Blocks: 2})
	expectEmpty(t, tr)
	expectRanks(t, tr) // a dropped event does not make the rank known
	if got := tr.Counts()[indexer.ReasonBlockSize]; got != 2 {
		t.Fatalf("Counts()[block_size] = %d, want 2", got)
	}
}

func TestTreeShortTokensTruncate(t *testing.T) {
	tr := indexer.NewTree(bs)
	s := root(hashRange(100, 3), 1, 2, 3)
	s.Tokens = s.Tokens[:bs+bs/2] // one and a half blocks
	err := tr.Store(w1, s)
	expectOpError(t, err, indexer.ErrShortTokens, indexer.OpError{Rank: w1, Reason: indexer.ReasonShortTokens, Hash: 101, Blocks: 2})
	expectMatch(t, tr, q(1, 2, 3), dev(w1, 1))
	expectStats(t, tr, 1, 1)
	// No tokens at all on the device is not an offload: nothing applies.
	err = tr.Store(w2, indexer.Stored{Hashes: hashRange(200, 2), BlockSize: bs})
	expectOpError(t, err, indexer.ErrShortTokens, indexer.OpError{Rank: w2, Reason: indexer.ReasonShortTokens, Hash: 200, Blocks: 2})
	expectStats(t, tr, 1, 1)
	if got := tr.Counts()[indexer.ReasonShortTokens]; got != 4 {
		t.Fatalf("Counts()[short_tokens] = %d, want 4", got)
	}
}

// ---- tiers ----

func TestTreeOffloadAddsTierToHeldBlocksOnly(t *testing.T) {
	tr := indexer.NewTree(bs)
	offload := func(r indexer.Rank, tier indexer.Tier, hs ...uint64) error {
		return tr.Store(r, indexer.Stored{Hashes: hs, Tier: tier, BlockSize: bs})
	}
	mustStore(t, tr, w1, root(hashRange(100, 3), 1, 2, 3))
	err := offload(w1, indexer.TierHost, 100, 999, 101)
	expectOpError(t, err, indexer.ErrOffloadUnknown, indexer.OpError{Rank: w1, Reason: indexer.ReasonOffloadUnknown, Hash: 999, Blocks: 1})
	expectHolds(t, tr, w1, 100, [indexer.NumTiers]uint32{1, 1, 0, 0})
	expectHolds(t, tr, w1, 999, notHeld)
	// Offloaded, then evicted from the device: still counts for Host.
	mustRemove(t, tr, w1, indexer.TierDevice, 100)
	expectMatch(t, tr, q(1, 2, 3), ov(w1, 0, 3, 3))
	// Block 3 goes to disk only, block 2 to external storage only.
	if err := offload(w1, indexer.TierDisk, 102); err != nil {
		t.Fatal(err)
	}
	mustRemove(t, tr, w1, indexer.TierDevice, 102)
	expectMatch(t, tr, q(1, 2, 3), ov(w1, 0, 2, 3))
	if err := offload(w1, indexer.TierExternal, 101); err != nil {
		t.Fatal(err)
	}
	mustRemove(t, tr, w1, indexer.TierDevice, 101)
	mustRemove(t, tr, w1, indexer.TierHost, 101)
	expectMatch(t, tr, q(1, 2, 3), ov(w1, 0, 1, 3))
	expectHolds(t, tr, w1, 101, [indexer.NumTiers]uint32{0, 0, 0, 1})
	// An offload for a rank the tree does not know.
	err = offload(w2, indexer.TierDisk, 100)
	expectOpError(t, err, indexer.ErrOffloadUnknown, indexer.OpError{Rank: w2, Reason: indexer.ReasonOffloadUnknown, Hash: 100, Blocks: 1})
	expectRanks(t, tr, w1)
	if got := tr.Counts()[indexer.ReasonOffloadUnknown]; got != 2 {
		t.Fatalf("Counts()[offload_unknown] = %d, want 2", got)
	}
	// A store with tokens in a lower tier places blocks like a device store.
	s := root(hashRange(200, 2), 1, 2)
	s.Tier = indexer.TierHost
	mustStore(t, tr, w2, s)
	expectMatch(t, tr, q(1, 2, 3), ov(w1, 0, 1, 3), ov(w2, 0, 2, 2))
}

func TestTierFromMedium(t *testing.T) {
	for _, tc := range []struct {
		medium string
		tier   indexer.Tier
		ok     bool
	}{
		{"", indexer.TierDevice, true},
		{"GPU", indexer.TierDevice, true},
		{"DEVICE", indexer.TierDevice, true},
		{"CPU", indexer.TierHost, true},
		{"CPU_PINNED", indexer.TierHost, true},
		{"CPU_TIER1", indexer.TierHost, true},
		{"CPU_TIER2", indexer.TierDisk, true},
		{"DISK", indexer.TierDisk, true},
		{"NVME", indexer.TierDisk, true},
		{"STORAGE", indexer.TierDisk, true},
		{"EXTERNAL", indexer.TierExternal, true},
		{"NETWORK", indexer.TierExternal, true},
		{"REMOTE", indexer.TierExternal, true},
		{"SHARED", indexer.TierExternal, true},
		{"gpu", 0, false},
		{"TAPE", 0, false},
		{"CPU_TIER3", 0, false},
		{" GPU", 0, false},
	} {
		tier, ok := indexer.TierFromMedium(tc.medium)
		if ok != tc.ok || (ok && tier != tc.tier) {
			t.Errorf("TierFromMedium(%q) = %v, %v; want %v, %v", tc.medium, tier, ok, tc.tier, tc.ok)
		}
	}
	for tier := indexer.Tier(0); tier < indexer.NumTiers; tier++ {
		if got, ok := indexer.ParseTier(tier.String()); !ok || got != tier {
			t.Errorf("ParseTier(%q) = %v, %v", tier.String(), got, ok)
		}
	}
	if _, ok := indexer.ParseTier("tape"); ok {
		t.Error("ParseTier accepted an unknown tier")
	}
}

// ---- LoRA and namespaces ----

func TestTreeLoRAAndNamespaceNeverCrossMatch(t *testing.T) {
	seeds := []uint64{
		indexer.Seed("", ""),
		indexer.Seed("adapter-a", ""),
		indexer.Seed("adapter-b", ""),
		indexer.Seed("", "tenant-1"),
		indexer.Seed("adapter-a", "tenant-1"),
	}
	tr := indexer.NewTree(bs)
	tokens := blockTokens(bs, 1, 2, 3)
	for i, seed := range seeds {
		// Each seed on its own worker, and all on worker 9 with distinct
		// engine hashes.
		s := indexer.Stored{Hashes: hashRange(uint64(100*(i+1)), 3), Tokens: tokens, BlockSize: bs, Seed: seed}
		mustStore(t, tr, indexer.Rank{WorkerID: uint64(i + 1)}, s)
		s.Hashes = hashRange(uint64(10000*(i+1)), 3)
		mustStore(t, tr, indexer.Rank{WorkerID: 9}, s)
	}
	for i, seed := range seeds {
		query := indexer.HashBlocks(nil, tokens, bs, seed)
		expectMatch(t, tr, query, dev(indexer.Rank{WorkerID: uint64(i + 1)}, 3), dev(indexer.Rank{WorkerID: 9}, 3))
	}
	expectStats(t, tr, 2*3*len(seeds), 3*len(seeds))
	// A LoRA continuation of a base-model prefix does not match the base
	// continuation.
	base, lora := seeds[0], seeds[1]
	s := indexer.Stored{Parent: 102, HasParent: true, Hashes: []uint64{103}, Tokens: blockTokens(bs, 4), BlockSize: bs, Seed: lora}
	mustStore(t, tr, w1, s)
	expectMatch(t, tr, indexer.HashBlocks(nil, blockTokens(bs, 1, 2, 3, 4), bs, base), dev(w1, 3), dev(indexer.Rank{WorkerID: 9}, 3))
}
