//go:build !unix

package openloop

import "time"

// CPUTime is the CPU time this process has used: 0 where getrusage(2)
// is not.
func CPUTime() time.Duration { return 0 }
