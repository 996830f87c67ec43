package indexbench

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// RecordConfig configures Record. The zero value is not valid; use
// DefaultRecordConfig.
type RecordConfig struct {
	// Engines is how many mock engines (one rank each) serve the trace;
	// each request goes to one drawn uniformly at random with Seed, as
	// mooncake_bench partitions the trace over its workers.
	Engines int
	// GPUBlocks and BlockSize size each engine's KV cache (prefix caching
	// on, LRU eviction of unused cached blocks, as vLLM).
	GPUBlocks int
	BlockSize int
	Seed      uint64
	// Timing prices the engines' steps (continuous batching with chunked
	// prefill): what spaces their events in the trace's time.
	Timing mocker.Timing
	// Vocab is the token id range the trace's hash ids expand into.
	Vocab uint32
}

// DefaultRecordConfig is mooncake_bench's shape: 64 engines (its default
// number of unique inference workers), 16,384 GPU blocks each, blocks of
// 16 tokens, steps priced as Llama-3.1-8B on one H100.
func DefaultRecordConfig() RecordConfig {
	return RecordConfig{Engines: 64, GPUBlocks: 16384, BlockSize: 16, Seed: 42, Timing: mocker.H100Llama8B, Vocab: 128256}
}

// Validate reports the first field out of range.
func (c RecordConfig) Validate() error {
	switch {
	case c.Engines < 1 || c.Engines > 1<<16:
		return fmt.Errorf("engines %d: want 1 to 65,536", c.Engines)
	case c.GPUBlocks < 1 || c.GPUBlocks > 1<<24:
		return fmt.Errorf("gpu blocks %d: want 1 to 16,777,216", c.GPUBlocks)
	case c.BlockSize < 1 || c.BlockSize > trace.BlockTokens:
		return fmt.Errorf("block size %d: want 1 to %d", c.BlockSize, trace.BlockTokens)
	case c.Vocab < 1:
		return errors.New("vocab must be positive")
	}
	return c.Timing.WithDefaults().Validate()
}

// Batch is one engine step's KV events as index ops: what the engine
// publishes as one batch at At (trace time).
type Batch struct {
	At     time.Duration
	Seq    uint64
	Ops    []indexer.Op
	Blocks int // blocks stored plus blocks removed
}

// Lookup is one request's lookup on arrival: the local block hashes of its
// prompt (the index's own hashing, seed indexer.BaseSeed).
type Lookup struct {
	At     time.Duration
	Engine int // the engine that served it
	Hashes []uint64
}

// Recording is the replayable stream: per engine its batches in order,
// and every request's lookup in arrival order. It is read-only once made
// and may be replayed any number of times, concurrently.
type Recording struct {
	Config  RecordConfig
	Ranks   []indexer.Rank // engine i is rank Ranks[i]
	Batches [][]Batch      // Batches[i]: engine i's batches, in publication order
	Lookups []Lookup
	// Final is each engine's prefix cache at the end: engine hash →
	// physical copies. An index that applied every batch holds exactly
	// this.
	Final []map[uint64]int
	// EventBlocks and LookupBlocks are the ops of one replay: blocks
	// stored plus removed, and blocks of the lookups' prompts.
	EventBlocks, LookupBlocks   int64
	StoredBlocks, RemovedBlocks int64
	Events                      int           // BlockStored and BlockRemoved events
	Span                        time.Duration // the last batch's or lookup's time
	Refused                     int           // requests an engine could not hold at all
	// Prompts are up to MaxPrompts of the trace's prompts of at least
	// PromptTokens tokens, cut to PromptTokens, spread over the trace:
	// what Latency scores.
	Prompts [][]uint32
}

// PromptTokens is the length of the prompts Latency scores, and
// MaxPrompts how many a recording keeps.
const (
	PromptTokens = 8192
	MaxPrompts   = 64
)

// Ops is one replay's ops: EventBlocks + LookupBlocks.
func (r *Recording) Ops() int64 { return r.EventBlocks + r.LookupBlocks }

