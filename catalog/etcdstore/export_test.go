package etcdstore

import (
	"context"
	"time"
)

// SetWatchCheck sets how often s's watches read etcd's header.
func SetWatchCheck(s *Store, every time.Duration) { s.watchCheck = every }

// WatchCheckFailures returns how many of s's watch header reads failed.
func WatchCheckFailures(s *Store) uint64 { return s.checkFailures.Load() }

// StartEmbeddedPicking is StartEmbedded with pick choosing the free
// loopback URLs.
func StartEmbeddedPicking(ctx context.Context, cfg EmbeddedConfig, pick func() (string, error)) (*Embedded, error) {
	return startEmbedded(ctx, cfg, pick)
}
