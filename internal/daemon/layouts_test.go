package daemon

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/pypub"
)

// engineLayout is one layout of the wire a real engine emits, as pypub
// (libzmq) publishes it.
type engineLayout struct {
	name   string
	args   []string // pypub flags: era, replay layout, hash form
	ranks  []uint32 // attention-DP ranks, one publisher each
	sglang bool     // SGLang's fields: no lora_name; cache_salt on every other chain
	hybrid bool     // vLLM's hybrid KV-cache manager: a sliding-window group 0, full attention as group 1
}

var engineLayouts = []engineLayout{
	{name: "vllm-map", args: []string{"--era", "map", "--layout", "topic", "--hash", "int"}, ranks: []uint32{0}},
	{name: "vllm-array", args: []string{"--era", "array", "--layout", "legacy", "--hash", "bytes"}, ranks: []uint32{0}},
	{name: "vllm-hybrid", args: []string{"--era", "map", "--layout", "topic", "--hash", "int"}, ranks: []uint32{0}, hybrid: true},
	{name: "sglang-positional", args: []string{"--era", "sglang", "--layout", "legacy", "--hash", "signed"}, ranks: []uint32{0, 1}, sglang: true},
	{name: "sglang-map", args: []string{"--era", "sglang-map", "--layout", "legacy", "--hash", "signed"}, ranks: []uint32{0}, sglang: true},
	{name: "trtllm", args: []string{"--era", "map", "--layout", "topic", "--hash", "signed"}, ranks: []uint32{0, 1}},
}

// Hybrid layout of the test: group 0 sliding window of layoutWindow
// tokens (a hit needs the ceil(47/16) = 3 blocks before its end), group 1
// full attention — a model whose first layer is sliding-window, as vLLM
// numbers Gemma 3's groups.
const layoutWindow = 48

var (
	layoutSW   = indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: layoutWindow}
	layoutFull = indexer.Group{Idx: 1, Kind: "full_attention"}
)

// layoutEngine is one engine rank behind pypub, with its truth: the
// index's own tree fed the ops the engine's events mean (salts as seeds,
// KV-cache groups), which the daemon's index must equal.
type layoutEngine struct {
	t     *testing.T
	lay   engineLayout
	rank  indexer.Rank
	py    *pypub.Pub
	truth *indexer.Tree
	last  uint64
	rng   *rand.Rand

	salt   map[uint64]string // engine hash → its chain's cache salt
	parent map[uint64]uint64 // engine hash → parent (absent for a root)
	tokens map[uint64][]uint32
	depth  map[uint64]int      // position of the block in its chain, from 0
	window map[uint64]bool     // hybrid: blocks the sliding-window group holds
	roots  int                 // chain roots seen (every other SGLang one salted)
	ops    map[string]int      // published ops by kind and group, for the log
	sent   map[uint64]struct{} // every engine hash stored

	published []indexer.Op // what the events meant, in order
}

func newLayoutEngine(t *testing.T, lay engineLayout, worker uint64, r uint32) *layoutEngine {
	args := append(slices.Clone(lay.args), "--topic", fmt.Sprintf("kv@w%d@m", worker), "--rank", fmt.Sprint(r))
	return &layoutEngine{
		t: t, lay: lay, rank: indexer.Rank{WorkerID: worker, DPRank: r}, py: pypub.Start(t, args...),
		truth: indexer.NewTree(16), rng: rand.New(rand.NewPCG(worker, uint64(r))),
		salt: map[uint64]string{}, parent: map[uint64]uint64{}, tokens: map[uint64][]uint32{},
		depth: map[uint64]int{}, window: map[uint64]bool{}, ops: map[string]int{}, sent: map[uint64]struct{}{},
	}
}

// event is the pypub event object for op in the engine's layout.
func (e *layoutEngine) event(op indexer.Op) map[string]any {
	ev := pypub.Event(op)
	switch op.Kind {
	case indexer.OpClear:
		return ev
	case indexer.OpStore:
		if salt := e.salt[op.Store.Hashes[0]]; salt != "" {
			ev["cache_salt"] = salt
		}
	}
	if e.lay.hybrid {
		ev["group_idx"] = op.Group.Idx
		if op.Kind == indexer.OpStore {
			ev["kv_cache_spec_kind"] = op.Group.Kind
			if op.Group.Window > 0 {
				ev["kv_cache_spec_sliding_window"] = op.Group.Window
			}
		}
	}
	return ev
}

