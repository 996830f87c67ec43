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
// most max·(1+Jitter)); Reset starts it over. It is not safe for
// concurrent use.
func Backoff(first, max time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: first, RandomizationFactor: Jitter, Multiplier: 2, MaxInterval: max}
	b.Reset()
	return b
}
