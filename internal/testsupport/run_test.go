package testsupport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// TestGoStopsAtCleanup: what Go starts is stopped when its test ends.
func TestGoStopsAtCleanup(t *testing.T) {
	var stopped atomic.Bool
	t.Run("run", func(t *testing.T) {
		Go(t, "loop", func(ctx context.Context) error {
			<-ctx.Done()
			stopped.Store(true)
			return ctx.Err()
		})
	})
	if !stopped.Load() {
		t.Fatal("the run was not stopped when its test ended")
	}
}

// TestReady returns the address the run reports.
func TestReady(t *testing.T) {
	addr, stop := Ready(t, "server", func(ctx context.Context, ready func(string)) error {
		ready("127.0.0.1:1")
		<-ctx.Done()
		return nil
	})
	if addr != "127.0.0.1:1" {
		t.Fatalf("addr %q", addr)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// errorsTB records Errorf and keeps cleanups to itself.
type errorsTB struct {
	testing.TB
	errs []string
}

func (r *errorsTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *errorsTB) Cleanup(func()) {}
func (r *errorsTB) Helper()        {}

// TestGoReportsError: a run that fails is reported once, however often
// stop is called; the context's own error is not a failure.
func TestGoReportsError(t *testing.T) {
	rt := &errorsTB{TB: t}
	stop := Go(rt, "engine", func(context.Context) error { return errors.New("boom") })
	for range 2 {
		if err := stop(); err == nil || err.Error() != "boom" {
			t.Fatalf("stop = %v", err)
		}
	}
	if len(rt.errs) != 1 || !strings.Contains(rt.errs[0], "engine: boom") {
		t.Fatalf("reported %q", rt.errs)
	}
	rt = &errorsTB{TB: t}
	Go(rt, "engine", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })()
	if len(rt.errs) != 0 {
		t.Fatalf("reported %q", rt.errs)
	}
}
