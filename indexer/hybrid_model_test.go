package indexer_test

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/prefixd/prefixd/indexer"
)

// This file holds a brute-force model of a vLLM engine with a hybrid
// KV-cache layout, written from vLLM's scheduler and hit rule (not from
// the index): one block pool shared by every KV-cache group, an LRU free
// queue, per-group caches of chained block hashes, and the events a
// scheduler publishes, group by group.

// hyKind is an attention type of the model.
type hyKind uint8

const (
	hyFull    hyKind = iota // full attention: a hit needs every block from the first
	hySliding               // sliding window
	hyChunked               // chunked local attention: the index does not model it
)

// hyGroup is one KV-cache group of the simulated engine.
type hyGroup struct {
	idx    int
	kind   hyKind
	window int            // tokens: the sliding window, or the chunk of chunked local attention
	cache  map[uint64]int // engine hash → cached physical copies
}

func (g *hyGroup) group() indexer.Group {
	switch g.kind {
	case hySliding:
		return indexer.Group{Idx: g.idx, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: g.window}
	case hyChunked:
		return indexer.Group{Idx: g.idx, Attention: indexer.AttentionOther, Kind: "chunked_local_attention"}
	}
	return indexer.Group{Idx: g.idx, Kind: "full_attention"}
}

// need is how many blocks before a hit's end a sliding-window group must
// hold: vLLM's ceil((sliding_window - 1) / block_size), at least 1.
func (g *hyGroup) need(bs int) int { return max(1, (g.window-1+bs-1)/bs) }

// hyBlock is one physical block of the pool.
type hyBlock struct {
	group  int // index in hyEngine.groups while cached
	hash   uint64
	cached bool
	refs   int
}

// hyReq is a request holding blocks: per group, one block id per
// position, -1 where the group holds none (vLLM's null block).
type hyReq struct{ blocks [][]int }

// hyEngine is the simulated engine of one rank.
type hyEngine struct {
	bs     int
	rng    *rand.Rand
	salt   uint64
	groups []*hyGroup // by group index
	blocks []hyBlock
	free   []int // vLLM's free block queue: evicted from the front, freed to the back
	live   []*hyReq
	docs   [][]uint32
	ops    []indexer.Op // the current batch
}

func newHyEngine(rng *rand.Rand, bs, poolBlocks int, kinds []hyKind, windows []int, docs [][]uint32) *hyEngine {
	e := &hyEngine{bs: bs, rng: rng, salt: rng.Uint64(), docs: docs, blocks: make([]hyBlock, poolBlocks)}
	for i, k := range kinds {
		e.groups = append(e.groups, &hyGroup{idx: i, kind: k, window: windows[i], cache: map[uint64]int{}})
	}
	for i := range e.blocks {
		e.free = append(e.free, i)
	}
	return e
}

// mainGroup is the lowest-numbered full-attention group: the one the
// index's tree holds.
func (e *hyEngine) mainGroup() *hyGroup {
	for _, g := range e.groups {
		if g.kind == hyFull {
			return g
		}
	}
	return nil
}

// hashes returns the engine hashes of tokens' full blocks: chained, as
// vLLM's, and unrelated to the index's local hashes.
func (e *hyEngine) hashes(tokens []uint32) []uint64 {
	local := indexer.HashBlocks(nil, tokens, e.bs, indexer.BaseSeed)
	seq := indexer.HashSequence(nil, local)
	for i := range seq {
		seq[i] ^= e.salt
	}
	return seq
}

