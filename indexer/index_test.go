package indexer

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// sim is a tiny engine stand-in for index tests: each rank stores chains of
// blocks along a few shared documents and evicts its leaves, producing
// batches of ops with per-rank engine hashes.
type sim struct {
	rng  *rand.Rand
	bs   int
	docs [][]uint32
	held map[Rank]map[string]uint64 // path key → engine hash
}

func newSim(seed uint64, bs int) *sim {
	s := &sim{rng: rand.New(rand.NewPCG(seed, 7)), bs: bs, held: map[Rank]map[string]uint64{}}
	for d := 0; d < 6; d++ {
		doc := make([]uint32, bs*(4+s.rng.IntN(20)))
		for i := range doc {
			doc[i] = uint32(s.rng.IntN(50))
		}
		if d > 0 && s.rng.IntN(2) == 0 { // share a prefix with an earlier document
			copy(doc, s.docs[0][:min(len(doc), len(s.docs[0]))/2])
		}
		s.docs = append(s.docs, doc)
	}
	return s
}

// pathKey is fmt.Sprint(tokens) ("[3 1 4]"), written out by hand: the
// sims call it for every prefix of every document they touch, and fmt's
// reflection made it most of their cost under -race.
func pathKey(tokens []uint32) string {
	b := make([]byte, 0, 2+4*len(tokens))
	b = append(b, '[')
	for i, x := range tokens {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, uint64(x), 10)
	}
	return string(append(b, ']'))
}

func extHash(r Rank, tokens []uint32) uint64 {
	h := HashBlocks(nil, tokens, len(tokens), uint64(r.WorkerID)*1000+uint64(r.DPRank))
	return h[0]
}

// batch returns the next batch of ops for rank r.
func (s *sim) batch(r Rank) []Op {
	held := s.held[r]
	if held == nil {
		held = map[string]uint64{}
		s.held[r] = held
	}
	var ops []Op
	for n := 1 + s.rng.IntN(3); n > 0; n-- {
		doc := s.docs[s.rng.IntN(len(s.docs))]
		blocks := len(doc) / s.bs
		if s.rng.IntN(4) == 0 && len(held) > 0 {
			// Evict: remove the deepest held block of a document.
			for b := blocks; b > 0; b-- {
				k := pathKey(doc[:b*s.bs])
				if x, ok := held[k]; ok {
					delete(held, k)
					ops = append(ops, Op{Kind: OpRemove, Remove: Removed{Hashes: []uint64{x}}})
					break
				}
			}
			continue
		}
		// Store: continue from the longest held prefix.
		start := 0
		for start < blocks {
			if _, ok := held[pathKey(doc[:(start+1)*s.bs])]; !ok {
				break
			}
			start++
		}
		end := min(blocks, start+1+s.rng.IntN(6))
		if start == end {
			continue
		}
		st := Stored{BlockSize: s.bs, Seed: BaseSeed, Tokens: doc[start*s.bs : end*s.bs]}
		if start > 0 {
			st.Parent, st.HasParent = held[pathKey(doc[:start*s.bs])], true
		}
		for b := start; b < end; b++ {
			x := extHash(r, doc[:(b+1)*s.bs])
			st.Hashes = append(st.Hashes, x)
			held[pathKey(doc[:(b+1)*s.bs])] = x
		}
		ops = append(ops, Op{Kind: OpStore, Store: st})
	}
	if s.rng.IntN(40) == 0 {
		clear(held)
		ops = append(ops, Op{Kind: OpClear})
	}
	return ops
}

type canonEntry struct {
	path   string
	counts [NumTiers]uint32
}

// canonical describes trees independently of their node layout: the
// shards of one partition, whose ranks are disjoint, or one tree.
func canonical(trees ...*Tree) (map[Rank]map[uint64]canonEntry, map[Rank]RankWatermark) {
	out := map[Rank]map[uint64]canonEntry{}
	wm := map[Rank]RankWatermark{}
	for _, t := range trees {
		canonicalInto(t, out, wm)
	}
	return out, wm
}

