package routing

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/one-router.json from the current code")

// TestOneRouterUnchanged: one replica replays exactly as the single
// router did before replicas existed. testdata/one-router.json holds that
// router's results on the trace's first 60 requests, every policy at ×4
// (written by the code before replicas; -rewrite regenerates it,
// which only a change meant to alter the simulation may do).
func TestOneRouterUnchanged(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:60], prompts[:60]
	cfg := DefaultConfig()
	cfg.Replicas = 1
	got, err := Sweep(context.Background(), cfg, reqs, prompts, Policies, []float64{4}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i].Replicas != 1 {
			t.Errorf("%s: %d replicas, want 1", got[i].Policy, got[i].Replicas)
		}
		// The file predates the field.
		got[i].Wall, got[i].Replicas = 0, 0
	}
	path := filepath.Join("testdata", "one-router.json")
	if *rewrite {
		b, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []Result
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d", len(got), len(want))
	}
	for i := range got {
		g := got[i]
		g.TTFTs = nil
		if !reflect.DeepEqual(g, want[i]) {
			t.Errorf("%s ×%g:\n got %+v\nwant %+v", g.Policy, g.Speedup, g, want[i])
		}
	}
}

// TestReplicasIndependent replays a short slice with 8 replicas and checks
// at every instant that each replica's Service holds exactly the bookings
// of the requests that arrived at it and have not ended: replicas that
// shared bookings, or a request booked at the wrong one, fail it. At the
// end every replica's index holds exactly each engine's blocks: every
// replica received every engine's events.
func TestReplicasIndependent(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:100], prompts[:100]
	cfg := DefaultConfig()
	cfg.Replicas, cfg.Speedup, cfg.TotalBlocks = 8, 4, 4096 // evictions in the slice
	s, err := newSim(cfg, reqs, prompts, Prefixd)
	if err != nil {
		t.Fatal(err)
	}
	delays := map[time.Duration]bool{}
	for _, rep := range s.replicas {
		delays[rep.delay] = true
		if rep.delay < cfg.EventDelay || rep.delay > cfg.EventDelay+cfg.ReplicaSpread {
			t.Errorf("replica %d: event delay %v, want %v plus up to %v", rep.i, rep.delay, cfg.EventDelay, cfg.ReplicaSpread)
		}
	}
	if s.replicas[0].delay != cfg.EventDelay || len(delays) < 4 {
		t.Errorf("event delays %v: want the first %v and the others spread", delays, cfg.EventDelay)
	}
	steps, busy := 0, 0
	s.stepped = func() {
		steps++
		open := make([]int, len(s.replicas))
		for _, r := range s.reqs[:s.next] {
			if r.finished.IsZero() && !r.failed {
				open[r.replica]++
			}
		}
		n := 0
		for i, rep := range s.replicas {
			if got := rep.svc.Reservations(); got != open[i] {
				t.Fatalf("at %v replica %d holds %d bookings, %d of its requests are open", s.now.Sub(epoch), i, got, open[i])
			}
			if open[i] > 0 {
				n++
			}
		}
		if n > 1 {
			busy++
		}
	}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	if busy == 0 {
		t.Errorf("%d instants, none with two replicas booking: the test checks nothing", steps)
	}
	k := indexer.PartitionKey{Model: model, Group: group}
	for _, rep := range s.replicas {
		for _, e := range s.engines {
			st, err := rep.ix.Rank(k, e.rank)
			if err != nil {
				t.Fatal(err)
			}
			if want := len(e.pool.Holds()); st.Degraded || st.Truncated || st.Blocks != want {
				t.Errorf("replica %d engine %d: index %+v, engine holds %d blocks", rep.i, e.idx, st, want)
			}
		}
	}
	if s.work.Removed == 0 || s.work.ApplyErrors != 0 {
		t.Errorf("index work %+v: want removals and no errors", s.work)
	}
}

// TestTwoReplicas replays a short slice with two replicas: every request
// completes, every booking returns, the index applied every batch twice;
// random routes as one router does, and prefixd differently.
func TestTwoReplicas(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:100], prompts[:100]
	cfg := DefaultConfig()
	cfg.Speedup = 4
	got, err := Sweep(context.Background(), cfg, reqs, prompts, []Policy{Random, Prefixd}, []float64{4}, []int{1, 2}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	by := map[string]Result{}
	for _, r := range got {
		names = append(names, r.Name(true))
		by[r.Name(true)] = r
		if r.Completed != len(reqs) || r.Bookings != 0 {
			t.Errorf("%s: %d of %d completed, %d bookings left", r.Name(true), r.Completed, len(reqs), r.Bookings)
		}
	}
	if want := []string{"random/r1", "prefixd/r1", "prefixd/r2"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
	one, two := by["prefixd/r1"], by["prefixd/r2"]
	if two.Index.Batches <= one.Index.Batches || two.Index.ApplyErrors != 0 {
		t.Errorf("index work: one replica %+v, two %+v", *one.Index, *two.Index)
	}
	if one.TTFT == two.TTFT {
		t.Errorf("prefixd: two replicas routed as one (TTFT %+v)", one.TTFT)
	}
	// Random keeps no router state: two replicas are one router.
	cfg.Replicas = 2
	r2, err := Run(cfg, reqs, prompts, Random)
	if err != nil {
		t.Fatal(err)
	}
	r1 := by["random/r1"]
	if r2.Replicas != 2 || r2.TTFT != r1.TTFT || r2.HitRate != r1.HitRate {
		t.Errorf("random: two replicas %+v, one %+v", r2.TTFT, r1.TTFT)
	}
}
