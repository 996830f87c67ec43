package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"weak"
)

// chainOp stores one parentless chain of n blocks for a rank: block ids
// first, first+1, … (distinct ids give distinct local hashes), engine
// hashes from base.
func chainOp(bs int, first uint32, n int, base uint64) Op {
	st := Stored{BlockSize: bs, Seed: BaseSeed}
	for i := 0; i < n; i++ {
		for j := 0; j < bs; j++ {
			st.Tokens = append(st.Tokens, (first+uint32(i))*uint32(bs)+uint32(j))
		}
		st.Hashes = append(st.Hashes, base+uint64(i))
	}
	return Op{Kind: OpStore, Store: st}
}

func chainQuery(bs int, first uint32, n int) []uint64 {
	return HashBlocks(nil, chainOp(bs, first, n, 1).Store.Tokens, bs, BaseSeed)
}

func partEntries(t *testing.T, ix *Index, k PartitionKey) int {
	t.Helper()
	n := 0
	must(t, ix.Read(k, func(tr *Tree) { n += tr.entries }))
	return n
}

// checkTotal checks the index total against the trees' own counts.
func checkTotal(t *testing.T, ix *Index) {
	t.Helper()
	sum := 0
	for _, st := range ix.Stats() {
		sum += st.Entries
	}
	if got := ix.Entries(); got != sum {
		t.Fatalf("Entries() = %d, partitions hold %d", got, sum)
	}
}

// TestMemoryCapEvictsAcrossPartitions: one full partition must not starve
// the others. With the cap reached by partition a, writes to b evict a's
// (older) leaves, not b's own new ones.
func TestMemoryCapEvictsAcrossPartitions(t *testing.T) {
	const bs, cap = 4, 1000
	ix := New(Options{MaxEntries: cap})
	a, b := PartitionKey{"a", "default"}, PartitionKey{"b", "default"}
	must(t, ix.AddPartition(a, bs))
	must(t, ix.AddPartition(b, bs))
	r := Rank{1, 0}
	for i := 0; i < 100; i++ { // 100 chains of 10: a holds exactly the cap
		_, err := ix.Apply(a, r, uint64(i), []Op{chainOp(bs, uint32(i*10), 10, uint64(i*10))})
		must(t, err)
	}
	if got := partEntries(t, ix, a); got != cap {
		t.Fatalf("a holds %d, want %d", got, cap)
	}
	var evicted uint64
	for i := 0; i < 50; i++ {
		res, err := ix.Apply(b, r, uint64(i), []Op{chainOp(bs, uint32(5000+i*10), 10, uint64(5000+i*10))})
		must(t, err)
		evicted += res.Skipped[ReasonEvicted]
		if n := ix.Entries(); n > cap {
			t.Fatalf("after b's batch %d: %d entries, cap %d", i, n, cap)
		}
	}
	if got := partEntries(t, ix, b); got != 500 {
		t.Fatalf("b holds %d of the 500 entries written last; the cap must evict a's older leaves", got)
	}
	if got := partEntries(t, ix, a); got > cap-500 || got < cap-500-cap/32-10 {
		t.Fatalf("a holds %d, want about %d", got, cap-500)
	}
	var aEvicted uint64
	for _, st := range ix.Stats() {
		if st.Key == a {
			aEvicted = st.Counts[ReasonEvicted]
		}
	}
	if aEvicted != evicted || evicted == 0 {
		t.Fatalf("evicted: batches report %d, partition a counts %d", evicted, aEvicted)
	}
	checkTotal(t, ix)
}