func canonicalInto(t *Tree, out map[Rank]map[uint64]canonEntry, wm map[Rank]RankWatermark) {
	paths := map[uint32]string{0: ""}
	var walk func(id uint32)
	walk = func(id uint32) {
		n := &t.nodes[id]
		base := paths[n.parent]
		L, H := len(n.hashes), len(n.hold)
		for j := range n.hashes {
			p := base + "/" + strconv.FormatUint(n.hashes[j], 16) // "/%x", without fmt's cost
			if j == L-1 {
				paths[id] = p
			}
			for h := range n.hold {
				if j >= int(n.hold[h].cut) {
					continue
				}
				r := t.ranks[n.hold[h].rid].rank
				if out[r] == nil {
					out[r] = map[uint64]canonEntry{}
				}
				var e canonEntry
				e.path = p
				for tier := Tier(0); tier < NumTiers; tier++ {
					e.counts[tier] = t.tierCount(id, h, uint32(j), tier)
				}
				out[r][n.ext[j*H+h]] = e
			}
			base = p
		}
		for c := n.first; c != 0; c = t.nodes[c].next {
			walk(c)
		}
	}
	for c := t.nodes[0].first; c != 0; c = t.nodes[c].next {
		walk(c)
	}
	for r, rid := range t.rankIDs {
		wm[r] = RankWatermark{Rank: r, Seq: t.ranks[rid].seq, HasSeq: t.ranks[rid].hasSeq}
	}
}

// shardTrees returns partition k's trees, one per shard.
func shardTrees(ix *Index, k PartitionKey) []*Tree {
	var out []*Tree
	for _, s := range *ix.parts[k].shards.Load() {
		out = append(out, s.tree)
	}
	return out
}

// sameTrees checks that two sets of trees (each a partition's shards, or
// one tree) hold the same ranks with the same blocks, states and counts;
// and, when both are sharded alike, the same node layout sizes.
func sameTrees(t *testing.T, got, want []*Tree) {
	t.Helper()
	g, gw := canonical(got...)
	w, ww := canonical(want...)
	if !maps.EqualFunc(g, w, maps.Equal) {
		t.Fatalf("trees differ:\n got  %v\n want %v", g, w)
	}
	if !maps.Equal(gw, ww) {
		t.Fatalf("watermarks differ: got %v want %v", gw, ww)
	}
	state := func(ts []*Tree, r Rank) *rankState {
		for _, t := range ts {
			if rid, ok := t.rankIDs[r]; ok {
				return &t.ranks[rid]
			}
		}
		return nil
	}
	for r := range ww {
		g, w := state(got, r), state(want, r)
		if g == nil {
			continue // watermark comparison above reports it
		}
		if g.tiers != w.tiers || g.truncated != w.truncated || g.limit != w.limit {
			t.Fatalf("rank %v: tiers %v truncated %v capacity %v, want %v %v %v", r, g.tiers, g.truncated, g.limit, w.tiers, w.truncated, w.limit)
		}
	}
	sum := func(ts []*Tree) (s TreeStats) {
		for _, t := range ts {
			st := t.Stats()
			s.Entries += st.Entries
			s.Blocks += st.Blocks
			s.Nodes += st.Nodes
		}
		return s
	}
	gs, ws := sum(got), sum(want)
	if gs.Entries != ws.Entries || len(got) == len(want) && (gs.Blocks != ws.Blocks || gs.Nodes != ws.Nodes) {
		t.Fatalf("stats differ: got %+v want %+v", gs, ws)
	}
}

type seqBatch struct {
	rank Rank
	seq  uint64
	ops  []Op
}

func genStream(seed uint64, n int) []seqBatch {
	s := newSim(seed, 4)
	ranks := []Rank{{1, 0}, {1, 1}, {2, 0}, {3, 0}}
	seqs := map[Rank]uint64{}
	var out []seqBatch
	for i := 0; i < n; i++ {
		r := ranks[s.rng.IntN(len(ranks))]
		out = append(out, seqBatch{r, seqs[r], s.batch(r)})
		seqs[r]++
	}
	return out
}

var testKey = PartitionKey{"m", "default"}