// translate turns one workload op (a single-group engine's) into the ops
// of the engine's layout: salted seeds for SGLang's salted chains; for
// the hybrid layout, the full-attention group's op and what the
// sliding-window group does with the same blocks (it caches the last
// blocks of each store and frees the blocks that left its window, as
// vLLM's SlidingWindowManager does, and some of its blocks are evicted
// on their own).
func (e *layoutEngine) translate(op indexer.Op) []indexer.Op {
	switch op.Kind {
	case indexer.OpStore:
		s := op.Store
		salt := ""
		d := 0
		if s.HasParent {
			salt, d = e.salt[s.Parent], e.depth[s.Parent]+1
		} else if _, seen := e.salt[s.Hashes[0]]; !seen {
			if e.lay.sglang && e.roots%2 == 0 {
				salt = fmt.Sprintf("tenant-%d", e.roots)
			}
			e.roots++
		} else {
			salt = e.salt[s.Hashes[0]]
		}
		s.Seed = indexer.Seed("", salt)
		prev, hasPrev := s.Parent, s.HasParent
		for i, h := range s.Hashes {
			e.salt[h], e.depth[h] = salt, d+i
			if hasPrev {
				e.parent[h] = prev
			}
			if (i+1)*16 <= len(s.Tokens) {
				e.tokens[h] = s.Tokens[i*16 : (i+1)*16]
			}
			e.sent[h] = struct{}{}
			prev, hasPrev = h, true
		}
		op.Store = s
		if !e.lay.hybrid {
			return []indexer.Op{op}
		}
		op.Group = layoutFull
		out := []indexer.Op{op}
		// The window group caches the event's last 3 blocks…
		keep := s.Hashes[max(0, len(s.Hashes)-3):]
		var fresh []uint64
		for _, h := range keep {
			if !e.window[h] {
				fresh = append(fresh, h)
				e.window[h] = true
			}
		}
		if len(fresh) > 0 {
			sw := s
			sw.Hashes = fresh
			out = append(out, indexer.Op{Kind: indexer.OpStore, Group: layoutSW, Store: sw})
		}
		// …and frees what left the window: its blocks of the chain more
		// than 3 before the end, and now and then one more at random.
		var gone []uint64
		end := d + len(s.Hashes) - 1
		for h, ok := s.Parent, s.HasParent; ok; h, ok = e.parentOf(h) {
			if e.window[h] && e.depth[h] <= end-3 {
				gone = append(gone, h)
				delete(e.window, h)
			}
			if e.depth[h] < end-8 {
				break
			}
		}
		if e.rng.IntN(8) == 0 {
			for _, h := range keep {
				if e.window[h] && !slices.Contains(gone, h) {
					gone = append(gone, h)
					delete(e.window, h)
					break
				}
			}
		}
		if len(gone) > 0 {
			out = append(out, indexer.Op{Kind: indexer.OpRemove, Group: layoutSW, Remove: indexer.Removed{Hashes: gone}})
		}
		return out
	case indexer.OpRemove:
		if !e.lay.hybrid {
			return []indexer.Op{op}
		}
		op.Group = layoutFull
		out := []indexer.Op{op}
		var gone []uint64
		for _, h := range op.Remove.Hashes {
			if e.window[h] {
				gone = append(gone, h)
				delete(e.window, h)
			}
		}
		if len(gone) > 0 {
			out = append(out, indexer.Op{Kind: indexer.OpRemove, Group: layoutSW, Remove: indexer.Removed{Hashes: gone}})
		}
		return out
	}
	clear(e.window)
	return []indexer.Op{op}
}

func (e *layoutEngine) parentOf(h uint64) (uint64, bool) {
	p, ok := e.parent[h]
	return p, ok
}

// feed publishes the workload's ops in batches of up to per; every
// dropEvery-th batch is lost on the PUB (the daemon must replay it).
func (e *layoutEngine) feed(ops []indexer.Op, per, dropEvery int) {
	e.t.Helper()
	n := 0
	for len(ops) > 0 {
		k := min(per, len(ops))
		var evs []map[string]any
		for _, op := range ops[:k] {
			for _, o := range e.translate(op) {
				evs = append(evs, e.event(o))
				_ = e.truth.Apply(e.rank, o)
				e.published = append(e.published, o)
				e.ops[fmt.Sprintf("%s/g%d", [...]string{"?", "store", "remove", "clear"}[o.Kind], o.Group.Idx)]++
			}
		}
		n++
		e.last = e.py.Publish(evs, dropEvery > 0 && n%dropEvery == 0)
		ops = ops[k:]
	}
}

