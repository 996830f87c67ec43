//go:build !unix

package indexbench

import "time"

// processCPU returns 0 where getrusage is not available: the CPU-time
// figures are then not reported.
func processCPU() time.Duration { return 0 }
