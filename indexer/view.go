package indexer

import (
	"runtime"
	"slices"
	"sync/atomic"
)

// Matches that take no lock.
//
// A tree in an Index publishes, for every node, an immutable view of what
// a match reads there: the edge's local hashes, each holder's runs (rid,
// cut, device and host run) and the children (a persistent trie, kids.go).
// The writer changes the tree in place under its shard's write lock, as
// before, and records which nodes it changed (touch); when it releases the
// lock (publishViews) it makes a new view of each and stores it, between
// two increments of the tree's sequence count. A match reads the count
// (even), walks the views, and reads the count again: the same count means
// it read the views of one publish, exactly the tree at the end of one
// hold of the write lock, which is what a match under the read lock sees.
// A count that moved means a publish ran meanwhile, and the match walks
// again (rarely more than once: a walk takes a microsecond or two, a hold
// is tens of blocks). So a match never waits for a writer's hold, only,
// rarely, for the few stores of a publish, and a writer descheduled while
// it holds the lock holds up no match: its changes are unpublished, and
// the views of the last publish are whole.
//
// What the writer never changes in place, so that no match reads memory
// being written (the race detector checks this):
//   - views: a new one per changed node and publish;
//   - holder arrays made before the current epoch (node.holdEp): a view
//     shares its node's, and the writer copies it before its first change
//     in an epoch (ownHold);
//   - the edge's hashes below the longest length ever published from its
//     array (node.pubHi): an append there, after the edge was trimmed,
//     copies the array first (appendHash);
//   - trie nodes made before the current epoch (kidNode.own);
//   - the published state (ranks, chunks, flags): replaced whole.
//
// A tree with a rank of a hybrid model publishes that, and its matches
// take the read lock: the grant reads the ranks' engine hashes and group
// bits, which are not in the views.

// view is what a match reads of one node: its edge, its holders (sorted
// by rid; a match reads their rid, cut and runs) and its children.
type view struct {
	hashes []uint64
	hold   []holder
	kids   *kidNode
}

const (
	viewChunkBits = 9
	viewChunkLen  = 1 << viewChunkBits
	// viewTries bounds the walks a match makes while publishes keep
	// moving the count, and viewSpins the times it yields while a publish
	// is under way, before it matches under the read lock instead.
	viewTries = 8
	viewSpins = 1 << 12
)

// viewChunk holds the published views of viewChunkLen consecutive node
// ids, and the LRU stamps matches give them (see Tree.stampOf).
type viewChunk struct {
	v     [viewChunkLen]atomic.Pointer[view]
	stamp [viewChunkLen]atomic.Uint32
}

// pubState is the published state besides the views. It is replaced
// whole when any of it changes.
type pubState struct {
	chunks   []*viewChunk // by node id >> viewChunkBits
	ranks    []Rank       // by rank id: the ranks the published holders name
	hybrid   bool         // the tree has a hybrid rank: match under the read lock
	trackLRU bool         // matches stamp the nodes they visit
}

func (st *pubState) view(id uint32) *view {
	if c := int(id >> viewChunkBits); c < len(st.chunks) {
		return st.chunks[c].v[id&(viewChunkLen-1)].Load()
	}
	return nil
}

// publisher is a tree's published side.
type publisher struct {
	seq   atomic.Uint64 // odd while a publish is under way
	state atomic.Pointer[pubState]
	// The writer's (under the write lock): chunks, ahead of the published
	// ones when nodes were added since; the nodes touched since the last
	// publish; whether the ranks changed.
	chunks []*viewChunk
	dirty  []uint32
	ranks  bool
	// publishes counts publishes, retries the walks that a publish made
	// a match repeat, fallbacks the matches made under the read lock
	// (tests and benchmarks read them).
	publishes, retries, fallbacks atomic.Uint64
}

// enableViews makes t publish views (Index does this for its trees): from
// now on the writer records what it changes and publishViews publishes
// it. It publishes the whole tree at once.
func (t *Tree) enableViews() {
	p := &publisher{ranks: true}
	p.state.Store(&pubState{})
	t.pub = p
	t.growChunks()
	for id := range t.nodes {
		if t.nodes[id].live {
			t.touch(uint32(id))
		}
	}
	t.publishViews()
}

// growChunks adds view chunks until every node id has one.
func (t *Tree) growChunks() {
	// They are appended past the published state's length, which matches
	// never read: the published slice keeps its length (and, if append
	// moves the chunks, its array).
	p := t.pub
	for len(p.chunks)*viewChunkLen < len(t.nodes) {
		p.chunks = append(p.chunks, new(viewChunk))
	}
}

