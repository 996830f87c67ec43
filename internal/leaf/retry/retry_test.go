package retry

import (
	"testing"
	"time"
)

// TestBackoff: delays double from first to max, each within the jitter,
// differ between schedules (jitter present), and Reset starts over.
func TestBackoff(t *testing.T) {
	first, max := 100*time.Millisecond, time.Second
	within := func(d, interval time.Duration) bool {
		return float64(d) >= float64(interval)*(1-Jitter) && float64(d) <= float64(interval)*(1+Jitter)+1
	}
	distinct := map[time.Duration]bool{}
	for range 20 {
		b := Backoff(first, max)
		for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
			d := b.NextBackOff()
			if !within(d, want*time.Millisecond) {
				t.Fatalf("delay %d: %v, want %v ±%v%%", i, d, want*time.Millisecond, Jitter*100)
			}
			if i == 0 {
				distinct[d] = true
			}
		}
		b.Reset()
		if d := b.NextBackOff(); !within(d, first) {
			t.Fatalf("after Reset: %v, want about %v", d, first)
		}
	}
	if len(distinct) < 5 {
		t.Fatalf("20 schedules drew %d distinct first delays: no jitter", len(distinct))
	}
}

// TestInterval: first, doubling per retry, capped at max; n ≤ 0 is the
// first interval.
func TestInterval(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		first, max time.Duration
		n          int
		want       time.Duration
	}{
		{100 * ms, time.Second, -1, 100 * ms},
		{100 * ms, time.Second, 0, 100 * ms},
		{100 * ms, time.Second, 1, 200 * ms},
		{100 * ms, time.Second, 3, 800 * ms},
		{100 * ms, time.Second, 4, time.Second}, // 1.6 s capped
		{100 * ms, time.Second, 1 << 40, time.Second},
		{250 * ms, 4 * time.Second, 4, 4 * time.Second}, // exactly 16×
		{250 * ms, 4 * time.Second, 5, 4 * time.Second},
		{5 * ms, time.Second, 7, 640 * ms},
		{5 * ms, time.Second, 8, time.Second},
		{2 * time.Second, time.Second, 0, 2 * time.Second}, // first above max, as Backoff
		{2 * time.Second, time.Second, 1, time.Second},
		{0, time.Second, 5, 0},
	} {
		if got := Interval(tc.first, tc.max, tc.n); got != tc.want {
			t.Errorf("Interval(%v, %v, %d) = %v, want %v", tc.first, tc.max, tc.n, got, tc.want)
		}
	}
}

// TestBackoffFollowsInterval: Backoff's n-th delay is Interval's n-th
// interval within the jitter, for caps that are and are not a power of
// two times the first.
func TestBackoffFollowsInterval(t *testing.T) {
	for _, c := range [][2]time.Duration{
		{5 * time.Millisecond, time.Second},
		{100 * time.Millisecond, time.Second},
		{250 * time.Millisecond, 4 * time.Second},
	} {
		b := Backoff(c[0], c[1])
		for n := range 12 {
			d, want := b.NextBackOff(), Interval(c[0], c[1], n)
			if float64(d) < float64(want)*(1-Jitter) || float64(d) > float64(want)*(1+Jitter)+1 {
				t.Fatalf("Backoff(%v, %v) delay %d: %v, want %v ±%v%%", c[0], c[1], n, d, want, Jitter*100)
			}
		}
	}
}
