package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// ranksPerShard returns how many ranks each of partition k's trees holds.
func ranksPerShard(t *testing.T, ix *Index, k PartitionKey) []int {
	t.Helper()
	var out []int
	must(t, ix.Read(k, func(tr *Tree) { out = append(out, len(tr.rankIDs)) }))
	return out
}

// matchAll returns the overlaps of every document, each list sorted.
func matchAll(t *testing.T, ix *Index, k PartitionKey, docs [][]uint32) [][]Overlap {
	t.Helper()
	var out [][]Overlap
	for _, d := range docs {
		o, err := ix.MatchTokens(k, d, BaseSeed, nil)
		must(t, err)
		slices.SortFunc(o, func(a, b Overlap) int {
			return cmp.Or(cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID), cmp.Compare(a.Rank.DPRank, b.Rank.DPRank))
		})
		out = append(out, o)
	}
	return out
}

// TestShardedEqualsUnsharded replays one stream into indexes of 1 to 5
// shards: every match, rank state and entry count is the one-tree
// index's, after the stream and after ranks and a worker are removed; and
// the ranks are spread evenly over the shards.
func TestShardedEqualsUnsharded(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		stream := genStream(seed, 400)
		s := newSim(seed, 4)
		for shards := 2; shards <= 5; shards++ {
			one := New(Options{Shards: 1})
			must(t, one.AddPartition(testKey, 4))
			for _, b := range stream {
				_, err := one.Apply(testKey, b.rank, b.seq, b.ops)
				must(t, err)
			}
			ix := New(Options{Shards: shards, WriteChunk: 3})
			must(t, ix.AddPartition(testKey, 4))
			for _, b := range stream {
				_, err := ix.Apply(testKey, b.rank, b.seq, b.ops)
				must(t, err)
			}
			if n, _ := ix.Shards(testKey); n != shards {
				t.Fatalf("%d shards, configured %d", n, shards)
			}
			per := ranksPerShard(t, ix, testKey)
			if slices.Max(per)-slices.Min(per) > 1 {
				t.Fatalf("%d shards: ranks per shard %v, not even", shards, per)
			}
			check := func(when string) {
				t.Helper()
				if got, want := ix.Entries(), one.Entries(); got != want {
					t.Fatalf("seed %d, %d shards, %s: %d entries, one tree %d", seed, shards, when, got, want)
				}
				if got, want := matchAll(t, ix, testKey, s.docs), matchAll(t, one, testKey, s.docs); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("seed %d, %d shards, %s: matches\n %v\none tree\n %v", seed, shards, when, got, want)
				}
				for _, r := range []Rank{{1, 0}, {1, 1}, {2, 0}, {3, 0}, {9, 9}} {
					got, err := ix.Rank(testKey, r)
					must(t, err)
					want, err := one.Rank(testKey, r)
					must(t, err)
					if got != want {
						t.Fatalf("seed %d, %d shards, %s: rank %v %+v, one tree %+v", seed, shards, when, r, got, want)
					}
				}
				gn, _ := ix.RankCount(testKey)
				wn, _ := one.RankCount(testKey)
				if gn != wn {
					t.Fatalf("%s: %d ranks, one tree %d", when, gn, wn)
				}
				var gs, ws PartitionStats
				gs, ws = ix.Stats()[0], one.Stats()[0]
				if gs.Entries != ws.Entries || gs.Ranks != ws.Ranks || gs.Counts != ws.Counts || gs.Redundant != ws.Redundant || gs.Shards != shards {
					t.Fatalf("%s: stats %+v, one tree %+v", when, gs, ws)
				}
			}
			check("after the stream")
			must(t, ix.RemoveRank(testKey, Rank{1, 1}))
			ix.RemoveWorker(2)
			// Two new ranks fill the shards the removed ones left.
			_, err := ix.Apply(testKey, Rank{7, 0}, 0, []Op{chainOp(4, 1, 3, 70)})
			must(t, err)
			_, err = ix.Apply(testKey, Rank{8, 0}, 0, []Op{chainOp(4, 1, 2, 80)})
			must(t, err)
			if per := ranksPerShard(t, ix, testKey); slices.Max(per)-slices.Min(per) > 1 {
				t.Fatalf("%d shards after removals and two new ranks: ranks per shard %v", shards, per)
			}
			must(t, ix.RemoveRank(testKey, Rank{7, 0}))
			must(t, ix.RemoveRank(testKey, Rank{8, 0}))
			must(t, one.RemoveRank(testKey, Rank{1, 1}))
			one.RemoveWorker(2)
			check("after removals")
			if n, _ := ix.RankCount(testKey); n != len(*ix.parts[testKey].where.Load()) {
				t.Fatalf("%d ranks, %d assigned", n, len(*ix.parts[testKey].where.Load()))
			}
		}
	}
}

