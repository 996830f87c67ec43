package routing

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/one-router.json from the current code")

// goldenRequests is how many of the trace's first requests
// testdata/one-router.json replays.
const goldenRequests = 30

// golden returns testdata/one-router.json's results, by policy, in
// Policies order.
func golden(t *testing.T) []Result {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "one-router.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want []Result
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestOneRouterUnchanged: one replica replays exactly as the single
// router did before replicas existed. testdata/one-router.json holds that
// router's results on the trace's first 30 requests, every policy at ×4
// (written by the code before replicas; -rewrite regenerates it,
// which only a change meant to alter the simulation may do). Policies
// added since (PrefixdQueued) are not in it.
func TestOneRouterUnchanged(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:goldenRequests], prompts[:goldenRequests]
	cfg := DefaultConfig()
	cfg.Replicas = 1
	var policies []Policy
	for _, r := range golden(t) {
		policies = append(policies, r.Policy)
	}
	got, err := Sweep(context.Background(), cfg, reqs, prompts, policies, []float64{4}, nil, 0, nil)
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
	want := golden(t)
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
	reqs, prompts = reqs[:goldenRequests], prompts[:goldenRequests]
	cfg := DefaultConfig()
	cfg.Replicas, cfg.Speedup = 8, 4
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
	if s.work.Batches == 0 || s.work.ApplyErrors != 0 {
		t.Errorf("index work %+v: want batches and no errors", s.work)
	}
}

// TestTwoReplicas replays the golden slice with two replicas: every
// request completes and every booking returns; random (no router state)
// routes as the single router did, prefixd (its bookings split) does not.
func TestTwoReplicas(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:goldenRequests], prompts[:goldenRequests]
	got, err := Sweep(context.Background(), DefaultConfig(), reqs, prompts, []Policy{Random, Prefixd}, []float64{4}, []int{2}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := golden(t)
	if len(got) != 2 {
		t.Fatalf("%d results, want 2", len(got))
	}
	for _, r := range got {
		one := want[slices.IndexFunc(want, func(w Result) bool { return w.Policy == r.Policy })]
		if r.Replicas != 2 || r.Completed != len(reqs) || r.Bookings != 0 {
			t.Errorf("%s: %d replicas, %d of %d completed, %d bookings left", r.Name(true), r.Replicas, r.Completed, len(reqs), r.Bookings)
		}
		if same := r.TTFT == one.TTFT && r.E2E == one.E2E; same != (r.Policy == Random) {
			t.Errorf("%s: TTFT %+v, one router's %+v: want equal only for random", r.Name(true), r.TTFT, one.TTFT)
		}
		if r.Index != nil && (r.Index.Batches <= one.Index.Batches || r.Index.ApplyErrors != 0) {
			t.Errorf("%s: index work %+v, one router's %+v: want more batches, no errors", r.Name(true), *r.Index, *one.Index)
		}
	}
}
