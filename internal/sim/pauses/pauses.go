// Package pauses watches the machine take the core away: a goroutine
// reads the clock back to back and records every jump of MinGap or more
// (a virtual machine's exits and timer ticks, interrupts, another
// process scheduled in). Benchmarks report it beside their tail
// latencies, which such pauses bound from below: a request, or a writer
// holding a lock that requests need, that is paused waits as long.
package pauses

import (
	"slices"
	"time"
)

// MinGap is the shortest jump of the clock Watch records.
const MinGap = 10 * time.Microsecond

// Result is what Watch saw: the jumps of MinGap or more, in order, over
// Elapsed.
type Result struct {
	Elapsed time.Duration
	Gaps    []time.Duration
}

// Watch reads the clock back to back for d and records its jumps. It
// keeps its goroutine's core busy meanwhile: run it with nothing else
// running to see the machine's own pauses.
func Watch(d time.Duration) Result {
	var r Result
	start := time.Now()
	for last := start; last.Sub(start) < d; {
		now := time.Now()
		if gap := now.Sub(last); gap >= MinGap {
			r.Gaps = append(r.Gaps, gap)
		}
		last = now
	}
	r.Elapsed = time.Since(start)
	return r
}

// Rate returns the jumps of at least min (≥ MinGap) per second.
func (r Result) Rate(min time.Duration) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.count(min)) / r.Elapsed.Seconds()
}

// Share returns the share of the time the jumps of at least min took.
func (r Result) Share(min time.Duration) float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	var lost time.Duration
	for _, g := range r.Gaps {
		if g >= min {
			lost += g
		}
	}
	return lost.Seconds() / r.Elapsed.Seconds()
}

// Max returns the longest jump (0 if none).
func (r Result) Max() time.Duration {
	if len(r.Gaps) == 0 {
		return 0
	}
	return slices.Max(r.Gaps)
}

func (r Result) count(min time.Duration) int {
	n := 0
	for _, g := range r.Gaps {
		if g >= min {
			n++
		}
	}
	return n
}
