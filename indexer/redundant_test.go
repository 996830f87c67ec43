package indexer_test

import (
	"errors"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// Redundant stores: a device-tier store of a rank's main group that
// applies whole and adds a device copy to blocks the rank already held on
// the device, on the chain it held (vLLM's kv_cache_report_mode="full"
// re-reporting prefix-cache hits). Each test states the count expected
// after every step, so removing the detection fails them all.

const rbs = 4 // block size of these tests

var rr = indexer.Rank{WorkerID: 1}

// chain returns the device store of blocks ids (engine hash 100+id, local
// hash from the block's tokens) after parent (0: at the root).
func chain(parent uint64, ids ...uint32) indexer.Stored {
	s := indexer.Stored{Tokens: blockTokens(rbs, ids...), BlockSize: rbs, Tier: indexer.TierDevice}
	for _, id := range ids {
		s.Hashes = append(s.Hashes, 100+uint64(id))
	}
	if parent != 0 {
		s.Parent, s.HasParent = parent, true
	}
	return s
}

func onTier(s indexer.Stored, tier indexer.Tier) indexer.Stored {
	s.Tier = tier
	return s
}

// wantRedundant checks the rank's and the tree's counts.
func wantRedundant(t *testing.T, tr *indexer.Tree, step string, rank, total uint64) {
	t.Helper()
	if got := tr.RankRedundant(rr); got != rank {
		t.Errorf("%s: RankRedundant = %d, want %d", step, got, rank)
	}
	if got := tr.Redundant(); got != total {
		t.Errorf("%s: Redundant = %d, want %d", step, got, total)
	}
}

// TestRedundantStoreReEmit: a chain stored again (a report-mode re-emit)
// counts every block, still adds a copy to each, and a remove of one copy
// keeps the blocks — the inflation the count warns of.
func TestRedundantStoreReEmit(t *testing.T) {
	tr := indexer.NewTree(rbs)
	mustStore(t, tr, rr, chain(0, 1, 2, 3))
	wantRedundant(t, tr, "first store", 0, 0)
	mustStore(t, tr, rr, chain(0, 1, 2, 3))
	wantRedundant(t, tr, "re-emit", 3, 3)
	if c, _ := tr.Holds(rr, 103); c[indexer.TierDevice] != 2 {
		t.Fatalf("device copies of the last block = %d, want 2 (a redundant store is applied)", c[indexer.TierDevice])
	}
	// A re-emit of the tail under its parent: the chain is held up to
	// the parent, then each block as its next block.
	mustStore(t, tr, rr, chain(101, 2, 3))
	wantRedundant(t, tr, "tail re-emit", 5, 5)
	if err := tr.Remove(rr, indexer.Removed{Hashes: []uint64{101, 102, 103}, Tier: indexer.TierDevice}); err != nil {
		t.Fatal(err)
	}
	if n := tr.RankBlocks(rr); n != 3 {
		t.Fatalf("after one eviction the rank holds %d blocks, want 3 (copies still counted)", n)
	}
	// A rank that already holds the chain three times over.
	mustStore(t, tr, rr, chain(0, 1))
	wantRedundant(t, tr, "third copy", 6, 6)
}

// TestRedundantStoreNotWhole: an event counts all its blocks or none. One
// new block, a skipped block (short tokens, a hash conflict) or a missing
// parent makes it not redundant, though its held blocks get their copies.
func TestRedundantStoreNotWhole(t *testing.T) {
	tr := indexer.NewTree(rbs)
	mustStore(t, tr, rr, chain(0, 1, 2))

	mustStore(t, tr, rr, chain(0, 1, 2, 3)) // 3 is new
	wantRedundant(t, tr, "held blocks then a new one", 0, 0)
	if c, _ := tr.Holds(rr, 101); c[indexer.TierDevice] != 2 {
		t.Fatalf("held block of a partly new store: %d device copies, want 2", c[indexer.TierDevice])
	}

	short := chain(0, 1, 2, 3)
	short.Tokens = short.Tokens[:2*rbs]
	if err := tr.Store(rr, short); !errors.Is(err, indexer.ErrShortTokens) {
		t.Fatalf("short store: %v, want ErrShortTokens", err)
	}
	wantRedundant(t, tr, "held blocks, tokens short of the last", 0, 0)

	conflict := chain(0, 1, 2)
	conflict.Hashes[1] = 999 // block 2 held under another engine hash
	if err := tr.Store(rr, conflict); !errors.Is(err, indexer.ErrHashConflict) {
		t.Fatalf("conflicting store: %v, want ErrHashConflict", err)
	}
	wantRedundant(t, tr, "held block, then a hash conflict", 0, 0)

	// Every hash held, but at another place than the event says: block 3
	// stored at the root is not the root's next block.
	if err := tr.Store(rr, chain(0, 3)); !errors.Is(err, indexer.ErrHashConflict) {
		t.Fatalf("held block elsewhere: %v, want ErrHashConflict", err)
	}
	wantRedundant(t, tr, "held block at another position", 0, 0)

	if err := tr.Store(rr, chain(777, 1)); !errors.Is(err, indexer.ErrParentNotFound) {
		t.Fatalf("unknown parent: %v, want ErrParentNotFound", err)
	}
	wantRedundant(t, tr, "unknown parent", 0, 0)

	// The whole chain again, now held entire: counted.
	mustStore(t, tr, rr, chain(0, 1, 2, 3))
	wantRedundant(t, tr, "whole chain held", 3, 3)
}

// TestRedundantStoreTiers: only device stores count, and only when every
// block already has a device copy; copies in other tiers do not make a
// device store redundant, and offloads never count.
func TestRedundantStoreTiers(t *testing.T) {
	tr := indexer.NewTree(rbs)
	mustStore(t, tr, rr, chain(0, 1, 2))
	offload := indexer.Stored{Hashes: []uint64{101, 102}, BlockSize: rbs, Tier: indexer.TierHost}
	mustStore(t, tr, rr, offload)
	mustStore(t, tr, rr, offload) // a second host copy
	wantRedundant(t, tr, "offloads of held blocks", 0, 0)

	// Stores with tokens in a slower tier, even of blocks held there.
	mustStore(t, tr, rr, onTier(chain(0, 1, 2), indexer.TierHost))
	mustStore(t, tr, rr, onTier(chain(0, 1, 2), indexer.TierDisk))
	mustStore(t, tr, rr, onTier(chain(0, 1, 2), indexer.TierDisk))
	wantRedundant(t, tr, "non-device stores with tokens", 0, 0)

	// The device copies go; the host ones stay. A device store brings
	// the blocks back to the device (an onload): not redundant.
	if err := tr.Remove(rr, indexer.Removed{Hashes: []uint64{101, 102}, Tier: indexer.TierDevice}); err != nil {
		t.Fatal(err)
	}
	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "device store of blocks held only in slower tiers", 0, 0)

	// One block on the device, the next only on the host.
	if err := tr.Remove(rr, indexer.Removed{Hashes: []uint64{102}, Tier: indexer.TierDevice}); err != nil {
		t.Fatal(err)
	}
	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "device store, one block held only on the host", 0, 0)

	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "device store of blocks held on the device", 2, 2)

	// A device event without tokens applies nothing (short_tokens).
	if err := tr.Store(rr, indexer.Stored{Hashes: []uint64{101}, BlockSize: rbs}); !errors.Is(err, indexer.ErrShortTokens) {
		t.Fatalf("device store without tokens: %v, want ErrShortTokens", err)
	}
	wantRedundant(t, tr, "device store without tokens", 2, 2)
}

