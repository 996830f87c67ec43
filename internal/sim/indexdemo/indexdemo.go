package indexdemo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// Options configure a run. The zero value is not valid; use NewOptions.
type Options struct {
	Seed          uint64
	Workers       int
	TargetEntries int
	ChurnBlocks   int
	Queries       int
	Era           wire.Era
}

// NewOptions returns the defaults: the benchmark workload (64 workers,
// 1M entries plus 1M blocks of churn) and 20,000 scoring queries.
func NewOptions() Options {
	c := workload.DefaultConfig()
	return Options{Seed: c.Seed, Workers: c.Workers, TargetEntries: c.TargetEntries, ChurnBlocks: c.ChurnBlocks, Queries: 20000}
}

func (o Options) config() workload.Config {
	c := workload.DefaultConfig()
	c.Seed, c.Workers, c.TargetEntries, c.ChurnBlocks = o.Seed, o.Workers, o.TargetEntries, o.ChurnBlocks
	return c
}

// Validate reports options that cannot run.
func (o Options) Validate() error {
	if o.Queries < 1 {
		return fmt.Errorf("queries %d must be positive", o.Queries)
	}
	return o.config().Validate()
}

// ErrMismatch means the index disagreed with the workload's truth.
var ErrMismatch = fmt.Errorf("index disagrees with the engines' caches")

// Payload is one encoded engine batch of a workload: what rank Rank would
// publish as batch Seq, and how many blocks it stores or removes.
type Payload struct {
	Rank   indexer.Rank
	Seq    uint64
	Bytes  []byte
	Blocks int
}

