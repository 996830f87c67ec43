package catalog

// SetRenewalHook makes s call f after each successful lease renewal (on
// Run's goroutine).
func SetRenewalHook(s *Session, f func(LeaseID)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRenewal = f
}
