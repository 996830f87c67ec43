package events

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// pyEngine is an engine rank published by pypub.py (real libzmq): the
// truth is tracked like e2eEngine's.
type pyEngine struct {
	*e2eEngine
	py   *pyPub
	junk *rand.Rand
}

func pyEvent(op indexer.Op) map[string]any {
	switch op.Kind {
	case indexer.OpStore:
		s := op.Store
		var parent any
		if s.HasParent {
			parent = s.Parent
		}
		return map[string]any{"type": "BlockStored", "block_hashes": s.Hashes, "parent_block_hash": parent,
			"token_ids": s.Tokens, "block_size": s.BlockSize, "medium": "GPU"}
	case indexer.OpRemove:
		return map[string]any{"type": "BlockRemoved", "block_hashes": op.Remove.Hashes, "medium": "GPU"}
	}
	return map[string]any{"type": "AllBlocksCleared"}
}

// feed publishes ops in batches of up to per; every dropEvery-th batch is
// dropped on the PUB (a high-water-mark loss the subscriber must replay).
// pad adds to each batch a BlockRemoved of that many hashes no rank holds
// (a no-op for engine and index alike) to make batches as large as real
// prefill batches.
func (e *pyEngine) feed(ops []indexer.Op, per, dropEvery, pad int) {
	n := 0
	for len(ops) > 0 {
		k := min(per, len(ops))
		var evs []map[string]any
		if pad > 0 {
			junk := make([]uint64, pad)
			for i := range junk {
				junk[i] = e.junk.Uint64() | 1<<63
			}
			evs = append(evs, map[string]any{"type": "BlockRemoved", "block_hashes": junk, "medium": "GPU"})
		}
		for _, op := range ops[:k] {
			evs = append(evs, pyEvent(op))
			_ = e.truth.Apply(e.rank, op)
			for _, h := range op.Store.Hashes {
				e.hashes[h] = true
			}
		}
		n++
		e.last = e.py.publish(evs, dropEvery > 0 && n%dropEvery == 0)
		ops = ops[k:]
	}
}

// gatedApplier blocks every apply until gate is closed.
type gatedApplier struct {
	Applier
	gate chan struct{}
}

func (g *gatedApplier) ApplyBatch(r indexer.Rank, m indexer.Mark, b *Batch) error {
	<-g.gate
	return g.Applier.ApplyBatch(r, m, b)
}

// TestSubscriberInteropPyPub: the Go subscriber against a real libzmq
// publisher of vLLM's wire protocol (pypub.py), in both payload eras, both
// replay layouts and both hash encodings. The subscriber joins late after
// a history longer than libzmq's ROUTER high-water mark (the replay loses
// its tail and end marker, as vLLM's does), live batches are dropped, and
// the engine restarts; at the end the index equals the engine's cache.
func TestSubscriberInteropPyPub(t *testing.T) {
	streams := e2eOps(t, 11, 1, 4000)
	ops := streams[0]
	for _, tc := range []struct{ era, layout, hash string }{
		{"map", "topic", "int"},
		{"array", "legacy", "bytes"},
	} {
		t.Run(tc.era+"-"+tc.layout+"-"+tc.hash, func(t *testing.T) {
			py := startPyPub(t, "--era", tc.era, "--layout", tc.layout, "--hash", tc.hash, "--topic", "kv@w9@m")
			e := &pyEngine{e2eEngine: &e2eEngine{t: t, rank: indexer.Rank{WorkerID: 9}, truth: indexer.NewTree(16), hashes: map[uint64]bool{}}, py: py, junk: rand.New(rand.NewPCG(1, 2))}
			// A long history first: more batches than the ROUTER's SNDHWM.
			long := ops[:len(ops)*2/3]
			e.feed(long, 1, 0, 400)
			if st := py.state(); st.Seq < 3000 {
				t.Fatalf("history of %d batches is too short to overflow the ROUTER", st.Seq)
			}
			ix, app := newE2EIndex(t)
			// Hold the first apply until pypub has handed the whole replay
			// to libzmq: the subscriber stops reading, its pipe fills, and
			// the ROUTER drops the rest silently, end marker included.
			gated := &gatedApplier{Applier: app, gate: make(chan struct{})}
			s := startSubscriber(t, Source{Worker: 9, Endpoint: py.Endpoint, ReplayEndpoint: py.ReplayEndpoint, Topic: "kv@w9"}, gated, SubscriberConfig{})
			waitUntil(t, 30*time.Second, "pypub to send the whole replay", func() bool {
				st := py.state()
				return st.LastReplay != nil && st.LastReplay.EndSent
			})
			close(gated.gate)
			caughtUp(t, s, e.e2eEngine)
			checkIndex(t, ix, e.e2eEngine, false)
			if st := s.s.State(); st.Degraded || st.Stats.Incomplete == 0 {
				t.Errorf("the long replay should have needed retries and stayed exact: %+v", st)
			}
			// Live traffic with every 5th batch dropped, then a restart.
			rest := ops[len(ops)*2/3:]
			e.feed(rest[:len(rest)/2], 4, 5, 0)
			e.feed(rest[len(rest)/2:len(rest)/2+1], 4, 0, 0) // a last batch that arrives
			caughtUp(t, s, e.e2eEngine)
			checkIndex(t, ix, e.e2eEngine, false)
			py.restart()
			e.truth = indexer.NewTree(16)
			e.feed(rest[len(rest)/2+1:], 4, 0, 0)
			caughtUp(t, s, e.e2eEngine)
			checkIndex(t, ix, e.e2eEngine, false)
			st := s.s.State()
			if st.Degraded || st.Stats.Restarts == 0 || st.Stats.Gaps+st.Stats.Probes == 0 {
				t.Errorf("state after gaps and a restart: %+v", st)
			}
			t.Logf("%+v", st.Stats)
		})
	}
}
