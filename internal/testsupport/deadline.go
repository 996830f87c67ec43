package testsupport

import (
	"context"
	"testing"
	"time"
)

// DeadlineMargin is what Context leaves of the test binary's deadline
// (go test -timeout) for the test to report its own failure before the
// binary's timeout panics.
const DeadlineMargin = 20 * time.Second

// Context returns a context for a long end-to-end run that ends when
// the test does, or DeadlineMargin before the test binary's deadline:
// the run is bounded by what go test allows it, not by a fixed guess of
// how slow a loaded machine is. Without a deadline (-timeout 0) only the
// test's end ends it.
func Context(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		return context.WithDeadline(ctx, d.Add(-DeadlineMargin))
	}
	return context.WithCancel(ctx)
}
