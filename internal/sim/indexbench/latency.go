package indexbench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/pauses"
	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// LatencyConfig configures Latency.
type LatencyConfig struct {
	// Appliers apply the second half of the recording as fast as they
	// can while the prober scores: the saturating ingest. With as many
	// appliers as cores the prober also waits for a core, not only for
	// the index; leave it one (Appliers = cores − 1) to measure the index.
	Appliers int
	// IdleProbes is how many scores are timed at idle.
	IdleProbes int
	Index      indexer.Options
}

// LatencyResult is score latency (hash + match of a PromptTokens-token
// prompt through Index.MatchTokens, one at a time) at idle and under
// saturating ingest, over the same index half filled; and, as a control,
// while the same ingest goes to another partition of the index.
type LatencyResult struct {
	IdleP50, IdleP99, IdleMax time.Duration
	LoadP50, LoadP99, LoadMax time.Duration
	IdleN, LoadN              int
	// IngestRate is the event blocks per second applied while the prober
	// ran.
	IngestRate float64
	// OtherP50, OtherP99 and OtherMax are the latencies while the appliers
	// write another partition (its own shards and locks), which shares
	// nothing with the scores but the machine: the cores' caches, memory
	// bandwidth and the runtime. What the scores lose there the index
	// cannot win back; what they lose beyond it under ingest into their
	// own partition is the index's (waits for its write locks, and reads
	// of what the writers just changed).
	OtherP50, OtherP99, OtherMax time.Duration
	OtherN                       int
	OtherIngestRate              float64
	// Pauses is how often per second, and PauseShare for what share of
	// the time, the clock watched at idle for pauseWatch jumped by
	// pauses.MinGap or more: the machine taking the core away (a
	// virtual machine's exits and ticks, interrupts). A writer that
	// pauses while it holds a shard's write lock makes the scores that
	// need the shard wait as long.
	Pauses, PauseShare float64
	// Index is the index after the ingest: Partition holds the whole
	// recording, Control its first half.
	Index *indexer.Index `json:"-"`
}

// Control is the partition Latency's control ingest writes.
var Control = indexer.PartitionKey{Model: "mooncake-control"}

// Latency applies the first half of each engine's batches, times
// cfg.IdleProbes scores with nothing else running, then applies that
// first half again into another partition (Control) with cfg.Appliers
// goroutines, unpaced, while one prober goroutine times scores back to
// back until the appliers are done; then the second half into the
// scored partition, the same way.
func Latency(ctx context.Context, rec *Recording, cfg LatencyConfig) (LatencyResult, error) {
	var res LatencyResult
	if cfg.Appliers < 1 || cfg.IdleProbes < 1 {
		return res, fmt.Errorf("appliers %d and idle probes %d must be positive", cfg.Appliers, cfg.IdleProbes)
	}
	if len(rec.Prompts) == 0 {
		return res, fmt.Errorf("no prompt of %d tokens in the trace to score", PromptTokens)
	}
	ix := indexer.New(cfg.Index)
	for _, k := range []indexer.PartitionKey{Partition, Control} {
		if err := ix.AddPartition(k, rec.Config.BlockSize); err != nil {
			return res, err
		}
	}
	firstHalf := func(bs []Batch) []Batch { return bs[:len(bs)/2] }
	secondHalf := func(bs []Batch) []Batch { return bs[len(bs)/2:] }
	for e, bs := range rec.Batches {
		for _, b := range firstHalf(bs) {
			if _, err := ix.ApplyBatch(Partition, rec.Ranks[e], indexer.Mark{Seq: b.Seq}, b.Ops); err != nil {
				return res, err
			}
		}
	}
	var dst []indexer.Overlap
	probe := func(i int) (time.Duration, error) {
		t0 := time.Now()
		var err error
		dst, err = ix.MatchTokens(Partition, rec.Prompts[i%len(rec.Prompts)], indexer.BaseSeed, dst[:0])
		return time.Since(t0), err
	}
	idle := make([]time.Duration, cfg.IdleProbes)
	for i := range idle {
		d, err := probe(i)
		if err != nil {
			return res, err
		}
		idle[i] = d
	}
	w := pauses.Watch(pauseWatch)
	res.Pauses, res.PauseShare = w.Rate(pauses.MinGap), w.Share(pauses.MinGap)
	other, otherRate, err := underIngest(ctx, ix, Control, rec, cfg.Appliers, probe, firstHalf)
	if err != nil {
		return res, err
	}
	load, loadRate, err := underIngest(ctx, ix, Partition, rec, cfg.Appliers, probe, secondHalf)
	if err != nil {
		return res, err
	}
	res.IngestRate, res.OtherIngestRate = loadRate, otherRate
	res.IdleP50, res.IdleP99, res.IdleMax, res.IdleN = quantiles(idle)
	res.LoadP50, res.LoadP99, res.LoadMax, res.LoadN = quantiles(load)
	res.OtherP50, res.OtherP99, res.OtherMax, res.OtherN = quantiles(other)
	res.Index = ix
	return res, nil
}

// underIngest runs appliers goroutines applying, unpaced, part(bs) of
// each engine's batches bs into partition k (engine e through applier e %
// appliers, in order), while this goroutine times probe back to back
// until they are done. It returns the probes' latencies and the event
// blocks per second applied.
func underIngest(ctx context.Context, ix *indexer.Index, k indexer.PartitionKey, rec *Recording, appliers int,
	probe func(int) (time.Duration, error), part func([]Batch) []Batch) ([]time.Duration, float64, error) {
	var (
		wg       sync.WaitGroup
		done     atomic.Bool
		firstErr error
		once     sync.Once
		blocks   atomic.Int64
	)
	fail := func(err error) { once.Do(func() { firstErr = err }) }
	start := time.Now()
	for a := range appliers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := a; e < len(rec.Batches); e += appliers {
				if ctx.Err() != nil {
					fail(ctx.Err())
					return
				}
				for _, b := range part(rec.Batches[e]) {
					if _, err := ix.ApplyBatch(k, rec.Ranks[e], indexer.Mark{Seq: b.Seq}, b.Ops); err != nil {
						fail(err)
						return
					}
					blocks.Add(int64(b.Blocks))
				}
			}
		}()
	}
	// done is set when the last applier returns (this goroutine ends
	// then too; waitErr below waits for the same group).
	go func() { wg.Wait(); done.Store(true) }()
	var lat []time.Duration
	for i := 0; !done.Load(); i++ {
		d, err := probe(i)
		if err != nil {
			return nil, 0, errors.Join(err, waitErr(&wg, &firstErr))
		}
		lat = append(lat, d)
	}
	elapsed := time.Since(start)
	if err := waitErr(&wg, &firstErr); err != nil {
		return nil, 0, err
	}
	return lat, float64(blocks.Load()) / elapsed.Seconds(), nil
}

// pauseWatch is how long Latency watches the machine's pauses.
const pauseWatch = 200 * time.Millisecond

func waitErr(wg *sync.WaitGroup, err *error) error {
	wg.Wait()
	return *err
}

// quantiles returns d's p50, p99 and largest latency (nearest rank) and
// how many there are.
func quantiles(d []time.Duration) (p50, p99, max time.Duration, n int) {
	q := quantile.Of(d)
	return q.At(0.5), q.At(0.99), q.At(1), q.Len()
}
