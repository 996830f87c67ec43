package indexer

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// Reason names why (part of) an event was not applied, or why entries left
// the index other than by an engine event. Tree counts each.
type Reason uint8

const (
	ReasonParentNotFound Reason = iota // store whose parent the rank does not hold (incl. evicted parents)
	ReasonBlockNotFound                // remove of a block (in that tier) the rank does not hold
	ReasonSelfReference                // store repeating a hash or its parent
	ReasonBlockSize                    // store whose block size differs from the partition's
	ReasonShortTokens                  // store whose token ids do not cover its blocks
	ReasonOffloadUnknown               // offload of a block the rank does not hold
	ReasonHashConflict                 // engine hash already names another block of the rank
	ReasonEvicted                      // entries evicted by the memory cap
	NumReasons
)

var reasonNames = [NumReasons]string{
	"parent_not_found", "block_not_found", "self_reference", "block_size",
	"short_tokens", "offload_unknown", "hash_conflict", "evicted",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

var reasonErrs = [NumReasons]error{
	ErrParentNotFound, ErrBlockNotFound, ErrSelfReference, ErrBlockSize,
	ErrShortTokens, ErrOffloadUnknown, ErrHashConflict, nil,
}

// OpError reports blocks of one event that were not applied. Blocks before
// the failure (and, for removes, other blocks of the event) were applied.
type OpError struct {
	Rank   Rank
	Reason Reason
	Hash   uint64 // the first engine hash concerned
	Blocks int    // how many blocks of the event were skipped
}

func (e *OpError) Error() string {
	return fmt.Sprintf("rank %v: %v (hash %#x, %d blocks skipped)", e.Rank, reasonErrs[e.Reason], e.Hash, e.Blocks)
}

func (e *OpError) Unwrap() error { return reasonErrs[e.Reason] }

// Overlap is how far one rank already caches a query, in blocks. The tiers
// are cumulative: Device counts leading blocks held on the device, Host those
// held on the device or in host memory, Disk those held in any tier, so
// Device ≤ Host ≤ Disk.
type Overlap struct {
	Rank   Rank
	Device uint32
	Host   uint32
	Disk   uint32
}

// loc is where a block sits: node and position on its edge.
type loc struct{ node, pos uint32 }

// ref is what a rank's lookup stores for a block: its node and its depth
// (blocks from the root). Depths do not change when edges split or merge,
// so only the part of an edge that moves to another node id needs its refs
// rewritten, and split and merge move the cheaper part.
type ref struct{ node, depth uint32 }

type childKey struct {
	parent uint32
	hash   uint64
}

// holder is one rank's hold on a whole node edge. Its per-block engine
// hashes and tier counts live in node.ext and node.cnt.
type holder struct {
	rid  uint32
	dev  uint32 // leading blocks of the edge held on the device
	host uint32 // leading blocks held on the device or in host memory
	// pext is the rank's engine hash of the block before this edge, as the
	// engine named it when storing; kept so dumps can name the parent even
	// when the rank no longer holds that block.
	pext uint64
	hasP bool
}

// node is one edge of the compressed tree: a run of blocks (local hashes)
// held by exactly the same ranks. Every holder holds every block of the
// edge (in some tier); a store or remove that would break this splits the
// node first.
type node struct {
	parent uint32
	nchild uint32
	first  uint32 // first child (0 = none), doubly linked through next/prev
	next   uint32
	prev   uint32
	stamp  uint32   // LRU clock of the last store or match (atomic when matched)
	depth  uint32   // blocks from the root to this edge's first block
	hashes []uint64 // local hashes along the edge; empty only at the root
	hold   []holder // sorted by rid
	ext    []uint64 // holder-major: ext[h*L+j] is holder h's engine hash of block j
	cnt    []uint32 // holder-major tier counts, 8 bits per tier (see overflow)
	live   bool
}

type rankState struct {
	rank   Rank
	lookup map[uint64]ref // engine hash → block
	seq    uint64
	hasSeq bool
}

type ovKey struct {
	rid  uint32
	tier Tier
	ext  uint64
}

// Tree is the prefix index of one partition (one model and routing group,
// one block size): a path-compressed radix tree over local block hashes.
//
// Tree is not safe for concurrent use, except that Match may run
// concurrently with other Match calls; Index adds the locking.
type Tree struct {
	blockSize int
	nodes     []node // nodes[0] is the root
	free      []uint32
	children  map[childKey]uint32
	rankIDs   map[Rank]uint32
	ranks     []rankState
	freeRanks []uint32
	overflow  map[ovKey]uint32 // tier counts beyond 255

	entries int // Σ holders × edge length: indexed (block, rank) pairs
	blocks  int // Σ edge lengths
	nnodes  int

	clock    uint32 // LRU clock; read atomically by Match
	trackLRU bool
	counts   [NumReasons]uint64
	localBuf []uint64
	touched  []uint32
	sortBuf  []uint64
}

// NewTree returns an empty tree for blocks of blockSize tokens.
func NewTree(blockSize int) *Tree {
	t := &Tree{
		blockSize: blockSize,
		nodes:     make([]node, 1, 64),
		children:  make(map[childKey]uint32),
		rankIDs:   make(map[Rank]uint32),
		overflow:  make(map[ovKey]uint32),
	}
	t.nodes[0].live = true
	return t
}

// BlockSize is the number of tokens per block of this partition.
func (t *Tree) BlockSize() int { return t.blockSize }

// Counts returns how many blocks were skipped or evicted, by reason.
func (t *Tree) Counts() [NumReasons]uint64 { return t.counts }

// TreeStats describes the size of a tree.
type TreeStats struct {
	Entries int // indexed (block, rank) pairs
	Blocks  int // distinct block positions (prefix paths)
	Nodes   int // compressed edges
	Ranks   int
	Bytes   int64 // estimated heap bytes
}

// Stats reports the tree's size.
func (t *Tree) Stats() TreeStats {
	// Estimate: node structs, edge hashes, per-entry engine hash and count,
	// holder headers, and Go map slots (≈1.6× raw at average load).
	nodeBytes := int64(len(t.nodes)) * 120
	holders := int64(0)
	for i := range t.nodes {
		holders += int64(len(t.nodes[i].hold))
	}
	b := nodeBytes + int64(t.blocks)*8 + int64(t.entries)*(8+4) + holders*24
	b += int64(t.entries) * 26 // rank lookups: 16-byte slots
	b += int64(t.nnodes) * 40  // children map: 24-byte slots
	return TreeStats{Entries: t.entries, Blocks: t.blocks, Nodes: t.nnodes, Ranks: len(t.rankIDs), Bytes: b}
}

// RankBlocks returns how many blocks r holds (in any tier).
func (t *Tree) RankBlocks(r Rank) int {
	if rid, ok := t.rankIDs[r]; ok {
		return len(t.ranks[rid].lookup)
	}
	return 0
}

// Ranks returns the ranks that hold blocks or have a watermark, unordered.
func (t *Tree) Ranks() []Rank {
	out := make([]Rank, 0, len(t.rankIDs))
	for r := range t.rankIDs {
		out = append(out, r)
	}
	return out
}

// Holds reports the tier counts of engine hash h for rank r.
func (t *Tree) Holds(r Rank, h uint64) (counts [NumTiers]uint32, ok bool) {
	rid, ok := t.rankIDs[r]
	if !ok {
		return counts, false
	}
	r0, ok := t.ranks[rid].lookup[h]
	if !ok {
		return counts, false
	}
	l := t.locOf(r0)
	hi := t.holderIndex(l.node, rid)
	for tier := Tier(0); tier < NumTiers; tier++ {
		counts[tier] = t.tierCount(l.node, hi, l.pos, tier)
	}
	return counts, true
}

// Watermark returns the last batch sequence number applied for r.
func (t *Tree) Watermark(r Rank) (seq uint64, ok bool) {
	if rid, found := t.rankIDs[r]; found {
		return t.ranks[rid].seq, t.ranks[rid].hasSeq
	}
	return 0, false
}

// SetWatermark records seq as the last batch applied for r.
func (t *Tree) SetWatermark(r Rank, seq uint64) {
	rid := t.rankID(r)
	t.ranks[rid].seq, t.ranks[rid].hasSeq = seq, true
}

func (t *Tree) rankID(r Rank) uint32 {
	if rid, ok := t.rankIDs[r]; ok {
		return rid
	}
	var rid uint32
	if n := len(t.freeRanks); n > 0 {
		rid = t.freeRanks[n-1]
		t.freeRanks = t.freeRanks[:n-1]
	} else {
		rid = uint32(len(t.ranks))
		t.ranks = append(t.ranks, rankState{})
	}
	t.ranks[rid] = rankState{rank: r, lookup: make(map[uint64]ref)}
	t.rankIDs[r] = rid
	return rid
}

// ---- node plumbing ----

func (t *Tree) allocNode(parent uint32, hashes []uint64) uint32 {
	var id uint32
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		id = uint32(len(t.nodes))
		t.nodes = append(t.nodes, node{})
	}
	t.nodes[id] = node{hashes: hashes, live: true, stamp: t.clock,
		depth: t.nodes[parent].depth + uint32(len(t.nodes[parent].hashes))}
	t.link(parent, id)
	t.nnodes++
	t.blocks += len(hashes)
	return id
}

