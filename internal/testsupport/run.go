package testsupport

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// StopTimeout bounds how long a component started by Go or Ready may take
// to return once its context is cancelled.
const StopTimeout = 20 * time.Second

// Go runs run (a component's Run) on its own goroutine until the test
// ends: at cleanup, or when the returned stop is called, it cancels run's
// context and waits for run to return, failing t if it returns an error
// other than the context's or takes longer than StopTimeout. stop returns
// run's error and may be called more than once.
func Go(t testing.TB, what string, run func(context.Context) error) (stop func() error) {
	t.Helper()
	s := start(t, what, run)
	t.Cleanup(func() { s.stop() })
	return s.stop
}

// Ready is Go for a component that reports an address once it serves
// (daemon.Config.OnReady and the like): run is given the callback to
// call, and Ready returns the address, failing t if run returns first or
// nothing is ready within a minute.
func Ready(t testing.TB, what string, run func(ctx context.Context, ready func(addr string)) error) (addr string, stop func() error) {
	t.Helper()
	addrs := make(chan string, 1)
	s := start(t, what, func(ctx context.Context) error {
		return run(ctx, func(a string) {
			select {
			case addrs <- a:
			default:
			}
		})
	})
	t.Cleanup(func() { s.stop() })
	select {
	case a := <-addrs:
		return a, s.stop
	case <-s.done:
		t.Fatalf("%s returned before it was ready: %v", what, s.err)
	case <-time.After(time.Minute):
		t.Fatalf("%s not ready within a minute", what)
	}
	return "", s.stop
}

type running struct {
	t      testing.TB
	what   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
	once   sync.Once
}

func start(t testing.TB, what string, run func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, what: what, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	return r
}

func (r *running) stop() error {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(StopTimeout):
		r.once.Do(func() { r.t.Errorf("%s did not stop within %v", r.what, StopTimeout) })
		return context.DeadlineExceeded
	}
	if r.err != nil && !errors.Is(r.err, context.Canceled) {
		r.once.Do(func() { r.t.Errorf("%s: %v", r.what, r.err) })
	}
	return r.err
}

// CaughtUp waits (up to 30 s) until a stream's subscriber, whose state
// returns (a stream.State), is live and has applied seq last; on timeout
// it fails t with the state and detail() (what the publisher says, say).
func CaughtUp[S interface{ CaughtUp(seq uint64) bool }](t testing.TB, state func() S, last uint64, detail func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		st := state()
		if st.CaughtUp(last) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the subscriber to apply seq %d: state %+v; %s", last, st, detail())
		}
		<-tick.C
	}
}
