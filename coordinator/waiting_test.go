package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// queuedService is a Service over two one-rank aggregated engines that
// are busy while they hold any prefill (Thresholds.PrefillTokens 1), with
// a router queue.
func queuedService(t interface{ Fatal(...any) }, qc QueueConfig, obs QueueObserver) (*Service, *clock) {
	clk := &clock{t0}
	cfg := ServiceConfig{Pool: DefaultPoolConfig(), Now: clk.now, Rand: seeded(1), Queue: &qc, QueueObserver: obs}
	cfg.QueueBusy.PrefillTokens = 1
	s := NewService(cfg)
	for id := uint64(1); id <= 2; id++ {
		if err := s.SetEngine(engine(id, RoleAggregated, endpoint(id))); err != nil {
			t.Fatal(err)
		}
	}
	return s, clk
}

var qPool = PoolKey{Model: "m", Group: "default", Role: RoleAggregated}

func waitReq(id string, prio int) SelectRequest {
	return SelectRequest{ID: id, Pool: qPool, Hashes: hashes(7, 4), Wait: &Wait{Priority: prio}}
}

// TestQueueWaitsForAFreeWorker: with both engines busy a waiting request
// is queued, not failed, and is placed when a prefill completes, on the
// worker that freed; a request without Wait still fails.
func TestQueueWaitsForAFreeWorker(t *testing.T) {
	s, _ := queuedService(t, DefaultQueueConfig(), nil)
	var busy []Choice
	for i := range 2 {
		c, tk, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0))
		if err != nil || tk != nil {
			t.Fatalf("enqueue b%d: ticket %v, %v", i, tk, err)
		}
		busy = append(busy, c)
	}
	// A request without a Wait is not subject to the queue's thresholds.
	if _, err := s.SelectAndReserve(SelectRequest{ID: "nowait", Pool: qPool, Hashes: hashes(7, 4)}); err != nil {
		t.Fatalf("no wait, both busy: %v, want a booking", err)
	}
	if err := s.Free("nowait"); err != nil {
		t.Fatal(err)
	}
	_, tk, err := s.Enqueue(waitReq("w", 0))
	if err != nil || tk == nil {
		t.Fatalf("enqueue w: ticket %v, %v", tk, err)
	}
	if n := s.Waiting(qPool); n != 1 {
		t.Fatalf("waiting %d, want 1", n)
	}
	select {
	case <-tk.Done():
		t.Fatal("placed while both engines are busy")
	default:
	}
	if err := s.ReservePrefillComplete("b1"); err != nil {
		t.Fatal(err)
	}
	<-tk.Done()
	c, err := tk.Result()
	if err != nil {
		t.Fatal(err)
	}
	if c.Rank != busy[1].Rank {
		t.Errorf("placed on %v, want %v (the worker that freed)", c.Rank, busy[1].Rank)
	}
	if n := s.Waiting(qPool); n != 0 {
		t.Errorf("waiting %d after placement, want 0", n)
	}
	if err := s.Free("w"); err != nil {
		t.Errorf("free the placed request: %v", err)
	}
}