// touch records that node id's view changed (its edge, holders' runs or
// children, or that it was made or freed).
func (t *Tree) touch(id uint32) {
	if t.pub == nil {
		return
	}
	if n := &t.nodes[id]; n.dirty != t.epoch {
		n.dirty = t.epoch
		t.pub.dirty = append(t.pub.dirty, id)
	}
}

// publishViews publishes the views of the nodes touched since the last
// publish, and the state if it changed; the caller holds the write lock.
// Then the epoch moves on: every trie node made so far is published.
func (t *Tree) publishViews() {
	p := t.pub
	if p == nil {
		return
	}
	st := p.state.Load()
	hybrid := t.hybrid > 0
	meta := p.ranks || hybrid != st.hybrid || t.trackLRU != st.trackLRU || len(p.chunks) != len(st.chunks)
	if len(p.dirty) == 0 && !meta {
		return
	}
	p.seq.Add(1)
	if meta {
		ns := &pubState{chunks: p.chunks, ranks: st.ranks, hybrid: hybrid, trackLRU: t.trackLRU}
		if p.ranks {
			ns.ranks = make([]Rank, len(t.ranks))
			for i := range t.ranks {
				ns.ranks[i] = t.ranks[i].rank
			}
			p.ranks = false
		}
		p.state.Store(ns)
	}
	for _, id := range p.dirty {
		var v *view
		if n := &t.nodes[id]; n.live {
			v = &view{hashes: n.hashes[:len(n.hashes):len(n.hashes)], hold: n.hold[:len(n.hold):len(n.hold)], kids: n.kids}
			n.pubHi = max(n.pubHi, uint32(len(n.hashes)))
		}
		p.chunks[id>>viewChunkBits].v[id&(viewChunkLen-1)].Store(v)
	}
	p.seq.Add(1)
	p.dirty = p.dirty[:0]
	if t.epoch++; t.epoch == 0 {
		t.rewind()
	}
	p.publishes.Add(1)
}

// rewind starts the epochs over at 1 when they wrap (after 2³² publishes):
// no node is touched, no holder array or trie node is the writer's to
// change in place any more (0 is never an epoch).
func (t *Tree) rewind() {
	for id := range t.nodes {
		n := &t.nodes[id]
		n.dirty, n.holdEp = 0, 0
		n.kids.seal()
	}
	t.epoch = 1
}

// ownHold returns node id, whose holders the caller is about to change
// in place, with a holder array of this epoch, which no published view
// shares (copying it if need be), and touches it.
func (t *Tree) ownHold(id uint32) *node {
	n := &t.nodes[id]
	if t.pub == nil {
		return n
	}
	if n.holdEp != t.epoch {
		n.hold, n.holdEp = slices.Clone(n.hold), t.epoch
	}
	t.touch(id)
	return n
}

// appendHash appends local hash lh to node n's edge. The array's slots
// below n.pubHi may be in published views (an edge trimmed and extended
// again): then the edge moves to a new array first.
func appendHash(n *node, lh uint64) {
	if len(n.hashes) < int(n.pubHi) {
		hs := make([]uint64, len(n.hashes), len(n.hashes)+len(n.hashes)/4+4)
		copy(hs, n.hashes)
		n.hashes, n.pubHi = hs, 0
	}
	n.hashes = appendGrow(n.hashes, lh)
}

// setHashes gives node n a new edge array.
func setHashes(n *node, hs []uint64) { n.hashes, n.pubHi = hs, 0 }

// touchRanks records that the rank ids changed (a rank added or freed).
func (t *Tree) touchRanks() {
	if t.pub != nil {
		t.pub.ranks = true
	}
}

// stampOf returns node id's LRU stamp: its own, or a later match's
// (matches that take no lock stamp the view chunk).
func (t *Tree) stampOf(id uint32) uint32 {
	s := atomic.LoadUint32(&t.nodes[id].stamp)
	if t.pub != nil {
		s = newer(s, t.pub.chunks[id>>viewChunkBits].stamp[id&(viewChunkLen-1)].Load())
	}
	return s
}

// resetStamp gives a node made under id the stamp of its making, so that
// a match stamp of an earlier node of that id does not carry over.
func (t *Tree) resetStamp(id uint32) {
	if t.pub != nil {
		t.pub.chunks[id>>viewChunkBits].stamp[id&(viewChunkLen-1)].Store(t.nodes[id].stamp)
	}
}