// link makes id a child of parent (id's hashes must be set).
func (t *Tree) link(parent, id uint32) {
	n := &t.nodes[id]
	p := &t.nodes[parent]
	n.parent = parent
	n.prev = 0
	n.next = p.first
	if p.first != 0 {
		t.nodes[p.first].prev = id
	}
	p.first = id
	p.nchild++
	t.children[childKey{parent, n.hashes[0]}] = id
}

func (t *Tree) unlink(id uint32) {
	n := &t.nodes[id]
	p := &t.nodes[n.parent]
	if n.prev != 0 {
		t.nodes[n.prev].next = n.next
	} else {
		p.first = n.next
	}
	if n.next != 0 {
		t.nodes[n.next].prev = n.prev
	}
	p.nchild--
	delete(t.children, childKey{n.parent, n.hashes[0]})
	n.next, n.prev = 0, 0
}

func (t *Tree) locOf(r ref) loc { return loc{r.node, r.depth - t.nodes[r.node].depth} }

// moveChildren makes from's children to's; to must have none.
func (t *Tree) moveChildren(from, to uint32) {
	f := &t.nodes[from]
	for c := f.first; c != 0; c = t.nodes[c].next {
		ch := &t.nodes[c]
		delete(t.children, childKey{from, ch.hashes[0]})
		t.children[childKey{to, ch.hashes[0]}] = c
		ch.parent = to
	}
	tn := &t.nodes[to]
	tn.first, tn.nchild = f.first, f.nchild
	f.first, f.nchild = 0, 0
}