// prompt rebuilds the tokens of the chain ending at h, and its salt.
func (e *layoutEngine) prompt(h uint64) ([]uint32, string, bool) {
	var chain []uint64
	for x, ok := h, true; ok; x, ok = e.parentOf(x) {
		chain = append(chain, x)
	}
	var p []uint32
	for i := len(chain) - 1; i >= 0; i-- {
		tk, ok := e.tokens[chain[i]]
		if !ok {
			return nil, "", false
		}
		p = append(p, tk...)
	}
	return p, e.salt[h], true
}

// layoutRankDump is what a dump says of one rank, independent of node
// numbering: each block's local hash (its place in the tree, salt
// included) and copies, the KV-cache groups with their blocks, and the
// stream layer's word.
type layoutRankDump struct {
	Blocks   map[uint64]indexer.DumpBlock
	Groups   []indexer.DumpGroup
	Degraded bool
}

func rankDumps(s *indexer.Snapshot) map[indexer.Rank]*layoutRankDump {
	out := map[indexer.Rank]*layoutRankDump{}
	get := func(r indexer.Rank) *layoutRankDump {
		if out[r] == nil {
			out[r] = &layoutRankDump{Blocks: map[uint64]indexer.DumpBlock{}}
		}
		return out[r]
	}
	for _, ev := range s.Events {
		for _, b := range ev.Blocks {
			get(ev.Rank).Blocks[b.Hash] = b
		}
	}
	for _, g := range s.Groups {
		g.Blocks = slices.Clone(g.Blocks)
		slices.SortFunc(g.Blocks, func(a, b indexer.DumpGroupBlock) int { return cmp.Compare(a.Hash, b.Hash) })
		rd := get(g.Rank)
		rd.Groups = append(rd.Groups, g)
	}
	for _, w := range s.Ranks {
		if w.Degraded {
			get(w.Rank).Degraded = true
		}
	}
	for _, rd := range out {
		slices.SortFunc(rd.Groups, func(a, b indexer.DumpGroup) int { return a.Idx - b.Idx })
	}
	return out
}

// sameRank says how got's rank r differs from want's ("" if not at all).
func sameRank(got, want map[indexer.Rank]*layoutRankDump, r indexer.Rank) string {
	g, w := got[r], want[r]
	switch {
	case g == nil && w == nil:
		return ""
	case g == nil:
		return fmt.Sprintf("rank %v absent, the engine holds %d blocks", r, len(w.Blocks))
	case w == nil:
		return fmt.Sprintf("rank %v holds %d blocks, the engine none", r, len(g.Blocks))
	case g.Degraded != w.Degraded:
		return fmt.Sprintf("rank %v degraded %v, want %v", r, g.Degraded, w.Degraded)
	case len(g.Blocks) != len(w.Blocks):
		return fmt.Sprintf("rank %v holds %d blocks, the engine %d", r, len(g.Blocks), len(w.Blocks))
	}
	for _, h := range slices.Sorted(maps.Keys(w.Blocks)) {
		if gb, ok := g.Blocks[h]; !ok || gb != w.Blocks[h] {
			return fmt.Sprintf("rank %v block %#x: index %+v (held %v), engine %+v", r, h, gb, ok, w.Blocks[h])
		}
	}
	if !reflect.DeepEqual(g.Groups, w.Groups) {
		return fmt.Sprintf("rank %v KV-cache groups differ:\n index  %+v\n engine %+v", r, summarise(g.Groups), summarise(w.Groups))
	}
	return ""
}

func summarise(gs []indexer.DumpGroup) []string {
	var out []string
	for _, g := range gs {
		out = append(out, fmt.Sprintf("{idx %d %v %q w%d main %v tracked %v: %d blocks}", g.Idx, g.Attention, g.Kind, g.Window, g.Main, g.Tracked, len(g.Blocks)))
	}
	return out
}

