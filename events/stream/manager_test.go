package stream

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

func startManager(t *testing.T, ix *indexer.Index) *Manager {
	t.Helper()
	return startManagerLog(t, ix, nil)
}

// startManagerLog is startManager logging to log.
func startManagerLog(t *testing.T, ix *indexer.Index, log *slog.Logger) *Manager {
	t.Helper()
	s := NewManager(ix, SubscriberConfig{IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond}, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func rankBlocks(ix *indexer.Index, k indexer.PartitionKey, w uint64, r uint32) int {
	st, err := ix.Rank(k, indexer.Rank{WorkerID: w, DPRank: r})
	if err != nil {
		return -1
	}
	return st.Blocks
}

// TestManagerLifecycle: a worker's ranks are indexed from their streams; a
// changed endpoint restarts only that rank's stream; removing the worker
// stops its streams and empties the index, and the line logged for each
// stream says how many blocks its rank held.
func TestManagerLifecycle(t *testing.T) {
	t.Parallel()
	ix := indexer.New(indexer.Options{})
	logs, log := testlog.New(nil)
	s := startManagerLog(t, ix, log)
	k := indexer.PartitionKey{Model: "m", Group: "default"}
	e0, e1 := publishtest.Start(t, 0), publishtest.Start(t, 0)
	e0.Store(3)
	e1.Store(5)
	w := Worker{ID: 7, Partition: k, BlockSize: 16, Sources: []Source{
		{Rank: 0, Ranks: []uint32{0, 1}, Endpoint: e0.Pub.Endpoint(), ReplayEndpoint: e0.Pub.ReplayEndpoint()},
		{Rank: 1, Ranks: []uint32{0, 1}, Endpoint: e1.Pub.Endpoint(), ReplayEndpoint: e1.Pub.ReplayEndpoint()},
	}}
	s.Set(w)
	testsupport.Eventually(t, 20*time.Second, "both ranks indexed", func() bool {
		return s.Synced() && rankBlocks(ix, k, 7, 0) == 3 && rankBlocks(ix, k, 7, 1) == 5
	})
	before := s.Status()
	if len(before) != 2 || before[0].Rank != 0 || before[1].Rank != 1 || !before[0].Connected {
		t.Fatalf("status %+v", before)
	}
	s.mu.Lock()
	sub0 := s.subs[rankKey{7, 0}].sub
	s.mu.Unlock()

	// Rank 1 moves to another engine: only its stream restarts.
	e2 := publishtest.Start(t, 0)
	e2.Store(2)
	w.Sources[1].Endpoint, w.Sources[1].ReplayEndpoint = e2.Pub.Endpoint(), e2.Pub.ReplayEndpoint()
	s.Set(w)
	testsupport.Eventually(t, 20*time.Second, "rank 1 re-indexed from its new engine", func() bool {
		return s.Synced() && rankBlocks(ix, k, 7, 1) == 2
	})
	s.mu.Lock()
	same := s.subs[rankKey{7, 0}].sub == sub0
	s.mu.Unlock()
	if !same || rankBlocks(ix, k, 7, 0) != 3 {
		t.Fatal("rank 0's stream was restarted by a change to rank 1")
	}

	// A conflicting block size keeps the worker out, and says why.
	bad := w
	bad.ID, bad.BlockSize = 8, 32
	bad.Sources = []Source{{Rank: 0, Endpoint: e0.Pub.Endpoint()}}
	s.Set(bad)
	testsupport.Eventually(t, 20*time.Second, "the conflict reported", func() bool {
		for _, st := range s.Status() {
			if st.Worker == 8 && !st.Running && strings.Contains(st.Err, "block size") {
				return true
			}
		}
		return false
	})
	s.Remove(8)

	s.Remove(7)
	// Its blocks are gone when Remove returns (its streams are fenced off
	// the index, not waited for).
	if n0, n1 := rankBlocks(ix, k, 7, 0), rankBlocks(ix, k, 7, 1); n0 > 0 || n1 > 0 {
		t.Fatalf("after Remove the worker still holds %d and %d blocks", n0, n1)
	}
	testsupport.Eventually(t, 20*time.Second, "the worker's streams gone and the partition removed", func() bool {
		return len(s.Status()) == 0 && len(ix.Partitions()) == 0
	})
	const stopped = "stream stopped; rank removed from index"
	logs.Wait(t, 10*time.Second, stopped, "worker=7", "rank=0", "blocks=3")
	logs.Wait(t, 10*time.Second, stopped, "worker=7", "rank=1", "blocks=2")
}

// TestManagerSharesRanks: the streams of a worker's ranks keep the one
// list of the worker's ranks they were given, not a copy each, which
// would cost the square of the ranks (a 4,096-rank worker: 64 MiB).
func TestManagerSharesRanks(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	s := startManager(t, ix)
	const n = 64
	ranks := make([]uint32, n)
	w := Worker{ID: 3, Partition: indexer.PartitionKey{Model: "m", Group: "default"}, BlockSize: 16}
	for r := range uint32(n) {
		ranks[r] = r
		// Nothing listens: the streams retry, which is all this needs.
		w.Sources = append(w.Sources, Source{Rank: r, Ranks: ranks, Endpoint: "tcp://127.0.0.1:1"})
	}
	s.Set(w)
	testsupport.Eventually(t, 10*time.Second, "every rank's stream running", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.subs) == n
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.subs {
		if got := *st.sub.ranks.Load(); len(got) != n || &got[0] != &ranks[0] {
			t.Fatalf("rank %d's stream holds a copy of the worker's ranks", k.rank)
		}
	}
}
