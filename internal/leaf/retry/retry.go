// Package retry is prefixd's one retry schedule: exponential backoff with
// jitter, so that many streams or registrations that failed together (an
// etcd or network outage, a fleet restart) do not retry in lockstep.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Jitter is the randomization factor: each delay is drawn uniformly from
// ±25 % of the current interval.
const Jitter = 0.25

// Backoff returns a schedule whose first delay is about first, doubling
// per call of NextBackOff up to an interval of max (so a delay is at
// most max·(1+Jitter)); Reset starts it over. Its n-th delay (from 0) is
// Interval(first, max, n) ±Jitter. It is not safe for concurrent use.
func Backoff(first, max time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: first, RandomizationFactor: Jitter, Multiplier: 2, MaxInterval: max}
	b.Reset()
	return b
}

// Interval is the schedule's interval before the n-th retry (from 0),
// without jitter: first, doubling per retry up to max (first for n ≤ 0).
// It is a pure function, for a driven state machine that counts its own
// retries and must be deterministic (the stream cursor's replays);
// loops that run beside many others like them take Backoff, whose
// jitter spreads them.
func Interval(first, max time.Duration, n int) time.Duration {
	d := first
	for range n {
		switch {
		case d <= 0:
			return d
		case d >= max-d: // doubled, it would reach max
			return max
		}
		d *= 2
	}
	return d
}
