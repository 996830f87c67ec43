package catalog

import "time"

// SetRenewalHook makes s call f after each successful lease renewal (on
// Run's goroutine).
func SetRenewalHook(s *Session, f func(LeaseID)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRenewal = f
}

// SetWatchCheck sets how often s's watches read etcd's header.
func SetWatchCheck(s *EtcdStore, every time.Duration) { s.watchCheck = every }

// WatchCheckFailures returns how many of s's watch header reads failed.
func WatchCheckFailures(s *EtcdStore) uint64 { return s.checkFailures.Load() }
