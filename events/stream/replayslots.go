package stream

import (
	"context"
	"slices"
	"sync"
	"time"
)

// DefaultReplayBudget is how long a replay attempt may hold a slot while
// other ranks wait for one (ReplaySlots). An honest replay of vLLM's
// whole 10,000-batch buffer takes well under a second on loopback; a
// preempted one carries on from where it was, after the ranks that waited.
const DefaultReplayBudget = 10 * time.Second

// ReplaySlots bounds how many replay attempts run at once across the
// Subscribers that share it (a replay costs the engine a burst of sends
// and the daemon a burst of applies; a restarted daemon with hundreds of
// ranks would otherwise ask every engine at once).
//
// Slots are handed out first come, first served. An attempt that has held
// its slot for longer than the budget while others wait is preempted: it
// ends as incomplete (the cursor asks again from the first missing seq)
// and queues behind them, so a slow or endless replay — an engine that
// trickles one batch every few seconds and never sends the end marker —
// cannot keep a slot from ranks that are waiting. Waiting for a slot does
// not count against an attempt's idle timeout or the session's deadline.
//
// A nil *ReplaySlots is unbounded. Methods are safe for concurrent use.
type ReplaySlots struct {
	n      int
	budget time.Duration

	mu      sync.Mutex // guards the fields below
	held    []*ReplaySlot
	waiting []*slotWaiter // first come, first served
}

// ReplaySlot is one granted slot. Release it when the attempt ends.
type ReplaySlot struct {
	slots     *ReplaySlots
	onPreempt func()
	timer     *time.Timer
	over      bool // held past the budget; guarded by slots.mu
	preempted bool // guarded by slots.mu
	released  bool // guarded by slots.mu
}

type slotWaiter struct {
	grant     chan *ReplaySlot // cap 1
	onPreempt func()
}

// NewReplaySlots returns n slots whose holders are preempted after
// budget when others wait (DefaultReplayBudget if budget ≤ 0); n ≤ 0
// means unbounded (nil).
func NewReplaySlots(n int, budget time.Duration) *ReplaySlots {
	if n <= 0 {
		return nil
	}
	if budget <= 0 {
		budget = DefaultReplayBudget
	}
	return &ReplaySlots{n: n, budget: budget}
}

// Acquire waits for a slot, in arrival order, until ctx ends. onPreempt
// (which may be nil) is called, from another goroutine and at most once,
// if the slot is preempted; the holder should then end its attempt and
// Release. On a nil *ReplaySlots it returns at once with a slot that is
// never preempted.
func (s *ReplaySlots) Acquire(ctx context.Context, onPreempt func()) (*ReplaySlot, error) {
	if s == nil {
		return &ReplaySlot{}, ctx.Err()
	}
	s.mu.Lock()
	if len(s.held) < s.n && len(s.waiting) == 0 {
		sl := s.grantLocked(onPreempt)
		s.mu.Unlock()
		return sl, nil
	}
	w := &slotWaiter{grant: make(chan *ReplaySlot, 1), onPreempt: onPreempt}
	s.waiting = append(s.waiting, w)
	preempt := s.preemptLocked()
	s.mu.Unlock()
	runPreempt(preempt)
	select {
	case sl := <-w.grant:
		return sl, nil
	case <-ctx.Done():
		s.mu.Lock()
		if i := slices.Index(s.waiting, w); i >= 0 {
			s.waiting = slices.Delete(s.waiting, i, i+1)
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Unlock()
		(<-w.grant).Release() // granted meanwhile: give it on
		return nil, ctx.Err()
	}
}

// Waiting returns how many attempts wait for a slot.
func (s *ReplaySlots) Waiting() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// grantLocked gives a new slot to the caller. s.mu held.
func (s *ReplaySlots) grantLocked(onPreempt func()) *ReplaySlot {
	sl := &ReplaySlot{slots: s, onPreempt: onPreempt}
	sl.timer = time.AfterFunc(s.budget, func() {
		s.mu.Lock()
		sl.over = !sl.released
		var preempt *ReplaySlot
		if sl.over && len(s.waiting) > 0 && !sl.preempted {
			sl.preempted, preempt = true, sl
		}
		s.mu.Unlock()
		runPreempt(preempt)
	})
	s.held = append(s.held, sl)
	return sl
}

// preemptLocked picks a holder past its budget to preempt for a new
// waiter (the longest held first), or nil. s.mu held.
func (s *ReplaySlots) preemptLocked() *ReplaySlot {
	pending := 0
	for _, h := range s.held {
		if h.preempted {
			pending++ // already giving its slot to someone waiting
		}
	}
	if pending >= len(s.waiting) {
		return nil
	}
	for _, h := range s.held {
		if h.over && !h.preempted {
			h.preempted = true
			return h
		}
	}
	return nil
}

func runPreempt(sl *ReplaySlot) {
	if sl != nil && sl.onPreempt != nil {
		sl.onPreempt()
	}
}

// Preempted reports whether the slot was preempted.
func (sl *ReplaySlot) Preempted() bool {
	if sl.slots == nil {
		return false
	}
	sl.slots.mu.Lock()
	defer sl.slots.mu.Unlock()
	return sl.preempted
}

// Release gives the slot to the first waiter. Later calls do nothing.
func (sl *ReplaySlot) Release() {
	s := sl.slots
	if s == nil {
		return
	}
	s.mu.Lock()
	if sl.released {
		s.mu.Unlock()
		return
	}
	sl.released = true
	sl.timer.Stop()
	if i := slices.Index(s.held, sl); i >= 0 {
		s.held = slices.Delete(s.held, i, i+1)
	}
	var preempt *ReplaySlot
	if len(s.waiting) > 0 {
		w := s.waiting[0]
		s.waiting = slices.Delete(s.waiting, 0, 1)
		w.grant <- s.grantLocked(w.onPreempt)
		preempt = s.preemptLocked()
	}
	s.mu.Unlock()
	runPreempt(preempt)
}
