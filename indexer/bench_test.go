package indexer_test

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

// The benchmark index: workload.DefaultConfig (64 ranks, 16-token blocks,
// ≥ 1,000,000 (block, rank) entries, then 1,000,000 blocks of churn with
// full caches), built once per process and shared by the read-only
// benchmarks.
var bench struct {
	once sync.Once
	w    *workload.Workload
	tree *indexer.Tree
	err  error
}

func benchIndex(b *testing.B) (*workload.Workload, *indexer.Tree) {
	b.Helper()
	bench.once.Do(func() {
		bench.w, bench.err = workload.Generate(workload.DefaultConfig())
		if bench.err != nil {
			return
		}
		bench.tree, bench.err = build(bench.w.BlockSize, bench.w.Events)
		if bench.err != nil {
			return
		}
		bench.err = checkLong(bench.tree, bench.w)
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return bench.w, bench.tree
}

// build applies events to a new tree; any skipped block is an error.
func build(blockSize int, events []workload.Event) (*indexer.Tree, error) {
	t := indexer.NewTree(blockSize)
	if err := apply(t, events); err != nil {
		return nil, err
	}
	return t, nil
}

func apply(t *indexer.Tree, events []workload.Event) error {
	for i, e := range events {
		if err := t.Apply(e.Rank, e.Op); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// checkLong checks that Match reports exactly the workload's holders of
// each long prompt.
func checkLong(t *indexer.Tree, w *workload.Workload) error {
	for i, p := range w.Long {
		ov := t.Match(indexer.HashBlocks(nil, p.Tokens, w.BlockSize, indexer.BaseSeed), nil)
		got := make([]workload.Hold, 0, len(ov))
		for _, o := range ov {
			got = append(got, workload.Hold{Rank: o.Rank, Blocks: int(o.Disk)})
		}
		slices.SortFunc(got, func(a, b workload.Hold) int {
			return cmp.Or(cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID), cmp.Compare(a.Rank.DPRank, b.Rank.DPRank))
		})
		if !slices.Equal(got, p.Holders) {
			return fmt.Errorf("long prompt %d: Match %v, want %v", i, got, p.Holders)
		}
	}
	return nil
}

func longTokens(w *workload.Workload) [][]uint32 {
	var out [][]uint32
	for _, p := range w.Long {
		out = append(out, p.Tokens)
	}
	return out
}

// BenchmarkHash8192 hashes an 8,192-token prompt into 512 local block
// hashes: the floor of any score.
func BenchmarkHash8192(b *testing.B) {
	w, _ := benchIndex(b)
	prompts := longTokens(w)
	h := make([]uint64, 0, 512)
	b.SetBytes(int64(4 * len(prompts[0])))
	i := 0
	for b.Loop() {
		h = indexer.HashBlocks(h[:0], prompts[i%len(prompts)], w.BlockSize, indexer.BaseSeed)
		i++
	}
}

// BenchmarkScore8192 hashes and matches 8,192-token prompts that several
// ranks hold completely (and dozens hold the system-prompt prefix of). It
// also times 10,000 single scores and hashes, interleaved, and reports
// their p50 and p99 and x-hash = p50(score) / p50(hash).
func BenchmarkScore8192(b *testing.B) {
	w, tree := benchIndex(b)
	prompts := longTokens(w)
	h := make([]uint64, 0, 512)
	var dst []indexer.Overlap
	i := 0
	for b.Loop() {
		h = indexer.HashBlocks(h[:0], prompts[i%len(prompts)], w.BlockSize, indexer.BaseSeed)
		dst = tree.Match(h, dst[:0])
		i++
	}
	const samples = 10000
	score := make([]time.Duration, samples)
	hash := make([]time.Duration, samples)
	for i := range samples {
		p := prompts[i%len(prompts)]
		doHash := func() {
			t0 := time.Now()
			h = indexer.HashBlocks(h[:0], p, w.BlockSize, indexer.BaseSeed)
			hash[i] = time.Since(t0)
		}
		doScore := func() {
			t0 := time.Now()
			h = indexer.HashBlocks(h[:0], p, w.BlockSize, indexer.BaseSeed)
			dst = tree.Match(h, dst[:0])
			score[i] = time.Since(t0)
		}
		if i%2 == 0 {
			doHash()
			doScore()
		} else {
			doScore()
			doHash()
		}
	}
	slices.Sort(score)
	slices.Sort(hash)
	b.ReportMetric(float64(score[samples/2]), "p50-ns")
	b.ReportMetric(float64(score[samples*99/100]), "p99-ns")
	b.ReportMetric(float64(hash[samples/2]), "hash-p50-ns")
	b.ReportMetric(float64(score[samples/2])/float64(hash[samples/2]), "x-hash")
	b.ReportMetric(float64(len(dst)), "ranks")
}

// BenchmarkMatchOnly8192 matches pre-hashed 8,192-token prompts.
func BenchmarkMatchOnly8192(b *testing.B) {
	w, tree := benchIndex(b)
	var hashed [][]uint64
	for _, p := range longTokens(w) {
		hashed = append(hashed, indexer.HashBlocks(nil, p, w.BlockSize, indexer.BaseSeed))
	}
	var dst []indexer.Overlap
	i := 0
	for b.Loop() {
		dst = tree.Match(hashed[i%len(hashed)], dst[:0])
		i++
	}
}

// BenchmarkScoreMixed hashes and matches workload.Queries: full hits,
// next-turn partial hits and misses of 64 to 16k tokens.
func BenchmarkScoreMixed(b *testing.B) {
	w, tree := benchIndex(b)
	queries := w.Queries(4096)
	tokens := 0
	for _, q := range queries {
		tokens += len(q)
	}
	var h []uint64
	var dst []indexer.Overlap
	i := 0
	for b.Loop() {
		h = indexer.HashBlocks(h[:0], queries[i%len(queries)], w.BlockSize, indexer.BaseSeed)
		dst = tree.Match(h, dst[:0])
		i++
	}
	b.ReportMetric(float64(tokens)/float64(len(queries)), "tokens/query")
}

// blockOps counts the blocks that events store and remove.
func blockOps(events []workload.Event) (stored, removed int) {
	for _, e := range events {
		switch e.Op.Kind {
		case indexer.OpStore:
			stored += len(e.Op.Store.Hashes)
		case indexer.OpRemove:
			removed += len(e.Op.Remove.Hashes)
		}
	}
	return stored, removed
}

// BenchmarkApply replays the benchmark workload into a fresh tree, one
// iteration per replay (generation excluded): fill is the events until
// 1,000,000 entries (nearly all stores), churn the rest applied to the
// filled tree (stores and evictions at full caches; building the filled
// tree is not timed), all both. blocks/s counts stored and removed blocks.
func BenchmarkApply(b *testing.B) {
	w, _ := benchIndex(b)
	fill, rest := w.Events[:w.FillEvents], w.Events[w.FillEvents:]
	run := func(b *testing.B, setup, events []workload.Event) {
		stored, removed := blockOps(events)
		var elapsed time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			t, err := build(w.BlockSize, setup)
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			b.StartTimer()
			t0 := time.Now()
			if err := apply(t, events); err != nil {
				b.Fatal(err)
			}
			elapsed += time.Since(t0)
		}
		sec := elapsed.Seconds()
		b.ReportMetric(float64(b.N*(stored+removed))/sec, "blocks/s")
		b.ReportMetric(float64(b.N*len(events))/sec, "events/s")
		b.ReportMetric(float64(stored)/float64(stored+removed), "store-share")
	}
	b.Run("fill", func(b *testing.B) { run(b, nil, fill) })
	b.Run("churn", func(b *testing.B) { run(b, fill, rest) })
	b.Run("all", func(b *testing.B) { run(b, nil, w.Events) })
}

// heapAfterGC returns the live heap after two collections.
func heapAfterGC() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// measureTree builds a tree from events and returns it with the live heap
// it added (the events themselves exist before and after).
func measureTree(b *testing.B, blockSize int, events []workload.Event) (*indexer.Tree, int64) {
	base := heapAfterGC()
	t, err := build(blockSize, events)
	if err != nil {
		b.Fatal(err)
	}
	delta := heapAfterGC() - base
	runtime.KeepAlive(events)
	return t, delta
}

func reportMemory(b *testing.B, s indexer.TreeStats, heap int64) {
	b.ReportMetric(float64(heap)/float64(s.Entries), "B/entry")
	b.ReportMetric(float64(heap)/float64(s.Blocks), "B/block")
	b.ReportMetric(float64(s.Bytes)/float64(heap), "est-ratio")
	b.ReportMetric(float64(s.Entries), "entries")
	b.ReportMetric(float64(s.Blocks), "blocks")
	b.ReportMetric(float64(s.Nodes), "nodes")
}

// BenchmarkMemory measures the live heap of the benchmark index after the
// fill and after the whole workload (churn leaves the tree shaped by
// evictions). B/entry is per (block, rank) entry, B/block per distinct
// block; est-ratio is Tree.Stats().Bytes over the measured heap.
func BenchmarkMemory(b *testing.B) {
	w, _ := benchIndex(b)
	for _, c := range []struct {
		name   string
		events []workload.Event
	}{{"fill", w.Events[:w.FillEvents]}, {"all", w.Events}} {
		b.Run(c.name, func(b *testing.B) {
			var t *indexer.Tree
			var heap int64
			for b.Loop() {
				t, heap = measureTree(b, w.BlockSize, c.events)
			}
			reportMemory(b, t.Stats(), heap)
		})
	}
}

// BenchmarkMemoryShards measures the live heap of the whole benchmark
// workload in one Index partition of 1, 2, 4 and 8 shards: a prefix that
// ranks in several shards hold is stored once per shard, so B/entry grows
// with the shards.
func BenchmarkMemoryShards(b *testing.B) {
	w, _ := benchIndex(b)
	k := indexer.PartitionKey{Model: "m"}
	for _, shards := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			var st indexer.PartitionStats
			var heap int64
			for b.Loop() {
				base := heapAfterGC()
				ix := indexer.New(indexer.Options{Shards: shards})
				if err := ix.AddPartition(k, w.BlockSize); err != nil {
					b.Fatal(err)
				}
				for i, e := range w.Events {
					if _, err := ix.ApplyBatch(k, e.Rank, indexer.Mark{Seq: uint64(i)}, []indexer.Op{e.Op}); err != nil {
						b.Fatal(err)
					}
				}
				heap = heapAfterGC() - base
				st = ix.Stats()[0]
				runtime.KeepAlive(ix)
			}
			b.ReportMetric(float64(heap)/float64(st.Entries), "B/entry")
			b.ReportMetric(float64(st.Bytes)/float64(heap), "est-ratio")
			b.ReportMetric(float64(st.Nodes), "nodes")
		})
	}
}