// TestRedundantStoreLifetime: the rank's count survives Clear (an
// AllBlocksCleared) and goes with RemoveRank; the tree's total stays.
// Other ranks holding the same chain do not make a store redundant.
func TestRedundantStoreLifetime(t *testing.T) {
	tr := indexer.NewTree(rbs)
	other := indexer.Rank{WorkerID: 2}
	if err := tr.Store(other, chain(0, 1, 2)); err != nil {
		t.Fatal(err)
	}
	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "a chain another rank holds", 0, 0)
	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "re-emit", 2, 2)
	if got := tr.RankRedundant(other); got != 0 {
		t.Fatalf("the other rank's count = %d, want 0", got)
	}
	tr.Clear(rr)
	wantRedundant(t, tr, "after Clear", 2, 2)
	mustStore(t, tr, rr, chain(0, 1, 2))
	wantRedundant(t, tr, "first store after Clear", 2, 2)
	tr.RemoveRank(rr)
	wantRedundant(t, tr, "after RemoveRank", 0, 2)
}

// TestRedundantStoreMainGroupOnly: for a hybrid model only the main
// group's stores are examined; a sliding-window group's re-emits are not
// counted.
func TestRedundantStoreMainGroupOnly(t *testing.T) {
	tr := indexer.NewTree(rbs)
	full := indexer.Group{Idx: 1, Attention: indexer.AttentionFull, Kind: "full_attention"}
	sw := indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 2 * rbs}
	for range 2 {
		for _, g := range []indexer.Group{sw, full} {
			if err := tr.Apply(rr, indexer.Op{Kind: indexer.OpStore, Group: g, Store: chain(0, 1, 2, 3)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantRedundant(t, tr, "each group stored twice", 3, 3)
	if err := tr.Apply(rr, indexer.Op{Kind: indexer.OpStore, Group: sw, Store: chain(0, 1, 2, 3)}); err != nil {
		t.Fatal(err)
	}
	wantRedundant(t, tr, "the sliding-window group a third time", 3, 3)
}

// TestRedundantStoreBatchResult: ApplyBatch reports the blocks of the
// batch's own redundant stores, RankState the rank's running count, and
// PartitionStats the partition's.
func TestRedundantStoreBatchResult(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	k := indexer.PartitionKey{Model: "m"}
	if err := ix.AddPartition(k, rbs); err != nil {
		t.Fatal(err)
	}
	store := func(s indexer.Stored) indexer.Op { return indexer.Op{Kind: indexer.OpStore, Store: s} }
	batches := []struct {
		ops        []indexer.Op
		batch, all uint64
	}{
		{[]indexer.Op{store(chain(0, 1, 2))}, 0, 0},
		{[]indexer.Op{store(chain(0, 1, 2)), store(chain(102, 3)), store(chain(0, 1, 2, 3))}, 5, 5},
		{[]indexer.Op{{Kind: indexer.OpClear}, store(chain(0, 1)), store(chain(0, 1))}, 1, 6},
		{[]indexer.Op{store(chain(101, 2))}, 0, 6},
	}
	for i, b := range batches {
		res, err := ix.ApplyBatch(k, rr, indexer.Mark{Seq: uint64(i)}, b.ops)
		if err != nil {
			t.Fatal(err)
		}
		if res.Redundant != b.batch {
			t.Errorf("batch %d: BatchResult.Redundant = %d, want %d", i, res.Redundant, b.batch)
		}
		rs, err := ix.Rank(k, rr)
		if err != nil {
			t.Fatal(err)
		}
		if rs.RedundantBlocks != b.all {
			t.Errorf("batch %d: RankState.RedundantBlocks = %d, want %d", i, rs.RedundantBlocks, b.all)
		}
		if ps := ix.Stats(); len(ps) != 1 || ps[0].Redundant != b.all {
			t.Errorf("batch %d: PartitionStats = %+v, want Redundant %d", i, ps, b.all)
		}
	}
}
