package routing

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/prefixd/prefixd/internal/sim/trace"
)

// Sweep runs every policy at every speedup (cfg.Speedup ignored), up to
// parallel runs at once (≤ 0: GOMAXPROCS), and returns the results in
// report order. progress, if set, is called after each run (from the
// runs' goroutines, one at a time).
func Sweep(ctx context.Context, cfg Config, reqs []trace.Request, prompts [][]uint32, policies []Policy, speedups []float64,
	parallel int, progress func(Result)) ([]Result, error) {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	type job struct {
		p  Policy
		sp float64
	}
	var jobs []job
	for _, sp := range speedups {
		for _, p := range policies {
			jobs = append(jobs, job{p, sp})
		}
	}
	// The slowest runs first (the overloaded end of the sweep), so that
	// the last to finish are short.
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Compare(b.sp, a.sp) })
	results := make([]Result, len(jobs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	done := make(chan Result)
	report := make(chan struct{})
	go func() {
		defer close(report)
		for r := range done {
			if progress != nil {
				progress(r)
			}
		}
	}()
	for i, j := range jobs {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			c := cfg
			c.Speedup = j.sp
			r, err := Run(c, reqs, prompts, j.p)
			if err != nil {
				return fmt.Errorf("%s at ×%g: %w", j.p, j.sp, err)
			}
			results[i] = r
			done <- r
			return nil
		})
	}
	err := g.Wait()
	close(done)
	<-report
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(results, byPolicyOrder)
	return results, nil
}