// The llm-d comparison index (the workload of docs/benchmarks.md, "Against peers"), built once per process.
var llmd struct {
	once sync.Once
	w    *workload.Workload
	tree *indexer.Tree
	heap int64
	err  error
}

func llmdIndex(b *testing.B) (*workload.Workload, *indexer.Tree) {
	b.Helper()
	llmd.once.Do(func() {
		llmd.w = workload.LLMDCompare(1)
		base := heapAfterGC()
		llmd.tree, llmd.err = build(llmd.w.BlockSize, llmd.w.Events)
		llmd.heap = heapAfterGC() - base
		if llmd.err == nil {
			llmd.err = checkLong(llmd.tree, llmd.w)
		}
	})
	if llmd.err != nil {
		b.Fatal(llmd.err)
	}
	return llmd.w, llmd.tree
}

// BenchmarkLLMDCompareScore hashes and matches the 8,192-token prompt of
// the llm-d comparison workload (ranks hold 64, 128, …, 512 of its blocks,
// checked once) and reports the index's heap per entry.
func BenchmarkLLMDCompareScore(b *testing.B) {
	w, tree := llmdIndex(b)
	p := w.Long[0].Tokens
	for i, h := range w.Long[0].Holders {
		if h.Blocks != workload.LLMDStep*(i+1) {
			b.Fatalf("truth: rank %v holds %d blocks, want %d", h.Rank, h.Blocks, workload.LLMDStep*(i+1))
		}
	}
	h := make([]uint64, 0, 512)
	var dst []indexer.Overlap
	for b.Loop() {
		h = indexer.HashBlocks(h[:0], p, w.BlockSize, indexer.BaseSeed)
		dst = tree.Match(h, dst[:0])
	}
	reportMemory(b, tree.Stats(), llmd.heap)
}