// daemonDump fetches partition m:default from the daemon's /dump.
func daemonDump(t *testing.T, d *testDaemon) *indexer.Snapshot {
	t.Helper()
	code, body := call(t, "GET", d.url+"/dump", "", nil)
	if code != http.StatusOK {
		t.Fatalf("dump: %d %s", code, body)
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(body, &parts); err != nil {
		t.Fatalf("dump: %v", err)
	}
	raw, ok := parts["m:default"]
	if !ok {
		return &indexer.Snapshot{}
	}
	s, err := apiserver.UnmarshalSnapshot(raw)
	if err != nil {
		t.Fatalf("dump m:default: %v", err)
	}
	return s
}

// TestDaemonEngineLayouts: for every layout of the wire the engines people
// run emit — vLLM's map and array eras, its hybrid KV-cache manager with
// the full-attention group numbered 1, SGLang's positional events with
// salted BlockStoredWithMetadata and its tagged maps, TensorRT-LLM's maps
// with signed hashes, one publisher per attention-DP rank — a real libzmq
// publisher (pypub) drives the daemon on a real etcd, losing every 7th
// live batch, and the daemon's index equals the engine's truth exactly:
// every block's place in the tree (salt namespaces included) and copies,
// every KV-cache group with its blocks, no rank degraded; and /query
// reports for the engine's prompts what the truth does (for the hybrid
// model, the hit vLLM would grant). Controls show what the comparison
// catches: salts ignored, and the hybrid model indexed as group 0 only
// (what prefixd did before it learned groups), both differ from the truth.
func TestDaemonEngineLayouts(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	c := workload.DefaultConfig()
	c.Seed, c.Workers, c.TargetEntries, c.ChurnBlocks = 31, 1, 600, 1200
	c.SystemPrompts, c.SystemPromptBlocksMin, c.SystemPromptBlocksMax = 4, 4, 12
	c.TurnBlocksMax, c.TurnsMax, c.Active = 12, 5, 12
	c.RankCapacityBlocks, c.LongPrompts = 640, 0 // full caches: evictions (BlockRemoved) half the time
	w, err := workload.Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	var ops []indexer.Op
	for _, ev := range w.Events {
		ops = append(ops, ev.Op)
	}
	for i, lay := range engineLayouts {
		worker := uint64(100 + i)
		t.Run(lay.name, func(t *testing.T) {
			var engines []*layoutEngine
			for _, r := range lay.ranks {
				e := newLayoutEngine(t, lay, worker, r)
				// Half the history before the daemon knows the worker: the
				// join replays it.
				e.feed(ops[:len(ops)/2], 6, 0)
				engines = append(engines, e)
			}
			for _, e := range engines {
				if code, body := register(t, d, map[string]any{"instance_id": worker, "dp_rank": e.rank.DPRank,
					"endpoint": e.py.Endpoint, "replay_endpoint": e.py.ReplayEndpoint,
					"model_name": "m", "block_size": 16}); code != http.StatusCreated {
					t.Fatalf("register: %d %s", code, body)
				}
			}
			for _, e := range engines {
				e.feed(ops[len(ops)/2:], 6, 7)
			}
			for _, e := range engines {
				testsupport.Eventually(t, 30*time.Second, fmt.Sprintf("rank %d caught up at seq %d", e.rank.DPRank, e.last), func() bool {
					l, ok := listener(t, d, "m", worker, e.rank.DPRank)
					return ok && l.LastSeq != nil && *l.LastSeq == e.last && l.Status == api.StatusActive
				})
			}
			got := rankDumps(daemonDump(t, d))
			for _, e := range engines {
				want := rankDumps(e.truth.Dump())
				if diff := sameRank(got, want, e.rank); diff != "" {
					t.Fatal(diff)
				}
				if len(want[e.rank].Blocks) < 100 || e.ops["remove/g0"]+e.ops["remove/g1"] < 50 {
					t.Fatalf("the engine holds %d blocks after ops %v: the workload proves little", len(want[e.rank].Blocks), e.ops)
				}
				e.checkQueries(t, d)
				e.controls(t, want)
				if l, _ := listener(t, d, "m", worker, e.rank.DPRank); l.Degraded {
					t.Fatalf("rank %v degraded: %s", e.rank, l.DegradedReason)
				}
				t.Logf("rank %v: %d blocks exact, ops %v", e.rank, len(want[e.rank].Blocks), e.ops)
			}
			if lay.hybrid {
				l, _ := listener(t, d, "m", worker, 0)
				want := []api.KVCacheGroup{
					{GroupIdx: 0, Attention: "sliding_window", Kind: "sliding_window", SlidingWindow: layoutWindow, Tracked: true, Blocks: len(engines[0].window)},
					{GroupIdx: 1, Attention: "full", Kind: "full_attention", Main: true, Tracked: true, Blocks: l.Blocks},
				}
				if !reflect.DeepEqual(l.KVCacheGroups, want) {
					t.Fatalf("/workers groups %+v, want %+v", l.KVCacheGroups, want)
				}
			}
			if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": worker, "model_name": "m"}); code != http.StatusOK {
				t.Fatalf("unregister: %d %s", code, body)
			}
		})
	}
}

