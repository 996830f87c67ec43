package indexer_test

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// drawHybrid draws a hybrid engine: 2 to 5 KV-cache groups in a random
// order (so the main group is at any index), at least one full-attention
// and one sliding-window group, at most three sliding-window groups with
// windows from 1 token to several blocks, sometimes a second
// full-attention group and a chunked local group (which the index does not
// model), a pool small enough to evict, and documents sharing prefixes.
func drawHybrid(t *rapid.T) *hyEngine {
	bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize")
	kinds := []hyKind{hyFull}
	for range rapid.IntRange(1, 3).Draw(t, "slidingGroups") {
		kinds = append(kinds, hySliding)
	}
	if rapid.IntRange(0, 3).Draw(t, "secondFull") == 0 {
		kinds = append(kinds, hyFull)
	}
	if rapid.IntRange(0, 3).Draw(t, "chunked") == 0 {
		kinds = append(kinds, hyChunked)
	}
	perm := rapid.Permutation(kinds).Draw(t, "layout")
	windows := make([]int, len(perm))
	for i, k := range perm {
		switch k {
		case hySliding:
			windows[i] = rapid.SampledFrom([]int{1, 2, bs, bs + 1, 2*bs + 1, 3 * bs, 5*bs - 1}).Draw(t, "window")
		case hyChunked:
			windows[i] = bs * rapid.IntRange(1, 4).Draw(t, "chunkBlocks")
		}
	}
	rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
	var docs [][]uint32
	for d := range rapid.IntRange(2, 5).Draw(t, "docs") {
		n := bs * rapid.IntRange(1, 14).Draw(t, "docBlocks")
		doc := make([]uint32, 0, n)
		if d > 0 && rng.IntN(2) == 0 {
			src := docs[rng.IntN(d)]
			doc = append(doc, src[:min(n, rng.IntN(len(src)+1))]...)
		}
		for len(doc) < n {
			doc = append(doc, uint32(rng.IntN(3)))
		}
		docs = append(docs, doc)
	}
	pool := len(perm) * bs * rapid.IntRange(2, 10).Draw(t, "poolBlocksPerGroup")
	return newHyEngine(rng, bs, pool, perm, windows, docs)
}

// probes returns the documents, their prefixes and a few prompts.
func (e *hyEngine) probes() [][]uint32 {
	var out [][]uint32
	for _, d := range e.docs {
		for n := e.bs; n <= len(d); n += e.bs {
			out = append(out, d[:n])
		}
	}
	for range 3 {
		out = append(out, e.prompt())
	}
	return out
}

// TestHybridMatchesVLLMRule drives a tree with the event stream of a
// simulated vLLM engine with a hybrid layout (requests allocating every
// group's blocks together, sliding-window groups freeing the blocks that
// left their window, LRU eviction from the shared pool, duplicates,
// resets) and checks after every batch that every group's holdings equal
// the engine's and that every probe's granted hit is what vLLM's rule
// grants over the groups the index models (and never less than over all
// groups), with Upper the main group's run.
func TestHybridMatchesVLLMRule(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e := drawHybrid(t)
		tr := indexer.NewTree(e.bs)
		// slow gets every non-main group's stores also as disk copies:
		// its device grant must not change, and is computed from the
		// groups' sets rather than the tree's group bits.
		slow := indexer.NewTree(e.bs)
		r := indexer.Rank{WorkerID: 3, DPRank: 1}
		probes := e.probes()
		steps := rapid.IntRange(20, 120).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			for _, op := range e.step() {
				if err := tr.Apply(r, op); err != nil {
					t.Fatalf("step %d: %+v: %v", i, op, err)
				}
				if err := slow.Apply(r, op); err != nil {
					t.Fatalf("step %d: %+v: %v", i, op, err)
				}
				if op.Kind == indexer.OpStore && op.Group.Idx != e.mainGroup().idx {
					off := op
					off.Store = indexer.Stored{Hashes: op.Store.Hashes, Tier: indexer.TierDisk}
					if err := slow.Apply(r, off); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, p := range probes {
				q := indexer.HashBlocks(nil, p, e.bs, indexer.BaseSeed)
				if a, b := overlapOf(tr, r, q), overlapOf(slow, r, q); a.Device != b.Device || a.Upper != b.Upper || b.Disk < b.Device {
					t.Fatalf("step %d: granted %+v, with disk copies in the groups %+v", i, a, b)
				}
			}
			if err := e.checkIndex(tr, r, probes); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if err := indexer.CheckGroupBits(tr); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		// A dump restores to the same index.
		rt, err := indexer.Restore(tr.Dump())
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if err := e.checkIndex(rt, r, probes); err != nil {
			t.Fatalf("restored: %v", err)
		}
		if err := indexer.CheckGroupBits(rt); err != nil {
			t.Fatalf("restored: %v", err)
		}
		if !reflect.DeepEqual(rt.Groups(r), tr.Groups(r)) {
			t.Fatalf("restored groups %+v, dumped %+v", rt.Groups(r), tr.Groups(r))
		}
		tr.RemoveRank(r)
		if st := tr.Stats(); st.Entries != 0 || st.GroupEntries != 0 || st.Ranks != 0 {
			t.Fatalf("after RemoveRank: %+v", st)
		}
	})
}