// TestMemoryCapEvictsOldestAnywhere: chains written round robin to three
// partitions; the cap evicts exactly the oldest chains whichever partition
// holds them, and a match makes a chain recent again.
func TestMemoryCapEvictsOldestAnywhere(t *testing.T) {
	const bs, cap, chains = 4, 1000, 100
	ix := New(Options{MaxEntries: cap})
	keys := []PartitionKey{{"a", "g"}, {"b", "g"}, {"c", "g"}}
	for _, k := range keys {
		must(t, ix.AddPartition(k, bs))
	}
	r := Rank{1, 0}
	write := func(i int) {
		t.Helper()
		_, err := ix.Apply(keys[i%3], r, uint64(i), []Op{chainOp(bs, uint32(i*10), 10, uint64(i*10))})
		must(t, err)
	}
	held := func(i int) uint32 {
		ov, err := ix.Match(keys[i%3], chainQuery(bs, uint32(i*10), 10), nil)
		must(t, err)
		if len(ov) == 0 {
			return 0
		}
		return ov[0].Device
	}
	for i := 0; i < chains; i++ {
		write(i)
	}
	if held(0) != 10 { // also refreshes chain 0
		t.Fatal("chain 0 not held before the cap bit")
	}
	write(chains) // 1,010 entries: evict 41+, five whole chains
	if n := ix.Entries(); n != cap+10-50 {
		t.Fatalf("%d entries after eviction, want %d", n, cap+10-50)
	}
	for i := 0; i <= chains; i++ {
		want := uint32(10)
		if i >= 1 && i <= 5 {
			want = 0
		}
		// Probe without refreshing the order: every probe happens after
		// the eviction, so order no longer matters.
		if got := held(i); got != want {
			t.Errorf("chain %d (partition %v): holds %d blocks, want %d", i, keys[i%3], got, want)
		}
	}
	checkTotal(t, ix)
}

