package indexbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/pauses"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// Options configure Run, what `prefixd-bench index` runs. The zero value
// is not valid; use NewOptions.
type Options struct {
	Record RecordConfig
	// Requests limits the trace to its first Requests requests (0: all).
	Requests int
	// CPUs are the core counts (GOMAXPROCS) to run at, in order.
	CPUs []int
	// Appliers are the ways of applying the events to sweep at each core
	// count, in order: PerRank (one goroutine per rank, as the daemon's
	// streams apply their batches), PerCore (one per core, each rank
	// sticky to one: Dynamo's thread pool), or that many goroutines, ranks
	// sticky to one each.
	Appliers []int
	// Lookupers are the lookup goroutines (0: the core count).
	Lookupers int
	// Rates are the offered loads in ops/s; empty: Fractions of the
	// unpaced capacity measured first at each core count.
	Rates     []float64
	Fractions []float64
	// Repeats is how many times each offered load is replayed; its point
	// is the run of the median achieved rate (the machine's speed moves
	// by a tenth and more between runs).
	Repeats int
	// Track: achieved tracks offered while achieved ≥ Track × offered.
	Track      float64
	IdleProbes int
	// Shards is the index's Options.Shards (0: its default at each core
	// count, indexer.DefaultShards), WriteChunk its Options.WriteChunk
	// (0: indexer.DefaultWriteChunk).
	Shards, WriteChunk int
}

// NewOptions returns the defaults: the whole Mooncake trace on
// DefaultRecordConfig's engines, at 1 core and at every core of the
// machine, offered 50 % to 160 % of the capacity.
func NewOptions() Options {
	cpus := []int{1}
	if n := runtime.NumCPU(); n > 1 {
		cpus = append(cpus, n)
	}
	return Options{Record: DefaultRecordConfig(), CPUs: cpus, Appliers: []int{PerRank, PerCore},
		Fractions: []float64{0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.15, 1.3}, Repeats: 3, Track: 0.95, IdleProbes: 20000}
}

// index returns the index options o sets.
func (o Options) index() indexer.Options {
	return indexer.Options{Shards: o.Shards, WriteChunk: o.WriteChunk}
}

// Options.Appliers' shapes besides a fixed number of goroutines.
const (
	PerRank = 0  // one applier goroutine per rank
	PerCore = -1 // one per core, each rank sticky to one
)

// appliers returns the goroutines shape a (see Options.Appliers) makes at
// cpus cores for engines ranks, and its name.
func appliers(a, cpus, engines int) (int, string) {
	switch a {
	case PerRank:
		return engines, "one per rank"
	case PerCore:
		return cpus, "one per core, ranks sticky"
	}
	return a, "ranks sticky"
}

// Validate reports the first option that cannot run.
func (o Options) Validate() error {
	if err := o.Record.Validate(); err != nil {
		return err
	}
	switch {
	case o.Requests < 0:
		return fmt.Errorf("requests %d must not be negative", o.Requests)
	case len(o.CPUs) == 0:
		return errors.New("no core count to run at")
	case len(o.Appliers) == 0:
		return errors.New("no way of applying the events: give appliers")
	case o.Lookupers < 0:
		return fmt.Errorf("lookupers %d must not be negative", o.Lookupers)
	case len(o.Rates) == 0 && len(o.Fractions) == 0:
		return errors.New("no offered load: give rates or fractions")
	case o.Track <= 0 || o.Track > 1:
		return fmt.Errorf("track %v: want a fraction in (0, 1]", o.Track)
	case o.WriteChunk < 0 || o.WriteChunk > 1<<20:
		return fmt.Errorf("write chunk %d: want 0 (the default) to %d blocks", o.WriteChunk, 1<<20)
	case o.Shards < 0 || o.Shards > indexer.MaxShards:
		return fmt.Errorf("shards %d: want 0 (the default) to %d", o.Shards, indexer.MaxShards)
	case o.IdleProbes < 1:
		return fmt.Errorf("idle probes %d must be positive", o.IdleProbes)
	case o.Repeats < 1 || o.Repeats > 100:
		return fmt.Errorf("repeats %d: want 1 to 100", o.Repeats)
	}
	for _, c := range o.CPUs {
		if c < 1 || c > 1<<12 {
			return fmt.Errorf("core count %d: want 1 to 4,096", c)
		}
	}
	for _, a := range o.Appliers {
		if a < PerCore || a > 1<<16 {
			return fmt.Errorf("appliers %d: want per rank, per core or 1 to 65,536 goroutines", a)
		}
	}
	for _, r := range o.Rates {
		if !(r > 0 && r < 1e12) {
			return fmt.Errorf("offered rate %v: want a positive rate below 10¹² ops/s", r)
		}
	}
	for _, f := range o.Fractions {
		if !(f > 0 && f < 100) {
			return fmt.Errorf("fraction %v: want a positive factor below 100", f)
		}
	}
	return nil
}

