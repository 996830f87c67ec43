package routing

import (
	"testing"
	"time"

	"github.com/prefixd/prefixd/coordinator"
)

// TestReplicasShareBookings replays the golden slice with 8 replicas and
// booking sync on, after the default delay: at every instant with no delta in flight, every replica's Service holds
// the bookings of every replica's open requests, and each engine's booked
// load is the same at all of them. Replicas that kept their bookings to
// themselves (TestReplicasIndependent's), or a delta lost, reordered or
// applied twice, fail it.
func TestReplicasShareBookings(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:goldenRequests], prompts[:goldenRequests]
	cfg := DefaultConfig()
	cfg.Replicas, cfg.Speedup, cfg.Sync = 8, 4, true
	s, err := newSim(cfg, reqs, prompts, Prefixd)
	if err != nil {
		t.Fatal(err)
	}
	checked, spread, lastOpen := 0, 0, 0
	s.stepped = func() {
		if s.syncHead < len(s.syncQ) {
			return // deltas in flight
		}
		checked++
		open, from, changed := 0, map[int]bool{}, false
		for _, r := range s.reqs[:s.next] {
			if r.finished.IsZero() && !r.failed {
				open++
				from[r.replica] = true
			}
			changed = changed || r.firstToken.Equal(s.now)
		}
		if len(from) > 1 {
			spread++
		}
		for _, rep := range s.replicas {
			if got := rep.svc.Reservations(); got != open {
				t.Fatalf("at %v replica %d holds %d bookings, %d requests are open", s.now.Sub(epoch), rep.i, got, open)
			}
		}
		// The engines' bookings change with an admit, a prefill done or
		// a free: compare them then.
		if !changed && open == lastOpen {
			return
		}
		lastOpen = open
		for _, e := range s.engines {
			k := coordinator.EngineKey{Model: model, Group: group, WorkerID: e.rank.WorkerID}
			want, _ := s.replicas[0].svc.RankLoad(k, 0)
			for _, rep := range s.replicas[1:] {
				if got, _ := rep.svc.RankLoad(k, 0); got.Booked != want.Booked {
					t.Fatalf("at %v engine %d: replica %d books %+v, replica 0 %+v", s.now.Sub(epoch), e.idx, rep.i, got.Booked, want.Booked)
				}
			}
		}
	}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	if spread == 0 {
		t.Errorf("%d instants checked, none with requests open at two replicas: the test checks nothing", checked)
	}
	res := s.result()
	if res.Completed != len(reqs) || res.Bookings != 0 || res.PeerDropped != 0 {
		t.Errorf("%d of %d completed, %d bookings left, %d deltas dropped", res.Completed, len(reqs), res.Bookings, res.PeerDropped)
	}
	for _, rep := range s.replicas {
		for _, p := range rep.svc.Peers() {
			if p.Gaps != 0 || p.Dropped != 0 || p.Bookings != 0 || p.Applied == 0 {
				t.Errorf("replica %d peer %+v: want deltas applied, no gaps or drops, nothing left", rep.i, p)
			}
		}
	}
}

// TestScrapeEngineLoad replays the golden slice with 4 replicas scraping
// every 250ms: at every instant, each replica's figure for each engine is
// what the engine's scheduler reported at that replica's last scrape (the
// running requests, the waiting and transferring ones, the KV usage as
// vLLM counts it), taken at its own phase.
func TestScrapeEngineLoad(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:goldenRequests], prompts[:goldenRequests]
	cfg := DefaultConfig()
	cfg.Replicas, cfg.Speedup, cfg.ScrapeInterval = 4, 4, 250*time.Millisecond
	s, err := newSim(cfg, reqs, prompts, Prefixd)
	if err != nil {
		t.Fatal(err)
	}
	// seen[replica][engine] is the engine's state at the replica's last
	// scrape, read by the test.
	seen := make([][]coordinator.EngineLoad, len(s.replicas))
	phases := map[time.Duration]bool{}
	scrapes, busy := 0, 0
	s.stepped = func() {
		for _, rep := range s.replicas {
			if !rep.lastScrape.IsZero() && rep.lastScrape.Equal(s.now) {
				scrapes++
				phases[s.now.Sub(epoch)%cfg.ScrapeInterval] = true
				seen[rep.i] = seen[rep.i][:0]
				for _, e := range s.engines {
					l := e.sched.Load()
					seen[rep.i] = append(seen[rep.i], coordinator.EngineLoad{At: s.now, Running: l.Running,
						Waiting: l.Waiting + l.Transferring, KVUsage: l.KVUsage})
					if l.Running > 0 && l.KVUsage > 0 {
						busy++
					}
				}
			}
			if want := rep.nextScrape.Sub(rep.lastScrape); !rep.lastScrape.IsZero() && want != cfg.ScrapeInterval {
				t.Fatalf("replica %d scrapes %v apart, want %v", rep.i, want, cfg.ScrapeInterval)
			}
			for j, e := range s.engines {
				k := coordinator.EngineKey{Model: model, Group: group, WorkerID: e.rank.WorkerID}
				rl, ok := rep.svc.RankLoad(k, 0)
				switch {
				case !ok:
					t.Fatalf("replica %d engine %d: no rank", rep.i, j)
				case seen[rep.i] == nil:
					if rl.HasEngine {
						t.Fatalf("at %v replica %d engine %d: figure %+v before any scrape", s.now.Sub(epoch), rep.i, j, rl.Engine)
					}
				case !rl.HasEngine || rl.Engine != seen[rep.i][j]:
					t.Fatalf("at %v replica %d engine %d: figure %+v (%v), the engine reported %+v at the last scrape",
						s.now.Sub(epoch), rep.i, j, rl.Engine, rl.HasEngine, seen[rep.i][j])
				}
			}
		}
	}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	if busy == 0 || len(phases) < 4 {
		t.Errorf("%d scrapes at %d phases, %d of an engine running: want busy engines seen at several phases", scrapes, len(phases), busy)
	}
	if res := s.result(); res.Completed != len(reqs) || res.Bookings != 0 || res.ScrapeErrors != 0 {
		t.Errorf("%d of %d completed, %d bookings left, %d scrape errors", res.Completed, len(reqs), res.Bookings, res.ScrapeErrors)
	}
}

// TestArrivalJitter: without jitter requests arrive when the trace says;
// with it each arrives up to the jitter later, and the draws differ.
func TestArrivalJitter(t *testing.T) {
	reqs, _ := sliceOf(t)
	reqs = reqs[:goldenRequests]
	cfg := DefaultConfig()
	for i, a := range cfg.arrivals(reqs) {
		if a != reqs[i].Arrival {
			t.Fatalf("request %d arrives at %v without jitter, the trace says %v", i, a, reqs[i].Arrival)
		}
	}
	cfg.ArrivalJitter = 3 * time.Second
	seen := map[time.Duration]bool{}
	for i, a := range cfg.arrivals(reqs) {
		if d := a - reqs[i].Arrival; d < 0 || d >= cfg.ArrivalJitter {
			t.Fatalf("request %d arrives %v after the trace says, want [0, %v)", i, d, cfg.ArrivalJitter)
		}
		seen[a] = true
	}
	if len(seen) < len(reqs)/2 {
		t.Errorf("%d distinct arrivals of %d requests: the jitter spread nothing", len(seen), len(reqs))
	}
}
