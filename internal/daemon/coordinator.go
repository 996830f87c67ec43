package daemon

import "time"

// ExpireInterval is how often the coordinator service expires stale
// reservations and plans.
const ExpireInterval = 10 * time.Second