// matchViews is Match on the published views, with no lock. ok is false
// when the caller must match under the read lock instead: the tree has a
// hybrid rank, or publishes kept moving the count (or a publish stayed
// under way) for longer than a match waits.
func (t *Tree) matchViews(q []uint64, dst []Overlap) (_ []Overlap, ok bool) {
	p := t.pub
	n := len(dst)
	for try, spins := 0, 0; try < viewTries; {
		s := p.seq.Load()
		if s&1 != 0 {
			if spins++; spins == viewSpins {
				break
			}
			runtime.Gosched() // on one P, the publisher may be the one descheduled
			continue
		}
		st := p.state.Load()
		if st.hybrid {
			return dst, false
		}
		dst, ok = t.walkViews(st, q, dst)
		if ok && p.seq.Load() == s {
			return dst, true
		}
		dst = dst[:n]
		try++
		p.retries.Add(1)
	}
	p.fallbacks.Add(1)
	return dst, false
}

// walkViews is Match's walk over the views of st. Views of different
// publishes may be mixed (a publish ran meanwhile, which the caller then
// sees in the count): ok is false if what it read cannot be one tree.
// Its loop is Match's, written out again on purpose: shared through
// helpers, even inlined ones, Match ran 40 % slower
// (BenchmarkMatchOnly8192 1.35 → 1.94 µs), and a shared emit 4 %. The
// property tests check that both give the same overlaps in the same
// order.
func (t *Tree) walkViews(st *pubState, q []uint64, dst []Overlap) (_ []Overlap, ok bool) {
	if len(q) == 0 {
		return dst, true
	}
	v := st.view(0)
	if v == nil {
		return dst, false
	}
	id, found := v.kids.get(q[0], t.kidHash(q[0]))
	if !found {
		return dst, true
	}
	var buf [128]active // on the stack; more ranks on the first edge spill to the heap
	act := buf[:0]
	var clock uint32
	if st.trackLRU {
		clock = t.now()
	}
	depth := 0
	for first := true; ; first = false {
		if v = st.view(id); v == nil || len(v.hashes) == 0 || v.hashes[0] != q[depth] {
			return dst, false
		}
		if st.trackLRU {
			if s := &st.chunks[id>>viewChunkBits].stamp[id&(viewChunkLen-1)]; s.Load() != clock {
				s.Store(clock)
			}
		}
		L := len(v.hashes)
		rest := q[depth:]
		k := 1
		for lim := min(L, len(rest)); k < lim && v.hashes[k] == rest[k]; k++ {
		}
		full := k == L
		if first {
			for _, hd := range v.hold {
				act = append(act, active{rid: hd.rid, devOn: true, hostOn: true})
			}
		}
		w, hi := 0, 0
		for _, a := range act {
			for hi < len(v.hold) && v.hold[hi].rid < a.rid {
				hi++
			}
			if hi == len(v.hold) || v.hold[hi].rid != a.rid {
				if dst, ok = emitView(st, dst, a); !ok {
					return dst, false
				}
				continue
			}
			hd := &v.hold[hi]
			if a.devOn {
				d := min(hd.dev, uint32(k))
				a.dev += d
				a.devOn = full && d == uint32(L)
			}
			if a.hostOn {
				d := min(hd.host, uint32(k))
				a.host += d
				a.hostOn = full && d == uint32(L)
			}
			c := min(hd.cut, uint32(k))
			a.any += c
			if !full || c < uint32(L) {
				if dst, ok = emitView(st, dst, a); !ok {
					return dst, false
				}
				continue
			}
			act[w] = a
			w++
		}
		act = act[:w]
		depth += k
		if !full || len(act) == 0 || depth == len(q) {
			break
		}
		if id, found = v.kids.get(q[depth], t.kidHash(q[depth])); !found {
			break
		}
	}
	for _, a := range act {
		if dst, ok = emitView(st, dst, a); !ok {
			return dst, false
		}
	}
	return dst, true
}

// emitView appends a's overlap, naming its rank from st (false: st does
// not know the rank id, so the views were not of one publish).
func emitView(st *pubState, dst []Overlap, a active) ([]Overlap, bool) {
	if a.any == 0 {
		return dst, true
	}
	if int(a.rid) >= len(st.ranks) {
		return dst, false
	}
	n := len(dst)
	if n < cap(dst) {
		dst = dst[:n+1]
	} else {
		dst = append(dst, Overlap{})
	}
	o := &dst[n]
	o.Rank, o.Device, o.Host, o.Disk, o.Upper = st.ranks[a.rid], a.dev, a.host, a.any, a.any
	return dst, true
}