// replaceChild puts nw in old's place under old's parent; both edges must
// start with the same local hash.
func (t *Tree) replaceChild(old, nw uint32) {
	o, n := &t.nodes[old], &t.nodes[nw]
	p := o.parent
	n.parent, n.prev, n.next = p, o.prev, o.next
	if o.prev != 0 {
		t.nodes[o.prev].next = nw
	} else {
		t.nodes[p].first = nw
	}
	if o.next != 0 {
		t.nodes[o.next].prev = nw
	}
	t.children[childKey{p, o.hashes[0]}] = nw
	o.prev, o.next = 0, 0
}

// rewriteRefs points every holder's lookup entry for id's blocks [from, to)
// at id.
func (t *Tree) rewriteRefs(id uint32, from, to int) {
	n := &t.nodes[id]
	L := len(n.hashes)
	for h := range n.hold {
		lk := t.ranks[n.hold[h].rid].lookup
		for j := from; j < to; j++ {
			lk[n.ext[h*L+j]] = ref{id, n.depth + uint32(j)}
		}
	}
}

// freeNode releases a node that has no holders and no children.
func (t *Tree) freeNode(id uint32) {
	t.unlink(id)
	t.blocks -= len(t.nodes[id].hashes)
	t.nodes[id] = node{}
	t.free = append(t.free, id)
	t.nnodes--
}