// Report is what Run measured at one core count with one way of applying
// the events (Options.Appliers).
type Report struct {
	CPUs     int
	Appliers int    // applier goroutines
	Shape    string // how they were chosen: "one per rank", "one per core, ranks sticky", …
	Capacity Result // unpaced
	// Points are the offered loads, ascending, each the run of the median
	// achieved rate of its repeats; Spread their lowest and highest
	// achieved rates.
	Points []Result
	Spread [][2]float64
	// Threshold is the highest offered load up to which every point's
	// achieved rate is within Track of it (0: none).
	Threshold float64
	// Latency is measured once per core count, in its first report (the
	// zero value in the others).
	Latency LatencyResult
}

// Run records the trace and, at each core count, measures the unpaced
// capacity (and checks the index against the engines), sweeps the
// offered load and times scores at idle and under ingest, writing the
// tables to out as it goes. GOMAXPROCS is restored at the end.
func Run(ctx context.Context, o Options, out io.Writer) ([]Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	p := func(format string, args ...any) { fmt.Fprintf(out, format, args...) }
	reqs, err := trace.Mooncake()
	if err != nil {
		return nil, err
	}
	if o.Requests > 0 && o.Requests < len(reqs) {
		reqs = reqs[:o.Requests]
	}
	c := o.Record
	p("recording %d Mooncake requests on %d mock engines (%d GPU blocks of %d tokens each, prefix caching on)…\n",
		len(reqs), c.Engines, c.GPUBlocks, c.BlockSize)
	t0 := time.Now()
	rec, err := Record(reqs, c)
	if err != nil {
		return nil, err
	}
	p("recorded in %v: %s events (%s blocks stored, %s removed) in %s batches, %s lookup blocks, trace span %v; %s ops per replay\n\n",
		time.Since(t0).Round(time.Millisecond), count(int64(rec.Events)), count(rec.StoredBlocks), count(rec.RemovedBlocks),
		count(int64(batches(rec))), count(rec.LookupBlocks), rec.Span.Round(time.Second), count(rec.Ops()))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var reports []Report
	for _, cpus := range o.CPUs {
		runtime.GOMAXPROCS(cpus)
		for k, a := range o.Appliers {
			rp, err := sweep(ctx, rec, o, cpus, a, p)
			if err != nil {
				return reports, err
			}
			if k == 0 {
				if rp.Latency, err = latency(ctx, rec, o, cpus, p); err != nil {
					return reports, err
				}
			}
			reports = append(reports, rp)
			p("\n")
		}
	}
	return reports, nil
}