// hit is the longest prefix hit, in blocks, within limit that vLLM's
// HybridKVCacheCoordinator.find_longest_cache_hit grants for hashes,
// written out as vLLM computes it: full-attention groups first, every
// group cuts the candidate length, repeated until no group cuts it.
// With tracked false the groups the index does not model are left out:
// the figure the index reports.
func (e *hyEngine) hit(hashes []uint64, limit int, all bool) int {
	order := slices.Clone(e.groups)
	slices.SortStableFunc(order, func(a, b *hyGroup) int {
		if (a.kind == hyFull) == (b.kind == hyFull) {
			return 0
		}
		if a.kind == hyFull {
			return -1
		}
		return 1
	})
	hitLen := limit
	for {
		cur := hitLen
		for _, g := range order {
			switch g.kind {
			case hyFull: // FullAttentionManager
				n := 0
				for n < cur && g.cache[hashes[n]] > 0 {
					n++
				}
				cur = n
			case hySliding: // SlidingWindowManager
				need := g.need(e.bs)
				contiguous, found := 0, false
				for i := cur - 1; i >= 0; i-- {
					if g.cache[hashes[i]] > 0 {
						contiguous++
						if contiguous >= need {
							cur = i + contiguous
							found = true
							break
						}
					} else {
						contiguous = 0
					}
				}
				if !found {
					cur = contiguous
				}
			case hyChunked: // ChunkedLocalAttentionManager
				if !all {
					continue
				}
				start := 0
				if cur > 0 {
					start = cur * e.bs / g.window * g.window / e.bs
				}
				n := start
				for n < cur && g.cache[hashes[n]] > 0 {
					n++
				}
				cur = n
			}
		}
		if cur >= hitLen {
			break
		}
		hitLen = cur
	}
	return hitLen
}

// run is how many leading blocks of hashes group g holds.
func (g *hyGroup) run(hashes []uint64) int {
	n := 0
	for n < len(hashes) && g.cache[hashes[n]] > 0 {
		n++
	}
	return n
}

// touched returns the positions of a hit of L blocks whose cached blocks
// group g takes (the rest are null blocks to it).
func (e *hyEngine) touched(g *hyGroup, L int) (from int) {
	switch g.kind {
	case hySliding:
		return max(0, L-g.need(e.bs))
	case hyChunked:
		return min(L, max(0, L*e.bs/g.window*g.window/e.bs))
	}
	return 0
}

// skipped is how many leading blocks of a request of tokens computed
// tokens group g no longer needs (vLLM's get_num_skipped_tokens, in
// blocks).
func (e *hyEngine) skipped(g *hyGroup, tokens int) int {
	switch g.kind {
	case hySliding:
		return max(0, tokens-g.window+1) / e.bs
	case hyChunked:
		return tokens / g.window * g.window / e.bs
	}
	return 0
}

// take pops the front of the free queue, evicting its cached block.
func (e *hyEngine) take() int {
	id := e.free[0]
	e.free = e.free[1:]
	b := &e.blocks[id]
	if b.cached {
		g := e.groups[b.group]
		if g.cache[b.hash]--; g.cache[b.hash] == 0 {
			delete(g.cache, b.hash)
		}
		e.ops = append(e.ops, indexer.Op{Kind: indexer.OpRemove, Group: indexer.Group{Idx: g.idx}, Remove: indexer.Removed{Hashes: []uint64{b.hash}}})
	}
	*b = hyBlock{}
	return id
}

// cachedBlock returns a cached physical block of g holding h.
func (e *hyEngine) cachedBlock(g int, h uint64) int {
	for id := range e.blocks {
		if b := &e.blocks[id]; b.cached && b.group == g && b.hash == h {
			return id
		}
	}
	panic("no cached block")
}

func (e *hyEngine) touch(id int) {
	b := &e.blocks[id]
	if b.refs == 0 {
		i := slices.Index(e.free, id)
		e.free = slices.Delete(e.free, i, i+1)
	}
	b.refs++
}

func (e *hyEngine) release(id int) {
	if id < 0 {
		return
	}
	b := &e.blocks[id]
	if b.refs--; b.refs == 0 {
		e.free = append(e.free, id)
	}
}