func (t *Tree) holderIndex(id, rid uint32) int {
	h := t.nodes[id].hold
	lo, hi := 0, len(h)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if h[m].rid < rid {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(h) && h[lo].rid == rid {
		return lo
	}
	return -1
}

// addHolder inserts rid as a holder of id with zeroed blocks and returns its index.
func (t *Tree) addHolder(id, rid uint32, pext uint64, hasP bool) int {
	n := &t.nodes[id]
	L := len(n.hashes)
	i := 0
	for i < len(n.hold) && n.hold[i].rid < rid {
		i++
	}
	n.hold = slices.Insert(n.hold, i, holder{rid: rid, pext: pext, hasP: hasP})
	n.ext = slices.Insert(n.ext, i*L, make([]uint64, L)...)
	n.cnt = slices.Insert(n.cnt, i*L, make([]uint32, L)...)
	t.entries += L
	return i
}

// removeHolder drops holder h of id together with its lookup entries.
func (t *Tree) removeHolder(id uint32, h int) {
	n := &t.nodes[id]
	L := len(n.hashes)
	rid := n.hold[h].rid
	lk := t.ranks[rid].lookup
	for j := 0; j < L; j++ {
		x := n.ext[h*L+j]
		if c := n.cnt[h*L+j]; c != 0 {
			t.dropOverflow(rid, x, c)
		}
		delete(lk, x)
	}
	n.hold = slices.Delete(n.hold, h, h+1)
	n.ext = slices.Delete(n.ext, h*L, (h+1)*L)
	n.cnt = slices.Delete(n.cnt, h*L, (h+1)*L)
	t.entries -= L
}

func (t *Tree) dropOverflow(rid uint32, x uint64, c uint32) {
	for tier := Tier(0); tier < NumTiers; tier++ {
		if (c>>(8*tier))&0xff == 0xff {
			delete(t.overflow, ovKey{rid, tier, x})
		}
	}
}

func (t *Tree) tierCount(id uint32, h int, pos uint32, tier Tier) uint32 {
	n := &t.nodes[id]
	c := (n.cnt[h*len(n.hashes)+int(pos)] >> (8 * tier)) & 0xff
	if c == 0xff {
		c += t.overflow[ovKey{n.hold[h].rid, tier, n.ext[h*len(n.hashes)+int(pos)]}]
	}
	return c
}

func (t *Tree) incCount(id uint32, h int, pos uint32, tier Tier) {
	n := &t.nodes[id]
	i := h*len(n.hashes) + int(pos)
	if (n.cnt[i]>>(8*tier))&0xff == 0xff {
		t.overflow[ovKey{n.hold[h].rid, tier, n.ext[i]}]++
		return
	}
	n.cnt[i] += 1 << (8 * tier)
}

// decCount decrements and reports whether the block is now held in no tier.
func (t *Tree) decCount(id uint32, h int, pos uint32, tier Tier) (empty bool) {
	n := &t.nodes[id]
	i := h*len(n.hashes) + int(pos)
	if (n.cnt[i]>>(8*tier))&0xff == 0xff {
		k := ovKey{n.hold[h].rid, tier, n.ext[i]}
		if v := t.overflow[k]; v > 0 {
			if v == 1 {
				delete(t.overflow, k)
			} else {
				t.overflow[k] = v - 1
			}
			return false
		}
	}
	n.cnt[i] -= 1 << (8 * tier)
	return n.cnt[i] == 0
}

const (
	maskDevice = 0xff
	maskHost   = 0xffff
)

// updateRun adjusts holder h's device and host runs after the counts of
// block j (only) changed.
func (t *Tree) updateRun(id uint32, h int, j uint32) {
	n := &t.nodes[id]
	L := len(n.hashes)
	c := n.cnt[h*L : (h+1)*L]
	hd := &n.hold[h]
	hd.dev = runAfter(c, hd.dev, j, maskDevice)
	hd.host = runAfter(c, hd.host, j, maskHost)
}

func runAfter(c []uint32, run, j, mask uint32) uint32 {
	if c[j]&mask == 0 {
		return min(run, j)
	}
	if j == run {
		for int(run) < len(c) && c[run]&mask != 0 {
			run++
		}
	}
	return run
}

// runFrom counts the leading blocks of c held in a tier of mask.
func runFrom(c []uint32, mask uint32) uint32 {
	r := 0
	for r < len(c) && c[r]&mask != 0 {
		r++
	}
	return uint32(r)
}

// fixRuns recomputes the device and host runs of holder h of id.
func (t *Tree) fixRuns(id uint32, h int) {
	n := &t.nodes[id]
	L := len(n.hashes)
	c := n.cnt[h*L : (h+1)*L]
	d := 0
	for d < L && c[d]&maskDevice != 0 {
		d++
	}
	hs := d
	for hs < L && c[hs]&maskHost != 0 {
		hs++
	}
	n.hold[h].dev, n.hold[h].host = uint32(d), uint32(hs)
}

// split cuts id's edge before position k (0 < k < L) into an upper node
// [0, k) and its only child, the lower node [k, L), which keeps id's
// children. One of them keeps id; the other, a new node, is whichever part
// costs fewer lookup rewrites (plus child moves).
func (t *Tree) split(id uint32, k int) (upper, lower uint32) {
	L := len(t.nodes[id].hashes)
	H := len(t.nodes[id].hold)
	keepUpper := H*(L-k)+int(t.nodes[id].nchild) <= H*k+1
	nid := t.allocNodeUnlinked(nil) // may grow t.nodes: take pointers after
	n := &t.nodes[id]
	up := node{hashes: slices.Clone(n.hashes[:k]), hold: make([]holder, H),
		ext: make([]uint64, H*k), cnt: make([]uint32, H*k), depth: n.depth, stamp: n.stamp}
	low := node{hashes: slices.Clone(n.hashes[k:]), hold: make([]holder, H),
		ext: make([]uint64, H*(L-k)), cnt: make([]uint32, H*(L-k)), depth: n.depth + uint32(k), stamp: n.stamp}
	for h, hd := range n.hold {
		copy(up.ext[h*k:], n.ext[h*L:h*L+k])
		copy(up.cnt[h*k:], n.cnt[h*L:h*L+k])
		copy(low.ext[h*(L-k):], n.ext[h*L+k:(h+1)*L])
		copy(low.cnt[h*(L-k):], n.cnt[h*L+k:(h+1)*L])
		up.hold[h] = holder{rid: hd.rid, pext: hd.pext, hasP: hd.hasP, dev: min(hd.dev, uint32(k)), host: min(hd.host, uint32(k))}
		lh := holder{rid: hd.rid, pext: n.ext[h*L+k-1], hasP: true}
		c := low.cnt[h*(L-k) : (h+1)*(L-k)]
		if hd.dev >= uint32(k) {
			lh.dev = hd.dev - uint32(k)
		} else {
			lh.dev = runFrom(c, maskDevice)
		}
		if hd.host >= uint32(k) {
			lh.host = hd.host - uint32(k)
		} else {
			lh.host = runFrom(c, maskHost)
		}
		low.hold[h] = lh
	}
	if keepUpper {
		t.moveChildren(id, nid)
		t.setEdge(id, &up)
		t.setEdge(nid, &low)
		t.link(id, nid)
		upper, lower = id, nid
	} else {
		t.setEdge(nid, &up)
		t.replaceChild(id, nid)
		t.setEdge(id, &low)
		t.link(nid, id)
		upper, lower = nid, id
	}
	t.rewriteRefs(nid, 0, len(t.nodes[nid].hashes))
	return upper, lower
}

// setEdge gives id the edge, holders, depth and stamp of e, keeping id's
// links.
func (t *Tree) setEdge(id uint32, e *node) {
	n := &t.nodes[id]
	n.hashes, n.hold, n.ext, n.cnt = e.hashes, e.hold, e.ext, e.cnt
	n.depth, n.stamp, n.live = e.depth, e.stamp, true
}

func (t *Tree) allocNodeUnlinked(hashes []uint64) uint32 {
	var id uint32
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		id = uint32(len(t.nodes))
		t.nodes = append(t.nodes, node{})
	}
	t.nodes[id] = node{hashes: hashes, live: true}
	t.nnodes++
	// Blocks are moved, not added: the caller's node shrinks by as many.
	return id
}