// BenchmarkLLMDCompareMatchOnly matches the pre-hashed llm-d prompt.
func BenchmarkLLMDCompareMatchOnly(b *testing.B) {
	w, tree := llmdIndex(b)
	h := indexer.HashBlocks(nil, w.Long[0].Tokens, w.BlockSize, indexer.BaseSeed)
	var dst []indexer.Overlap
	for b.Loop() {
		dst = tree.Match(h, dst[:0])
	}
}

// BenchmarkLLMDCompareAdd16 stores one parentless 16-block chain of new
// random tokens into a private copy of the llm-d index (llm-d: 46.9 µs).
// Drawing the 256 tokens is timed too; gen-ns reports its share.
func BenchmarkLLMDCompareAdd16(b *testing.B) {
	w, _ := llmdIndex(b)
	tree, err := build(w.BlockSize, w.Events)
	if err != nil {
		b.Fatal(err)
	}
	var x uint64 = 0x9e3779b97f4a7c15
	tokens := make([]uint32, 16*w.BlockSize)
	draw := func() {
		for j := range tokens {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			tokens[j] = uint32(x % 128256)
		}
	}
	hashes := make([]uint64, 16)
	var n uint64
	op := 0
	for b.Loop() {
		draw()
		for j := range hashes {
			n++
			hashes[j] = n<<8 | 0xad // distinct from the workload's hashes with overwhelming probability
		}
		st := indexer.Stored{Hashes: hashes, Tokens: tokens, BlockSize: w.BlockSize, Seed: indexer.BaseSeed}
		op++
		if err := tree.Store(w.Ranks[op%len(w.Ranks)], st); err != nil {
			b.Fatal(err)
		}
	}
	const reps = 100000
	t0 := time.Now()
	for range reps {
		draw()
	}
	b.ReportMetric(float64(time.Since(t0).Nanoseconds())/reps, "gen-ns")
}

