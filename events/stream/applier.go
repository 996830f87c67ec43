package stream

import (
	"errors"
	"sync"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
)

// IndexApplier applies batches to one partition of an indexer.Index: it
// converts each batch with wire.AppendOps and records the batch seq as the
// rank's watermark. Safe for concurrent use by several Subscribers.
type IndexApplier struct {
	Index     *indexer.Index
	Partition indexer.PartitionKey

	mu       sync.Mutex // guards ops, filtered, skipped and fenced; held across each apply
	ops      []indexer.Op
	filtered [wire.NumFilters]uint64
	skipped  [indexer.NumReasons]uint64
	fenced   bool
}

// ErrFenced is returned by a fenced IndexApplier.
var ErrFenced = errors.New("events: applier fenced: its rank left the index")

var _ Applier = (*IndexApplier)(nil)

// ApplyBatch implements Applier.
func (a *IndexApplier) ApplyBatch(r indexer.Rank, m indexer.Mark, b *wire.Batch) error {
	_, err := a.ApplyBatchResult(r, m, b)
	return err
}

// ApplyBatchResult is ApplyBatch that also returns what the index made of
// the batch: the blocks it skipped and the blocks of its redundant stores
// (indexer.BatchResult). A Subscriber over an IndexApplier counts and logs
// the redundant stores of each batch.
func (a *IndexApplier) ApplyBatchResult(r indexer.Rank, m indexer.Mark, b *wire.Batch) (indexer.BatchResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fenced {
		return indexer.BatchResult{}, ErrFenced
	}
	a.ops = wire.AppendOps(a.ops[:0], b, &a.filtered)
	res, err := a.Index.ApplyBatch(a.Partition, r, m, a.ops)
	for i, n := range res.Skipped {
		a.skipped[i] += n
	}
	return res, err
}

// ResetRank implements Applier.
func (a *IndexApplier) ResetRank(r indexer.Rank, degraded bool, reason string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fenced {
		return ErrFenced
	}
	return a.Index.Reset(a.Partition, r, degraded, reason)
}

// Fence makes every later ApplyBatch and ResetRank fail with ErrFenced,
// and returns once none is in progress: after it, the index changes for
// this applier's ranks only through others. A stream being stopped is
// fenced so that its rank can leave the index at once, before its
// subscriber has wound down.
func (a *IndexApplier) Fence() {
	a.mu.Lock()
	a.fenced = true
	a.mu.Unlock()
}

// Degraded reports the index's word on r (indexer.RankState): degraded
// — r holds a strict subset of its engine's cache, by its own stream's
// word, a foreign batch's or its truncation — and truncated, whether the
// index dropped some of r's blocks itself (the memory cap, or r's
// capacity) since r was last cleared.
func (a *IndexApplier) Degraded(r indexer.Rank) (degraded, truncated bool) {
	rs, err := a.Index.Rank(a.Partition, r)
	return err == nil && rs.Degraded, err == nil && rs.Truncated
}

// Counts returns the events filtered out and the blocks the index skipped,
// by reason, since the applier was made.
func (a *IndexApplier) Counts() (filtered [wire.NumFilters]uint64, skipped [indexer.NumReasons]uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.filtered, a.skipped
}