// sameHolders reports whether a and b have the same holders and b's edge
// continues each holder's chain from a's last block.
func (t *Tree) sameHolders(a, b uint32) bool {
	na, nb := &t.nodes[a], &t.nodes[b]
	if len(na.hold) != len(nb.hold) {
		return false
	}
	L := len(na.hashes)
	for h := range na.hold {
		if na.hold[h].rid != nb.hold[h].rid || !nb.hold[h].hasP || nb.hold[h].pext != na.ext[h*L+L-1] {
			return false
		}
	}
	return true
}

// tryMerge merges id with its only child, and its parent with id, when
// they have the same holders, and returns the node that now holds id's
// blocks.
func (t *Tree) tryMerge(id uint32) uint32 {
	if id == 0 || !t.nodes[id].live {
		return id
	}
	if t.nodes[id].nchild == 1 && t.sameHolders(id, t.nodes[id].first) {
		id = t.merge(id, t.nodes[id].first)
	}
	if p := t.nodes[id].parent; p != 0 && t.nodes[p].nchild == 1 && t.sameHolders(p, id) {
		id = t.merge(p, id)
	}
	return id
}

// merge joins id and its only child c into one edge and returns the node
// that holds it: id or c, whichever keeps more lookup entries in place.
func (t *Tree) merge(id, c uint32) uint32 {
	n, m := &t.nodes[id], &t.nodes[c]
	L1, L2 := len(n.hashes), len(m.hashes)
	L := L1 + L2
	H := len(n.hold)
	keepN := H*L2+int(m.nchild) <= H*L1+1
	e := node{hashes: make([]uint64, 0, L), hold: make([]holder, H), ext: make([]uint64, H*L), cnt: make([]uint32, H*L),
		depth: n.depth, stamp: max(n.stamp, m.stamp)}
	e.hashes = append(append(e.hashes, n.hashes...), m.hashes...)
	for h, hd := range n.hold {
		copy(e.ext[h*L:], n.ext[h*L1:(h+1)*L1])
		copy(e.ext[h*L+L1:], m.ext[h*L2:(h+1)*L2])
		copy(e.cnt[h*L:], n.cnt[h*L1:(h+1)*L1])
		copy(e.cnt[h*L+L1:], m.cnt[h*L2:(h+1)*L2])
		e.hold[h] = hd
		if hd.dev == uint32(L1) {
			e.hold[h].dev += m.hold[h].dev
		}
		if hd.host == uint32(L1) {
			e.hold[h].host += m.hold[h].host
		}
	}
	t.unlink(c)
	keep, gone := id, c
	if keepN {
		t.moveChildren(c, id)
		t.setEdge(id, &e)
		t.rewriteRefs(id, L1, L)
	} else {
		keep, gone = c, id
		t.setEdge(c, &e)
		t.replaceChild(id, c)
		t.rewriteRefs(c, 0, L1)
	}
	t.nodes[gone] = node{}
	t.free = append(t.free, gone)
	t.nnodes--
	return keep
}

// prune frees id and its ancestors while they hold nothing and have no
// children, then merges what remains where possible. A merge of two
// holderless nodes can leave a holderless leaf, which is pruned in turn.
func (t *Tree) prune(id uint32) {
	for {
		for id != 0 && t.nodes[id].live && len(t.nodes[id].hold) == 0 && t.nodes[id].nchild == 0 {
			p := t.nodes[id].parent
			t.freeNode(id)
			id = p
		}
		id = t.tryMerge(id)
		if id == 0 || !t.nodes[id].live || len(t.nodes[id].hold) != 0 || t.nodes[id].nchild != 0 {
			return
		}
	}
}

// ---- events ----

// Apply applies one op for rank r. The returned error (an *OpError, or nil)
// describes blocks that were skipped; the rest of the op was applied.
func (t *Tree) Apply(r Rank, op Op) error {
	switch op.Kind {
	case OpStore:
		return t.Store(r, op.Store)
	case OpRemove:
		return t.Remove(r, op.Remove)
	case OpClear:
		t.Clear(r)
		return nil
	}
	return fmt.Errorf("rank %v: unknown op kind %d", r, op.Kind)
}

