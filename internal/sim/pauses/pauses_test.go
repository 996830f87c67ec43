package pauses

import (
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchSeesTheCoreTakenAway: on one P, a goroutine that spins takes
// the core from Watch for a scheduler slice (10 ms) at a time; Watch must
// record those jumps, and Rate, Share and Max must count them.
func TestWatchSeesTheCoreTakenAway(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
		}
	}()
	r := Watch(100 * time.Millisecond)
	stop.Store(true)
	<-done
	if r.Rate(time.Millisecond) < 1 || r.Share(time.Millisecond) < 0.1 || r.Share(MinGap) > 1 || r.Max() < time.Millisecond {
		t.Fatalf("watch over %v: %d jumps, %.0f/s of 1 ms or more, %.2f of the time, longest %v; want some, a tenth of the time at least",
			r.Elapsed, len(r.Gaps), r.Rate(time.Millisecond), r.Share(time.Millisecond), r.Max())
	}
}

// TestResultCounts checks Rate, Share and Max on given jumps.
func TestResultCounts(t *testing.T) {
	r := Result{Elapsed: 2 * time.Second, Gaps: []time.Duration{20 * time.Microsecond, time.Millisecond, 100 * time.Millisecond}}
	if got := r.Rate(MinGap); got != 1.5 {
		t.Errorf("Rate(MinGap) = %v, want 1.5", got)
	}
	if got := r.Rate(500 * time.Microsecond); got != 1 {
		t.Errorf("Rate(500µs) = %v, want 1", got)
	}
	if got, want := r.Share(500*time.Microsecond), 0.101/2; math.Abs(got-want) > 1e-12 {
		t.Errorf("Share(500µs) = %v, want %v", got, want)
	}
	if r.Max() != 100*time.Millisecond || (Result{}).Max() != 0 || (Result{}).Rate(MinGap) != 0 || (Result{}).Share(MinGap) != 0 {
		t.Errorf("Max %v; the zero Result: %v %v %v", r.Max(), (Result{}).Max(), (Result{}).Rate(MinGap), (Result{}).Share(MinGap))
	}
}
