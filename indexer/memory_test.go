package indexer_test

import (
	"runtime"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

func TestMaxEntriesForMemory(t *testing.T) {
	for _, c := range []struct {
		budget int64
		want   int
	}{
		{-1, 0}, {0, 0}, {1, 1}, {indexer.MemoryPerEntry, 1}, {2*indexer.MemoryPerEntry - 1, 1},
		{1000 * indexer.MemoryPerEntry, 1000}, {1 << 30, (1 << 30) / 288}, {1 << 62, (1 << 62) / 288},
	} {
		if got := indexer.MaxEntriesForMemory(c.budget); got != c.want {
			t.Errorf("MaxEntriesForMemory(%d) = %d, want %d", c.budget, got, c.want)
		}
	}
}

// TestMaxEntriesForMemoryFitsBudget fills an index capped from a 16 MiB
// budget with chat traffic four times its size: the live heap of the full
// index, with a snapshot of it held as a /dump would, stays within half
// the budget (the other half is the garbage collector's headroom).
func TestMaxEntriesForMemoryFitsBudget(t *testing.T) {
	const budget = 16 << 20
	cfg := workload.DefaultConfig()
	cfg.Workers, cfg.RankCapacityBlocks = 16, 16384
	cfg.TargetEntries, cfg.ChurnBlocks = 4*budget/indexer.MemoryPerEntry, 50_000
	events, bs := func() ([]workload.Event, int) { // only the events stay live
		w, err := workload.Generate(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return w.Events, w.BlockSize
	}()
	k := indexer.PartitionKey{Model: "m", Group: "default"}
	base := heapNow()
	ix := indexer.New(indexer.Options{MaxEntries: indexer.MaxEntriesForMemory(budget)})
	if err := ix.AddPartition(k, bs); err != nil {
		t.Fatal(err)
	}
	for i, e := range events {
		if _, err := ix.Apply(k, e.Rank, uint64(i), []indexer.Op{e.Op}); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := ix.Snapshot(k)
	if err != nil {
		t.Fatal(err)
	}
	live := heapNow() - base
	t.Logf("cap %d entries, %d held, live heap %.1f MiB of a %d MiB budget",
		ix.MaxEntries(), ix.Entries(), float64(live)/(1<<20), budget>>20)
	if ix.Entries() < ix.MaxEntries()*9/10 {
		t.Fatalf("the index holds %d entries: the cap (%d) did not bind", ix.Entries(), ix.MaxEntries())
	}
	if live > budget/2 {
		t.Fatalf("live heap %d bytes, more than half the %d-byte budget", live, budget)
	}
	runtime.KeepAlive(snap)
	runtime.KeepAlive(events)
}

func heapNow() int64 { return heapAfterGC() }
