package indexbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/indexer"
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
// saturating ingest, over the same index half filled.
type LatencyResult struct {
	IdleP50, IdleP99, IdleMax time.Duration
	LoadP50, LoadP99, LoadMax time.Duration
	IdleN, LoadN              int
	// IngestRate is the event blocks per second applied while the prober
	// ran.
	IngestRate float64
}

// Latency applies the first half of each engine's batches, times
// cfg.IdleProbes scores with nothing else running, then applies the
// second half with cfg.Appliers goroutines, unpaced, while one prober
// goroutine times scores back to back until the appliers are done.
func Latency(ctx context.Context, rec *Recording, cfg LatencyConfig) (LatencyResult, error) {
	var res LatencyResult
	if cfg.Appliers < 1 || cfg.IdleProbes < 1 {
		return res, fmt.Errorf("appliers %d and idle probes %d must be positive", cfg.Appliers, cfg.IdleProbes)
	}
	if len(rec.Prompts) == 0 {
		return res, fmt.Errorf("no prompt of %d tokens in the trace to score", PromptTokens)
	}
	ix := indexer.New(cfg.Index)
	if err := ix.AddPartition(Partition, rec.Config.BlockSize); err != nil {
		return res, err
	}
	apply := func(e, from, to int) error {
		for j := from; j < to; j++ {
			b := &rec.Batches[e][j]
			if _, err := ix.ApplyBatch(Partition, rec.Ranks[e], indexer.Mark{Seq: b.Seq}, b.Ops); err != nil {
				return err
			}
		}
		return nil
	}
	for e, bs := range rec.Batches {
		if err := apply(e, 0, len(bs)/2); err != nil {
			return res, err
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
	var (
		wg       sync.WaitGroup
		done     atomic.Bool
		firstErr error
		once     sync.Once
		blocks   atomic.Int64
	)
	fail := func(err error) { once.Do(func() { firstErr = err }) }
	start := time.Now()
	for a := range cfg.Appliers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := a; e < len(rec.Batches); e += cfg.Appliers {
				if ctx.Err() != nil {
					fail(ctx.Err())
					return
				}
				bs := rec.Batches[e]
				if err := apply(e, len(bs)/2, len(bs)); err != nil {
					fail(err)
					return
				}
				for _, b := range bs[len(bs)/2:] {
					blocks.Add(int64(b.Blocks))
				}
			}
		}()
	}
	// done is set when the last applier returns (this goroutine ends
	// then too; waitErr below waits for the same group).
	go func() { wg.Wait(); done.Store(true) }()
	var load []time.Duration
	for i := 0; !done.Load(); i++ {
		d, err := probe(i)
		if err != nil {
			return res, errors.Join(err, waitErr(&wg, &firstErr))
		}
		load = append(load, d)
	}
	elapsed := time.Since(start)
	if err := waitErr(&wg, &firstErr); err != nil {
		return res, err
	}
	res.IngestRate = float64(blocks.Load()) / elapsed.Seconds()
	res.IdleP50, res.IdleP99, res.IdleMax, res.IdleN = quantiles(idle)
	res.LoadP50, res.LoadP99, res.LoadMax, res.LoadN = quantiles(load)
	return res, nil
}

func waitErr(wg *sync.WaitGroup, err *error) error {
	wg.Wait()
	return *err
}

func quantiles(d []time.Duration) (p50, p99, max time.Duration, n int) {
	if len(d) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100], d[len(d)-1], len(d)
}