// TestMemoryCapConcurrentPartitions writes to several partitions from
// several goroutines, with matchers, under a cap the workload exceeds many
// times. It must not deadlock (the test would time out), the total must
// end within the cap and equal the trees' sum, and every partition must
// stay a subset of an uncapped replay, with every rank not flagged
// truncated equal to it.
func TestMemoryCapConcurrentPartitions(t *testing.T) {
	const parts, cap = 4, 150
	ix := New(Options{MaxEntries: cap})
	truth := New(Options{})
	keys := make([]PartitionKey, parts)
	streams := make([][]seqBatch, parts)
	for i := range keys {
		keys[i] = PartitionKey{fmt.Sprintf("m%d", i), "default"}
		must(t, ix.AddPartition(keys[i], 4))
		must(t, truth.AddPartition(keys[i], 4))
		streams[i] = genStream(uint64(100+i), 600)
	}
	s := newSim(100, 4)
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range keys {
		byRank := map[Rank][]seqBatch{}
		for _, b := range streams[i] {
			byRank[b.rank] = append(byRank[b.rank], b)
		}
		for _, bs := range byRank {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, b := range bs {
					if _, err := ix.Apply(keys[i], b.rank, b.seq, b.ops); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	var mg sync.WaitGroup
	for m := 0; m < 2; m++ {
		mg.Add(1)
		go func() {
			defer mg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				_, _ = ix.MatchTokens(keys[i%parts], s.docs[i%len(s.docs)], BaseSeed, nil)
			}
		}()
	}
	wg.Wait()
	close(done)
	mg.Wait()
	if n := ix.Entries(); n > cap {
		t.Fatalf("%d entries after the writers finished, cap %d", n, cap)
	}
	checkTotal(t, ix)
	evicted := uint64(0)
	for _, st := range ix.Stats() {
		evicted += st.Counts[ReasonEvicted]
	}
	if evicted == 0 {
		t.Fatal("the cap never bit")
	}
	for i, k := range keys {
		for _, b := range streams[i] {
			_, err := truth.Apply(k, b.rank, b.seq, b.ops)
			must(t, err)
		}
		checkSubset(t, shardTrees(ix, k), shardTrees(truth, k))
	}
}

// checkSubset checks that every entry of got is in want with the same path
// and at most as many copies in every tier, and that every rank of got not
// flagged truncated holds exactly what it holds in want.
func checkSubset(t *testing.T, got, want []*Tree) {
	t.Helper()
	g, _ := canonical(got...)
	w, _ := canonical(want...)
	for r, ents := range g {
		for h, e := range ents {
			we, ok := w[r][h]
			if !ok || we.path != e.path {
				t.Fatalf("rank %v: block %#x at %s is not in the truth (%v)", r, h, e.path, we)
			}
			for tier := range e.counts {
				if e.counts[tier] > we.counts[tier] {
					t.Fatalf("rank %v block %#x: %v copies, truth %v", r, h, e.counts, we.counts)
				}
			}
		}
	}
	truncated := func(r Rank) bool {
		for _, t := range got {
			if t.Truncated(r) {
				return true
			}
		}
		return false
	}
	for r := range w {
		if !truncated(r) && !maps.Equal(g[r], w[r]) {
			t.Fatalf("rank %v is not flagged truncated but holds %d of the truth's %d blocks", r, len(g[r]), len(w[r]))
		}
	}
}

// tierSim wraps sim with offloads to the host tier and removals from it.
type tierSim struct {
	*sim
	offloaded map[Rank]map[uint64]bool
}

func (s *tierSim) batch(r Rank) []Op {
	ops := s.sim.batch(r)
	if s.offloaded[r] == nil {
		s.offloaded[r] = map[uint64]bool{}
	}
	off := s.offloaded[r]
	for _, op := range ops {
		if op.Kind == OpClear {
			clear(off)
		}
	}
	if s.rng.IntN(3) == 0 && len(s.held[r]) > 0 {
		var hs []uint64
		for _, x := range sortedValues(s.held[r]) {
			if s.rng.IntN(3) == 0 && !off[x] {
				hs = append(hs, x)
				off[x] = true
			}
		}
		if len(hs) > 0 {
			ops = append(ops, Op{Kind: OpStore, Store: Stored{Hashes: hs, Tier: TierHost, BlockSize: s.bs}})
		}
	}
	if s.rng.IntN(4) == 0 && len(off) > 0 {
		xs := slices.Sorted(maps.Keys(off))
		x := xs[s.rng.IntN(len(xs))]
		ops = append(ops, Op{Kind: OpRemove, Remove: Removed{Hashes: []uint64{x}, Tier: TierHost}})
		delete(off, x)
	}
	return ops
}

// sortedValues returns m's values in key order (map order is random).
func sortedValues[K cmp.Ordered, V any](m map[K]V) []V {
	var out []V
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// TestRankCapacityProperty drives a capacity-limited index and an
// unlimited one with the same random batches (device stores and removes,
// host offloads and removes, clears) and checks after every batch that no
// rank holds more blocks in a tier than its capacity, that the limited
// index is a subset of the other, that ranks not flagged truncated hold
// exactly the truth, and that the dropped blocks are counted.
func TestRankCapacityProperty(t *testing.T) {
	var total uint64
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			s := &tierSim{sim: newSim(seed, 4), offloaded: map[Rank]map[uint64]bool{}}
			ranks := []Rank{{1, 0}, {1, 1}, {2, 0}, {3, 0}}
			limited, truth := New(Options{}), New(Options{})
			must(t, limited.AddPartition(testKey, 4))
			must(t, truth.AddPartition(testKey, 4))
			caps := map[Rank]Capacity{}
			for _, r := range ranks {
				c := Capacity{TierDevice: 1 + rng.IntN(40)}
				if rng.IntN(2) == 0 {
					c[TierHost] = 1 + rng.IntN(20)
				}
				caps[r] = c
				must(t, limited.SetRankCapacity(testKey, r, c))
			}
			var dropped uint64
			seqs := map[Rank]uint64{}
			for i := 0; i < 400; i++ {
				r := ranks[rng.IntN(len(ranks))]
				ops := s.batch(r)
				res, err := limited.Apply(testKey, r, seqs[r], ops)
				must(t, err)
				_, err = truth.Apply(testKey, r, seqs[r], ops)
				must(t, err)
				seqs[r]++
				dropped += res.Skipped[ReasonRankCapacity]
				for _, r := range ranks {
					st, err := limited.Rank(testKey, r)
					must(t, err)
					for tier, lim := range caps[r] {
						if lim > 0 && st.Tiers[tier] > lim {
							t.Fatalf("batch %d: rank %v holds %d blocks in %v, capacity %d", i, r, st.Tiers[tier], Tier(tier), lim)
						}
					}
					if st.Capacity != caps[r] {
						t.Fatalf("rank %v capacity %v, set %v", r, st.Capacity, caps[r])
					}
				}
				checkSubset(t, shardTrees(limited, testKey), shardTrees(truth, testKey))
			}
			var counted uint64
			for _, st := range limited.Stats() {
				counted = st.Counts[ReasonRankCapacity]
			}
			if counted != dropped {
				t.Fatalf("rank_capacity: batches report %d, tree counts %d", dropped, counted)
			}
			total += dropped
		})
	}
	if total == 0 {
		t.Fatal("no rank ever reached its capacity")
	}
}

