package testsupport

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPoll: Poll returns nil once f succeeds, and f's last error when the
// timeout passes first.
func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Minute, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("Poll = %v after %d calls", err, n)
	}
	want := errors.New("never")
	if err := Poll(context.Background(), 20*time.Millisecond, func() error { return want }); err != want {
		t.Fatalf("Poll = %v, want %v", err, want)
	}
}

// TestEventually: Eventually returns once cond holds.
func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Minute, "three calls", func() bool { n++; return n >= 3 })
	if n != 3 {
		t.Fatalf("cond called %d times", n)
	}
}
