package indexer_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// TestIndexConcurrentWritersMatchModel is the property test with
// concurrent writers: random per-rank streams of stores, offloads,
// removes and clears (drawn and checked against the brute-force model in
// order, as TestTreeMatchesModel does) are then applied to one Index
// partition by one goroutine per rank, in batches of 1 to 4 ops, while a
// matcher and a dumper run; with a write chunk of 1 to 5 blocks, larger
// ops are applied in pieces and the writers' holds interleave. Ranks are independent, so
// the index must end equal to the model whatever the interleaving, and
// every batch's result must count exactly its own skipped blocks.
func TestIndexConcurrentWritersMatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, streams := drawStreams(t)
		w := p.w
		k := indexer.PartitionKey{Model: "m"}
		shards := rapid.IntRange(1, 3).Draw(t, "shards")
		ix := indexer.New(indexer.Options{WriteChunk: rapid.IntRange(1, 5).Draw(t, "chunk"), Shards: shards})
		if err := ix.AddPartition(k, w.bs); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		done := make(chan struct{})
		errs := make(chan error, len(streams)+2)
		for r, ops := range streams {
			sizes := make([]int, 0, len(ops))
			for n := 0; n < len(ops); {
				s := min(len(ops)-n, rapid.IntRange(1, 4).Draw(t, "batch"))
				sizes = append(sizes, s)
				n += s
			}
			p.m.SetWatermark(r, uint64(len(sizes))) // each batch records its seq
			wg.Add(1)
			go func() {
				defer wg.Done()
				seq := uint64(0)
				for _, s := range sizes {
					batch := make([]indexer.Op, s)
					var want uint64
					for i := range s {
						batch[i] = ops[i].op
						want += ops[i].skipped
					}
					ops = ops[s:]
					seq++
					res, err := ix.ApplyBatch(k, r, indexer.Mark{Seq: seq}, batch)
					if err != nil {
						errs <- err
						return
					}
					var got uint64
					for _, n := range res.Skipped {
						got += n
					}
					if got != want {
						errs <- fmt.Errorf("rank %v batch %d: result skipped %d blocks, want %d (errors: %v)", r, seq, got, want, res.Errs)
						return
					}
				}
			}()
		}
		var side sync.WaitGroup
		side.Add(2)
		go func() { // matcher
			defer side.Done()
			var dst []indexer.Overlap
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				var err error
				if dst, err = ix.Match(k, w.local[i%len(w.docs)][0], dst[:0]); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // dumper: every snapshot restores
			defer side.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				s, err := ix.Snapshot(k)
				if err == nil {
					err = indexer.New(indexer.Options{Shards: shards}).Restore(k, s)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
		wg.Wait()
		close(done)
		side.Wait()
		close(errs)
		for err := range errs {
			p.fatalf("%v", err)
		}
		var trees []*indexer.Tree // read after every writer is done
		if err := ix.Read(k, func(tr *indexer.Tree) { trees = append(trees, tr) }); err != nil {
			t.Fatal(err)
		}
		if n, _ := ix.Shards(k); len(trees) != n || n != shards {
			t.Fatalf("%d trees read, %d shards, %d configured", len(trees), n, shards)
		}
		if err := compareShards(trees, p.m, p.probes(), w.ranks); err != nil {
			p.fatalf("after the concurrent replay: %v", err)
		}
	})
}

// streamOp is one op of a rank's stream and the blocks it skips.
type streamOp struct {
	op      indexer.Op
	skipped uint64
}

// drawStreams draws random per-rank streams of stores, offloads, removes
// and clears, checked against the brute-force model in order (as
// TestTreeMatchesModel does); p.m is the model after all of them.
func drawStreams(t *rapid.T) (*propRun, map[indexer.Rank][]streamOp) {
	w := drawWorld(t)
	streams := map[indexer.Rank][]streamOp{}
	p := &propRun{t: t, w: w, tr: indexer.NewTree(w.bs), m: newRefModel(w.bs)}
	var cur *streamOp
	p.record = func(r indexer.Rank, op indexer.Op) {
		streams[r] = append(streams[r], streamOp{op: op})
		cur = &streams[r][len(streams[r])-1]
	}
	before := p.tr.Counts()
	note := func() {
		after := p.tr.Counts()
		for i := range after {
			cur.skipped += after[i] - before[i]
		}
		before = after
	}
	for range rapid.IntRange(50, 150).Draw(t, "ops") {
		switch op := rapid.IntRange(0, 99).Draw(t, "op"); {
		case op < 55:
			p.store()
		case op < 65:
			p.offload()
		case op < 95:
			p.remove()
		default:
			r := p.drawRank("rank")
			p.logf("clear %v", r)
			p.m.Clear(r)
			p.record(r, indexer.Op{Kind: indexer.OpClear})
			p.tr.Clear(r)
		}
		note()
	}
	return p, streams
}