// TestWriteToOneShardWhileAnotherIsLocked: a batch of a rank in one shard
// completes while another shard's write lock is held, so writes to one
// partition take no lock that all its writers share.
func TestWriteToOneShardWhileAnotherIsLocked(t *testing.T) {
	ix := New(Options{Shards: 2})
	must(t, ix.AddPartition(testKey, 4))
	a, b := Rank{1, 0}, Rank{2, 0}
	_, err := ix.Apply(testKey, a, 0, []Op{chainOp(4, 1, 3, 10)})
	must(t, err)
	_, err = ix.Apply(testKey, b, 0, []Op{chainOp(4, 1, 3, 20)})
	must(t, err)
	p := ix.parts[testKey]
	sa, sb := p.shardOf(a, false), p.shardOf(b, false)
	if sa == sb {
		t.Fatal("two ranks in one shard of two")
	}
	sa.mu.Lock() // a's shard is busy
	done := make(chan error, 1)
	go func() {
		_, err := ix.Apply(testKey, b, 1, []Op{chainOp(4, 2, 40, 30)})
		done <- err
	}()
	must(t, <-done) // would deadlock (and time out) if b's write needed a's lock
	sa.mu.Unlock()
	if st, _ := ix.Rank(testKey, b); st.Blocks != 43 || st.Watermark != 1 {
		t.Fatalf("rank b: %+v, want 43 blocks at watermark 1", st)
	}
}

// TestMatchesDoNotWaitForTheWriteLock: while a writer holds a shard's
// write lock (as one descheduled in the middle of a hold does) and has
// changed the tree without publishing, matches complete and see the tree
// as of the last publish; once the writer lets go they see its changes.
func TestMatchesDoNotWaitForTheWriteLock(t *testing.T) {
	ix := New(Options{Shards: 1})
	must(t, ix.AddPartition(testKey, 4))
	a, b := Rank{1, 0}, Rank{2, 0}
	_, err := ix.Apply(testKey, a, 0, []Op{chainOp(4, 1, 20, 10)})
	must(t, err)
	q := HashBlocks(nil, chainOp(4, 1, 40, 0).Store.Tokens, 4, BaseSeed)
	before, _ := ix.Match(testKey, q, nil)
	if len(before) != 1 || before[0].Device != 20 {
		t.Fatalf("before: %+v, want rank a at 20 blocks", before)
	}
	s := ix.parts[testKey].shardOf(a, false)
	s.mu.Lock()
	// Unpublished changes: a splits its edge (a new rank holds its first
	// 5 blocks and goes its own way), a's tail goes, and a grows again.
	ext := chainOp(4, 21, 20, 30)
	ext.Store.Parent, ext.Store.HasParent = 29, true
	must(t, s.tree.Apply(b, chainOp(4, 1, 5, 10)))
	must(t, s.tree.Apply(b, chainOp(4, 900, 3, 15)))
	must(t, s.tree.Apply(a, Op{Kind: OpRemove, Remove: Removed{Hashes: []uint64{29}}}))
	back := chainOp(4, 20, 1, 29)
	back.Store.Parent, back.Store.HasParent = 28, true
	must(t, s.tree.Apply(a, back))
	must(t, s.tree.Apply(a, ext))
	// The match runs on this goroutine, which holds the write lock: had
	// it waited for the lock, the test would hang here.
	got, err := ix.Match(testKey, q, nil)
	must(t, err)
	if !slices.Equal(got, before) {
		t.Errorf("while the writer holds the lock: %+v, want the published %+v", got, before)
	}
	s.unlock()
	after, _ := ix.Match(testKey, q, nil)
	slices.SortFunc(after, func(x, y Overlap) int { return cmp.Compare(x.Rank.WorkerID, y.Rank.WorkerID) })
	if len(after) != 2 || after[0].Device != 40 || after[1].Rank != b || after[1].Device != 5 {
		t.Fatalf("after the writer let go: %+v, want a at 40 blocks and b at 5", after)
	}
}