// TestRankCapacityDropsOldestTailFirst: past its device capacity a rank
// loses its least recently stored or matched blocks, the tail of each
// chain first, and a block with a copy in another tier keeps it.
func TestRankCapacityDropsOldestTailFirst(t *testing.T) {
	const bs = 4
	ix := New(Options{})
	must(t, ix.AddPartition(testKey, bs))
	r := Rank{1, 0}
	must(t, ix.SetRankCapacity(testKey, r, Capacity{TierDevice: 16}))
	apply := func(ops ...Op) BatchResult {
		t.Helper()
		res, err := ix.Apply(testKey, r, 0, ops)
		must(t, err)
		return res
	}
	held := func(first uint32) Overlap {
		t.Helper()
		ov, err := ix.Match(testKey, chainQuery(bs, first, 10), nil)
		must(t, err)
		if len(ov) == 0 {
			return Overlap{}
		}
		return ov[0]
	}
	apply(chainOp(bs, 0, 10, 100))  // A
	apply(chainOp(bs, 10, 10, 200)) // B: 20 > 16, drop A's tail 4
	if a, b := held(0), held(10); a.Device != 6 || b.Device != 10 {
		t.Fatalf("after B: A %+v, B %+v; want A's 6 first blocks and all of B", a, b)
	}
	// A is now matched more recently than B; offload B's first block to
	// the host tier.
	apply(Op{Kind: OpStore, Store: Stored{Hashes: []uint64{200}, Tier: TierHost, BlockSize: bs}})
	held(0)
	res := apply(chainOp(bs, 20, 10, 300)) // C: 26 > 16, drop 10: B's (oldest)
	if got := res.Skipped[ReasonRankCapacity]; got != 10 {
		t.Fatalf("C dropped %d blocks, want 10", got)
	}
	a, b, c := held(0), held(10), held(20)
	if a.Device != 6 || c.Device != 10 || b.Device != 0 || b.Host != 1 || b.Disk != 1 {
		t.Fatalf("after C: A %+v, B %+v, C %+v; want A 6, B only its host copy of block 0, C 10", a, b, c)
	}
	st, err := ix.Rank(testKey, r)
	must(t, err)
	if st.Tiers != (Capacity{16, 1, 0, 0}) || st.Blocks != 17 || !st.Truncated {
		t.Fatalf("rank state %+v, want 16 device blocks, 1 host, 17 in all, truncated", st)
	}
}

// TestTruncatedFlag: the memory cap and the rank capacity flag the ranks
// they take entries from, and only those; Clear, an AllBlocksCleared op
// and RemoveRank reset the flag; snapshots keep it.
func TestTruncatedFlag(t *testing.T) {
	const bs = 4
	ix := New(Options{MaxEntries: 30})
	a, b := PartitionKey{"a", "g"}, PartitionKey{"b", "g"}
	must(t, ix.AddPartition(a, bs))
	must(t, ix.AddPartition(b, bs))
	r1, r2, r3 := Rank{1, 0}, Rank{2, 0}, Rank{3, 0}
	state := func(k PartitionKey, r Rank) RankState {
		t.Helper()
		st, err := ix.Rank(k, r)
		must(t, err)
		return st
	}
	apply := func(k PartitionKey, r Rank, ops ...Op) {
		t.Helper()
		_, err := ix.Apply(k, r, 0, ops)
		must(t, err)
	}
	apply(a, r1, chainOp(bs, 0, 10, 100))
	apply(b, r2, chainOp(bs, 10, 10, 200))
	apply(b, r3, chainOp(bs, 20, 10, 300))
	if state(a, r1).Truncated || state(b, r2).Truncated || state(b, r3).Truncated {
		t.Fatal("truncated before anything was dropped")
	}
	apply(b, r3, chainOp(bs, 30, 5, 400)) // 35 > 30: r1's chain in a is the oldest
	if st := state(a, r1); !st.Truncated || st.Blocks != 0 {
		t.Fatalf("r1 after the cap took its chain: %+v", st)
	}
	if state(b, r2).Truncated || state(b, r3).Truncated {
		t.Fatal("ranks the cap did not touch are flagged truncated")
	}
	snap, err := ix.Snapshot(a)
	must(t, err)
	other := New(Options{})
	must(t, other.Restore(a, snap))
	if st, _ := other.Rank(a, r1); !st.Truncated {
		t.Fatalf("restored %+v: r1 not truncated", snap.Ranks)
	}
	must(t, ix.Clear(a, r1))
	if state(a, r1).Truncated {
		t.Fatal("Clear kept the flag")
	}

	// Capacity: a trim flags the rank; an AllBlocksCleared in a later
	// batch resets it, also when stores follow in the same batch.
	must(t, ix.SetRankCapacity(b, r2, Capacity{TierDevice: 8}))
	if st := state(b, r2); !st.Truncated || st.Tiers[TierDevice] != 8 {
		t.Fatalf("r2 after a capacity below its holdings: %+v", st)
	}
	apply(b, r2, Op{Kind: OpClear}, chainOp(bs, 40, 3, 500))
	if st := state(b, r2); st.Truncated || st.Blocks != 3 {
		t.Fatalf("r2 after AllBlocksCleared and a store: %+v", st)
	}
	apply(b, r2, chainOp(bs, 50, 10, 600))
	if !state(b, r2).Truncated {
		t.Fatal("r2 not truncated past its capacity")
	}
	must(t, ix.RemoveRank(b, r2))
	if st := state(b, r2); st != (RankState{}) {
		t.Fatalf("r2 after RemoveRank: %+v", st)
	}
}