func (t *Tree) fail(r Rank, reason Reason, h uint64, blocks int) error {
	t.counts[reason] += uint64(blocks)
	return &OpError{Rank: r, Reason: reason, Hash: h, Blocks: blocks}
}

// Store applies a BlockStored event for r.
func (t *Tree) Store(r Rank, s Stored) error {
	if len(s.Hashes) == 0 {
		return nil
	}
	t.clock++
	if len(s.Tokens) == 0 && s.Tier != TierDevice {
		return t.offload(r, s)
	}
	if s.BlockSize != t.blockSize {
		return t.fail(r, ReasonBlockSize, s.Hashes[0], len(s.Hashes))
	}
	if t.selfReferencing(s) {
		return t.fail(r, ReasonSelfReference, s.Hashes[0], len(s.Hashes))
	}
	rid := t.rankID(r)
	lk := t.ranks[rid].lookup
	cur := loc{0, ^uint32(0)} // after the last placed block; root: before its (empty) edge
	prevExt, hasPrev := s.Parent, s.HasParent
	if s.HasParent {
		pr, ok := lk[s.Parent]
		if !ok {
			return t.fail(r, ReasonParentNotFound, s.Parent, len(s.Hashes))
		}
		cur = t.locOf(pr)
	}
	usable := min(len(s.Hashes), len(s.Tokens)/t.blockSize)
	t.localBuf = HashBlocks(t.localBuf[:0], s.Tokens[:usable*t.blockSize], t.blockSize, s.Seed)
	local := t.localBuf
	t.touched = t.touched[:0]
	var err error
	for i := 0; i < usable; i++ {
		x := s.Hashes[i]
		if xr, ok := lk[x]; ok {
			// Known hash: it must be exactly the next block.
			l := t.locOf(xr)
			if !t.isNext(cur, l, local[i]) {
				err = t.fail(r, ReasonHashConflict, x, len(s.Hashes)-i)
				break
			}
			h := t.holderIndex(l.node, rid)
			t.incCount(l.node, h, l.pos, s.Tier)
			t.afterCount(l, h)
			cur, prevExt, hasPrev = l, x, true
			continue
		}
		tgt, created := t.descend(cur, local[i], rid)
		if created {
			// A new node or an extension of the rank's own leaf: the rank
			// is its holder already (holder added, entry zeroed).
			h := t.holderIndex(tgt.node, rid)
			if h < 0 {
				h = t.addHolder(tgt.node, rid, prevExt, hasPrev)
			}
			n := &t.nodes[tgt.node]
			n.ext[h*len(n.hashes)+int(tgt.pos)] = x
			lk[x] = ref{tgt.node, n.depth + tgt.pos}
			t.incCount(tgt.node, h, tgt.pos, s.Tier)
			t.afterCount(tgt, h)
			cur, prevExt, hasPrev = tgt, x, true
			continue
		}
		if t.holderIndex(tgt.node, rid) >= 0 {
			// The rank holds this block under another engine hash.
			err = t.fail(r, ReasonHashConflict, x, len(s.Hashes)-i)
			break
		}
		// Take hold of the run of following blocks that this event stores
		// along the same edge, splitting the edge to the run's bounds.
		n := &t.nodes[tgt.node]
		L := len(n.hashes)
		run := 1
		for i+run < usable && int(tgt.pos)+run < L && n.hashes[int(tgt.pos)+run] == local[i+run] {
			if _, known := lk[s.Hashes[i+run]]; known {
				break
			}
			run++
		}
		id := tgt.node
		if tgt.pos > 0 {
			_, id = t.split(id, int(tgt.pos))
		}
		if run < len(t.nodes[id].hashes) {
			id, _ = t.split(id, run)
		}
		h := t.addHolder(id, rid, prevExt, hasPrev)
		n = &t.nodes[id]
		for j := 0; j < run; j++ {
			n.ext[h*run+j] = s.Hashes[i+j]
			n.cnt[h*run+j] = 1 << (8 * s.Tier)
			lk[s.Hashes[i+j]] = ref{id, n.depth + uint32(j)}
		}
		t.fixRuns(id, h)
		n.stamp = t.clock
		t.touched = append(t.touched, id)
		cur, prevExt, hasPrev = loc{id, uint32(run - 1)}, s.Hashes[i+run-1], true
		i += run - 1
	}
	for _, id := range t.touched {
		t.tryMerge(id)
	}
	if err == nil && usable < len(s.Hashes) {
		err = t.fail(r, ReasonShortTokens, s.Hashes[usable], len(s.Hashes)-usable)
	}
	return err
}

// afterCount updates holder h's runs after a count changed at l.
func (t *Tree) afterCount(l loc, h int) {
	t.updateRun(l.node, h, l.pos)
	t.nodes[l.node].stamp = t.clock
}

