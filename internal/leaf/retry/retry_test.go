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