// TestRemovePartition: partitions created, filled and removed by the
// thousand leave the partition count, the index total (and so the cap's
// headroom) and the heap where they were; a partition added again may
// have another block size; RemoveEmptyPartition keeps a partition that
// still knows a rank.
func TestRemovePartition(t *testing.T) {
	ix := New(Options{MaxEntries: 1 << 20})
	base := PartitionKey{"base", "default"}
	must(t, ix.AddPartition(base, 4))
	_, err := ix.Apply(base, Rank{1 << 40, 0}, 0, []Op{chainOp(4, 0, 8, 1)})
	must(t, err)
	baseParts, baseEntries := len(ix.Partitions()), ix.Entries()
	var trees []weak.Pointer[Tree]
	for i := 0; i < 5000; i++ {
		k := PartitionKey{fmt.Sprintf("model-%d", i), "default"}
		must(t, ix.AddPartition(k, 16))
		_, err := ix.Apply(k, Rank{uint64(i), 0}, 0, []Op{chainOp(16, uint32(i), 3, 7)})
		must(t, err)
		if i%1000 == 0 {
			must(t, ix.Read(k, func(tr *Tree) { trees = append(trees, weak.Make(tr)) }))
		}
		if i%2 == 0 {
			must(t, ix.RemovePartition(k))
			continue
		}
		// The daemon's path: the last worker leaves, then the partition.
		if removed, err := ix.RemoveEmptyPartition(k); err != nil || removed {
			t.Fatalf("RemoveEmptyPartition of a partition with a rank: %v, %v", removed, err)
		}
		ix.RemoveWorker(uint64(i))
		if n, err := ix.RankCount(k); err != nil || n != 0 {
			t.Fatalf("RankCount after RemoveWorker: %d, %v", n, err)
		}
		if removed, err := ix.RemoveEmptyPartition(k); err != nil || !removed {
			t.Fatalf("RemoveEmptyPartition of an empty partition: %v, %v", removed, err)
		}
	}
	if n := len(ix.Partitions()); n != baseParts {
		t.Fatalf("%d partitions after removing 5,000, want %d", n, baseParts)
	}
	if n := ix.Entries(); n != baseEntries {
		t.Fatalf("%d entries after removing 5,000 partitions, want %d", n, baseEntries)
	}
	if n := len(ix.Stats()); n != baseParts {
		t.Fatalf("Stats lists %d partitions", n)
	}
	runtime.GC()
	for i, w := range trees {
		if w.Value() != nil {
			t.Errorf("tree %d of a removed partition still reachable", i)
		}
	}
	k := PartitionKey{"model-0", "default"}
	if err := ix.RemovePartition(k); !errors.Is(err, ErrNoPartition) {
		t.Fatalf("removing a removed partition: %v", err)
	}
	if _, err := ix.Apply(k, Rank{1, 0}, 0, nil); !errors.Is(err, ErrNoPartition) {
		t.Fatalf("Apply to a removed partition: %v", err)
	}
	must(t, ix.AddPartition(k, 32)) // a new fleet, another block size
	if bs, err := ix.BlockSize(k); err != nil || bs != 32 {
		t.Fatalf("re-added partition: block size %d, %v", bs, err)
	}
	if n, _ := ix.RankCount(k); n != 0 {
		t.Fatalf("re-added partition knows %d ranks", n)
	}
	checkTotal(t, ix)
}