// checkQueries asks the daemon's /query for prompts of chains the engine
// stored (the live ones and some it evicted) and compares what it reports
// for the rank with what the truth's Match reports: the device hit, and
// for the hybrid layout the hit vLLM would grant.
func (e *layoutEngine) checkQueries(t *testing.T, d *testDaemon) {
	t.Helper()
	hashes := slices.Sorted(maps.Keys(e.sent))
	granted, short := 0, 0
	for i := 0; i < 60; i++ {
		h := hashes[e.rng.IntN(len(hashes))]
		p, salt, ok := e.prompt(h)
		if !ok {
			continue
		}
		q := indexer.HashBlocks(nil, p, 16, indexer.Seed("", salt))
		var want uint64
		for _, o := range e.truth.Match(q, nil) {
			if o.Rank == e.rank {
				want = uint64(o.Device) * 16
				if o.Device < o.Upper {
					short++
				}
			}
		}
		body := map[string]any{"token_ids": p, "model_name": "m"}
		if salt != "" {
			body["cache_salt"] = salt
		}
		code, raw := call(t, "POST", d.url+"/query", "", body)
		if code != http.StatusOK {
			t.Fatalf("query: %d %s", code, raw)
		}
		var resp api.ScoreResponse
		if err := json.Unmarshal(raw, &resp); err != nil {
			t.Fatal(err)
		}
		got := resp.Scores[e.rank.WorkerID][e.rank.DPRank]
		if got != want {
			t.Fatalf("rank %v, prompt of %d tokens (salt %q) ending at %#x: /query %d tokens, the engine %d", e.rank, len(p), salt, h, got, want)
		}
		if want > 0 {
			granted++
		}
	}
	if granted == 0 {
		t.Fatal("no query matched: the lookups prove nothing")
	}
	if e.lay.hybrid && short == 0 {
		t.Fatal("the sliding-window group never cut a hit: the grant is not exercised")
	}
}

// controls rebuild the rank as a wrong index would and check that the
// comparison catches it.
func (e *layoutEngine) controls(t *testing.T, want map[indexer.Rank]*layoutRankDump) {
	t.Helper()
	if e.lay.sglang {
		// Salts ignored: the salted chains land in the unsalted namespace.
		ctl := indexer.NewTree(16)
		e.replay(ctl, func(op indexer.Op) (indexer.Op, bool) { op.Store.Seed = indexer.BaseSeed; return op, true })
		if sameRank(rankDumps(ctl.Dump()), want, e.rank) == "" {
			t.Fatal("control: an index that ignores cache salts passes the comparison")
		}
	}
	if e.lay.hybrid {
		// Group 0 of a main-attention kind only: the sliding-window group
		// 0 is filtered and group 1 too.
		ctl := indexer.NewTree(16)
		e.replay(ctl, func(op indexer.Op) (indexer.Op, bool) {
			return op, op.Group.Idx == 0 && op.Group.Attention == indexer.AttentionFull
		})
		if sameRank(rankDumps(ctl.Dump()), want, e.rank) == "" {
			t.Fatal("control: group-0-only indexing passes the comparison")
		}
	}
}

// replay applies the ops the engine published to tr, through edit.
func (e *layoutEngine) replay(tr *indexer.Tree, edit func(indexer.Op) (indexer.Op, bool)) {
	for _, op := range e.published {
		if op, ok := edit(op); ok {
			_ = tr.Apply(e.rank, op)
		}
	}
}