// BenchmarkEvictSharedPrefix evicts, tail first and one block per event as
// a full vLLM cache does, an L-block prefix (a system prompt) that H ranks
// hold, from one of them. ns/block is the cost of one evicted block; it
// should not grow with L. Re-storing the prefix between iterations is not
// timed.
func BenchmarkEvictSharedPrefix(b *testing.B) {
	for _, c := range []struct{ holders, blocks int }{{1, 256}, {8, 64}, {8, 256}, {64, 64}, {64, 256}} {
		b.Run(fmt.Sprintf("H=%d/L=%d", c.holders, c.blocks), func(b *testing.B) {
			const bs = 16
			tree := indexer.NewTree(bs)
			tokens := make([]uint32, c.blocks*bs)
			for i := range tokens {
				tokens[i] = uint32(i*7919 + 1)
			}
			hashes := func(r int) []uint64 {
				h := make([]uint64, c.blocks)
				for i := range h {
					h[i] = uint64(r)<<32 | uint64(i+1)
				}
				return h
			}
			store := func(r int) {
				st := indexer.Stored{Hashes: hashes(r), Tokens: tokens, BlockSize: bs, Seed: indexer.BaseSeed}
				if err := tree.Store(indexer.Rank{WorkerID: uint64(r)}, st); err != nil {
					b.Fatal(err)
				}
			}
			for r := range c.holders {
				store(r)
			}
			victim := hashes(0)
			rm := indexer.Removed{Hashes: make([]uint64, 1)}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := c.blocks - 1; j >= 0; j-- {
					rm.Hashes[0] = victim[j]
					if err := tree.Remove(indexer.Rank{}, rm); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				store(0)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.blocks), "ns/block")
		})
	}
}

