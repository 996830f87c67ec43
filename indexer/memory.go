package indexer

import "math"

// MemoryPerEntry is the memory MaxEntriesForMemory budgets per indexed
// (block, rank) entry, in bytes: 256. It is
//
//   - 56 B of live heap per entry in an Index: the most measured on any
//     benchmark workload, rounded up (55.8 B for the llm-d comparison's
//     65,536 unrelated 16-block chains, the tree's worst shape, whose
//     nodes each cost a published view; the default chat workload takes
//     37.5 B, BenchmarkMemoryShards), which includes the tree's overheads
//     (nodes, holders, slice capacity, the children tries, the published
//     views and the per-rank lookup tables at their load);
//   - plus 2 × 36 B: two /dump snapshots in flight at once (the default
//     concurrency; BenchmarkDump measures 32.5 B of snapshot and 34 B
//     allocated per entry);
//   - all doubled, the safety factor: with GOGC=100 the heap grows to
//     twice the live heap before a collection reclaims the garbage of
//     churn, so the process needs about twice what is live.
//
// It does not cover the rest of the daemon (streams, HTTP buffers, the
// Go runtime): give MaxEntriesForMemory the index's share of the memory.
const MemoryPerEntry = (56 + 2*36) * 2

// MaxEntriesForMemory returns the Options.MaxEntries that keeps an index
// (with its dumps and garbage-collector headroom) within budget bytes:
// budget / MemoryPerEntry, at least 1. A budget ≤ 0 (unknown) returns 0,
// no cap.
func MaxEntriesForMemory(budget int64) int {
	if budget <= 0 {
		return 0
	}
	return int(min(max(budget/MemoryPerEntry, 1), int64(math.MaxInt)))
}
