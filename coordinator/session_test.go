package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// sessionService is a Service over three one-rank aggregated engines
// with session affinity (TTL 10 minutes) and a router queue. A worker is
// over the pool's threshold past 100 booked prefill tokens and busy for
// the queue past 50; a request of sessReq books 64 (4 blocks of 16).
func sessionService(t interface{ Fatal(...any) }, ttl time.Duration, maxSessions int) (*Service, *clock) {
	clk := &clock{t0}
	qc := DefaultQueueConfig()
	cfg := ServiceConfig{Pool: DefaultPoolConfig(), Now: clk.now, Rand: seeded(1), Queue: &qc, SessionTTL: ttl, MaxSessions: maxSessions}
	cfg.Pool.Thresholds.PrefillTokens = 100
	cfg.QueueBusy.PrefillTokens = 50
	s := NewService(cfg)
	for id := uint64(1); id <= 3; id++ {
		if err := s.SetEngine(engine(id, RoleAggregated, endpoint(id))); err != nil {
			t.Fatal(err)
		}
	}
	return s, clk
}

func sessReq(id, session string) SelectRequest {
	return SelectRequest{ID: id, Pool: qPool, Hashes: hashes(7, 4), Session: session}
}

// TestSessionAffinity: a session goes back to its rank while that rank
// may take the request, and moves (once, then sticks again) when it
// cannot.
func TestSessionAffinity(t *testing.T) {
	type step func(t *testing.T, s *Service, clk *clock)
	load := func(n int) step { // n bookings of 64 prefill tokens on rank 1, no session
		return func(t *testing.T, s *Service, _ *clock) {
			for i := range n {
				if _, err := s.Reserve(SelectRequest{ID: fmt.Sprint("load", i), Pool: qPool, Hashes: hashes(100, 4), Pin: pin(1)}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, tc := range []struct {
		name  string
		setup step
		req   func() SelectRequest
		wait  bool // through Enqueue, with a Wait
		want  func(indexer.Rank) bool
		stats SessionStats
	}{
		{name: "hit", req: func() SelectRequest { return sessReq("x", "s") },
			want: is(1), stats: SessionStats{Sessions: 1, Hits: 1, New: 1}},
		{name: "hit on a dearer rank", setup: load(1), req: func() SelectRequest { return sessReq("x", "s") },
			want: is(1), stats: SessionStats{Sessions: 1, Hits: 1, New: 1}},
		{name: "over the pool's threshold", setup: load(2), req: func() SelectRequest { return sessReq("x", "s") },
			want: not(1), stats: SessionStats{Sessions: 1, Moves: 1, New: 1}},
		{name: "busy for the queue, with a Wait", setup: load(1), wait: true, req: func() SelectRequest { return sessReq("x", "s") },
			want: not(1), stats: SessionStats{Sessions: 1, Moves: 1, New: 1}},
		{name: "busy for the queue, without a Wait", setup: load(1), req: func() SelectRequest { return sessReq("x", "s") },
			want: is(1), stats: SessionStats{Sessions: 1, Hits: 1, New: 1}},
		{name: "gone", setup: func(_ *testing.T, s *Service, _ *clock) {
			s.RemoveEngine(EngineKey{Model: "m", Group: "default", WorkerID: 1})
		}, req: func() SelectRequest { return sessReq("x", "s") },
			want: not(1), stats: SessionStats{Sessions: 1, Moves: 1, New: 1}},
		{name: "not allowed", req: func() SelectRequest { r := sessReq("x", "s"); r.Allowed = []uint64{2}; return r },
			want: is(2), stats: SessionStats{Sessions: 1, Moves: 1, New: 1}},
		{name: "past the TTL", setup: func(_ *testing.T, _ *Service, clk *clock) { clk.t = clk.t.Add(10*time.Minute + 1) },
			req: func() SelectRequest { return sessReq("x", "s") }, want: not(1), stats: SessionStats{Sessions: 1, New: 2}},
		{name: "another session", req: func() SelectRequest { return sessReq("x", "t") },
			want: not(1), stats: SessionStats{Sessions: 2, New: 2}},
		{name: "pinned elsewhere", req: func() SelectRequest { r := sessReq("x", "s"); r.Pin = pin(3); return r },
			want: is(3), stats: SessionStats{Sessions: 1, Moves: 1, New: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := sessionService(t, 10*time.Minute, 0)
			// The session starts on rank 1, which then holds a request
			// but no prefill: selection alone prefers ranks 2 and 3.
			if _, err := s.Reserve(SelectRequest{ID: "first", Pool: qPool, Hashes: hashes(200, 4), Pin: pin(1), Session: "s"}); err != nil {
				t.Fatal(err)
			}
			if err := s.ReservePrefillComplete("first"); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, s, clk)
			}
			r := tc.req()
			var c Choice
			var err error
			if tc.wait {
				r.Wait = &Wait{}
				var tk *Ticket
				c, tk, err = s.Enqueue(r)
				if tk != nil {
					t.Fatal("queued with a free worker")
				}
			} else if r.Pin != nil {
				c, err = s.Reserve(r)
			} else {
				c, err = s.SelectAndReserve(r)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(c.Rank) {
				t.Errorf("booked on %v", c.Rank)
			}
			if got := s.SessionStats(); got != tc.stats {
				t.Errorf("stats %+v, want %+v", got, tc.stats)
			}
			// The session is now on c.Rank: its next request (no load
			// added there beyond the pool's threshold) sticks to it.
			if r.Session == "s" {
				if err := s.Free("x"); err != nil {
					t.Fatal(err)
				}
				r2 := sessReq("y", "s")
				r2.Allowed = r.Allowed
				c2, err := s.SelectAndReserve(r2)
				if err != nil {
					t.Fatal(err)
				}
				if c2.Rank != c.Rank {
					t.Errorf("next request on %v, want the session's %v", c2.Rank, c.Rank)
				}
			}
		})
	}
}

func is(id uint64) func(indexer.Rank) bool  { return func(r indexer.Rank) bool { return r == rk(id) } }
func not(id uint64) func(indexer.Rank) bool { return func(r indexer.Rank) bool { return r != rk(id) } }

// TestSessionSpreadWithout: the control of TestSessionAffinity's "hit on
// a dearer rank": without its session the request goes elsewhere.
func TestSessionSpreadWithout(t *testing.T) {
	s, _ := sessionService(t, 10*time.Minute, 0)
	if _, err := s.Reserve(SelectRequest{ID: "load", Pool: qPool, Hashes: hashes(100, 4), Pin: pin(1)}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, err := s.SelectAndReserve(sessReq(fmt.Sprint("x", i), ""))
		if err != nil {
			t.Fatal(err)
		}
		if c.Rank == rk(1) {
			t.Fatalf("request %d without a session on the loaded rank 1", i)
		}
	}
	if got := s.SessionStats(); got != (SessionStats{}) {
		t.Errorf("stats %+v without sessions", got)
	}
}

// TestSessionOff: with SessionTTL 0 sessions are ignored and nothing is
// counted; Select never counts or moves a session.
func TestSessionOff(t *testing.T) {
	s, _ := sessionService(t, 0, 0)
	for i := range 3 {
		if _, err := s.SelectAndReserve(sessReq(fmt.Sprint("x", i), "s")); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.SessionStats(); got != (SessionStats{}) {
		t.Errorf("off: stats %+v", got)
	}
	s, _ = sessionService(t, time.Minute, 0)
	if _, err := s.Select(sessReq("x", "s")); err != nil {
		t.Fatal(err)
	}
	if got := s.SessionStats(); got != (SessionStats{}) {
		t.Errorf("after Select: stats %+v, want nothing", got)
	}
}

// TestSessionWaiterPlaced: a waiting request of a session is placed on
// its session's rank when that rank frees, and moves when another frees
// first.
func TestSessionWaiterPlaced(t *testing.T) {
	s, _ := queuedService(t, DefaultQueueConfig(), nil) // ranks 1 and 2, busy with any prefill
	s.sess = newSessions(time.Minute, 0)
	if _, err := s.Reserve(SelectRequest{ID: "a", Pool: qPool, Hashes: hashes(7, 4), Pin: pin(1), Session: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(SelectRequest{ID: "b", Pool: qPool, Hashes: hashes(50, 4), Pin: pin(2)}); err != nil {
		t.Fatal(err)
	}
	place := func(id, complete string) Choice {
		t.Helper()
		r := sessReq(id, "s")
		r.Wait = &Wait{}
		_, tk, err := s.Enqueue(r)
		if err != nil || tk == nil {
			t.Fatalf("enqueue %s: ticket %v, %v", id, tk, err)
		}
		if err := s.ReservePrefillComplete(complete); err != nil {
			t.Fatal(err)
		}
		<-tk.Done()
		c, err := tk.Result()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Rank 2 frees first: the session moves there.
	if c := place("w1", "b"); c.Rank != rk(2) {
		t.Fatalf("w1 on %v, want 2", c.Rank)
	}
	if got, want := s.SessionStats(), (SessionStats{Sessions: 1, New: 1, Moves: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	// Both busy again (a and w1 hold prefill); w1's rank frees: the
	// waiter goes back to it.
	if c := place("w2", "w1"); c.Rank != rk(2) {
		t.Fatalf("w2 on %v, want 2", c.Rank)
	}
	if got, want := s.SessionStats(), (SessionStats{Sessions: 1, New: 1, Moves: 1, Hits: 1}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestSessionBounds: long ids are remembered by their hash, distinct;
// MaxSessions bounds the map; Expire forgets sessions past the TTL.
func TestSessionBounds(t *testing.T) {
	long := strings.Repeat("a", MaxSessionIDLen)
	if got := sessionID(long); got != long {
		t.Errorf("an id of %d bytes changed", len(long))
	}
	h1, h2 := sessionID(long+"b"), sessionID(long+"c")
	if h1 == h2 || len(h1) != len("sha256:")+64 || !strings.HasPrefix(h1, "sha256:") {
		t.Errorf("long ids hashed to %q and %q", h1, h2)
	}
	s, clk := sessionService(t, time.Minute, 2)
	for i, id := range []string{long + "b", long + "c", "x"} {
		if _, err := s.SelectAndReserve(sessReq(fmt.Sprint("r", i), id)); err != nil {
			t.Fatal(err)
		}
		if err := s.Free(fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.SessionStats(); got.Sessions != 2 || got.New != 3 {
		t.Errorf("stats %+v, want 2 sessions remembered of 3 new", got)
	}
	clk.t = clk.t.Add(time.Minute + 1)
	s.Expire(clk.t)
	if got := s.SessionStats(); got.Sessions != 0 {
		t.Errorf("%d sessions past the TTL remembered", got.Sessions)
	}
}

// TestSessionProperty drives a Service with session affinity through
// random bookings, frees, prefill completions, engine changes and clock
// steps, and checks against a model of each session's rank: a request
// whose session's rank was live, in the pool, allowed and under every
// threshold that applies is booked there, and only such a booking counts
// as a hit (a sticky request never lands on a busy or excluded worker);
// no request lands on a worker it excludes; every booking of a session
// counts once; the map never holds more than MaxSessions.
func TestSessionProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		maxSessions := rapid.IntRange(1, 4).Draw(rt, "maxSessions")
		s, clk := sessionService(rt, time.Minute, maxSessions)
		type last struct {
			rank indexer.Rank
			at   time.Time
		}
		model := map[string]last{} // a superset of what the LRU keeps
		var live []string
		present := map[uint64]bool{1: true, 2: true, 3: true}
		for i := range rapid.IntRange(1, 50).Draw(rt, "steps") {
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0, 1: // a booking
				sess := rapid.SampledFrom([]string{"", "a", "b", "c", "d", "e"}).Draw(rt, "session")
				r := sessReq(fmt.Sprint("r", i), sess)
				r.Hashes = hashes(uint64(rapid.IntRange(0, 3).Draw(rt, "prompt"))*10, 4)
				if rapid.Bool().Draw(rt, "allowed") {
					r.Allowed = []uint64{uint64(rapid.IntRange(1, 3).Draw(rt, "a1")), uint64(rapid.IntRange(1, 3).Draw(rt, "a2"))}
				}
				wait := rapid.Bool().Draw(rt, "wait")
				// What the remembered rank looks like before the booking.
				var want *indexer.Rank
				if m, ok := model[sess]; ok && sess != "" && clk.t.Sub(m.at) <= time.Minute {
					p := s.pools.Pool(qPool)
					ws, in := p.workers[m.rank]
					if in && p.eligible(ws, &Query{Allowed: r.Allowed}) && !p.overloaded(ws) && !(wait && over(ws, &s.wait.busy)) {
						want = &m.rank
					}
				}
				before := s.SessionStats()
				var c Choice
				var err error
				if wait {
					r.Wait = &Wait{}
					var tk *Ticket
					c, tk, err = s.Enqueue(r)
					if tk != nil { // every worker busy: leave
						s.Cancel(tk)
						continue
					}
				} else {
					c, err = s.SelectAndReserve(r)
				}
				if err != nil {
					if want != nil {
						rt.Fatalf("%s (session %q): %v, its rank %v was free", r.ID, sess, err, *want)
					}
					continue
				}
				live = append(live, r.ID)
				after := s.SessionStats()
				if want != nil && c.Rank != *want {
					rt.Fatalf("%s (session %q) on %v, want its rank %v", r.ID, sess, c.Rank, *want)
				}
				if len(r.Allowed) > 0 && !slices.Contains(r.Allowed, c.Rank.WorkerID) {
					rt.Fatalf("%s on %v, not allowed %v", r.ID, c.Rank, r.Allowed)
				}
				if sess != "" {
					if after.Hits+after.Moves+after.New != before.Hits+before.Moves+before.New+1 {
						rt.Fatalf("stats %+v after %+v: one booking not counted once", after, before)
					}
					if (after.Hits > before.Hits) != (want != nil) {
						rt.Fatalf("hit counted %v, sticky %v", after.Hits > before.Hits, want != nil)
					}
					model[sess] = last{c.Rank, clk.t}
				} else if after != before {
					rt.Fatalf("stats changed by a request without a session")
				}
			case 2: // a booking ends or completes its prefill
				if len(live) == 0 {
					continue
				}
				j := rapid.IntRange(0, len(live)-1).Draw(rt, "which")
				if rapid.Bool().Draw(rt, "free") {
					_ = s.Free(live[j])
					live = slices.Delete(live, j, j+1)
				} else {
					_ = s.ReservePrefillComplete(live[j])
				}
			case 3: // an engine leaves or comes back
				id := uint64(rapid.IntRange(1, 3).Draw(rt, "engine"))
				if present[id] {
					s.RemoveEngine(EngineKey{Model: "m", Group: "default", WorkerID: id})
				} else if err := s.SetEngine(engine(id, RoleAggregated, endpoint(id))); err != nil {
					rt.Fatal(err)
				}
				present[id] = !present[id]
			case 4:
				clk.t = clk.t.Add(time.Duration(rapid.IntRange(0, 40).Draw(rt, "seconds")) * time.Second)
			case 5:
				s.Expire(clk.t)
			}
			if n := s.SessionStats().Sessions; n > maxSessions {
				rt.Fatalf("%d sessions remembered, max %d", n, maxSessions)
			}
			// The LRU forgets sessions the model keeps: drop those.
			for sess := range model {
				s.mu.Lock()
				_, ok := s.sess.m.Peek(sessionKey{qPool, sess})
				s.mu.Unlock()
				if !ok {
					delete(model, sess)
				}
			}
		}
	})
}
