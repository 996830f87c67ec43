package indexbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// Partition is the one index partition a replay writes (one model).
var Partition = indexer.PartitionKey{Model: "mooncake"}

// ReplayConfig configures one Replay.
type ReplayConfig struct {
	// Offered is the offered load in ops/s: the recording's ops spread
	// over its span compressed to Ops/Offered seconds. 0 replays unpaced
	// (every item as soon as its goroutine reaches it): the capacity.
	Offered float64
	// Appliers and Lookupers are the goroutines applying batches (rank e
	// always through applier e % Appliers) and matching lookups.
	Appliers, Lookupers int
	// Index configures the index replayed into.
	Index indexer.Options
}

// Result is what one Replay measured.
type Result struct {
	Offered             float64       // ops/s asked for (0: unpaced)
	Duration            time.Duration // the compressed span (0: unpaced)
	Elapsed             time.Duration // from start until the last op completed
	Ops                 int64         // event blocks applied + lookup blocks matched
	EventOps, LookupOps int64
	Achieved            float64 // Ops / Elapsed
	// CPU is the CPU time the process used during the replay (0 where
	// it cannot be read): Ops/CPU is the ops per core-second whether or
	// not the cores were shared, CPU/Elapsed the cores kept busy.
	CPU time.Duration
	// LagP50, LagP99 and LagMax are how late items started against their
	// due time: near zero while achieved tracks offered.
	LagP50, LagP99, LagMax time.Duration
	// Skipped counts event blocks the index did not apply (any reason);
	// 0 for an uncapped index fed a consistent recording.
	Skipped uint64
	Index   *indexer.Index `json:"-"` // the index after the replay
}

// Replay feeds rec into a new index at cfg's offered rate and returns the
// result with the index. Items never start before their due time, so
// Achieved ≤ Offered whenever Offered > 0.
func Replay(ctx context.Context, rec *Recording, cfg ReplayConfig) (Result, error) {
	if cfg.Appliers < 1 || cfg.Lookupers < 0 {
		return Result{}, fmt.Errorf("appliers %d must be positive and lookupers %d not negative", cfg.Appliers, cfg.Lookupers)
	}
	if cfg.Offered < 0 || math.IsNaN(cfg.Offered) || math.IsInf(cfg.Offered, 0) {
		return Result{}, fmt.Errorf("offered load %v: want a finite rate ≥ 0", cfg.Offered)
	}
	ix := indexer.New(cfg.Index)
	if err := ix.AddPartition(Partition, rec.Config.BlockSize); err != nil {
		return Result{}, err
	}
	res := Result{Offered: cfg.Offered, Index: ix}
	// scale maps trace time to wall time from the start.
	scale := 0.0
	if cfg.Offered > 0 && rec.Span > 0 {
		res.Duration = time.Duration(float64(rec.Ops()) / cfg.Offered * float64(time.Second))
		scale = float64(res.Duration) / float64(rec.Span)
	}
	appl := rec.applierTimelines(cfg.Appliers)
	var looks [][]item
	if cfg.Lookupers > 0 {
		looks = rec.lookupTimelines(cfg.Lookupers)
	}
	var (
		eventOps, lookupOps atomic.Int64
		skipped             atomic.Uint64
		firstErr            error
		errOnce             sync.Once
		wg                  sync.WaitGroup
	)
	lags := make([][]time.Duration, len(appl)+len(looks))
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	start, cpu0 := time.Now(), processCPU()
	run := func(slot int, tl []item, do func(item) error) {
		defer wg.Done()
		lag := make([]time.Duration, 0, len(tl))
		for i, it := range tl {
			if i&63 == 0 && ctx.Err() != nil {
				fail(ctx.Err())
				return
			}
			if scale > 0 {
				due := time.Duration(float64(it.at) * scale)
				if d := due - time.Since(start); d > 0 {
					time.Sleep(d) // pacing the offered load, not synchronisation
				}
				lag = append(lag, time.Since(start)-due)
			}
			if err := do(it); err != nil {
				fail(err)
				return
			}
		}
		lags[slot] = lag
	}
	for a, tl := range appl {
		wg.Add(1)
		go run(a, tl, func(it item) error {
			b := &rec.Batches[it.rank][it.batch]
			r, err := ix.ApplyBatch(Partition, rec.Ranks[it.rank], indexer.Mark{Seq: b.Seq}, b.Ops)
			if err != nil {
				return err
			}
			var s uint64
			for _, n := range r.Skipped {
				s += n
			}
			skipped.Add(s)
			eventOps.Add(int64(b.Blocks))
			return nil
		})
	}
	for l, tl := range looks {
		wg.Add(1)
		go func() {
			var dst []indexer.Overlap
			run(len(appl)+l, tl, func(it item) error {
				q := rec.Lookups[it.look].Hashes
				var err error
				if dst, err = ix.Match(Partition, q, dst[:0]); err != nil {
					return err
				}
				lookupOps.Add(int64(len(q)))
				return nil
			})
		}()
	}
	wg.Wait()
	res.Elapsed, res.CPU = time.Since(start), processCPU()-cpu0
	if firstErr != nil {
		return res, firstErr
	}
	res.EventOps, res.LookupOps = eventOps.Load(), lookupOps.Load()
	res.Ops = res.EventOps + res.LookupOps
	res.Achieved = float64(res.Ops) / res.Elapsed.Seconds()
	res.Skipped = skipped.Load()
	res.LagP50, res.LagP99, res.LagMax, _ = quantiles(slices.Concat(lags...))
	return res, nil
}

// ErrMismatch: after a replay the index disagrees with the engines'
// final caches.
var ErrMismatch = errors.New("index disagrees with the engines' caches")

// Verify checks that ix (a replay of rec with no cap) holds exactly each
// engine's final cache: the same blocks, each with its number of device
// copies, and nothing else.
func Verify(rec *Recording, ix *indexer.Index) error {
	for e, r := range rec.Ranks {
		var bad error
		err := ix.ReadRank(Partition, r, func(t *indexer.Tree) {
			want := rec.Final[e]
			if got := t.RankBlocks(r); got != len(want) {
				bad = fmt.Errorf("engine %d: %d blocks indexed, the engine holds %d: %w", e, got, len(want), ErrMismatch)
				return
			}
			for h, n := range want {
				c, ok := t.Holds(r, h)
				if !ok || int(c[indexer.TierDevice]) != n {
					bad = fmt.Errorf("engine %d: block %#x indexed with %d copies (held %v), the engine has %d: %w",
						e, h, c[indexer.TierDevice], ok, n, ErrMismatch)
					return
				}
			}
		})
		if err != nil {
			return err
		}
		if bad != nil {
			return bad
		}
	}
	return nil
}
