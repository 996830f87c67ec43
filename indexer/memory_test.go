package indexer_test

import (
	"math"
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
		{1000 * indexer.MemoryPerEntry, 1000}, {1 << 30, (1 << 30) / 256}, {1 << 62, int(min(int64(1<<62)/256, math.MaxInt))},
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
	cfg.Workers, cfg.RankCapacityBlocks = 32, 16384
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

// TestStatsBytesTracksHeap checks Tree.Stats().Bytes, the estimate the
// memory cap's budget rests on, against the live heap the tree adds, on
// the chat workload (filled, then churned at full caches) and on the
// llm-d comparison's unrelated chains (the tree's worst shape): within
// 80–110 % of the measured heap.
func TestStatsBytesTracksHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two indexes of 10⁵–10⁶ entries")
	}
	chat := workload.DefaultConfig()
	chat.Workers, chat.TargetEntries, chat.ChurnBlocks = 16, 200_000, 200_000
	w, err := workload.Generate(chat)
	if err != nil {
		t.Fatal(err)
	}
	// The llm-d workload's prompt chains, then a quarter of its
	// background (262,144 parentless blocks): the shape, at a quarter of
	// the race detector's time.
	llmd := workload.LLMDCompare(1)
	llmd.Events = llmd.Events[:len(llmd.Events)-(workload.LLMDBackground/16)*3/4]
	for _, c := range []struct {
		name string
		w    *workload.Workload
	}{{"chat", w}, {"llmd", llmd}} {
		base := heapNow()
		tree := indexer.NewTree(c.w.BlockSize)
		for i, e := range c.w.Events {
			if err := tree.Apply(e.Rank, e.Op); err != nil {
				t.Fatalf("%s: event %d: %v", c.name, i, err)
			}
		}
		heap := heapNow() - base
		s := tree.Stats()
		ratio := float64(s.Bytes) / float64(heap)
		t.Logf("%s: %d entries, heap %.1f B/entry, estimate %.1f B/entry (%.2f)",
			c.name, s.Entries, float64(heap)/float64(s.Entries), float64(s.Bytes)/float64(s.Entries), ratio)
		if ratio < 0.8 || ratio > 1.1 {
			t.Errorf("%s: Stats().Bytes = %d, %.2f × the measured heap %d", c.name, s.Bytes, ratio, heap)
		}
		runtime.KeepAlive(tree)
		runtime.KeepAlive(c.w)
	}
}