// Run executes the demo, writing progress and the report to out. It
// returns ErrMismatch (wrapped) if any check of the index against the
// engines' true caches fails.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	p := func(format string, args ...any) { fmt.Fprintf(out, format, args...) }
	cfg := o.config()
	p("prefixd index demo — the event codec and prefix index on a simulated fleet\n")
	p("(the index alone, in one process: `prefixd demo` runs the whole system, with etcd, ZMQ streams and the API)\n\n")

	p("[1/6] generating the workload: %d workers, %d system prompts, chats with forks, LRU caches of %d blocks per rank\n",
		cfg.Workers, cfg.SystemPrompts, cfg.RankCapacityBlocks)
	t0 := time.Now()
	w, err := workload.Generate(cfg)
	if err != nil {
		return err
	}
	p("      %d events (%d stores, %d removes), %d conversations, %d turns, in %v\n",
		len(w.Events), w.Stats.StoreEvents, w.Stats.RemoveEvents, w.Stats.Conversations, w.Stats.Turns, since(t0))
	if err := ctx.Err(); err != nil {
		return err
	}

	p("[2/6] encoding every engine step as a vLLM %v-era KVEventBatch (msgpack)\n", o.Era)
	t0 = time.Now()
	stream, totalBytes, err := Encode(w, o.Era)
	if err != nil {
		return err
	}
	p("      %d batches, %.1f MB, in %v\n", len(stream), float64(totalBytes)/1e6, since(t0))

	p("[3/6] ingesting: decode → filter → apply, one engine batch at a time\n")
	key := indexer.PartitionKey{Model: "demo-model", Group: "default"}
	// One tree: the demo ingests on one goroutine, and its checks count
	// distinct blocks, which shards would count once per shard.
	ix := indexer.New(indexer.Options{Shards: 1})
	if err := ix.AddPartition(key, cfg.BlockSize); err != nil {
		return err
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var dec wire.Decoder
	var batch wire.Batch
	var ops []indexer.Op
	var filtered [wire.NumFilters]uint64
	var skipped [indexer.NumReasons]uint64
	blocks := 0
	t0 = time.Now()
	for i, b := range stream {
		if i%(len(stream)/10+1) == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			p("      %3d%%  %d batches\n", 100*i/len(stream), i)
		}
		if err := dec.Decode(b.Bytes, &batch); err != nil {
			return fmt.Errorf("decode batch %d: %w", i, err)
		}
		ops = wire.AppendOps(ops[:0], &batch, &filtered)
		res, err := ix.Apply(key, b.Rank, b.Seq, ops)
		if err != nil {
			return err
		}
		for r, n := range res.Skipped {
			skipped[r] += n
		}
		blocks += b.Blocks
	}
	ingest := time.Since(t0)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(stream)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	p("      100%%  %d blocks in %v: %.2fM blocks/s, %.0fk batches/s\n", blocks, ingest.Round(time.Millisecond),
		float64(blocks)/ingest.Seconds()/1e6, float64(len(stream))/ingest.Seconds()/1e3)

	p("[4/6] checking the index against every engine's true cache\n")
	st := ix.Stats()[0]
	mismatches := 0
	if st.Entries != w.Stats.Entries || st.Blocks != w.Stats.Blocks {
		p("      MISMATCH: index holds %d entries / %d blocks, engines %d / %d\n", st.Entries, st.Blocks, w.Stats.Entries, w.Stats.Blocks)
		mismatches++
	}
	queries := w.Queries(o.Queries)
	for _, lp := range w.Long {
		queries = append(queries, lp.Tokens)
	}
	var dst []indexer.Overlap
	for _, q := range queries {
		dst, err = ix.MatchTokens(key, q, indexer.BaseSeed, dst[:0])
		if err != nil {
			return err
		}
		if !sameAsTruth(dst, w.Holders(q)) {
			mismatches++
		}
	}
	if mismatches > 0 {
		return fmt.Errorf("%d of %d checks failed: %w", mismatches, len(queries)+1, ErrMismatch)
	}
	p("      exact: %d entries, %d blocks, and all %d queries score every rank exactly\n", st.Entries, st.Blocks, len(queries))

	p("[5/6] scoring: hash + match, %d queries (%d tokens on average), then the 8,192-token prompts\n", len(queries), avgLen(queries))
	lat := make([]time.Duration, 0, len(queries))
	for _, q := range queries {
		s := time.Now()
		dst, _ = ix.MatchTokens(key, q, indexer.BaseSeed, dst[:0])
		lat = append(lat, time.Since(s))
	}
	var long []time.Duration
	for range 200 {
		for _, lp := range w.Long {
			s := time.Now()
			dst, _ = ix.MatchTokens(key, lp.Tokens, indexer.BaseSeed, dst[:0])
			long = append(long, time.Since(s))
		}
	}

	p("[6/6] snapshot: dump as Dynamo-shaped JSON, restore into a fresh index, compare\n")
	t0 = time.Now()
	snap, err := ix.Snapshot(key)
	if err != nil {
		return err
	}
	raw, err := apiserver.MarshalSnapshot(snap)
	if err != nil {
		return err
	}
	back, err := apiserver.UnmarshalSnapshot(raw)
	if err != nil {
		return err
	}
	restored := indexer.New(indexer.Options{Shards: 1})
	if err := restored.Restore(key, back); err != nil {
		return err
	}
	snapTime := since(t0)
	for _, lp := range w.Long {
		a, _ := ix.MatchTokens(key, lp.Tokens, indexer.BaseSeed, nil)
		b, _ := restored.MatchTokens(key, lp.Tokens, indexer.BaseSeed, nil)
		sortOverlaps(a)
		sortOverlaps(b)
		if !slices.Equal(a, b) {
			return fmt.Errorf("restored snapshot scores differently: %w", ErrMismatch)
		}
	}
	rs := restored.Stats()[0]
	if rs.Entries != st.Entries || rs.Blocks != st.Blocks || rs.Nodes != st.Nodes {
		return fmt.Errorf("restored snapshot has %+v, live index %+v: %w", rs.TreeStats, st.TreeStats, ErrMismatch)
	}

	p("\n=== report ===\n")
	p("fleet            %d ranks, block size %d, %d-block LRU cache per rank\n", len(w.Ranks), cfg.BlockSize, cfg.RankCapacityBlocks)
	p("events           %d batches, %d blocks stored, %d removed\n", len(stream), w.Stats.StoredBlocks, w.Stats.RemovedBlocks)
	p("ingest           %.2fM blocks/s (decode + filter + apply, one core)\n", float64(blocks)/ingest.Seconds()/1e6)
	p("index            %d (block, rank) entries, %d distinct blocks, %d edges\n", st.Entries, st.Blocks, st.Nodes)
	p("memory           %.1f MB heap after GC = %.1f B per entry (estimate %.1f MB)\n", float64(heap)/1e6, float64(heap)/float64(st.Entries), float64(st.Bytes)/1e6)
	latQ, longQ := quantile.Of(lat), quantile.Of(long)
	p("score, all       p50 %v  p99 %v  (%d queries, hash + match)\n", pct(latQ, 0.5), pct(latQ, 0.99), len(lat))
	p("score, 8k tokens p50 %v  p99 %v\n", pct(longQ, 0.5), pct(longQ, 0.99))
	p("snapshot         %.1f MB JSON, %d store events, dump+restore %v\n", float64(len(raw))/1e6, len(snap.Events), snapTime)
	p("dropped          ")
	any := false
	for r, n := range skipped {
		if n > 0 {
			p("%v=%d ", indexer.Reason(r), n)
			any = true
		}
	}
	for f, n := range filtered {
		if n > 0 {
			p("%v=%d ", wire.Filter(f), n)
			any = true
		}
	}
	if !any {
		p("none")
	}
	p("\nverdict          index == engine truth for every rank (%d queries checked)\n", len(queries))
	return nil
}