// TestHybridCapacityAndCapKeepSubsets drives a capacity-limited index and
// a capped one with a hybrid engine's stream next to an unlimited index:
// neither ever holds more than the engine in any group, a rank that holds
// less reads as truncated, and the capacity bounds all groups together.
func TestHybridCapacityAndCapKeepSubsets(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		e := drawHybrid(t)
		k := indexer.PartitionKey{Model: "m", Group: "g"}
		limit := rapid.IntRange(4, 40).Draw(t, "capacity")
		maxEntries := rapid.IntRange(8, 80).Draw(t, "maxEntries")
		limited, capped, free := indexer.New(indexer.Options{}), indexer.New(indexer.Options{MaxEntries: maxEntries}), indexer.New(indexer.Options{})
		r := indexer.Rank{WorkerID: 1}
		for _, ix := range []*indexer.Index{limited, capped, free} {
			if err := ix.AddPartition(k, e.bs); err != nil {
				t.Fatal(err)
			}
		}
		if err := limited.SetRankCapacity(k, r, indexer.Capacity{indexer.TierDevice: limit}); err != nil {
			t.Fatal(err)
		}
		for i := range rapid.IntRange(20, 100).Draw(t, "steps") {
			ops := e.step()
			for _, ix := range []*indexer.Index{limited, capped, free} {
				if _, err := ix.Apply(k, r, uint64(i), ops); err != nil {
					t.Fatal(err)
				}
			}
			if n := capped.Entries(); n > maxEntries {
				t.Fatalf("step %d: %d entries, cap %d", i, n, maxEntries)
			}
			for name, ix := range map[string]*indexer.Index{"limited": limited, "capped": capped, "free": free} {
				var err error
				_ = ix.ReadRank(k, r, func(tr *indexer.Tree) {
					truncated := tr.Truncated(r)
					if err = indexer.CheckGroupBits(tr); err != nil {
						return
					}
					err = e.checkHoldings(tr, r, truncated)
					if err == nil && !truncated {
						err = e.checkIndex(tr, r, nil)
					}
				})
				if err != nil {
					t.Fatalf("step %d, %s index: %v", i, name, err)
				}
			}
			gs, _ := limited.Groups(k, r)
			dev := 0
			for _, g := range gs {
				dev += g.Tiers[indexer.TierDevice]
			}
			if dev > limit {
				t.Fatalf("step %d: %d device blocks over all groups, capacity %d", i, dev, limit)
			}
		}
	})
}

// Hand-written cases of group learning.

func hyStore(g indexer.Group, parent uint64, hashes []uint64, ids ...uint32) indexer.Op {
	st := indexer.Stored{Hashes: hashes, Tokens: blockTokens(4, ids...), BlockSize: 4, Seed: indexer.BaseSeed}
	if parent != 0 {
		st.Parent, st.HasParent = parent, true
	}
	return indexer.Op{Kind: indexer.OpStore, Group: g, Store: st}
}

func hyRemove(idx int, hashes ...uint64) indexer.Op {
	return indexer.Op{Kind: indexer.OpRemove, Group: indexer.Group{Idx: idx}, Remove: indexer.Removed{Hashes: hashes}}
}

var (
	swGroup0 = indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 5} // needs 1 block of 4
	faGroup1 = indexer.Group{Idx: 1, Kind: "full_attention"}
)