// TestConcurrentMatchesSeeWholeBatches: random per-rank streams (as
// above) are applied to an Index in batches of 1 to 4 ops, one goroutine
// per rank, with a write chunk larger than any batch, so that each batch
// is published whole; two matchers score every probe meanwhile, with no
// lock. Each match must give every rank the overlap the model gives it
// after one of the batches that could be published while the match ran:
// from the last batch applied before the match to the last one started
// before it ended. So a match never sees a batch half applied, nor a mix
// of the views of two publishes, nor anything but the truth of its time.
func TestConcurrentMatchesSeeWholeBatches(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, streams := drawStreams(t)
		probes := p.probes()
		type plan struct {
			r       indexer.Rank
			batches [][]indexer.Op
			// exp[i][j]: the rank's overlap of probe j after i batches
			exp              [][]indexer.Overlap
			started, applied atomic.Int32
		}
		var plans []*plan
		for _, r := range slices.SortedFunc(maps.Keys(streams), cmpRank) {
			pl := &plan{r: r}
			m := newRefModel(p.w.bs)
			expect := func() {
				row := make([]indexer.Overlap, len(probes))
				for j, q := range probes {
					row[j] = rankOverlap(m.Match(q), r)
				}
				pl.exp = append(pl.exp, row)
			}
			expect()
			ops := streams[r]
			for len(ops) > 0 {
				n := min(len(ops), rapid.IntRange(1, 4).Draw(t, "batch"))
				var b []indexer.Op
				for _, so := range ops[:n] {
					b = append(b, so.op)
					switch so.op.Kind {
					case indexer.OpStore:
						m.Store(r, so.op.Store)
					case indexer.OpRemove:
						m.Remove(r, so.op.Remove)
					case indexer.OpClear:
						m.Clear(r)
					}
				}
				ops = ops[n:]
				pl.batches = append(pl.batches, b)
				expect()
			}
			plans = append(plans, pl)
		}
		k := indexer.PartitionKey{Model: "m"}
		ix := indexer.New(indexer.Options{WriteChunk: 1 << 20, Shards: rapid.IntRange(1, 3).Draw(t, "shards")})
		if err := ix.AddPartition(k, p.w.bs); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, len(plans)+2)
		var writers, matchers sync.WaitGroup
		done := make(chan struct{})
		for _, pl := range plans {
			writers.Add(1)
			go func() {
				defer writers.Done()
				for i, b := range pl.batches {
					pl.started.Store(int32(i + 1))
					if _, err := ix.ApplyBatch(k, pl.r, indexer.Mark{Seq: uint64(i + 1)}, b); err != nil {
						errs <- err
						return
					}
					pl.applied.Store(int32(i + 1))
				}
			}()
		}
		for m := range 2 {
			matchers.Add(1)
			go func() {
				defer matchers.Done()
				lo, hi := make([]int32, len(plans)), make([]int32, len(plans))
				var dst []indexer.Overlap
				for i := m; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					j := i % len(probes)
					for x, pl := range plans {
						lo[x] = pl.applied.Load()
					}
					var err error
					if dst, err = ix.Match(k, probes[j], dst[:0]); err != nil {
						errs <- err
						return
					}
					for x, pl := range plans {
						hi[x] = pl.started.Load()
					}
					seen := 0
					for x, pl := range plans {
						got := rankOverlap(dst, pl.r)
						if got.Disk > 0 {
							seen++
						}
						if !slices.Contains(columnOf(pl.exp[lo[x]:hi[x]+1], j), got) {
							errs <- fmt.Errorf("rank %v, probe %x, batches %d–%d applied during the match: %+v, the model's %+v",
								pl.r, probes[j], lo[x], hi[x], got, columnOf(pl.exp[lo[x]:hi[x]+1], j))
							return
						}
					}
					if seen != len(dst) {
						errs <- fmt.Errorf("probe %x: %d overlaps, %d of known ranks: %+v", probes[j], len(dst), seen, dst)
						return
					}
				}
			}()
		}
		writers.Wait()
		close(done)
		matchers.Wait()
		close(errs)
		for err := range errs {
			p.fatalf("%v", err)
		}
	})
}