// Record serves reqs (in arrival order) on c.Engines mock engines on a
// virtual clock and records their events and the requests' lookups. It is
// deterministic: the same requests and config give the same recording.
func Record(reqs []trace.Request, c RecordConfig) (*Recording, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("no requests to record")
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6d6f6f6e63616b65))
	per := make([][]int, c.Engines)
	rec := &Recording{Config: c, Ranks: make([]indexer.Rank, c.Engines), Batches: make([][]Batch, c.Engines),
		Final: make([]map[uint64]int, c.Engines), Lookups: make([]Lookup, len(reqs))}
	for i, r := range reqs {
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			return nil, fmt.Errorf("request %d arrives before request %d", i, i-1)
		}
		e := rng.IntN(c.Engines)
		per[e] = append(per[e], i)
		rec.Lookups[i] = Lookup{At: r.Arrival, Engine: e}
	}
	// Engines are independent: serve them on every core. Each writes only
	// its own batches, final cache, counts and its requests' lookups.
	counts := make([]engineCounts, c.Engines)
	errs := make([]error, c.Engines)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := int(next.Add(1) - 1); e < c.Engines; e = int(next.Add(1) - 1) {
				rec.Ranks[e] = indexer.Rank{WorkerID: uint64(e + 1)}
				counts[e], errs[e] = rec.serve(e, reqs, per[e])
			}
		}()
	}
	wg.Wait()
	for e := range c.Engines {
		if errs[e] != nil {
			return nil, fmt.Errorf("engine %d: %w", e, errs[e])
		}
		k := &counts[e]
		rec.StoredBlocks += k.stored
		rec.RemovedBlocks += k.removed
		rec.EventBlocks += k.stored + k.removed
		rec.Events += k.events
		rec.Refused += k.refused
		rec.Span = max(rec.Span, k.span)
	}
	var long []int
	for i, r := range reqs {
		if r.InputLength >= PromptTokens {
			long = append(long, i)
		}
	}
	for j := range min(len(long), MaxPrompts) {
		r := reqs[long[j*len(long)/min(len(long), MaxPrompts)]]
		rec.Prompts = append(rec.Prompts, r.Tokens(nil, c.Vocab)[:PromptTokens])
	}
	for i := range rec.Lookups {
		rec.LookupBlocks += int64(len(rec.Lookups[i].Hashes))
		rec.Span = max(rec.Span, rec.Lookups[i].At)
	}
	return rec, nil
}

// serve runs engine e's requests (indices into reqs, in arrival order)
// through its scheduler: a discrete-event loop that admits the requests
// that have arrived, plans a step, records the step's events as one batch
// at the step's start, and advances the clock by the step's cost (or to
// the next arrival when idle).
func (rec *Recording) serve(e int, reqs []trace.Request, mine []int) (engineCounts, error) {
	c := rec.Config
	var k engineCounts
	pool, err := mocker.NewPool(c.GPUBlocks, c.BlockSize)
	if err != nil {
		return k, err
	}
	sched, err := mocker.NewScheduler(pool, c.Timing)
	if err != nil {
		return k, err
	}
	t0 := time.Unix(0, 0)
	now := time.Duration(0)
	var seq uint64
	var wb wire.Batch
	next := 0
	for {
		for next < len(mine) && reqs[mine[next]].Arrival <= now {
			i := mine[next]
			tokens := reqs[i].Tokens(nil, c.Vocab)
			rec.Lookups[i].Hashes = indexer.HashBlocks(nil, tokens, c.BlockSize, indexer.BaseSeed)
			if err := sched.Add(&mocker.Seq{Tokens: tokens, MaxTokens: reqs[i].OutputLength}, t0.Add(now)); err != nil {
				if !errors.Is(err, mocker.ErrNoSpace) {
					return k, err
				}
				k.refused++
			}
			next++
		}
		st := sched.Plan(t0.Add(now))
		k.refused += len(st.Ended)
		if evs := pool.Events(); len(evs) > 0 {
			seq++
			wb.Events = evs
			b := Batch{At: now, Seq: seq, Ops: wire.AppendOps(nil, &wb, nil)}
			for _, ev := range evs {
				n := int64(len(ev.BlockHashes))
				switch ev.Kind {
				case wire.KindBlockStored:
					k.stored += n
				case wire.KindBlockRemoved:
					k.removed += n
				}
				b.Blocks += int(n)
			}
			k.events += len(evs)
			rec.Batches[e] = append(rec.Batches[e], b)
			k.span = now
		}
		if st.Empty() {
			if next == len(mine) {
				if l := sched.Load(); l.Waiting+l.Running+l.Transferring == 0 {
					break
				}
				return k, fmt.Errorf("scheduler stalled with %+v", sched.Load())
			}
			now = max(now, reqs[mine[next]].Arrival)
			continue
		}
		now += st.Duration
		sched.Finish(t0.Add(now))
	}
	rec.Final[e] = pool.Holds()
	return k, nil
}

// engineCounts is what one engine's serve counted.
type engineCounts struct {
	stored, removed int64
	events, refused int
	span            time.Duration
}

// timeline is one goroutine's share of a replay: items in time order.
type item struct {
	at    time.Duration
	rank  int32 // engine index, for a batch
	batch int32 // index into Batches[rank]; -1 for a lookup
	look  int32 // index into Lookups
}

// applierTimelines splits the batches over n appliers, rank e to applier
// e % n (sticky), each applier's batches merged in time order (a rank's
// own batches keep their order).
func (rec *Recording) applierTimelines(n int) [][]item {
	out := make([][]item, n)
	for e, bs := range rec.Batches {
		a := e % n
		for j, b := range bs {
			out[a] = append(out[a], item{at: b.At, rank: int32(e), batch: int32(j)})
		}
	}
	for _, tl := range out {
		slices.SortStableFunc(tl, func(x, y item) int { return cmp.Compare(x.at, y.at) })
	}
	return out
}

// lookupTimelines deals the lookups round robin over n goroutines, each
// in arrival order.
func (rec *Recording) lookupTimelines(n int) [][]item {
	out := make([][]item, n)
	for i, l := range rec.Lookups {
		out[i%n] = append(out[i%n], item{at: l.At, batch: -1, look: int32(i)})
	}
	return out
}
