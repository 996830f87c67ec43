package indexbench

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// small is a recording small enough for tests (also under -race): the
// trace's first 150 requests on 3 engines of 8,192 blocks, so that every
// cache fills and evicts, with arrivals 20 times further apart than the
// trace's, so that no engine queues (a queued request's admission is
// retried, and its prompt rehashed, at every step).
func smallRequests() ([]trace.Request, error) {
	reqs, err := trace.Mooncake()
	if err != nil {
		return nil, err
	}
	reqs = reqs[:150]
	for i := range reqs {
		reqs[i].Arrival *= 20
	}
	return reqs, nil
}

var small struct {
	once sync.Once
	rec  *Recording
	err  error
}

func smallRecording(t testing.TB) *Recording {
	t.Helper()
	small.once.Do(func() {
		reqs, err := smallRequests()
		if err != nil {
			small.err = err
			return
		}
		c := DefaultRecordConfig()
		c.Engines, c.GPUBlocks = 3, 8192
		small.rec, small.err = Record(reqs, c)
	})
	if small.err != nil {
		t.Fatal(small.err)
	}
	return small.rec
}

// TestRecord: the recording has the trace's lookups, evictions, batches
// in order per engine, and totals that add up.
func TestRecord(t *testing.T) {
	rec := smallRecording(t)
	if len(rec.Lookups) != 150 {
		t.Fatalf("%d lookups, want 150", len(rec.Lookups))
	}
	if rec.RemovedBlocks == 0 || rec.StoredBlocks <= rec.RemovedBlocks {
		t.Fatalf("stored %d, removed %d: want evictions, and fewer than the stores", rec.StoredBlocks, rec.RemovedBlocks)
	}
	var blocks, lookups int64
	for e, bs := range rec.Batches {
		if len(bs) == 0 {
			t.Fatalf("engine %d published nothing", e)
		}
		for j, b := range bs {
			if j > 0 && (b.At < bs[j-1].At || b.Seq != bs[j-1].Seq+1) {
				t.Fatalf("engine %d batch %d (seq %d at %v) after seq %d at %v", e, j, b.Seq, b.At, bs[j-1].Seq, bs[j-1].At)
			}
			n := 0
			for _, op := range b.Ops {
				n += len(op.Store.Hashes) + len(op.Remove.Hashes)
			}
			if n != b.Blocks {
				t.Fatalf("engine %d batch %d: ops carry %d blocks, Blocks says %d", e, j, n, b.Blocks)
			}
			blocks += int64(n)
		}
	}
	for _, l := range rec.Lookups {
		lookups += int64(len(l.Hashes))
	}
	if blocks != rec.EventBlocks || blocks != rec.StoredBlocks+rec.RemovedBlocks || lookups != rec.LookupBlocks {
		t.Fatalf("blocks %d, lookups %d; recording says %d (= %d + %d) and %d", blocks, lookups,
			rec.EventBlocks, rec.StoredBlocks, rec.RemovedBlocks, rec.LookupBlocks)
	}
	if len(rec.Prompts) == 0 || len(rec.Prompts[0]) != PromptTokens {
		t.Fatalf("%d prompts to score, want some of %d tokens", len(rec.Prompts), PromptTokens)
	}
}

// TestRecordDeterministic: the same requests and config record the same
// stream, whatever the goroutines' interleaving.
func TestRecordDeterministic(t *testing.T) {
	a := smallRecording(t)
	reqs, err := smallRequests()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Record(reqs, a.Config)
	if err != nil {
		t.Fatal(err)
	}
	if a.EventBlocks != b.EventBlocks || a.Events != b.Events || a.Span != b.Span || batches(a) != batches(b) {
		t.Fatalf("two recordings differ: %d/%d event blocks, %d/%d events, span %v/%v, %d/%d batches",
			a.EventBlocks, b.EventBlocks, a.Events, b.Events, a.Span, b.Span, batches(a), batches(b))
	}
	for e := range a.Final {
		if len(a.Final[e]) != len(b.Final[e]) {
			t.Fatalf("engine %d ends with %d and %d blocks", e, len(a.Final[e]), len(b.Final[e]))
		}
	}
}

