//go:build !linux

package openloop

import "time"

// A waker sleeps with time.Sleep (on Linux, with a timerfd).
type waker struct{}

func newWaker() (*waker, error) { return &waker{}, nil }

func (*waker) sleepUntil(t time.Time) error {
	time.Sleep(time.Until(t))
	return nil
}

func (*waker) close() {}
