//go:build !linux

package indexer

import "time"

var clockStart = time.Now()

// threadTime returns the wall time since the process started (the
// thread's CPU time is read only on Linux; see lookup_clock_linux_test.go).
func threadTime() time.Duration { return time.Since(clockStart) }