// TestReplayEqualsEngines: an unpaced replay with several sticky appliers
// and lookup goroutines counts exactly the recorded ops and leaves the
// index equal to every engine's final cache.
func TestReplayEqualsEngines(t *testing.T) {
	rec := smallRecording(t)
	for _, cfg := range []ReplayConfig{{Appliers: 1, Lookupers: 1}, {Appliers: 4, Lookupers: 3}, {Appliers: 5, Lookupers: 0}} {
		res, err := Replay(context.Background(), rec, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wantLook := rec.LookupBlocks
		if cfg.Lookupers == 0 {
			wantLook = 0
		}
		if res.EventOps != rec.EventBlocks || res.LookupOps != wantLook || res.Ops != res.EventOps+res.LookupOps {
			t.Fatalf("%+v: counted %d event + %d lookup ops, recorded %d + %d", cfg, res.EventOps, res.LookupOps, rec.EventBlocks, wantLook)
		}
		if res.Skipped != 0 {
			t.Fatalf("%+v: %d event blocks skipped", cfg, res.Skipped)
		}
		if err := Verify(rec, res.Index); err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}

// TestVerifyDetectsMismatch: Verify fails on an index missing a block or
// holding one the engine lacks.
func TestVerifyDetectsMismatch(t *testing.T) {
	rec := smallRecording(t)
	res, err := Replay(context.Background(), rec, ReplayConfig{Appliers: 2})
	if err != nil {
		t.Fatal(err)
	}
	var h uint64
	for h = range rec.Final[1] {
		break
	}
	rm := indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{h}}}
	if _, err := res.Index.ApplyBatch(Partition, rec.Ranks[1], indexer.Mark{Seq: 1 << 40}, []indexer.Op{rm}); err != nil {
		t.Fatal(err)
	}
	if err := Verify(rec, res.Index); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Verify after removing a block: %v, want ErrMismatch", err)
	}
	if err := res.Index.Clear(Partition, rec.Ranks[1]); err != nil {
		t.Fatal(err)
	}
	if err := Verify(rec, res.Index); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Verify after clearing a rank: %v, want ErrMismatch", err)
	}
}