// isNext reports whether block l (with local hash lh) directly follows cur.
func (t *Tree) isNext(cur, l loc, lh uint64) bool {
	n := &t.nodes[l.node]
	if n.hashes[l.pos] != lh {
		return false
	}
	if l.pos > 0 {
		return l.node == cur.node && l.pos == cur.pos+1
	}
	return n.parent == cur.node && cur.pos+1 == uint32(len(t.nodes[cur.node].hashes))
}

// descend finds or makes the block with local hash lh right after cur.
// created reports that rid already holds the returned position as a new,
// zeroed entry (a fresh node, or an extension of rid's own leaf).
func (t *Tree) descend(cur loc, lh uint64, rid uint32) (l loc, created bool) {
	L := uint32(len(t.nodes[cur.node].hashes))
	next := cur.pos + 1
	if next < L {
		if t.nodes[cur.node].hashes[next] == lh {
			return loc{cur.node, next}, false
		}
		cur.node, _ = t.split(cur.node, int(next))
	}
	if c, ok := t.children[childKey{cur.node, lh}]; ok {
		return loc{c, 0}, false
	}
	n := &t.nodes[cur.node]
	if cur.node != 0 && n.nchild == 0 && len(n.hold) == 1 && n.hold[0].rid == rid {
		n.hashes = appendGrow(n.hashes, lh)
		n.ext = appendGrow(n.ext, 0)
		n.cnt = appendGrow(n.cnt, 0)
		t.entries++
		t.blocks++
		return loc{cur.node, L}, true
	}
	id := t.allocNode(cur.node, []uint64{lh})
	t.touched = append(t.touched, id)
	return loc{id, 0}, true
}

func (t *Tree) selfReferencing(s Stored) bool {
	hs := s.Hashes
	if len(hs) <= 16 {
		for i, h := range hs {
			if s.HasParent && h == s.Parent {
				return true
			}
			for _, g := range hs[:i] {
				if g == h {
					return true
				}
			}
		}
		return false
	}
	t.sortBuf = append(t.sortBuf[:0], hs...)
	slices.Sort(t.sortBuf)
	for i := 1; i < len(t.sortBuf); i++ {
		if t.sortBuf[i] == t.sortBuf[i-1] {
			return true
		}
	}
	if s.HasParent {
		_, found := slices.BinarySearch(t.sortBuf, s.Parent)
		return found
	}
	return false
}

// offload adds s.Tier to blocks r already holds (an offload event carries
// no tokens); unknown blocks are skipped and counted.
func (t *Tree) offload(r Rank, s Stored) error {
	rid, ok := t.rankIDs[r]
	if !ok {
		return t.fail(r, ReasonOffloadUnknown, s.Hashes[0], len(s.Hashes))
	}
	lk := t.ranks[rid].lookup
	missing, first := 0, uint64(0)
	for _, x := range s.Hashes {
		xr, ok := lk[x]
		if !ok {
			if missing == 0 {
				first = x
			}
			missing++
			continue
		}
		l := t.locOf(xr)
		h := t.holderIndex(l.node, rid)
		t.incCount(l.node, h, l.pos, s.Tier)
		t.afterCount(l, h)
	}
	if missing > 0 {
		return t.fail(r, ReasonOffloadUnknown, first, missing)
	}
	return nil
}

// Remove applies a BlockRemoved event for r: one copy of each hash leaves
// the tier. Hashes r does not hold there are skipped and counted.
func (t *Tree) Remove(r Rank, rm Removed) error {
	rid, ok := t.rankIDs[r]
	if !ok {
		if len(rm.Hashes) == 0 {
			return nil
		}
		return t.fail(r, ReasonBlockNotFound, rm.Hashes[0], len(rm.Hashes))
	}
	lk := t.ranks[rid].lookup
	missing, first := 0, uint64(0)
	for _, x := range rm.Hashes {
		xr, ok := lk[x]
		h := -1
		var l loc
		if ok {
			l = t.locOf(xr)
			h = t.holderIndex(l.node, rid)
		}
		if h < 0 || t.tierCount(l.node, h, l.pos, rm.Tier) == 0 {
			if missing == 0 {
				first = x
			}
			missing++
			continue
		}
		if !t.decCount(l.node, h, l.pos, rm.Tier) {
			t.updateRun(l.node, h, l.pos)
			continue
		}
		t.dropBlock(rid, l, h)
	}
	if missing > 0 {
		return t.fail(r, ReasonBlockNotFound, first, missing)
	}
	return nil
}