// BenchmarkJoinSharedPrefix stores, in chained stores of C blocks, an
// L-block prefix that H other ranks already hold (a rank prefilling a
// popular prompt in chunks, or decoding along a cached path when C = 1).
// ns/block should not grow with L. Removing the joined rank between
// iterations is not timed.
func BenchmarkJoinSharedPrefix(b *testing.B) {
	for _, c := range []struct{ holders, blocks, chunk int }{{8, 256, 16}, {64, 256, 16}, {64, 256, 1}, {64, 512, 16}} {
		b.Run(fmt.Sprintf("H=%d/L=%d/C=%d", c.holders, c.blocks, c.chunk), func(b *testing.B) {
			const bs = 16
			tree := indexer.NewTree(bs)
			tokens := make([]uint32, c.blocks*bs)
			for i := range tokens {
				tokens[i] = uint32(i*7919 + 1)
			}
			hashes := func(r int) []uint64 {
				h := make([]uint64, c.blocks)
				for i := range h {
					h[i] = uint64(r)<<32 | uint64(i+1)
				}
				return h
			}
			for r := 1; r <= c.holders; r++ {
				st := indexer.Stored{Hashes: hashes(r), Tokens: tokens, BlockSize: bs, Seed: indexer.BaseSeed}
				if err := tree.Store(indexer.Rank{WorkerID: uint64(r)}, st); err != nil {
					b.Fatal(err)
				}
			}
			joiner := hashes(0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for from := 0; from < c.blocks; from += c.chunk {
					st := indexer.Stored{
						Hashes: joiner[from : from+c.chunk], Tokens: tokens[from*bs : (from+c.chunk)*bs],
						BlockSize: bs, Seed: indexer.BaseSeed,
					}
					if from > 0 {
						st.Parent, st.HasParent = joiner[from-1], true
					}
					if err := tree.Store(indexer.Rank{}, st); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				tree.RemoveRank(indexer.Rank{})
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.blocks), "ns/block")
		})
	}
}

// indexBatches groups the workload's events into engine batches of up to
// four consecutive ops of one rank, as a vLLM publisher batches them.
func indexBatches(events []workload.Event) (ranks []indexer.Rank, batches [][]indexer.Op) {
	for i := 0; i < len(events); {
		r := events[i].Rank
		ops := []indexer.Op{events[i].Op}
		for i++; i < len(events) && len(ops) < 4 && events[i].Rank == r; i++ {
			ops = append(ops, events[i].Op)
		}
		ranks, batches = append(ranks, r), append(batches, ops)
	}
	return ranks, batches
}

// BenchmarkIndexApply replays the whole benchmark workload through
// Index.Apply (locking, watermarks and the memory cap included), one
// iteration per replay into a fresh index: uncapped; capped at 750,000
// entries in one partition (the cap evicts through the fill and the
// churn); and capped with the ranks spread over four partitions.
func BenchmarkIndexApply(b *testing.B) {
	w, _ := benchIndex(b)
	ranks, batches := indexBatches(w.Events)
	stored, removed := blockOps(w.Events)
	for _, c := range []struct {
		name  string
		cap   int
		parts int
	}{{"uncapped", 0, 1}, {"capped", 750_000, 1}, {"capped-4parts", 750_000, 4}} {
		b.Run(c.name, func(b *testing.B) {
			keys := make([]indexer.PartitionKey, c.parts)
			for i := range keys {
				keys[i] = indexer.PartitionKey{Model: fmt.Sprintf("m%d", i), Group: "default"}
			}
			var elapsed time.Duration
			var evicted uint64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ix := indexer.New(indexer.Options{MaxEntries: c.cap})
				for _, k := range keys {
					if err := ix.AddPartition(k, w.BlockSize); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				b.StartTimer()
				t0 := time.Now()
				for j, ops := range batches {
					r := ranks[j]
					res, err := ix.Apply(keys[int(r.WorkerID)%c.parts], r, uint64(j), ops)
					if err != nil {
						b.Fatal(err)
					}
					evicted += res.Skipped[indexer.ReasonEvicted]
				}
				elapsed += time.Since(t0)
			}
			sec := elapsed.Seconds()
			b.ReportMetric(float64(b.N*(stored+removed))/sec, "blocks/s")
			b.ReportMetric(float64(evicted)/float64(b.N), "evicted/op")
		})
	}
}

