package stream

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/pypub"
)

// pyEngine is an engine rank published by pypub.py (real libzmq): the
// truth is tracked like e2eEngine's.
type pyEngine struct {
	*e2eEngine
	py   *pypub.Pub
	junk *rand.Rand
}

func pyEvent(op indexer.Op) map[string]any { return pypub.Event(op) }

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
		e.last = e.py.Publish(evs, dropEvery > 0 && n%dropEvery == 0)
		ops = ops[k:]
	}
}

// gatedApplier blocks every apply until gate is closed.
type gatedApplier struct {
	Applier
	gate chan struct{}
}

func (g *gatedApplier) ApplyBatch(r indexer.Rank, m indexer.Mark, b *wire.Batch) error {
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
	t.Parallel()
	streams := e2eOps(t, 11, 1, 4000)
	ops := streams[0]
	for _, tc := range []struct{ era, layout, hash string }{
		{"map", "topic", "int"},
		{"array", "legacy", "bytes"},
	} {
		t.Run(tc.era+"-"+tc.layout+"-"+tc.hash, func(t *testing.T) {
			t.Parallel()
			py := pypub.Start(t, "--era", tc.era, "--layout", tc.layout, "--hash", tc.hash, "--topic", "kv@w9@m")
			e := &pyEngine{e2eEngine: &e2eEngine{t: t, rank: indexer.Rank{WorkerID: 9}, truth: indexer.NewTree(16), hashes: map[uint64]bool{}}, py: py, junk: rand.New(rand.NewPCG(1, 2))}
			// A long history first: more batches than the ROUTER's SNDHWM.
			long := ops[:len(ops)*2/3]
			e.feed(long, 1, 0, 400)
			if st := py.State(); st.Seq < 3000 {
				t.Fatalf("history of %d batches is too short to overflow the ROUTER", st.Seq)
			}
			ix, app := newE2EIndex(t)
			// Hold the first apply until pypub has handed the whole replay
			// to libzmq: the subscriber stops reading, its pipe fills, and
			// the ROUTER drops the rest silently, end marker included.
			gated := &gatedApplier{Applier: app, gate: make(chan struct{})}
			s := startSubscriber(t, Source{Worker: 9, Endpoint: py.Endpoint, ReplayEndpoint: py.ReplayEndpoint, Topic: "kv@w9"}, gated, SubscriberConfig{})
			testsupport.Eventually(t, 30*time.Second, "pypub to send the whole replay", func() bool {
				st := py.State()
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
			py.Restart()
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

// sglangEngine is an engine rank published by pypub.py in SGLang's layout
// (positional events, a metadata map on salted stores, signed hashes,
// attn_dp_rank, legacy replay): salts are given per prompt chain, and the
// truth's stores carry the seed the salt implies.
type sglangEngine struct {
	*e2eEngine
	py    *pypub.Pub
	salts map[uint64]string // engine hash → cache salt of its chain ("" = none)
	nroot int               // distinct chain roots seen
	roots []indexer.Op      // chain roots published, for lookups
	mixed int               // batches with salted and unsalted stores
}

// salt salts the chains of every other distinct root (the workload's
// system prompts), and children as their parent.
func (e *sglangEngine) salt(op indexer.Op) indexer.Op {
	if op.Kind != indexer.OpStore {
		return op
	}
	s := op.Store
	salt, seen := e.salts[s.Hashes[0]]
	switch {
	case s.HasParent:
		salt = e.salts[s.Parent]
	case !seen:
		if e.nroot%2 == 0 {
			salt = fmt.Sprintf("tenant-%d", e.nroot)
		}
		e.nroot++
	}
	for _, h := range s.Hashes {
		e.salts[h] = salt
	}
	s.Seed = indexer.Seed("", salt)
	op.Store = s
	return op
}

func (e *sglangEngine) event(op indexer.Op) map[string]any {
	ev := pyEvent(op)
	if op.Kind == indexer.OpStore {
		delete(ev, "lora_name")
		if salt := e.salts[op.Store.Hashes[0]]; salt != "" {
			ev["cache_salt"] = salt
			if op.Store.Hashes[0]%2 == 0 {
				ev["session_id"] = "session-" + salt
			}
		}
	}
	return ev
}

// feed publishes ops in batches of up to per; every dropEvery-th batch is
// dropped on the PUB.
func (e *sglangEngine) feed(ops []indexer.Op, per, dropEvery int) {
	n := 0
	for len(ops) > 0 {
		k := min(per, len(ops))
		var evs []map[string]any
		kinds := 0 // bit 0: an unsalted store, bit 1: a salted one
		for _, op := range ops[:k] {
			op = e.salt(op)
			if op.Kind == indexer.OpStore {
				kinds |= 1 << min(1, len(e.salts[op.Store.Hashes[0]]))
			}
			evs = append(evs, e.event(op))
			_ = e.truth.Apply(e.rank, op)
			for _, h := range op.Store.Hashes {
				e.hashes[h] = true
			}
			if op.Kind == indexer.OpStore && !op.Store.HasParent {
				e.roots = append(e.roots, op)
			}
		}
		if kinds == 3 {
			e.mixed++
		}
		n++
		e.last = e.py.Publish(evs, dropEvery > 0 && n%dropEvery == 0)
		ops = ops[k:]
	}
}

// checkLookups requires the index to answer prefix lookups of every root
// the engine published as the engine's cache would, under the root's own
// salt and under the other namespace: a salted block is found only in its
// salt's namespace.
func (e *sglangEngine) checkLookups(t *testing.T, ix *indexer.Index) (salted int) {
	t.Helper()
	for _, op := range e.roots {
		s := op.Store
		for _, seed := range []uint64{s.Seed, indexer.Seed("", "")} {
			got, err := ix.MatchTokens(e2eKey, s.Tokens, seed, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := e.truth.Match(indexer.HashBlocks(nil, s.Tokens, 16, seed), nil)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("root %#x seed %#x: index %v, engine %v", s.Hashes[0], seed, got, want)
			}
		}
		if s.Seed != indexer.BaseSeed {
			salted++
		}
	}
	return salted
}

// TestSubscriberInteropPyPubSGLang: the Go subscriber against a real
// libzmq publisher of SGLang's wire (pypub.py --era sglang): positional
// events, salted stores as BlockStoredWithMetadata (a metadata map at
// position 7) mixed with unsalted ones in the same batches, signed hashes,
// attn_dp_rank, replay without the topic frame. The subscriber joins late,
// live batches are dropped and replayed, the engine restarts; at the end
// the index equals the engine's cache, and lookups in each salt's
// namespace find exactly what the engine holds.
func TestSubscriberInteropPyPubSGLang(t *testing.T) {
	t.Parallel()
	ops := e2eOps(t, 21, 1, 2500)[0]
	py := pypub.Start(t, "--era", "sglang", "--layout", "legacy", "--hash", "signed", "--topic", "kv@w12@m", "--rank", "0")
	e := &sglangEngine{
		e2eEngine: &e2eEngine{t: t, rank: indexer.Rank{WorkerID: 12}, truth: indexer.NewTree(16), hashes: map[uint64]bool{}},
		py:        py, salts: map[uint64]string{},
	}
	third := len(ops) / 3
	e.feed(ops[:third], 4, 0) // history before the subscriber joins
	ix, app := newE2EIndex(t)
	reg := prometheus.NewRegistry()
	s := startSubscriber(t, Source{Worker: 12, Endpoint: py.Endpoint, ReplayEndpoint: py.ReplayEndpoint, Topic: "kv@w12"}, app,
		SubscriberConfig{Metrics: NewMetrics(reg)})
	caughtUp(t, s, e.e2eEngine)
	checkIndex(t, ix, e.e2eEngine, false)
	e.feed(ops[third:2*third], 4, 5) // live, every 5th batch dropped
	e.feed(ops[2*third:2*third+1], 4, 0)
	caughtUp(t, s, e.e2eEngine)
	checkIndex(t, ix, e.e2eEngine, false)
	salted, roots := e.checkLookups(t, ix), len(e.roots)
	py.Restart()
	e.truth = indexer.NewTree(16)
	e.roots = nil
	e.feed(ops[2*third+1:], 4, 0)
	caughtUp(t, s, e.e2eEngine)
	checkIndex(t, ix, e.e2eEngine, false)
	salted += e.checkLookups(t, ix)
	roots += len(e.roots)
	st := s.s.State()
	if st.Degraded || st.Stats.Restarts == 0 || st.Stats.Gaps+st.Stats.Probes == 0 {
		t.Errorf("state after gaps and a restart: %+v", st)
	}
	if salted == 0 || salted == roots || e.mixed < 20 {
		t.Fatalf("%d of %d roots salted, %d batches mixed: the stream must mix salted and unsalted requests", salted, roots, e.mixed)
	}
	var dropped float64
	for _, reason := range []string{"malformed_field", "lossy"} {
		dropped += testutil.ToFloat64(s.s.cfg.Metrics.dropped.WithLabelValues("12", "0", reason))
	}
	if dropped != 0 {
		t.Errorf("%v batches dropped as malformed", dropped)
	}
	t.Logf("%d of %d roots salted, %d batches mixed; %+v", salted, roots, e.mixed, st.Stats)
}