// rankOverlap returns r's overlap in os, or r's zero overlap.
func rankOverlap(os []indexer.Overlap, r indexer.Rank) indexer.Overlap {
	for _, o := range os {
		if o.Rank == r {
			return o
		}
	}
	return indexer.Overlap{Rank: r}
}

// columnOf returns column j of rows.
func columnOf(rows [][]indexer.Overlap, j int) []indexer.Overlap {
	out := make([]indexer.Overlap, len(rows))
	for i, row := range rows {
		out[i] = row[j]
	}
	return out
}

// TestSnapshotConsistentWhileWriting: batch i of each rank stores a chain
// of 3 × DefaultWriteChunk + 5 blocks (applied in pieces, the write lock released
// between them) and removes batch i−1's chain, so after any whole number of
// batches a rank holds exactly one chain, the one its watermark names.
// Snapshots taken while four ranks write concurrently must show exactly
// that for every rank: never a batch half applied.
func TestSnapshotConsistentWhileWriting(t *testing.T) {
	const bs, batches = 4, 40
	n := 3*indexer.DefaultWriteChunk + 5
	k := indexer.PartitionKey{Model: "m"}
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(k, bs); err != nil {
		t.Fatal(err)
	}
	ranks := []indexer.Rank{{WorkerID: 1}, {WorkerID: 2}, {WorkerID: 3}, {WorkerID: 3, DPRank: 1}}
	chain := func(r indexer.Rank, i int) indexer.Stored {
		s := indexer.Stored{BlockSize: bs, Seed: indexer.BaseSeed}
		for j := range n {
			s.Hashes = append(s.Hashes, uint64(r.WorkerID)<<40|uint64(r.DPRank)<<32|uint64(i)<<16|uint64(j)+1)
			s.Tokens = append(s.Tokens, uint32(i), uint32(j), uint32(r.WorkerID), uint32(r.DPRank))
		}
		return s
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ranks)+1)
	for _, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= batches; i++ {
				ops := []indexer.Op{{Kind: indexer.OpStore, Store: chain(r, i)}}
				if i > 1 {
					prev := chain(r, i-1).Hashes
					slices.Reverse(prev) // tail first, as an engine evicts
					ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: prev}})
				}
				// Three unknown blocks: the result must count them, and
				// only them, whatever the other writers skipped meanwhile.
				ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{7, 8, 9}}})
				res, err := ix.ApplyBatch(k, r, indexer.Mark{Seq: uint64(i)}, ops)
				if err == nil && (res.Skipped[indexer.ReasonBlockNotFound] != 3 || len(res.Errs) != 1) {
					err = fmt.Errorf("rank %v batch %d: skipped %v, errors %v", r, i, res.Skipped, res.Errs)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	check := func(s *indexer.Snapshot) error {
		tr, err := indexer.Restore(s)
		if err != nil {
			return err
		}
		for _, r := range ranks {
			seq, ok := tr.Watermark(r)
			if !ok {
				if tr.RankBlocks(r) != 0 {
					return fmt.Errorf("rank %v: %d blocks and no watermark", r, tr.RankBlocks(r))
				}
				continue
			}
			c := chain(r, int(seq))
			if got := tr.RankBlocks(r); got != n {
				return fmt.Errorf("rank %v at watermark %d: %d blocks, want its chain's %d", r, seq, got, n)
			}
			if ov := match(tr, indexer.HashBlocks(nil, c.Tokens, bs, indexer.BaseSeed)); len(ov) != 1 || ov[0].Rank != r || ov[0].Device != uint32(n) {
				return fmt.Errorf("rank %v at watermark %d: its chain matches %v", r, seq, ov)
			}
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 300 {
			s, err := ix.Snapshot(k)
			if err == nil {
				err = check(s)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	<-done
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s, err := ix.Snapshot(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(s); err != nil {
		t.Fatal(err)
	}
}