// serve schedules a request with prompt tokens as one prefill step and
// returns false if the pool cannot hold it now.
func (e *hyEngine) serve(tokens []uint32) bool {
	hs := e.hashes(tokens)
	n := len(hs)
	total := (len(tokens) + e.bs - 1) / e.bs
	L := e.hit(hs, n, true)
	// Blocks needed: new ones for every group past the hit, and the hit's
	// cached blocks that sit in the free queue.
	need := 0
	for gi, g := range e.groups {
		need += total - L
		for p := e.touched(g, L); p < L; p++ {
			if e.blocks[e.cachedBlock(gi, hs[p])].refs == 0 {
				need++
			}
		}
	}
	if need > len(e.free) {
		return false
	}
	req := &hyReq{}
	// Touch every group's hit first, then allocate (vLLM's two phases).
	for gi, g := range e.groups {
		bl := slices.Repeat([]int{-1}, total)
		for p := e.touched(g, L); p < L; p++ {
			bl[p] = e.cachedBlock(gi, hs[p])
			e.touch(bl[p])
		}
		req.blocks = append(req.blocks, bl)
	}
	for gi := range e.groups {
		for p := L; p < total; p++ {
			id := e.take()
			e.blocks[id].refs = 1
			req.blocks[gi][p] = id
		}
	}
	// cache_blocks: each group caches its new full blocks, group by group.
	for gi, g := range e.groups {
		if L == n {
			continue
		}
		for p := L; p < n; p++ {
			b := &e.blocks[req.blocks[gi][p]]
			b.group, b.hash, b.cached = gi, hs[p], true
			g.cache[hs[p]]++
		}
		st := indexer.Stored{Hashes: slices.Clone(hs[L:n]), Tokens: slices.Clone(tokens[L*e.bs : n*e.bs]),
			BlockSize: e.bs, Seed: indexer.BaseSeed}
		if L > 0 {
			st.Parent, st.HasParent = hs[L-1], true
		}
		e.ops = append(e.ops, indexer.Op{Kind: indexer.OpStore, Group: g.group(), Store: st})
	}
	// The next step's remove_skipped_blocks: blocks that left the window
	// are freed (still cached), the last of them first.
	for gi, g := range e.groups {
		for p := min(e.skipped(g, len(tokens)), total) - 1; p >= 0; p-- {
			if id := req.blocks[gi][p]; id >= 0 {
				e.release(id)
				req.blocks[gi][p] = -1
			}
		}
	}
	e.live = append(e.live, req)
	return true
}

// finish frees a request's blocks: every group's, reversed, so that the
// last group's tail is evicted first (vLLM's pop_blocks_for_free).
func (e *hyEngine) finish(i int) {
	req := e.live[i]
	e.live = slices.Delete(e.live, i, i+1)
	for gi := len(req.blocks) - 1; gi >= 0; gi-- {
		for p := len(req.blocks[gi]) - 1; p >= 0; p-- {
			e.release(req.blocks[gi][p])
		}
	}
}

// reset is vLLM's reset_prefix_cache on an idle engine.
func (e *hyEngine) reset() {
	for _, g := range e.groups {
		clear(g.cache)
	}
	e.free = e.free[:0]
	for i := range e.blocks {
		e.blocks[i] = hyBlock{}
		e.free = append(e.free, i)
	}
	e.ops = append(e.ops, indexer.Op{Kind: indexer.OpClear})
}

// prompt draws a prompt: a prefix of a document, sometimes with a fresh
// tail.
func (e *hyEngine) prompt() []uint32 {
	doc := e.docs[e.rng.IntN(len(e.docs))]
	p := slices.Clone(doc[:e.rng.IntN(len(doc)+1)])
	if e.rng.IntN(3) == 0 {
		for range e.rng.IntN(3 * e.bs) {
			p = append(p, 1000+uint32(e.rng.IntN(1000)))
		}
	}
	return p
}

// step runs one scheduler step and returns its batch of ops: a request
// finishes, or a new one is scheduled (finishing running ones until it
// fits), or, rarely and only when idle, the prefix cache is reset.
func (e *hyEngine) step() []indexer.Op {
	e.ops = e.ops[:0]
	switch {
	case len(e.live) > 0 && e.rng.IntN(2) == 0:
		e.finish(e.rng.IntN(len(e.live)))
	case len(e.live) == 0 && e.rng.IntN(60) == 0:
		e.reset()
	default:
		p := e.prompt()
		for !e.serve(p) && len(e.live) > 0 {
			e.finish(0)
		}
	}
	return e.ops
}