// BenchmarkDump dumps the benchmark index (1,048,576 entries) as a
// Snapshot, one iteration per dump. snapshot-B/entry is the live heap of
// the Snapshot, the one large allocation of a /dump. Its JSON is
// internal/apiserver's BenchmarkWriteSnapshot.
func BenchmarkDump(b *testing.B) {
	_, tree := benchIndex(b)
	entries := tree.Stats().Entries
	base := heapAfterGC()
	s := tree.Dump()
	snapBytes := heapAfterGC() - base
	runtime.KeepAlive(s)
	s = nil
	b.ReportAllocs()
	for b.Loop() {
		tree.Dump() // b.Loop keeps the result
	}
	b.ReportMetric(float64(snapBytes)/float64(entries), "snapshot-B/entry")
}

// The hybrid benchmark index: a smaller workload (100,000 entries, 100,000
// blocks of churn, the same long prompts) as a Gemma 3 engine would
// publish it: every store and remove in five sliding-window groups
// (0..4, 1,024-token windows: a hit needs 64 blocks before its end) and
// the full-attention group 5, which the tree holds.
var benchHybrid struct {
	once sync.Once
	w    *workload.Workload
	tree *indexer.Tree
	err  error
}

func hybridIndex(b *testing.B) (*workload.Workload, *indexer.Tree) {
	b.Helper()
	benchHybrid.once.Do(func() {
		cfg := workload.DefaultConfig()
		cfg.TargetEntries, cfg.ChurnBlocks = 100_000, 100_000
		w, err := workload.Generate(cfg)
		if err != nil {
			benchHybrid.err = err
			return
		}
		t := indexer.NewTree(w.BlockSize)
		for i, e := range w.Events {
			for g := 0; g <= 5; g++ {
				op := e.Op
				op.Group = indexer.Group{Idx: g, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 1024}
				if g == 5 {
					op.Group = indexer.Group{Idx: g, Kind: "full_attention"}
				}
				if err := t.Apply(e.Rank, op); err != nil {
					benchHybrid.err = fmt.Errorf("event %d group %d: %w", i, g, err)
					return
				}
			}
		}
		benchHybrid.w, benchHybrid.tree = w, t
	})
	if benchHybrid.err != nil {
		b.Fatal(benchHybrid.err)
	}
	return benchHybrid.w, benchHybrid.tree
}

// BenchmarkMatchHybrid8192 matches pre-hashed 8,192-token prompts that 8
// ranks of the hybrid index hold whole: each rank's grant reads its five
// sliding-window groups' last 64 blocks.
func BenchmarkMatchHybrid8192(b *testing.B) {
	w, tree := hybridIndex(b)
	var hashed [][]uint64
	for _, p := range longTokens(w) {
		hashed = append(hashed, indexer.HashBlocks(nil, p, w.BlockSize, indexer.BaseSeed))
	}
	dst := tree.Match(hashed[0], nil)
	granted := 0
	for _, o := range dst {
		if o.Device == o.Upper && o.Upper == 512 {
			granted++
		}
	}
	if granted < 8 {
		b.Fatalf("%d ranks granted the whole prompt, want at least 8: %v", granted, dst)
	}
	i := 0
	for b.Loop() {
		dst = tree.Match(hashed[i%len(hashed)], dst[:0])
		i++
	}
	b.ReportMetric(float64(len(dst)), "ranks")
}
