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

// Sweep runs every policy at every speedup (cfg.Speedup ignored) and, if
// replicas is set, at every replica count (cfg.Replicas ignored), up to
// parallel runs at once (≤ 0: GOMAXPROCS), and returns the results in
// report order. progress, if set, is called after each run (from the
// runs' goroutines, one at a time).
//
// Random and consistent hashing keep no router state: every replica
// count routes as one router does, so they run at the smallest count
// only.
func Sweep(ctx context.Context, cfg Config, reqs []trace.Request, prompts [][]uint32, policies []Policy, speedups []float64,
	replicas []int, parallel int, progress func(Result)) ([]Result, error) {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	if len(replicas) == 0 {
		replicas = []int{cfg.Replicas}
	}
	type job struct {
		p  Policy
		sp float64
		n  int
	}
	var jobs []job
	for _, sp := range speedups {
		for _, p := range policies {
			for _, n := range replicas {
				if stateless(p) && n != slices.Min(replicas) {
					continue
				}
				jobs = append(jobs, job{p, sp, n})
			}
		}
	}
	// The slowest runs first (the overloaded end of the sweep, the most
	// indexes), so that the last to finish are short.
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Or(cmp.Compare(b.sp, a.sp), cmp.Compare(b.n, a.n)) })
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
			c.Speedup, c.Replicas = j.sp, j.n
			r, err := Run(c, reqs, prompts, j.p)
			if err != nil {
				return fmt.Errorf("%s/r%d at ×%g: %w", j.p, c.replicas(), j.sp, err)
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

// stateless reports whether p routes without router state, the same at
// any replica count.
func stateless(p Policy) bool { return p == Random || p == ConsistentHash }