// TestReplayPaced: a paced replay never runs ahead of its offered load
// (so achieved ≤ offered), applies everything and still matches.
func TestReplayPaced(t *testing.T) {
	rec := smallRecording(t)
	offered := float64(rec.Ops()) / 0.05 // spread over 50 ms
	res, err := Replay(context.Background(), rec, ReplayConfig{Offered: offered, Appliers: 3, Lookupers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed < res.Duration || res.Achieved > offered {
		t.Fatalf("elapsed %v for a %v span: achieved %.0f ops/s over the %.0f offered", res.Elapsed, res.Duration, res.Achieved, offered)
	}
	if res.Ops != rec.Ops() {
		t.Fatalf("counted %d ops, recorded %d", res.Ops, rec.Ops())
	}
	if err := Verify(rec, res.Index); err != nil {
		t.Fatal(err)
	}
}

// TestReplayCancelled: a cancelled context ends a long paced replay with
// its error.
func TestReplayCancelled(t *testing.T) {
	rec := smallRecording(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Replay(ctx, rec, ReplayConfig{Offered: 1, Appliers: 2, Lookupers: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Replay with a cancelled context: %v", err)
	}
}

// TestLatency: the three phases are timed, in order of size, and the
// ingests went where they belong: the scored partition ends equal to the
// engines' caches, the control partition holds the first half of the
// recording.
func TestLatency(t *testing.T) {
	rec := smallRecording(t)
	l, err := Latency(context.Background(), rec, LatencyConfig{Appliers: 2, IdleProbes: 200})
	if err != nil {
		t.Fatal(err)
	}
	if l.IdleN != 200 || l.LoadN < 1 || l.IdleP50 <= 0 || l.IdleP50 > l.IdleP99 || l.IdleP99 > l.IdleMax ||
		l.LoadP50 > l.LoadP99 || l.LoadP99 > l.LoadMax || l.IngestRate <= 0 ||
		l.OtherN < 1 || l.OtherP50 > l.OtherP99 || l.OtherP99 > l.OtherMax || l.OtherIngestRate <= 0 ||
		l.Pauses < 0 || l.PauseShare < 0 || l.PauseShare >= 1 {
		t.Fatalf("latency %+v", l)
	}
	if err := Verify(rec, l.Index); err != nil {
		t.Fatal(err)
	}
	half := indexer.New(indexer.Options{})
	if err := half.AddPartition(Partition, rec.Config.BlockSize); err != nil {
		t.Fatal(err)
	}
	for e, bs := range rec.Batches {
		for _, b := range bs[:len(bs)/2] {
			if _, err := half.ApplyBatch(Partition, rec.Ranks[e], indexer.Mark{Seq: b.Seq}, b.Ops); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries := func(ix *indexer.Index, k indexer.PartitionKey) int {
		for _, st := range ix.Stats() {
			if st.Key == k {
				return st.Entries
			}
		}
		t.Fatalf("no partition %v", k)
		return 0
	}
	if got, want := entries(l.Index, Control), entries(half, Partition); got != want || want == 0 {
		t.Fatalf("control partition: %d entries, want %d (the first half's)", got, want)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Record.Engines = 0 }, "engines 0"},
		{func(o *Options) { o.Record.GPUBlocks = -1 }, "gpu blocks -1"},
		{func(o *Options) { o.Record.BlockSize = 513 }, "block size 513"},
		{func(o *Options) { o.Requests = -1 }, "requests -1"},
		{func(o *Options) { o.CPUs = nil }, "no core count"},
		{func(o *Options) { o.CPUs = []int{0} }, "core count 0"},
		{func(o *Options) { o.Rates, o.Fractions = nil, nil }, "no offered load"},
		{func(o *Options) { o.Rates = []float64{-1} }, "offered rate -1"},
		{func(o *Options) { o.Fractions = []float64{0} }, "fraction 0"},
		{func(o *Options) { o.Track = 1.5 }, "track 1.5"},
		{func(o *Options) { o.IdleProbes = 0 }, "idle probes 0"},
		{func(o *Options) { o.Appliers = []int{PerRank, -2} }, "appliers -2"},
		{func(o *Options) { o.Appliers = nil }, "no way of applying"},
		{func(o *Options) { o.Lookupers = -1 }, "lookupers -1"},
		{func(o *Options) { o.Repeats = 0 }, "repeats 0"},
	} {
		o := NewOptions()
		c.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
	if err := NewOptions().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if _, err := Replay(context.Background(), smallRecording(t), ReplayConfig{Appliers: 0}); err == nil {
		t.Error("Replay with no applier: accepted")
	}
	if _, err := Record(nil, DefaultRecordConfig()); err == nil {
		t.Error("Record of no requests: accepted")
	}
}

// TestRun: the whole report at one core count on a small trace.
func TestRun(t *testing.T) {
	o := NewOptions()
	o.Requests, o.Record.Engines, o.Record.GPUBlocks = 60, 2, 8192
	o.CPUs, o.Fractions, o.IdleProbes = []int{1}, []float64{0.5, 2}, 100
	var out strings.Builder
	before := runtime.GOMAXPROCS(0)
	reps, err := Run(context.Background(), o, &out)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOMAXPROCS(0) != before {
		t.Errorf("GOMAXPROCS %d after the run, was %d", runtime.GOMAXPROCS(0), before)
	}
	// One report per way of applying: a goroutine per rank (2), then one
	// per core (1); the latency in the first.
	if len(reps) != 2 || reps[0].CPUs != 1 || reps[0].Appliers != 2 || reps[1].Appliers != 1 ||
		reps[0].Latency.LoadN == 0 || reps[1].Latency.LoadN != 0 {
		t.Fatalf("reports %+v", reps)
	}
	for _, rp := range reps {
		if len(rp.Points) != 2 || len(rp.Spread) != 2 {
			t.Fatalf("%s: %d offered loads, %d spreads, want 2", rp.Shape, len(rp.Points), len(rp.Spread))
		}
		for i, p := range rp.Points {
			if p.Achieved > p.Offered {
				t.Errorf("%s: achieved %.0f over offered %.0f", rp.Shape, p.Achieved, p.Offered)
			}
			if s := rp.Spread[i]; !(s[0] <= p.Achieved && p.Achieved <= s[1]) {
				t.Errorf("%s: the median run's %.0f outside the runs' %v", rp.Shape, p.Achieved, s)
			}
		}
		// The threshold: the highest offered load up to which every
		// point tracks.
		want, tracking := 0.0, true
		for _, p := range rp.Points {
			if tracking = tracking && p.Achieved >= o.Track*p.Offered; tracking {
				want = p.Offered
			}
		}
		if rp.Threshold != want {
			t.Errorf("%s: threshold %.0f, want %.0f", rp.Shape, rp.Threshold, want)
		}
	}
	for _, want := range []string{"index equal to the engines' caches", "achieved tracks offered", "under ingest", "(one per rank)", "(one per core, ranks sticky)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the report:\n%s", want, out.String())
		}
	}
}
