// Package testsupport holds the helpers that tests across prefixd share.
// It is test infrastructure: production code never imports it.
package testsupport

import (
	"context"
	"testing"
	"time"
)

// Tick is how often Eventually and Poll check their condition.
const Tick = 5 * time.Millisecond

// Eventually polls cond every Tick until it holds, failing t after
// timeout with what it waited for. It waits on a condition, never for a
// fixed time.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// Poll runs f every Tick until it returns nil, ctx ends or timeout
// passes; it returns nil or f's last error.
func Poll(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}