// checkIndex compares the tree's view of rank r with the engine: every
// group's holdings exactly, and for each probe the granted hit with the
// vLLM rule over the groups the index models (an upper bound of the rule
// over every group), and Upper with the main group's run.
func (e *hyEngine) checkIndex(tr *indexer.Tree, r indexer.Rank, probes [][]uint32) error {
	main := e.mainGroup()
	if err := e.checkHoldings(tr, r, false); err != nil {
		return err
	}
	for _, p := range probes {
		hs := e.hashes(p)
		q := indexer.HashBlocks(nil, p, e.bs, indexer.BaseSeed)
		var got indexer.Overlap
		for _, o := range tr.Match(q, nil) {
			if o.Rank == r {
				got = o
			}
		}
		want, all, run := e.hit(hs, len(hs), false), e.hit(hs, len(hs), true), main.run(hs)
		if int(got.Device) != want || got.Host != got.Device || got.Disk != got.Device || int(got.Upper) != run {
			return fmt.Errorf("probe of %d blocks: overlap %+v, want granted %d (%d over every group), main run %d", len(hs), got, want, all, run)
		}
		if all > want {
			return fmt.Errorf("probe of %d blocks: vLLM grants %d over every group, more than %d", len(hs), all, want)
		}
	}
	return nil
}

// checkHoldings compares the tree's holdings of rank r, every group's,
// with the engine's caches: equal, or with subset at most the engine's
// copies (a truncated rank).
func (e *hyEngine) checkHoldings(tr *indexer.Tree, r indexer.Rank, subset bool) error {
	held := map[int]map[uint64]uint32{} // group → hash → device copies
	add := func(g int, h uint64, c [indexer.NumTiers]uint32) error {
		if c[indexer.TierDevice] == 0 || c[indexer.TierHost]+c[indexer.TierDisk]+c[indexer.TierExternal] != 0 {
			return fmt.Errorf("group %d hash %#x: copies %v, the engine has device copies only", g, h, c)
		}
		if held[g] == nil {
			held[g] = map[uint64]uint32{}
		}
		held[g][h] = c[indexer.TierDevice]
		return nil
	}
	states := tr.Groups(r)
	mainIdx := -1
	for _, st := range states {
		if st.Main {
			mainIdx = st.Idx
		}
		if st.Idx < 0 || st.Idx >= len(e.groups) {
			return fmt.Errorf("the index learned a group %d the engine does not have", st.Idx)
		}
		if g := e.groups[st.Idx]; g.kind == hyChunked && st.Tracked {
			return fmt.Errorf("chunked local group %d is tracked: %+v", g.idx, st)
		}
	}
	snap := tr.Dump()
	for _, ev := range snap.Events {
		if ev.Rank != r {
			continue
		}
		for _, b := range ev.Blocks {
			if err := add(mainIdx, b.Hash, b.Counts); err != nil {
				return err
			}
		}
	}
	for _, g := range snap.Groups {
		if g.Rank != r {
			continue
		}
		for _, b := range g.Blocks {
			if err := add(g.Idx, b.Hash, b.Counts); err != nil {
				return err
			}
		}
	}
	main := e.mainGroup()
	if len(held[mainIdx]) > 0 && (main == nil || mainIdx != main.idx) {
		return fmt.Errorf("the index's main group is %d, the engine's lowest full-attention group %v", mainIdx, main)
	}
	for _, g := range e.groups {
		if g.kind == hyChunked {
			continue
		}
		for h, n := range held[g.idx] {
			if int(n) > g.cache[h] || (!subset && int(n) != g.cache[h]) {
				return fmt.Errorf("group %d hash %#x: the index holds %d copies, the engine %d", g.idx, h, n, g.cache[h])
			}
		}
		if !subset && len(held[g.idx]) != len(g.cache) {
			return fmt.Errorf("group %d: the index holds %d blocks, the engine %d (index groups %+v)", g.idx, len(held[g.idx]), len(g.cache), states)
		}
	}
	return nil
}