func applyAll(t *testing.T, tr *indexer.Tree, r indexer.Rank, ops ...indexer.Op) []error {
	t.Helper()
	var errs []error
	for _, op := range ops {
		if err := tr.Apply(r, op); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func overlapOf(tr *indexer.Tree, r indexer.Rank, q []uint64) indexer.Overlap {
	for _, o := range tr.Match(q, nil) {
		if o.Rank == r {
			return o
		}
	}
	return indexer.Overlap{}
}

// TestHybridMainGroupAtNonZeroIndex: with group 0 sliding-window (as
// Gemma 3 numbers its groups) the full-attention group 1 is indexed, the
// sliding-window group's holdings decide the granted hit.
func TestHybridMainGroupAtNonZeroIndex(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	hs := hashRange(100, 6)
	if errs := applyAll(t, tr, r,
		hyStore(swGroup0, 0, hs, ids(1, 6)...), // group 0 stores first, as vLLM's cache_blocks does
		hyStore(faGroup1, 0, hs, ids(1, 6)...),
	); len(errs) > 0 {
		t.Fatal(errs)
	}
	want := []indexer.GroupState{
		{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 5, Tracked: true, Need: 1, Blocks: 6, Tiers: [indexer.NumTiers]int{6}},
		{Idx: 1, Attention: indexer.AttentionFull, Kind: "full_attention", Main: true, Tracked: true, Blocks: 6, Tiers: [indexer.NumTiers]int{6}},
	}
	if got := tr.Groups(r); !reflect.DeepEqual(got, want) {
		t.Fatalf("groups %+v\nwant %+v", got, want)
	}
	q6 := q(ids(1, 6)...)
	if o := overlapOf(tr, r, q6); o.Device != 6 || o.Upper != 6 {
		t.Fatalf("overlap %+v, want 6 granted of 6", o)
	}
	// The window slides: the sliding-window group keeps only its last
	// blocks; a hit needs the one block before its end.
	applyAll(t, tr, r, hyRemove(0, hs[0], hs[1], hs[2], hs[3]))
	if o := overlapOf(tr, r, q6); o.Device != 6 || o.Upper != 6 {
		t.Fatalf("after the window slid: %+v, want 6", o)
	}
	if o := overlapOf(tr, r, q(ids(1, 3)...)); o.Device != 0 || o.Upper != 3 {
		t.Fatalf("3-block prompt, window blocks gone: %+v, want 0 granted of 3", o)
	}
	// The sliding-window group loses block 5 (the last): the hit ends at 5,
	// which block 4 serves.
	applyAll(t, tr, r, hyRemove(0, hs[5]))
	if o := overlapOf(tr, r, q6); o.Device != 5 || o.Upper != 6 {
		t.Fatalf("after block 5 left group 0: %+v, want 5 of 6", o)
	}
	// The main group's removes shorten Upper.
	applyAll(t, tr, r, hyRemove(1, hs[3], hs[4], hs[5]))
	if o := overlapOf(tr, r, q6); o.Device != 0 || o.Upper != 3 {
		t.Fatalf("after the main group lost blocks 3..5: %+v, want 0 of 3", o)
	}
	// AllBlocksCleared empties every group and forgets the layout.
	applyAll(t, tr, r, indexer.Op{Kind: indexer.OpClear})
	if g := tr.Groups(r); g != nil {
		t.Fatalf("groups after a clear: %+v", g)
	}
	if st := tr.Stats(); st.Entries != 0 || st.GroupEntries != 0 {
		t.Fatalf("after a clear: %+v", st)
	}
}

// TestHybridRemoveOfUnknownGroup: a remove of a group the rank never
// stored is skipped, never applied to the main group, even for hashes the
// main group holds.
func TestHybridRemoveOfUnknownGroup(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	hs := hashRange(100, 3)
	applyAll(t, tr, r, hyStore(indexer.Group{Idx: 2, Kind: "full_attention"}, 0, hs, ids(1, 3)...))
	for _, idx := range []int{0, 1, 3} {
		errs := applyAll(t, tr, r, hyRemove(idx, hs...))
		var oe *indexer.OpError
		if len(errs) != 1 || !errors.As(errs[0], &oe) || oe.Reason != indexer.ReasonUnknownGroup || oe.Blocks != 3 ||
			!errors.Is(errs[0], indexer.ErrUnknownGroup) {
			t.Fatalf("remove of group %d: %v, want 3 blocks skipped as unknown_group", idx, errs)
		}
	}
	if o := overlapOf(tr, r, q(ids(1, 3)...)); o.Device != 3 {
		t.Fatalf("the main group lost blocks to another group's removes: %+v", o)
	}
	if n := tr.Counts()[indexer.ReasonUnknownGroup]; n != 9 {
		t.Fatalf("unknown_group counted %d, want 9", n)
	}
	// A rank that learned nothing counts a remove as block_not_found, as
	// before groups: it holds nothing.
	errs := applyAll(t, tr, indexer.Rank{WorkerID: 2}, hyRemove(4, 7))
	if len(errs) != 1 || !errors.Is(errs[0], indexer.ErrBlockNotFound) {
		t.Fatalf("remove on an empty rank: %v", errs)
	}
}

// TestHybridLowerMainGroupLater: a full-attention group numbered below the
// main one, first stored later, becomes the main group; the former main
// group's blocks move to a tracked set, and the grant needs both.
func TestHybridLowerMainGroupLater(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	hs := hashRange(100, 4)
	applyAll(t, tr, r, hyStore(indexer.Group{Idx: 3, Kind: "full_attention"}, 0, hs, ids(1, 4)...))
	applyAll(t, tr, r, hyStore(indexer.Group{Idx: 1, Kind: "mla_attention"}, 0, hs[:2], ids(1, 2)...))
	gs := tr.Groups(r)
	if len(gs) != 2 || !gs[0].Main || gs[0].Idx != 1 || gs[0].Blocks != 2 || gs[1].Main || !gs[1].Tracked || gs[1].Blocks != 4 {
		t.Fatalf("groups %+v, want main 1 of 2 blocks and group 3 of 4", gs)
	}
	if tr.Truncated(r) {
		t.Fatal("moving the former main group's blocks truncated the rank")
	}
	if o := overlapOf(tr, r, q(ids(1, 4)...)); o.Device != 2 || o.Upper != 2 {
		t.Fatalf("overlap %+v, want 2 of 2", o)
	}
	applyAll(t, tr, r, hyStore(indexer.Group{Idx: 1, Kind: "mla_attention"}, hs[1], hs[2:], ids(3, 2)...))
	applyAll(t, tr, r, hyRemove(3, hs[3]))
	if o := overlapOf(tr, r, q(ids(1, 4)...)); o.Device != 3 || o.Upper != 4 {
		t.Fatalf("overlap %+v, want 3 (group 3 lost block 3) of 4", o)
	}
	if c, ok := tr.GroupHolds(r, 3, hs[0]); !ok || c[indexer.TierDevice] != 1 {
		t.Fatalf("group 3 block 0: %v %v", c, ok)
	}
}

// TestHybridUntrackedGroup: a group whose rule the index does not model
// is learned, its blocks are not tracked, its removes are no error, and it
// does not limit the grant (which is then an upper bound).
func TestHybridUntrackedGroup(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	hs := hashRange(100, 3)
	chunked := indexer.Group{Idx: 0, Attention: indexer.AttentionOther, Kind: "chunked_local_attention"}
	if errs := applyAll(t, tr, r,
		hyStore(chunked, 0, hs, ids(1, 3)...),
		hyStore(faGroup1, 0, hs, ids(1, 3)...),
		hyRemove(0, hs...),
		// A sliding window without a window, and one of another block
		// size, cannot be modelled either.
		hyStore(indexer.Group{Idx: 2, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window"}, 0, hs, ids(1, 3)...),
		indexer.Op{Kind: indexer.OpStore, Group: indexer.Group{Idx: 3, Attention: indexer.AttentionSlidingWindow, Window: 8},
			Store: indexer.Stored{Hashes: hs[:1], Tokens: blockTokens(8, 1), BlockSize: 8}},
	); len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range tr.Groups(r) {
		if g.Tracked != g.Main || (!g.Main && g.Blocks != 0) {
			t.Fatalf("group %+v", g)
		}
	}
	if st := tr.Stats(); st.GroupEntries != 0 {
		t.Fatalf("untracked groups hold entries: %+v", st)
	}
	if o := overlapOf(tr, r, q(ids(1, 3)...)); o.Device != 3 || o.Upper != 3 {
		t.Fatalf("overlap %+v", o)
	}
}

// TestHybridGroupLimit: a rank learns at most MaxGroups groups.
func TestHybridGroupLimit(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	var errs []error
	for i := 0; i < indexer.MaxGroups+3; i++ {
		g := indexer.Group{Idx: i, Attention: indexer.AttentionSlidingWindow, Window: 4}
		if i == 0 {
			g = indexer.Group{}
		}
		errs = append(errs, applyAll(t, tr, r, hyStore(g, 0, []uint64{uint64(1000 + i)}, 1))...)
	}
	if len(tr.Groups(r)) != indexer.MaxGroups || len(errs) != 3 || !errors.Is(errs[0], indexer.ErrUnknownGroup) {
		t.Fatalf("%d groups, errors %v", len(tr.Groups(r)), errs)
	}
}

// TestHybridTiers: the grant of each tier counts the groups' copies in
// that tier or faster.
func TestHybridTiers(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 1}
	hs := hashRange(100, 4)
	host := func(idx int, h ...uint64) indexer.Op {
		g := swGroup0
		g.Idx = idx
		if idx == 1 {
			g = faGroup1
		}
		return indexer.Op{Kind: indexer.OpStore, Group: g, Store: indexer.Stored{Hashes: h, Tier: indexer.TierHost, BlockSize: 4}}
	}
	applyAll(t, tr, r,
		hyStore(swGroup0, 0, hs, ids(1, 4)...),
		hyStore(faGroup1, 0, hs, ids(1, 4)...),
		host(0, hs[3]), host(1, hs[2], hs[3]),
		hyRemove(0, hs[3]), // device copy of block 3 leaves group 0; its host copy stays
	)
	o := overlapOf(tr, r, q(ids(1, 4)...))
	if o.Device != 3 || o.Host != 4 || o.Disk != 4 || o.Upper != 4 {
		t.Fatalf("overlap %+v, want device 3, host and disk 4", o)
	}
	if c, ok := tr.GroupHolds(r, 0, hs[3]); !ok || c != [indexer.NumTiers]uint32{0, 1, 0, 0} {
		t.Fatalf("group 0 block 3: %v %v", c, ok)
	}
}

// TestHybridSnapshotRestore: a hybrid rank's layout and group blocks
// survive Dump and Restore; inconsistent layouts are rejected.
func TestHybridSnapshotRestore(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 7, DPRank: 2}
	hs := hashRange(100, 3)
	applyAll(t, tr, r,
		hyStore(swGroup0, 0, hs, ids(1, 3)...),
		hyStore(swGroup0, 0, hs[:1], ids(1, 1)...),
		hyStore(faGroup1, 0, hs, ids(1, 3)...),
		indexer.Op{Kind: indexer.OpStore, Group: swGroup0, Store: indexer.Stored{Hashes: hs[1:2], Tier: indexer.TierDisk}},
		hyStore(indexer.Group{Idx: 2, Attention: indexer.AttentionOther, Kind: "mamba"}, 0, hs, ids(1, 3)...),
	)
	snap := tr.Dump()
	rt, err := indexer.Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rt.Groups(r), tr.Groups(r)) {
		t.Fatalf("restored %+v\nwant %+v", rt.Groups(r), tr.Groups(r))
	}
	for _, h := range hs {
		a, okA := rt.GroupHolds(r, 0, h)
		b, okB := tr.GroupHolds(r, 0, h)
		if a != b || okA != okB {
			t.Fatalf("hash %#x: restored %v %v, dumped %v %v", h, a, okA, b, okB)
		}
	}
	// Inconsistent layouts are rejected.
	for name, bad := range map[string]func(s *indexer.Snapshot){
		"two mains":      func(s *indexer.Snapshot) { s.Groups[0].Main = true },
		"group twice":    func(s *indexer.Snapshot) { s.Groups = append(s.Groups, s.Groups[0]) },
		"untracked data": func(s *indexer.Snapshot) { s.Groups[2].Blocks = s.Groups[0].Blocks },
		"no copies":      func(s *indexer.Snapshot) { s.Groups[0].Blocks[0].Counts = [indexer.NumTiers]uint32{} },
		"main with data": func(s *indexer.Snapshot) { s.Groups[1].Blocks = s.Groups[0].Blocks },
		"duplicate hash": func(s *indexer.Snapshot) { s.Groups[0].Blocks[1].Hash = s.Groups[0].Blocks[0].Hash },
	} {
		s := tr.Dump()
		bad(s)
		if _, err := indexer.Restore(s); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
	if !slices.ContainsFunc(snap.Groups, func(g indexer.DumpGroup) bool { return g.Idx == 2 && !g.Tracked && g.Kind == "mamba" }) {
		t.Fatalf("the untracked group is not dumped: %+v", snap.Groups)
	}
}
