package stream

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixd/prefixd/events/cursor"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// waitFor bounds every wait for something that must happen.
const waitFor = 10 * time.Second

// TestReplaySlotsFirstComeFirstServed: waiters get slots in arrival
// order, a waiter that gives up leaves the queue, and nil is unbounded.
func TestReplaySlotsFirstComeFirstServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := NewReplaySlots(1, time.Hour)
	first, err := s.Acquire(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	gone, cancel := context.WithCancel(ctx)
	for i := range 3 {
		testsupport.Eventually(t, waitFor, "the queue to grow", func() bool { return s.Waiting() == i })
		wg.Add(1)
		wctx := ctx
		if i == 1 {
			wctx = gone // gives up before its turn
		}
		go func() {
			defer wg.Done()
			sl, err := s.Acquire(wctx, nil)
			if err != nil {
				return
			}
			order <- i
			sl.Release()
		}()
	}
	testsupport.Eventually(t, waitFor, "three waiters", func() bool { return s.Waiting() == 3 })
	cancel()
	testsupport.Eventually(t, waitFor, "the cancelled waiter to leave", func() bool { return s.Waiting() == 2 })
	first.Release()
	first.Release() // a second Release does nothing
	wg.Wait()
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("slots went to waiters %v, want [0 2]", got)
	}
	var unbounded *ReplaySlots
	if sl, err := unbounded.Acquire(ctx, nil); err != nil || sl.Preempted() {
		t.Fatalf("nil slots: %v, %v", sl, err)
	}
}

// TestReplaySlotsPreemptOverBudget: a holder past its budget is preempted
// when someone waits, never when no one does, and at most one holder per
// waiter.
func TestReplaySlotsPreemptOverBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := NewReplaySlots(2, 20*time.Millisecond)
	var preempted atomic.Int32
	onPreempt := func() { preempted.Add(1) }
	a, _ := s.Acquire(ctx, onPreempt)
	b, _ := s.Acquire(ctx, onPreempt)
	// Both are over budget soon; with no one waiting nothing happens.
	testsupport.Eventually(t, waitFor, "the budget to pass", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return a.over && b.over
	})
	if a.Preempted() || b.Preempted() || preempted.Load() != 0 {
		t.Fatal("preempted with nobody waiting")
	}
	got := make(chan *ReplaySlot)
	go func() {
		sl, _ := s.Acquire(ctx, nil)
		got <- sl
	}()
	testsupport.Eventually(t, waitFor, "one holder preempted", func() bool { return preempted.Load() == 1 })
	if a.Preempted() == b.Preempted() {
		t.Fatalf("preempted a=%v b=%v; want exactly one for one waiter", a.Preempted(), b.Preempted())
	}
	victim := a
	if b.Preempted() {
		victim = b
	}
	victim.Release()
	sl := <-got
	if sl.Preempted() {
		t.Fatal("the new holder starts preempted")
	}
	sl.Release()
	a.Release()
	b.Release()
}

// slowReplayServer is a hostile replay ROUTER: it answers every request
// with one valid batch every interval, from the seq asked for, and never
// sends the end marker.
func slowReplayServer(t *testing.T, interval time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	router := zmq4.NewRouter(ctx)
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		router.Close()
		wg.Wait()
	})
	var enc wire.Encoder
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			req, err := router.Recv()
			if err != nil {
				return
			}
			if len(req.Frames) != 3 || len(req.Frames[2]) != wire.SeqLen {
				continue
			}
			id, from := req.Frames[0], binary.BigEndian.Uint64(req.Frames[2])
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(interval)
				defer tick.Stop()
				for seq := from; ; seq++ {
					ev := wire.Event{Kind: wire.KindBlockStored, BlockSize: 16, Medium: "GPU", BlockHashes: []uint64{seq + 1}, TokenIDs: make([]uint32, 16)}
					if seq > from {
						ev.ParentHash, ev.HasParent = seq, true
					}
					for i := range ev.TokenIDs {
						ev.TokenIDs[i] = uint32(seq*16) + uint32(i)
					}
					p, err := enc.AppendBatch(nil, &wire.Batch{Events: []wire.Event{ev}})
					if err != nil {
						return
					}
					if router.Send(zmq4.NewMsgFrom(id, nil, wire.AppendSeq(nil, seq), p)) != nil {
						return
					}
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
			}()
		}
	}()
	return "tcp://" + router.Addr().String()
}

// TestSubscriberSlowReplayPreempted: rogue replay servers that trickle
// batches without end take every replay slot; a good rank that needs a
// replay is not starved (their attempts are preempted after their budget
// and queue behind it), says it is queued while it waits, and ends exact;
// the rogue ranks end degraded at their session deadline instead of
// holding slots forever.
func TestSubscriberSlowReplayPreempted(t *testing.T) {
	t.Parallel()
	const rogues = 2
	slots := NewReplaySlots(rogues, time.Second)
	ix, app := newE2EIndex(t)
	var subs []*e2eSub
	for i := range rogues {
		live := startEngine(t, indexer.Rank{WorkerID: uint64(40 + i)}, mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
		subs = append(subs, startSubscriber(t, Source{Worker: uint64(40 + i), Endpoint: live.pub.Endpoint(), ReplayEndpoint: slowReplayServer(t, 200*time.Millisecond)},
			app, SubscriberConfig{ReplaySlots: slots, IdleTimeout: time.Second, Cursor: cursor.Config{Deadline: 6 * time.Second}}))
	}
	testsupport.Eventually(t, waitFor, "the rogues to hold every slot", func() bool {
		for _, s := range subs {
			if s.s.State().Replay != ReplayRunning {
				return false
			}
		}
		return true
	})
	e := startEngine(t, indexer.Rank{WorkerID: 50}, mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	e.feed(e2eOps(t, 50, 1, 300)[0])
	var queued atomic.Bool
	good := startSubscriber(t, Source{Worker: 50, Endpoint: e.pub.Endpoint(), ReplayEndpoint: e.pub.ReplayEndpoint()}, app,
		SubscriberConfig{ReplaySlots: slots, IdleTimeout: time.Second, Cursor: cursor.Config{Deadline: 6 * time.Second},
			OnStateChange: func(st State) {
				if st.Replay == ReplayQueued && !st.ReplayQueuedSince.IsZero() {
					queued.Store(true)
				}
			}})
	start := time.Now()
	caughtUp(t, good, e)
	t.Logf("the good rank caught up %v after it joined (replay budget 1 s, rogues' deadline 6 s)", time.Since(start).Round(time.Millisecond))
	// Before the rogues' 6 s deadline: only preemption can have freed a
	// slot for the good rank.
	for i, s := range subs {
		if st := s.s.State(); st.Degraded || st.Stats.ReplaysFailed > 0 {
			t.Fatalf("rogue %d gave up (%+v) before the good rank caught up: it got a slot only from the deadline", i, st)
		}
	}
	if !queued.Load() {
		t.Error("the good rank never reported waiting for a replay slot")
	}
	if st := good.s.State(); st.Degraded {
		t.Fatalf("good rank degraded: %+v", st)
	}
	checkIndex(t, ix, e, false)
	for i, s := range subs {
		testsupport.Eventually(t, 20*time.Second, "a rogue rank's session to hit its deadline", func() bool {
			st := s.s.State()
			return st.Degraded && st.Replay == ReplayNone
		})
		if st := s.s.State().Stats; st.ReplaysFailed == 0 {
			t.Errorf("rogue %d: %+v", i, st)
		}
	}
}
