package mocker

import (
	"container/heap"
	"sync"
	"time"
)

// Clock is the time an Engine runs on: its scheduler waits for the end of
// each step and for KV transfers on it, and stamps batches and requests
// with its Now.
//
// The engine's model — which requests a step schedules, what the step
// costs, when a token or a transfer is done — lives in Scheduler, a plain
// type driven by method calls with an explicit now that never reads a
// clock. The Engine is a thin goroutine on top that sleeps on a Clock
// between steps. So a model can run without real waiting in two ways:
//
//   - a discrete-event simulation drives Scheduler directly: Add each
//     request at its arrival time, Plan a step at now, and Finish it at
//     now plus the plan's Duration, keeping its own queue of arrivals,
//     step ends and transfer ends (Scheduler.NextTransfer) on virtual
//     time — no goroutines, no clock;
//   - a test (or a simulation that wants the HTTP engine) gives the Engine
//     a VirtualClock and advances it, e.g. with AdvanceToNext whenever
//     the engine waits (Waiters), so every step takes exactly its modelled
//     time and none of it passes for real.
//
// RealClock is the default.
type Clock interface {
	// Now returns the clock's current time.
	Now() time.Time
	// NewTimer returns a timer whose channel receives the clock's time
	// once d has passed on it (at once for d <= 0).
	NewTimer(d time.Duration) *Timer
}

// Timer is a Clock's one-shot timer, as time.Timer.
type Timer struct {
	// C receives the clock's time when the timer fires; it is buffered.
	C    <-chan time.Time
	stop func() bool
}

// Stop prevents the timer from firing; it reports whether it stopped it
// (false: it had fired or been stopped).
func (t *Timer) Stop() bool { return t.stop() }

// RealClock is the wall clock.
var RealClock Clock = realClock{}

type realClock struct{}

var _ Clock = realClock{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) *Timer {
	t := time.NewTimer(d)
	return &Timer{C: t.C, stop: t.Stop}
}

// VirtualClock is a Clock that moves only when told to (Advance,
// AdvanceToNext): timers fire when the time passes their deadline, in
// deadline order. Safe for concurrent use.
type VirtualClock struct {
	mu      sync.Mutex // guards now, timers, seq and changed
	now     time.Time
	timers  timerHeap
	seq     uint64        // orders timers with equal deadlines by creation
	changed chan struct{} // closed (and replaced) when a timer is added
}

var _ Clock = (*VirtualClock)(nil)

// NewVirtualClock returns a virtual clock reading start.
func NewVirtualClock(start time.Time) *VirtualClock {
	return &VirtualClock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires once the clock has advanced by d
// (at once for d <= 0).
func (c *VirtualClock) NewTimer(d time.Duration) *Timer {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if d <= 0 {
		ch <- c.now
		return &Timer{C: ch, stop: func() bool { return false }}
	}
	vt := &vtimer{at: c.now.Add(d), seq: c.seq, ch: ch, index: -1}
	c.seq++
	heap.Push(&c.timers, vt)
	close(c.changed)
	c.changed = make(chan struct{})
	return &Timer{C: ch, stop: func() bool { return c.stopTimer(vt) }}
}

func (c *VirtualClock) stopTimer(vt *vtimer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if vt.index < 0 {
		return false
	}
	heap.Remove(&c.timers, vt.index)
	return true
}

// Waiters returns how many timers have not fired yet.
func (c *VirtualClock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Changed returns a channel closed when the next timer is added, so that
// a driver can wait for the engine to wait instead of polling Waiters.
func (c *VirtualClock) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Advance moves the clock d forward, firing every timer whose deadline it
// passes, earliest first.
func (c *VirtualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now.Add(d))
}

// AdvanceToNext moves the clock to the earliest pending timer's deadline
// and fires it (and any other due then). It returns how far the clock
// moved, and false if no timer was pending (the clock did not move).
func (c *VirtualClock) AdvanceToNext() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	d := c.timers[0].at.Sub(c.now)
	c.setLocked(c.timers[0].at)
	return d, true
}

func (c *VirtualClock) setLocked(t time.Time) {
	if t.After(c.now) {
		c.now = t
	}
	for len(c.timers) > 0 && !c.timers[0].at.After(c.now) {
		vt := heap.Pop(&c.timers).(*vtimer)
		vt.ch <- c.now // buffered, sent once
	}
}

type vtimer struct {
	at    time.Time
	seq   uint64
	ch    chan time.Time
	index int // in the heap; -1 once fired or stopped
}

type timerHeap []*vtimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	vt := x.(*vtimer)
	vt.index = len(*h)
	*h = append(*h, vt)
}
func (h *timerHeap) Pop() any {
	old := *h
	vt := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	vt.index = -1
	return vt
}
