package routing

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prefixd/prefixd/internal/sim/trace"
)

// BenchOptions are `prefixd-bench routing`'s: the fleet, the trace and
// the sweep. Start from NewBenchOptions.
type BenchOptions struct {
	Config
	// Trace is a Mooncake-format trace file ("": the shipped FAST'25
	// conversation trace); Requests keeps its first so many (0: all).
	Trace    string
	Requests int
	Policies []Policy
	// Speedups compress the trace's arrival times; the report has one
	// table per speedup, the charts one point.
	Speedups []float64
	// Weights, if set, are overlap weights to sweep prefixd's and the
	// oracle's cost function over, at every speedup.
	Weights []float64
	// Replicas, if set, are router counts to sweep every policy over, at
	// every speedup (Config.Replicas; random and consistent hashing run
	// at the smallest only): rows are named "<policy>/r<N>".
	Replicas []int
	// Out is the directory for report.json, report.md and the charts
	// ("": none written).
	Out      string
	Parallel int
	// Progress, if set, receives one line per finished run.
	Progress io.Writer
}

// NewBenchOptions returns the full benchmark: every policy on the whole
// trace, at its own load and compressed up to 16 times.
func NewBenchOptions() BenchOptions {
	return BenchOptions{Config: DefaultConfig(), Policies: slices.Clone(Policies), Speedups: []float64{0.5, 1, 2, 4, 8, 16}}
}

// Validate names the first option out of range.
func (o BenchOptions) Validate() error {
	if o.Requests < 0 {
		return fmt.Errorf("--requests %d: must not be negative", o.Requests)
	}
	if len(o.Policies) == 0 || len(o.Speedups) == 0 {
		return fmt.Errorf("want at least one policy and one speedup")
	}
	for _, s := range o.Speedups {
		if !(s > 0) || s > 1e6 {
			return fmt.Errorf("--speedups %v: want positive factors", s)
		}
	}
	for _, w := range o.Weights {
		if !(w >= 0) || w > 1e6 {
			return fmt.Errorf("--weights %v: want non-negative weights", w)
		}
	}
	for _, n := range o.Replicas {
		if n < 1 || n > MaxReplicas {
			return fmt.Errorf("--replicas %d: want 1 to %d", n, MaxReplicas)
		}
	}
	c := o.Config
	c.Speedup = 1
	return c.Validate()
}

// Bench runs the benchmark and writes the table to w, and the report and
// charts to o.Out.
func Bench(ctx context.Context, o BenchOptions, w io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	name := "Mooncake FAST'25 conversation trace"
	var reqs []trace.Request
	var err error
	if o.Trace == "" {
		reqs, err = trace.Mooncake()
	} else {
		name = filepath.Base(o.Trace)
		reqs, err = readTrace(o.Trace)
	}
	if err != nil {
		return err
	}
	if o.Requests > 0 && o.Requests < len(reqs) {
		reqs = reqs[:o.Requests]
	}
	if len(reqs) == 0 {
		return fmt.Errorf("trace %s has no requests", name)
	}
	prompts := Prompts(reqs, DefaultVocab)
	start := time.Now()
	// Rows carry their replica count when a count above one is swept (as
	// NewReport names them).
	named := slices.ContainsFunc(o.Replicas, func(n int) bool { return n > 1 })
	progress := func(r Result) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%-16s ×%-4g hit %5.1f %%  TTFT p50 %9s p99 %9s  (%.1f s)\n", r.Name(named), r.Speedup,
				100*r.HitRate, msStr(r.TTFT.P50), msStr(r.TTFT.P99), r.Wall)
		}
	}
	results, err := Sweep(ctx, o.Config, reqs, prompts, o.Policies, o.Speedups, o.Replicas, o.Parallel, progress)
	if err != nil {
		return err
	}
	rep := NewReport(name, len(reqs), o.Config, results)
	for _, wt := range o.Weights {
		c := o.Config
		c.Options.OverlapCredit = wt
		rs, err := Sweep(ctx, c, reqs, prompts, []Policy{Prefixd, Oracle}, o.Speedups, nil, o.Parallel, progress)
		if err != nil {
			return err
		}
		rep.Weights = append(rep.Weights, rs...)
	}
	slices.SortStableFunc(rep.Weights, byPolicyOrder)
	if err := rep.WriteTable(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d runs in %.1f s.\n", len(results)+len(rep.Weights), time.Since(start).Seconds())
	if o.Out == "" {
		return nil
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	files := []string{filepath.Join(o.Out, "report.json"), filepath.Join(o.Out, "report.md")}
	if err := writeFile(files[0], rep.WriteJSON); err != nil {
		return err
	}
	if err := writeFile(files[1], rep.WriteTable); err != nil {
		return err
	}
	cdfAt := 1.0
	if !slices.Contains(o.Speedups, cdfAt) {
		cdfAt = o.Speedups[0]
	}
	charts, err := rep.WriteCharts(o.Out, cdfAt)
	if err != nil {
		return err
	}
	for _, f := range append(files, charts...) {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}

func readTrace(path string) ([]trace.Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := trace.Read(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