// TestMatchesWhileAnEdgeGrows: eight ranks hold one edge of 128 blocks,
// and one of them extends it by 600 blocks in one store (19 pieces, each
// published), while a matcher scores under -race: every match sees the
// seven other ranks at 128 blocks and the growing one at no fewer than
// before and no more than it will hold; the index ends equal to a serial
// tree.
func TestMatchesWhileAnEdgeGrows(t *testing.T) {
	const holders, shared, extra = 8, 128, 600
	ix := New(Options{Shards: 1})
	must(t, ix.AddPartition(testKey, 4))
	serial := NewTree(4)
	for w := range holders {
		op := chainOp(4, 1, shared, 1000)
		_, err := ix.Apply(testKey, Rank{uint64(w + 1), 0}, 0, []Op{op})
		must(t, err)
		must(t, serial.Apply(Rank{uint64(w + 1), 0}, op))
	}
	grow := Rank{1, 0}
	ext := chainOp(4, 1+shared, extra, 1000+shared)
	ext.Store.Parent, ext.Store.HasParent = 1000+shared-1, true
	q := chainQuery(4, 1, shared+extra)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var matches atomic.Int64
	seen := map[uint32]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var dst []Overlap
		last := uint32(shared)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var err error
			dst, err = ix.Match(testKey, q, dst[:0])
			if err != nil || len(dst) != holders {
				t.Errorf("match: %+v, %v; want %d ranks", dst, err, holders)
				return
			}
			for _, o := range dst {
				switch {
				case o.Rank == grow && (o.Device < last || o.Device > shared+extra):
					t.Errorf("growing rank: %d blocks after %d, want %d–%d", o.Device, last, last, shared+extra)
					return
				case o.Rank == grow:
					last = o.Device
					seen[last] = true
				case o.Device != shared:
					t.Errorf("rank %v: %d blocks, want %d", o.Rank, o.Device, shared)
					return
				}
			}
			matches.Add(1)
		}
	}()
	for matches.Load() == 0 { // the matcher runs before the store starts
		runtime.Gosched()
	}
	_, err := ix.Apply(testKey, grow, 1, []Op{ext})
	must(t, err)
	close(stop)
	wg.Wait()
	must(t, serial.Apply(grow, ext))
	got, _ := ix.Match(testKey, q, nil)
	if want := serial.Match(q, nil); !slices.Equal(got, want) {
		t.Fatalf("after the store: %+v, the serial tree %+v", got, want)
	}
	for n := range seen {
		if (n-shared)%DefaultWriteChunk != 0 && n != shared+extra {
			t.Errorf("a match saw the growing rank at %d blocks: not a piece's end", n)
		}
	}
	pubs, retries, fallbacks := ViewStats(ix.parts[testKey].shardOf(grow, false).tree)
	t.Logf("%d matches during the store saw %d lengths; %d publishes, %d walks repeated, %d matches under the lock",
		matches.Load(), len(seen), pubs, retries, fallbacks)
}

