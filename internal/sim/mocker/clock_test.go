package mocker

import (
	"testing"
	"time"
)

func fired(t *Timer) (time.Time, bool) {
	select {
	case at := <-t.C:
		return at, true
	default:
		return time.Time{}, false
	}
}

// TestVirtualClock: timers fire when the clock passes their deadline, in
// deadline order, never before; a stopped timer never fires.
func TestVirtualClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewVirtualClock(start)
	now := c.NewTimer(0)
	if at, ok := fired(now); !ok || !at.Equal(start) {
		t.Fatalf("a zero timer: fired %v at %v, want at once", ok, at)
	}
	changed := c.Changed()
	late, early, stopped := c.NewTimer(3*time.Second), c.NewTimer(time.Second), c.NewTimer(2*time.Second)
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by a new timer")
	}
	if c.Waiters() != 3 {
		t.Fatalf("%d waiters, want 3", c.Waiters())
	}
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop: want true once, then false")
	}
	c.Advance(999 * time.Millisecond)
	if _, ok := fired(early); ok {
		t.Fatal("a timer fired before its deadline")
	}
	d, ok := c.AdvanceToNext()
	if !ok || d != time.Millisecond {
		t.Fatalf("AdvanceToNext moved %v (%v), want 1ms", d, ok)
	}
	if at, ok := fired(early); !ok || !at.Equal(start.Add(time.Second)) {
		t.Fatalf("early timer: fired %v at %v", ok, at)
	}
	if _, ok := fired(late); ok {
		t.Fatal("the late timer fired with the early one")
	}
	c.Advance(time.Hour)
	if at, ok := fired(late); !ok || !at.Equal(start.Add(time.Second+time.Hour)) {
		t.Fatalf("late timer: fired %v at %v, want at the clock's time", ok, at)
	}
	if _, ok := fired(stopped); ok {
		t.Fatal("a stopped timer fired")
	}
	if _, ok := c.AdvanceToNext(); ok || c.Waiters() != 0 {
		t.Fatal("AdvanceToNext with no timers moved the clock")
	}
	if late.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}
}

func TestRealClock(t *testing.T) {
	t.Parallel()
	tm := RealClock.NewTimer(time.Millisecond)
	if at := <-tm.C; at.IsZero() {
		t.Fatal("a real timer fired with no time")
	}
	if RealClock.Now().IsZero() {
		t.Fatal("RealClock.Now is zero")
	}
}