// TestSnapshotRestoreThenResume: a snapshot taken mid-stream, restored, and
// fed each rank's batches after its watermark, equals the uninterrupted
// index.
func TestSnapshotRestoreThenResume(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		stream := genStream(seed, 300)
		live := New(Options{})
		if err := live.AddPartition(testKey, 4); err != nil {
			t.Fatal(err)
		}
		cut := len(stream) / 2
		var snap *Snapshot
		for i, b := range stream {
			if i == cut {
				var err error
				if snap, err = live.Snapshot(testKey); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := live.Apply(testKey, b.rank, b.seq, b.ops); err != nil {
				t.Fatal(err)
			}
		}
		if len(snap.Events) == 0 || len(snap.Ranks) == 0 {
			t.Fatalf("seed %d: empty snapshot mid-stream", seed)
		}
		restored := New(Options{})
		if err := restored.Restore(testKey, snap); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		wm := map[Rank]RankWatermark{}
		for _, w := range snap.Ranks {
			wm[w.Rank] = w
		}
		for _, b := range stream {
			if w, ok := wm[b.rank]; ok && w.HasSeq && b.seq <= w.Seq {
				continue
			}
			if _, err := restored.Apply(testKey, b.rank, b.seq, b.ops); err != nil {
				t.Fatal(err)
			}
		}
		sameTrees(t, shardTrees(restored, testKey), shardTrees(live, testKey))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRestoreRejectsInconsistentSnapshots(t *testing.T) {
	tr := NewTree(4)
	r := Rank{1, 0}
	must(t, tr.Store(r, Stored{Hashes: []uint64{1, 2, 3}, Tokens: make([]uint32, 12), BlockSize: 4, Seed: BaseSeed}))
	good := tr.Dump()
	cases := map[string]func(s *Snapshot){
		"no block size":  func(s *Snapshot) { s.BlockSize = 0 },
		"hostile offset": func(s *Snapshot) { s.Events[0].Offset = 1 << 31 },
		"unknown parent": func(s *Snapshot) { s.Events[0].ParentNode = 99 },
		"duplicate hash": func(s *Snapshot) { s.Events[0].Blocks[1].Hash = 1 },
		"zero copies":    func(s *Snapshot) { s.Events[0].Blocks[0].Counts = [NumTiers]uint32{} },
		"partial holding": func(s *Snapshot) {
			s.Events[0].Blocks = s.Events[0].Blocks[:2]
			s.Structural = []DumpNode{{Node: s.Events[0].Node, Hashes: make([]uint64, 3)}}
		},
	}
	for name, mutate := range cases {
		s := tr.Dump()
		mutate(s)
		if _, err := Restore(s); err == nil {
			t.Errorf("%s: restore accepted an inconsistent snapshot", name)
		}
	}
	if _, err := Restore(good); err != nil {
		t.Fatalf("good snapshot: %v", err)
	}
}

// TestMemoryCapKeepsSubset: with a cap, entries stay within it and every
// rank's overlap is at most its uncapped overlap (index ⊆ engine truth).
func TestMemoryCapKeepsSubset(t *testing.T) {
	const maxEntries = 60
	capped := New(Options{MaxEntries: maxEntries})
	truth := New(Options{})
	must(t, capped.AddPartition(testKey, 4))
	must(t, truth.AddPartition(testKey, 4))
	stream := genStream(42, 600)
	s := newSim(42, 4)
	var evicted, parentMissing uint64
	for _, b := range stream {
		res, err := capped.Apply(testKey, b.rank, b.seq, b.ops)
		must(t, err)
		evicted += res.Skipped[ReasonEvicted]
		parentMissing += res.Skipped[ReasonParentNotFound]
		if _, err := truth.Apply(testKey, b.rank, b.seq, b.ops); err != nil {
			t.Fatal(err)
		}
		if e := capped.Entries(); e > maxEntries {
			t.Fatalf("entries %d above cap %d", e, maxEntries)
		}
		for _, doc := range s.docs {
			got, _ := capped.MatchTokens(testKey, doc, BaseSeed, nil)
			want, _ := truth.MatchTokens(testKey, doc, BaseSeed, nil)
			wantBy := map[Rank]Overlap{}
			for _, o := range want {
				wantBy[o.Rank] = o
			}
			for _, o := range got {
				w := wantBy[o.Rank]
				if o.Device > w.Device || o.Host > w.Host || o.Disk > w.Disk {
					t.Fatalf("capped index claims more than the engine holds: %+v vs %+v", o, w)
				}
			}
		}
	}
	if evicted == 0 || parentMissing == 0 {
		t.Fatalf("cap never bit: evicted %d, stores with evicted parents %d", evicted, parentMissing)
	}
}

// TestConcurrentApplyAndMatch runs appliers and matchers together under
// the race detector and checks the final state equals a serial replay.
func TestConcurrentApplyAndMatch(t *testing.T) {
	stream := genStream(9, 2000)
	byRank := map[Rank][]seqBatch{}
	for _, b := range stream {
		byRank[b.rank] = append(byRank[b.rank], b)
	}
	ix := New(Options{})
	must(t, ix.AddPartition(testKey, 4))
	s := newSim(9, 4)
	var wg sync.WaitGroup
	done := make(chan struct{})
	for _, bs := range byRank {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, b := range bs {
				if _, err := ix.Apply(testKey, b.rank, b.seq, b.ops); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var mg sync.WaitGroup
	for m := 0; m < 2; m++ {
		mg.Add(1)
		go func() {
			defer mg.Done()
			var dst []Overlap
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				dst, _ = ix.MatchTokens(testKey, s.docs[i%len(s.docs)], BaseSeed, dst[:0])
				for _, o := range dst {
					if o.Device > o.Host || o.Host > o.Disk {
						t.Errorf("tiers not cumulative: %+v", o)
					}
				}
				_ = ix.Stats()
			}
		}()
	}
	wg.Wait()
	close(done)
	mg.Wait()
	serial := NewTree(4)
	// Per-rank order is what matters; ranks are independent owners.
	for _, b := range stream {
		for _, op := range b.ops {
			_ = serial.Apply(b.rank, op)
		}
		serial.SetWatermark(b.rank, b.seq)
	}
	sameTrees(t, shardTrees(ix, testKey), []*Tree{serial})
}

func TestIndexPartitions(t *testing.T) {
	ix := New(Options{})
	must(t, ix.AddPartition(testKey, 16))
	must(t, ix.AddPartition(testKey, 16))
	if err := ix.AddPartition(testKey, 32); !errors.Is(err, ErrBlockSizeConflict) {
		t.Fatalf("block size conflict: %v", err)
	}
	if _, err := ix.Match(PartitionKey{"other", "default"}, []uint64{1}, nil); !errors.Is(err, ErrNoPartition) {
		t.Fatalf("missing partition: %v", err)
	}
	other := PartitionKey{"m", "group-b"}
	must(t, ix.AddPartition(other, 16))
	toks := make([]uint32, 32)
	for _, k := range []PartitionKey{testKey, other} {
		if _, err := ix.Apply(k, Rank{1, 0}, 0, []Op{{Kind: OpStore, Store: Stored{Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 16, Seed: BaseSeed}}}); err != nil {
			t.Fatal(err)
		}
	}
	ix.RemoveWorker(1)
	for _, st := range ix.Stats() {
		if st.Entries != 0 || st.Nodes != 0 {
			t.Fatalf("partition %v not empty after RemoveWorker: %+v", st.Key, st.TreeStats)
		}
	}
	keys := ix.Partitions()
	slices.SortFunc(keys, func(a, b PartitionKey) int { return strings.Compare(a.String(), b.String()) })
	if len(keys) != 2 {
		t.Fatalf("partitions %v", keys)
	}
}

// TestDegradedTravels: the stream layer's degraded word is recorded with a
// batch (Mark) or a Reset under the partition's lock, so a Snapshot sees
// it with the state it describes, and a restore keeps it; Reset also
// drops the watermark, so a dump never pairs the old watermark with the
// emptied blocks.
func TestDegradedTravels(t *testing.T) {
	ix := New(Options{})
	must(t, ix.AddPartition(testKey, 4))
	r := Rank{WorkerID: 3}
	st := Stored{Hashes: []uint64{10}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Seed: BaseSeed}
	_, err := ix.ApplyBatch(testKey, r, Mark{Seq: 4, Digest: 44}, []Op{{Kind: OpStore, Store: st}})
	must(t, err)
	must(t, ix.Reset(testKey, r, true, "lost history: the engine no longer has the batches"))
	if rs, _ := ix.Rank(testKey, r); rs.HasSeq || rs.Blocks != 0 || !rs.Degraded || rs.DegradedReason == "" {
		t.Fatalf("after Reset: %+v", rs)
	}
	_, err = ix.ApplyBatch(testKey, r, Mark{Seq: 9, Digest: 99, Degraded: true, Reason: "lost history: the engine no longer has the batches"},
		[]Op{{Kind: OpStore, Store: st}})
	must(t, err)
	snap, err := ix.Snapshot(testKey)
	must(t, err)
	other := New(Options{})
	must(t, other.Restore(testKey, snap))
	rs, err := other.Rank(testKey, r)
	must(t, err)
	if !rs.Degraded || rs.DegradedReason != "lost history: the engine no longer has the batches" || rs.Watermark != 9 || rs.Digest != 99 || rs.Blocks != 1 {
		t.Fatalf("restored rank: %+v", rs)
	}
	// A batch that says otherwise (the stream saw AllBlocksCleared) lifts it.
	_, err = other.ApplyBatch(testKey, r, Mark{Seq: 10}, []Op{{Kind: OpClear}})
	must(t, err)
	if rs, _ := other.Rank(testKey, r); rs.Degraded || rs.DegradedReason != "" {
		t.Fatalf("after a batch marked exact: %+v", rs)
	}
}

// TestForeignMark: a batch carried by another rank's stream (Mark.Foreign)
// leaves the rank's watermark alone, can mark it degraded but not lift the
// flag, and its mark outlives the rank's own exact batches until an
// AllBlocksCleared empties the rank; dumps carry it.
func TestForeignMark(t *testing.T) {
	ix := New(Options{})
	must(t, ix.AddPartition(testKey, 4))
	r := Rank{WorkerID: 3, DPRank: 1}
	st := Stored{Hashes: []uint64{10}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Seed: BaseSeed}
	apply := func(m Mark, ops ...Op) RankState {
		t.Helper()
		_, err := ix.ApplyBatch(testKey, r, m, ops)
		must(t, err)
		rs, err := ix.Rank(testKey, r)
		must(t, err)
		return rs
	}
	if rs := apply(Mark{Seq: 5, Digest: 55}, Op{Kind: OpStore, Store: st}); rs.Degraded || rs.Watermark != 5 {
		t.Fatalf("own batch: %+v", rs)
	}
	if rs := apply(Mark{Seq: 70, Foreign: true, Degraded: true, Reason: "a store was skipped"}); !rs.Degraded || rs.DegradedReason != "a store was skipped" || rs.Watermark != 5 || rs.Digest != 55 {
		t.Fatalf("foreign degraded batch: %+v; want degraded, watermark 5 kept", rs)
	}
	if rs := apply(Mark{Seq: 71, Foreign: true}); !rs.Degraded {
		t.Fatalf("a foreign exact batch lifted the flag: %+v", rs)
	}
	if rs := apply(Mark{Seq: 6}); !rs.Degraded || rs.Watermark != 6 {
		t.Fatalf("the rank's own exact batch lifted a foreign batch's flag: %+v", rs)
	}
	snap, err := ix.Snapshot(testKey)
	must(t, err)
	if len(snap.Ranks) != 1 || !snap.Ranks[0].Degraded || snap.Ranks[0].DegradedReason != "a store was skipped" {
		t.Fatalf("dump: %+v", snap.Ranks)
	}
	if rs := apply(Mark{Seq: 72, Foreign: true}, Op{Kind: OpClear}); rs.Degraded || rs.Watermark != 6 {
		t.Fatalf("after the rank's clear: %+v; want exact, watermark 6", rs)
	}
}