// TestQueueCancel: a caller that leaves while queued leaves the queue
// with nothing booked; one that leaves after placement has its booking
// freed.
func TestQueueCancel(t *testing.T) {
	s, _ := queuedService(t, DefaultQueueConfig(), nil)
	for i := range 2 {
		if _, _, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	_, a, _ := s.Enqueue(waitReq("a", 0))
	if !s.Cancel(a) {
		t.Fatal("cancel a waiting request: false")
	}
	if _, err := a.Result(); !errors.Is(err, ErrWaitCancelled) {
		t.Errorf("cancelled: %v, want ErrWaitCancelled", err)
	}
	_, b, _ := s.Enqueue(waitReq("b", 0))
	if err := s.Free("b0"); err != nil {
		t.Fatal(err)
	}
	<-b.Done()
	if s.Cancel(b) {
		t.Error("cancel a placed request: true")
	}
	if _, err := s.reservationOf("b"); err == nil {
		t.Error("a placed request whose caller left is still booked")
	}
	if n := s.Reservations(); n != 1 {
		t.Errorf("%d reservations, want 1 (b1)", n)
	}
}

func (s *Service) reservationOf(id string) (*Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reservation(id)
}

// TestQueueExpiry: a request past its deadline is shed with
// ErrWaitExpired and a Retry-After; SelectAndReserveWait returns ctx's
// error when its caller leaves.
func TestQueueExpiry(t *testing.T) {
	s, clk := queuedService(t, DefaultQueueConfig(), nil)
	for i := range 2 {
		if _, _, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	r := waitReq("late", 0)
	r.Wait.Deadline = t0.Add(time.Second)
	_, tk, err := s.Enqueue(r)
	if err != nil {
		t.Fatal(err)
	}
	clk.t = t0.Add(time.Second)
	s.Expire(clk.t)
	<-tk.Done()
	_, err = tk.Result()
	var se *ShedError
	if !errors.As(err, &se) || !errors.Is(err, ErrWaitExpired) || se.RetryAfter <= 0 {
		t.Fatalf("expired: %v, want a *ShedError wrapping ErrWaitExpired with a Retry-After", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.SelectAndReserveWait(ctx, waitReq("gone", 0))
		errc <- err
	}()
	waitFor(t, func() bool { return s.Waiting(qPool) == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller left: %v, want context.Canceled", err)
	}
	if n := s.Waiting(qPool); n != 0 {
		t.Errorf("waiting %d after the caller left, want 0", n)
	}
}

// TestQueuePlacementOrder: when a worker frees, shortest-work places the
// waiter with the least uncached prefill on it, FCFS the oldest.
func TestQueuePlacementOrder(t *testing.T) {
	for _, tc := range []struct {
		order QueueOrder
		want  string
	}{{QueueShortestWork, "short"}, {QueueFCFS, "long"}} {
		t.Run(tc.order.String(), func(t *testing.T) {
			qc := DefaultQueueConfig()
			qc.Order = tc.order
			s, clk := queuedService(t, qc, nil)
			for i := range 2 {
				if _, _, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0)); err != nil {
					t.Fatal(err)
				}
			}
			tickets := map[string]*Ticket{}
			for _, w := range []struct {
				id     string
				blocks int
			}{{"long", 40}, {"short", 2}} {
				_, tk, err := s.Enqueue(SelectRequest{ID: w.id, Pool: qPool, Hashes: hashes(1000*uint64(w.blocks), w.blocks), Wait: &Wait{}})
				if err != nil || tk == nil {
					t.Fatalf("enqueue %s: %v, %v", w.id, tk, err)
				}
				tickets[w.id] = tk
				clk.t = clk.t.Add(time.Millisecond)
			}
			if err := s.ReservePrefillComplete("b0"); err != nil {
				t.Fatal(err)
			}
			for id, tk := range tickets {
				select {
				case <-tk.Done():
					if id != tc.want {
						t.Errorf("%s placed first, want %s", id, tc.want)
					}
				default:
					if id == tc.want {
						t.Errorf("%s still waits", id)
					}
				}
			}
		})
	}
}

// TestQueueOvertakingBound: under shortest-work a long waiter that has
// waited Aging is among the waiters compared, and is overtaken by
// shorter, younger ones at most bestFit times, then placed first.
func TestQueueOvertakingBound(t *testing.T) {
	s, clk := queuedService(t, DefaultQueueConfig(), nil)
	s.wait.bestFit = 2
	for i := range 2 {
		if _, _, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"long", "s1", "s2", "s3", "s4"}
	tickets := map[string]*Ticket{}
	for i, id := range ids {
		n := 2
		if id == "long" {
			n = 40
		}
		_, tk, err := s.Enqueue(SelectRequest{ID: id, Pool: qPool, Hashes: hashes(uint64(i+1)<<10, n), Wait: &Wait{}})
		if err != nil || tk == nil {
			t.Fatalf("enqueue %s: %v, %v", id, tk, err)
		}
		tickets[id] = tk
		clk.t = clk.t.Add(time.Millisecond)
	}
	clk.t = clk.t.Add(DefaultQueueAging) // all aged: compared in arrival order
	var order []string
	free := "b0"
	for len(order) < len(ids) {
		if err := s.Free(free); err != nil {
			t.Fatal(err)
		}
		placed := ""
		for _, id := range ids {
			select {
			case <-tickets[id].Done():
				if !slices.Contains(order, id) {
					placed = id
				}
			default:
			}
		}
		if placed == "" {
			t.Fatalf("nothing placed after freeing %s (order so far %v)", free, order)
		}
		order = append(order, placed)
		free = placed
	}
	if want := []string{"s1", "s2", "long", "s3", "s4"}; !slices.Equal(order, want) {
		t.Errorf("placed %v, want %v (long overtaken twice, then first)", order, want)
	}
}

// TestQueueWaitDeadline: SelectAndReserveWait gives up at the request's
// deadline on its own timer, with a *ShedError wrapping ErrWaitExpired,
// and leaves nothing waiting or booked.
func TestQueueWaitDeadline(t *testing.T) {
	s, _ := queuedService(t, DefaultQueueConfig(), nil)
	for i := range 2 {
		if _, _, err := s.Enqueue(waitReq(fmt.Sprint("b", i), 0)); err != nil {
			t.Fatal(err)
		}
	}
	r := waitReq("soon", 3)
	r.Wait.Deadline = t0.Add(20 * time.Millisecond) // the test clock stays at t0
	_, err := s.SelectAndReserveWait(context.Background(), r)
	var se *ShedError
	if !errors.As(err, &se) || !errors.Is(err, ErrWaitExpired) || se.Priority != 3 {
		t.Fatalf("deadline passed: %v, want a priority-3 *ShedError wrapping ErrWaitExpired", err)
	}
	if n := s.Waiting(qPool); n != 0 {
		t.Errorf("waiting %d, want 0", n)
	}
	if n := s.Reservations(); n != 2 {
		t.Errorf("%d reservations, want 2", n)
	}
}

// waitFor polls cond until it holds (another goroutine's progress).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPropertyQueueEndsEveryRequestOnce drives random traffic through a
// queued Service: waiting requests, prefill completions, frees, cancels
// and the clock. Every request ends exactly once (booked, then freed;
// shed; expired; or cancelled), never twice (a second end would close
// its ticket's channel again and panic), and when the traffic stops
// and the bookings are freed no request waits and no load is left.
func TestPropertyQueueEndsEveryRequestOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		qc := DefaultQueueConfig()
		qc.MaxLen = rapid.IntRange(1, 6).Draw(rt, "maxLen")
		qc.MaxWait = time.Duration(rapid.IntRange(1, 5).Draw(rt, "maxWait")) * time.Second
		s, clk := queuedService(rt, qc, nil)
		s.wait.bestFit = rapid.IntRange(1, 3).Draw(rt, "bestFit")
		type req struct {
			t      *Ticket
			booked bool // placed and not freed
			ended  bool // freed, shed, expired or cancelled
		}
		var reqs []*req
		settle := func() {
			for _, r := range reqs {
				if r.t == nil || r.ended || r.booked {
					continue
				}
				select {
				case <-r.t.Done():
					if _, err := r.t.Result(); err == nil {
						r.booked = true
					} else {
						r.ended = true
					}
				default:
				}
			}
		}
		for i := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0:
				id := fmt.Sprint("r", i)
				r := waitReq(id, rapid.IntRange(-1, 1).Draw(rt, "prio"))
				r.Hashes = hashes(uint64(i)<<8, rapid.IntRange(1, 6).Draw(rt, "blocks"))
				_, tk, err := s.Enqueue(r)
				switch {
				case err != nil:
					reqs = append(reqs, &req{ended: true})
				case tk == nil:
					reqs = append(reqs, &req{t: &Ticket{id: id, done: closed()}, booked: true})
				default:
					reqs = append(reqs, &req{t: tk})
				}
			case 1, 2:
				var live []*req
				for _, r := range reqs {
					if r.booked && !r.ended {
						live = append(live, r)
					}
				}
				if len(live) == 0 {
					continue
				}
				r := rapid.SampledFrom(live).Draw(rt, "req")
				if rapid.Bool().Draw(rt, "free") {
					if err := s.Free(r.t.id); err != nil {
						rt.Fatalf("free %s: %v", r.t.id, err)
					}
					r.ended = true
				} else if err := s.ReservePrefillComplete(r.t.id); err != nil {
					rt.Fatalf("prefill complete %s: %v", r.t.id, err)
				}
			case 3:
				var waiting []*req
				for _, r := range reqs {
					if r.t != nil && !r.booked && !r.ended {
						waiting = append(waiting, r)
					}
				}
				if len(waiting) > 0 {
					r := rapid.SampledFrom(waiting).Draw(rt, "cancel")
					if s.Cancel(r.t) {
						r.ended = true
					}
				}
			case 4:
				clk.t = clk.t.Add(time.Duration(rapid.IntRange(1, 3000).Draw(rt, "ms")) * time.Millisecond)
				s.Expire(clk.t)
			}
			settle()
			if n := s.Waiting(qPool); n > qc.MaxLen {
				rt.Fatalf("%d waiting, over MaxLen %d", n, qc.MaxLen)
			}
			// The shortest-work bound: a waiter is overtaken at most
			// bestFit times once compared.
			for id, tk := range s.wait.tickets {
				if tk.passed > s.wait.bestFit {
					rt.Fatalf("%s overtaken %d times, over %d", id, tk.passed, s.wait.bestFit)
				}
			}
		}
		// Free everything booked: the queue drains behind it.
		for {
			settle()
			progress := false
			for _, r := range reqs {
				if r.booked && !r.ended {
					if err := s.Free(r.t.id); err != nil {
						rt.Fatalf("free %s: %v", r.t.id, err)
					}
					r.ended, progress = true, true
				}
			}
			if !progress {
				break
			}
		}
		for _, r := range reqs {
			if !r.ended {
				rt.Fatalf("request %s never ended", r.t.id)
			}
		}
		if n := s.Waiting(qPool); n != 0 {
			rt.Fatalf("%d still waiting", n)
		}
		if !idle(s) {
			rt.Fatalf("load left: %v", loads(s))
		}
	})
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
