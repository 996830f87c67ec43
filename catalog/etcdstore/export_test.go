package etcdstore

import "time"

// SetWatchCheck sets how often s's watches read etcd's header.
func SetWatchCheck(s *Store, every time.Duration) { s.watchCheck = every }

// WatchCheckFailures returns how many of s's watch header reads failed.
func WatchCheckFailures(s *Store) uint64 { return s.checkFailures.Load() }