// sweep measures the unpaced capacity (and checks the index against the
// engines) and the offered loads at cpus cores with appliers shape a.
func sweep(ctx context.Context, rec *Recording, o Options, cpus, a int, p func(string, ...any)) (Report, error) {
	appl, shape := appliers(a, cpus, len(rec.Ranks))
	rp := Report{CPUs: cpus, Appliers: appl, Shape: shape}
	look := cmpOr(o.Lookupers, cpus)
	cfg := ReplayConfig{Appliers: appl, Lookupers: look, Index: o.index()}
	eff := indexer.New(cfg.Index).Options() // the defaults filled in
	runtime.GC()
	var err error
	if rp.Capacity, err = Replay(ctx, rec, cfg); err != nil {
		return rp, err
	}
	if err := Verify(rec, rp.Capacity.Index); err != nil {
		return rp, err
	}
	rp.Capacity.Index = nil
	p("GOMAXPROCS=%d, %d appliers (%s), %d lookup goroutines, %d index shards, write chunk %d blocks\n",
		cpus, appl, shape, look, eff.Shards, eff.WriteChunk)
	p("  unpaced: %s ops/s (%s per core) in %v%s; index equal to the engines' caches\n",
		mops(rp.Capacity.Achieved), mops(rp.Capacity.Achieved/float64(cpus)), rp.Capacity.Elapsed.Round(time.Millisecond), cpuNote(rp.Capacity))
	rates := slices.Clone(o.Rates)
	if len(rates) == 0 {
		for _, f := range o.Fractions {
			rates = append(rates, f*rp.Capacity.Achieved)
		}
	}
	slices.Sort(rates)
	p("  %-14s %-14s %-9s %-10s %-10s %s\n", "offered ops/s", "achieved ops/s", "achieved", "lag p50", "lag p99", "achieved in each run")
	tracking := true
	for _, r := range rates {
		cfg.Offered = r
		runs := make([]Result, o.Repeats)
		for k := range runs {
			runtime.GC()
			if runs[k], err = Replay(ctx, rec, cfg); err != nil {
				return rp, err
			}
			runs[k].Index = nil
		}
		slices.SortFunc(runs, func(x, y Result) int { return cmp.Compare(x.Achieved, y.Achieved) })
		res := runs[len(runs)/2]
		rp.Points = append(rp.Points, res)
		rp.Spread = append(rp.Spread, [2]float64{runs[0].Achieved, runs[len(runs)-1].Achieved})
		if tracking = tracking && res.Achieved >= o.Track*r; tracking {
			rp.Threshold = r
		}
		each := make([]string, len(runs))
		for k := range runs {
			each[k] = mops(runs[k].Achieved)
		}
		p("  %-14s %-14s %-9s %-10v %-10v %s\n", mops(r), mops(res.Achieved), fmt.Sprintf("%.0f %%", 100*res.Achieved/r),
			res.LagP50.Round(time.Microsecond), res.LagP99.Round(time.Microsecond), strings.Join(each, " "))
	}
	p("  achieved tracks offered (≥ %.0f %%) up to %s ops/s = %s per core\n", 100*o.Track, mops(rp.Threshold), mops(rp.Threshold/float64(cpus)))
	return rp, nil
}

// latency times scores at idle and under saturating ingest at cpus cores:
// the ingest on cpus − 1 sticky appliers (at least one), so that the
// prober has a core of its own and the figure is the index's, not the Go
// scheduler's.
func latency(ctx context.Context, rec *Recording, o Options, cpus int, p func(string, ...any)) (LatencyResult, error) {
	runtime.GC()
	l, err := Latency(ctx, rec, LatencyConfig{Appliers: max(1, cpus-1), IdleProbes: o.IdleProbes,
		Index: o.index()})
	if err != nil {
		return l, err
	}
	l.Index = nil
	p("  score (%d tokens, hash + match): idle p50 %v p99 %v; under ingest (%d appliers, %s blocks/s) p50 %v p99 %v (%.1f× idle p99)\n",
		PromptTokens, l.IdleP50, l.IdleP99, max(1, cpus-1), mops(l.IngestRate), l.LoadP50, l.LoadP99, float64(l.LoadP99)/float64(l.IdleP99))
	p("  control, the same ingest into another partition (%s blocks/s): p50 %v p99 %v (%.1f× idle p99)\n",
		mops(l.OtherIngestRate), l.OtherP50, l.OtherP99, float64(l.OtherP99)/float64(l.IdleP99))
	p("  the machine's pauses of %v or more, seen at idle: %.0f per second, %.1f %% of the time\n",
		pauses.MinGap, l.Pauses, 100*l.PauseShare)
	return l, nil
}

// cpuNote describes r's CPU time: ops per core-second and the cores kept
// busy, or nothing where it was not measured.
func cpuNote(r Result) string {
	if r.CPU <= 0 {
		return ""
	}
	return fmt.Sprintf(", %s ops per CPU-second, %.2f cores busy", mops(float64(r.Ops)/r.CPU.Seconds()), r.CPU.Seconds()/r.Elapsed.Seconds())
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func batches(rec *Recording) int {
	n := 0
	for _, bs := range rec.Batches {
		n += len(bs)
	}
	return n
}

// mops formats a rate in millions.
func mops(r float64) string { return fmt.Sprintf("%.2fM", r/1e6) }

// count formats n with thousands separators.
func count(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[0] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