// dropBlock takes block l (now held in no tier) away from holder h = rid.
func (t *Tree) dropBlock(rid uint32, l loc, h int) {
	id := l.node
	n := &t.nodes[id]
	L := uint32(len(n.hashes))
	x := n.ext[int(h)*int(L)+int(l.pos)]
	if len(n.hold) == 1 && n.nchild == 0 && l.pos == L-1 && L > 1 {
		// The common eviction: the tail of the rank's own leaf.
		delete(t.ranks[rid].lookup, x)
		n.hashes = n.hashes[:L-1]
		n.ext = n.ext[:L-1]
		n.cnt = n.cnt[:L-1]
		t.entries--
		t.blocks--
		n.hold[0].dev = min(n.hold[0].dev, L-1)
		n.hold[0].host = min(n.hold[0].host, L-1)
		return
	}
	if l.pos+1 < L {
		id, _ = t.split(id, int(l.pos)+1)
	}
	if l.pos > 0 {
		_, id = t.split(id, int(l.pos))
	}
	t.removeHolder(id, t.holderIndex(id, rid))
	if len(t.nodes[id].hold) == 0 && t.nodes[id].nchild == 0 {
		t.prune(id)
		return
	}
	t.tryMerge(id)
}

// Clear drops every block r holds (AllBlocksCleared); its watermark stays.
func (t *Tree) Clear(r Rank) {
	rid, ok := t.rankIDs[r]
	if !ok {
		return
	}
	t.clearRank(rid)
}

func (t *Tree) clearRank(rid uint32) {
	lk := t.ranks[rid].lookup
	t.touched = t.touched[:0]
	for _, l := range lk {
		if !t.nodes[l.node].live {
			continue
		}
		if h := t.holderIndex(l.node, rid); h >= 0 {
			t.removeHolder(l.node, h)
			t.touched = append(t.touched, l.node)
		}
	}
	clear(lk)
	for _, id := range t.touched {
		if t.nodes[id].live {
			t.prune(id)
		}
	}
}

// RemoveRank drops r's blocks and forgets r (and its watermark).
func (t *Tree) RemoveRank(r Rank) {
	rid, ok := t.rankIDs[r]
	if !ok {
		return
	}
	t.clearRank(rid)
	delete(t.rankIDs, r)
	t.ranks[rid] = rankState{}
	t.freeRanks = append(t.freeRanks, rid)
}

// RemoveWorker removes every rank of worker id.
func (t *Tree) RemoveWorker(id uint64) {
	for r := range t.rankIDs {
		if r.WorkerID == id {
			t.RemoveRank(r)
		}
	}
}

// ---- matching ----

type active struct {
	rid            uint32
	dev, host, any uint32
	devOn, hostOn  bool
}

// Match appends to dst the overlap of every rank that holds at least the
// first block of the query q (local block hashes), in blocks. A rank's run
// ends at the first block it does not hold. Match does not modify the tree
// except for LRU stamps (atomically), so concurrent Match calls are safe.
func (t *Tree) Match(q []uint64, dst []Overlap) []Overlap {
	if len(q) == 0 {
		return dst
	}
	id, ok := t.children[childKey{0, q[0]}]
	if !ok {
		return dst
	}
	var buf [128]active // on the stack; more ranks on the first edge spill to the heap
	act := buf[:0]
	var clock uint32
	if t.trackLRU {
		clock = atomic.LoadUint32(&t.clock)
	}
	depth := 0
	for first := true; ; first = false {
		n := &t.nodes[id]
		if t.trackLRU && atomic.LoadUint32(&n.stamp) != clock {
			atomic.StoreUint32(&n.stamp, clock)
		}
		L := len(n.hashes)
		rest := q[depth:]
		k := 1
		for lim := min(L, len(rest)); k < lim && n.hashes[k] == rest[k]; k++ {
		}
		full := k == L
		if first {
			for _, hd := range n.hold {
				act = append(act, active{rid: hd.rid, devOn: true, hostOn: true})
			}
		}
		w, hi := 0, 0
		for _, a := range act {
			for hi < len(n.hold) && n.hold[hi].rid < a.rid {
				hi++
			}
			if hi == len(n.hold) || n.hold[hi].rid != a.rid {
				dst = t.emit(dst, a)
				continue
			}
			hd := &n.hold[hi]
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
			a.any += uint32(k)
			if !full {
				dst = t.emit(dst, a)
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
		id, ok = t.children[childKey{id, q[depth]}]
		if !ok {
			break
		}
	}
	for _, a := range act {
		dst = t.emit(dst, a)
	}
	return dst
}

func (t *Tree) emit(dst []Overlap, a active) []Overlap {
	if a.any == 0 {
		return dst
	}
	return append(dst, Overlap{Rank: t.ranks[a.rid].rank, Device: a.dev, Host: a.host, Disk: a.any})
}

// appendGrow appends v, growing a full slice by a quarter rather than
// doubling it: edges extended one decoded block at a time would otherwise
// keep up to half their capacity unused.
func appendGrow[T any](s []T, v T) []T {
	if len(s) == cap(s) {
		ns := make([]T, len(s), len(s)+len(s)/4+4)
		copy(ns, s)
		s = ns
	}
	return append(s, v)
}