// TestShardedSnapshotRoundTrip dumps a 3-shard partition and restores it
// into indexes configured with fewer and more shards: the restored index
// keeps the snapshot's shards (or more), each rank where it was, scores
// and states as the live one, and the stream's remaining batches bring
// both to the same state.
func TestShardedSnapshotRoundTrip(t *testing.T) {
	stream := genStream(7, 600)
	s := newSim(7, 4)
	live := New(Options{Shards: 3})
	must(t, live.AddPartition(testKey, 4))
	half := len(stream) / 2
	for _, b := range stream[:half] {
		_, err := live.Apply(testKey, b.rank, b.seq, b.ops)
		must(t, err)
	}
	snap, err := live.Snapshot(testKey)
	must(t, err)
	shardOf := map[Rank]uint32{}
	for _, w := range snap.Ranks {
		shardOf[w.Rank] = w.Shard
	}
	if len(shardOf) != 4 || len(slices.Compact(slices.Sorted(mapValues(shardOf)))) != 3 {
		t.Fatalf("snapshot ranks' shards %v, want 4 ranks over 3 shards", shardOf)
	}
	for _, shards := range []int{1, 3, 5} {
		restored := New(Options{Shards: shards})
		must(t, restored.Restore(testKey, snap))
		if n, _ := restored.Shards(testKey); n != max(3, shards) {
			t.Fatalf("into %d: %d shards, want %d", shards, n, max(3, shards))
		}
		rp, lp := restored.parts[testKey], live.parts[testKey]
		for r := range shardOf {
			if (*rp.where.Load())[r] != (*lp.where.Load())[r] {
				t.Fatalf("into %d: rank %v in shard %d, was in %d", shards, r, (*rp.where.Load())[r], (*lp.where.Load())[r])
			}
		}
		if got, want := matchAll(t, restored, testKey, s.docs), matchAll(t, live, testKey, s.docs); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("into %d: restored scores differ", shards)
		}
		again, err := restored.Snapshot(testKey)
		must(t, err)
		if fmt.Sprint(again.Ranks) != fmt.Sprint(snap.Ranks) {
			t.Fatalf("into %d: restored partition dumps ranks\n %v\nwas\n %v", shards, again.Ranks, snap.Ranks)
		}
		sameTrees(t, shardTrees(restored, testKey)[:3], shardTrees(live, testKey))
	}
	restored := New(Options{Shards: 1})
	must(t, restored.Restore(testKey, snap))
	for _, b := range stream[half:] {
		_, err := live.Apply(testKey, b.rank, b.seq, b.ops)
		must(t, err)
		_, err = restored.Apply(testKey, b.rank, b.seq, b.ops)
		must(t, err)
	}
	sameTrees(t, shardTrees(restored, testKey), shardTrees(live, testKey))
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestUnshardedSnapshotIntoShards: a dump of one tree (the shape dumps had
// before shards) restores into a sharded index: its ranks stay in shard
// 0, the other shards start empty, and new ranks go to them first.
func TestUnshardedSnapshotIntoShards(t *testing.T) {
	one := New(Options{Shards: 1})
	must(t, one.AddPartition(testKey, 4))
	for i, r := range []Rank{{1, 0}, {2, 0}} {
		_, err := one.Apply(testKey, r, 0, []Op{chainOp(4, uint32(i), 3, uint64(10*i+1))})
		must(t, err)
	}
	snap, err := one.Snapshot(testKey)
	must(t, err)
	for _, w := range snap.Ranks {
		if w.Shard != 0 {
			t.Fatalf("a one-tree dump puts rank %v in shard %d", w.Rank, w.Shard)
		}
	}
	for _, n := range snap.Structural {
		if n.Shard != 0 {
			t.Fatalf("a one-tree dump puts node %d in shard %d", n.Node, n.Shard)
		}
	}
	ix := New(Options{Shards: 3})
	must(t, ix.Restore(testKey, snap))
	if got := ranksPerShard(t, ix, testKey); !slices.Equal(got, []int{2, 0, 0}) {
		t.Fatalf("ranks per shard %v, want [2 0 0]", got)
	}
	for _, r := range []Rank{{3, 0}, {4, 0}} {
		_, err := ix.Apply(testKey, r, 0, []Op{chainOp(4, 5, 2, r.WorkerID*100)})
		must(t, err)
	}
	if got := ranksPerShard(t, ix, testKey); !slices.Equal(got, []int{2, 1, 1}) {
		t.Fatalf("ranks per shard %v, want [2 1 1]", got)
	}
}

// TestRestoreCarriesCapacitiesAcrossShards: a capacity set before a
// restore applies to the restored rank, in whichever shard it lands.
func TestRestoreCarriesCapacitiesAcrossShards(t *testing.T) {
	src := New(Options{Shards: 2})
	must(t, src.AddPartition(testKey, 4))
	for i, r := range []Rank{{1, 0}, {2, 0}} {
		_, err := src.Apply(testKey, r, 0, []Op{chainOp(4, uint32(i), 40, uint64(1000*(i+1)))})
		must(t, err)
	}
	snap, err := src.Snapshot(testKey)
	must(t, err)
	dst := New(Options{Shards: 2})
	must(t, dst.AddPartition(testKey, 4))
	must(t, dst.SetRankCapacity(testKey, Rank{2, 0}, Capacity{TierDevice: 10}))
	must(t, dst.Restore(testKey, snap))
	st, err := dst.Rank(testKey, Rank{2, 0})
	must(t, err)
	if st.Capacity != (Capacity{TierDevice: 10}) || st.Blocks > 10 || !st.Truncated {
		t.Fatalf("rank 2 after restore: %+v, want its capacity of 10 enforced", st)
	}
	if st1, _ := dst.Rank(testKey, Rank{1, 0}); st1.Blocks != 40 {
		t.Fatalf("rank 1 after restore: %+v, want 40 blocks", st1)
	}
	if n, _ := dst.RankCount(testKey); n != 2 {
		t.Fatalf("%d ranks after restore, want 2", n)
	}
	if got, want := dst.Entries(), 40+st.Blocks; got != want {
		t.Fatalf("%d entries counted, the ranks hold %d", got, want)
	}
}

// TestSplitSnapshotRejects: shards out of bounds and ranks in two shards.
func TestSplitSnapshotRejects(t *testing.T) {
	for name, s := range map[string]*Snapshot{
		"rank shard": {BlockSize: 4, Ranks: []RankWatermark{{Rank: Rank{1, 0}, Shard: MaxShards}}},
		"node shard": {BlockSize: 4, Structural: []DumpNode{{Node: 1, Hashes: []uint64{1}, Shard: 1 << 20}}},
		"two shards": {BlockSize: 4, Ranks: []RankWatermark{{Rank: Rank{1, 0}}, {Rank: Rank{1, 0}, Shard: 1}}},
	} {
		err := New(Options{}).Restore(testKey, s)
		if err == nil || !strings.Contains(err.Error(), "shard") {
			t.Errorf("%s: %v, want an error naming the shard", name, err)
		}
		if errors.Is(err, ErrNoPartition) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