// Encode turns a workload's events into vLLM KVEventBatch payloads of the
// given era, one batch per engine step (up to 4 consecutive events of one
// rank), with per-rank sequence numbers from 0. It returns the payloads and
// their total size in bytes.
func Encode(w *workload.Workload, era wire.Era) ([]Payload, int, error) {
	enc := wire.Encoder{Era: era, Wide: era == wire.EraArray}
	var batch wire.Batch
	var out []Payload
	total := 0
	seqs := map[indexer.Rank]uint64{}
	var cur Payload
	flush := func() error {
		if len(batch.Events) == 0 {
			return nil
		}
		b, err := enc.AppendBatch(nil, &batch)
		if err != nil {
			return err
		}
		cur.Bytes, cur.Seq = b, seqs[cur.Rank]
		seqs[cur.Rank]++
		total += len(b)
		out = append(out, cur)
		batch.Events = batch.Events[:0]
		cur = Payload{}
		return nil
	}
	for _, ev := range w.Events {
		// One batch per engine step: up to 4 consecutive events of a rank.
		if len(batch.Events) == 4 || (len(batch.Events) > 0 && ev.Rank != cur.Rank) {
			if err := flush(); err != nil {
				return nil, 0, err
			}
		}
		cur.Rank = ev.Rank
		batch.TS, batch.DPRank, batch.HasDPRank = 0, int32(ev.Rank.DPRank), true
		batch.Events = append(batch.Events, wire.EventFromOp(ev.Op))
		for _, h := range [][]uint64{ev.Op.Store.Hashes, ev.Op.Remove.Hashes} {
			cur.Blocks += len(h)
		}
	}
	if err := flush(); err != nil {
		return nil, 0, err
	}
	return out, total, nil
}

func sameAsTruth(got []indexer.Overlap, want []workload.Hold) bool {
	if len(got) != len(want) {
		return false
	}
	sortOverlaps(got)
	for i, o := range got {
		if o.Rank != want[i].Rank || int(o.Device) != want[i].Blocks || o.Host != o.Device || o.Disk != o.Device {
			return false
		}
	}
	return true
}

func sortOverlaps(s []indexer.Overlap) {
	slices.SortFunc(s, func(a, b indexer.Overlap) int {
		return cmp.Or(cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID), cmp.Compare(a.Rank.DPRank, b.Rank.DPRank))
	})
}

// pct is the p-quantile of d, to 10 ns.
func pct(d quantile.Samples[time.Duration], p float64) time.Duration {
	return d.At(p).Round(10 * time.Nanosecond)
}

func avgLen(q [][]uint32) int {
	n := 0
	for _, x := range q {
		n += len(x)
	}
	return n / max(1, len(q))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
