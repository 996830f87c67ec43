package indexer

import "slices"

// Node plumbing for Tree: allocation and links, holders, counts, runs,
// split, merge and tidy. Everything here keeps these invariants:
//   - every holder of a node holds a prefix [0, cut) of its edge, cut ≥ 1,
//     with a lookup entry per held block; slots past the cut are zero;
//   - a leaf is exactly as long as its longest holder;
//   - a node no rank holds has children;
//   - t.entries = Σ cuts, t.blocks = Σ edge lengths, t.nnodes = live nodes.

func (t *Tree) allocNode(parent uint32, hashes []uint64) uint32 {
	id := t.allocNodeUnlinked(hashes)
	p := &t.nodes[parent]
	n := &t.nodes[id]
	n.stamp = t.clock
	n.depth = p.depth + uint32(len(p.hashes))
	t.resetStamp(id)
	t.link(parent, id)
	t.blocks += len(hashes)
	return id
}

// allocNodeUnlinked returns a fresh node; its blocks are not counted (the
// caller moves them from another node).
func (t *Tree) allocNodeUnlinked(hashes []uint64) uint32 {
	id := allocSlot(&t.nodes, &t.free)
	t.nodes[id] = node{hashes: hashes, live: true}
	t.nnodes++
	if t.pub != nil {
		t.growChunks()
		t.touch(id)
	}
	return id
}

// allocSlot returns a free index of *s, reusing one from *free or growing
// *s by one zero element.
func allocSlot[T any](s *[]T, free *[]uint32) uint32 {
	if n := len(*free); n > 0 {
		id := (*free)[n-1]
		*free = (*free)[:n-1]
		return id
	}
	var zero T
	*s = append(*s, zero)
	return uint32(len(*s) - 1)
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
	t.setChild(parent, n.hashes[0], id)
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
	t.delChild(n.parent, n.hashes[0])
	n.next, n.prev = 0, 0
}

func (t *Tree) locOf(r ref) loc { return loc{r.node, r.depth - t.nodes[r.node].depth} }

// moveChildren makes from's children to's; to must have none.
func (t *Tree) moveChildren(from, to uint32) {
	f := &t.nodes[from]
	for c := f.first; c != 0; c = t.nodes[c].next {
		t.nodes[c].parent = to
	}
	tn := &t.nodes[to]
	tn.first, tn.nchild, tn.kids = f.first, f.nchild, f.kids
	f.first, f.nchild, f.kids = 0, 0, nil
	t.touch(from)
	t.touch(to)
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
	t.setChild(p, o.hashes[0], nw)
	o.prev, o.next = 0, 0
}

// rewriteRefs points every holder's lookup entries for id's blocks
// [from, to), which were node old's, at id.
func (t *Tree) rewriteRefs(id, old uint32, from, to int) {
	n := &t.nodes[id]
	H := len(n.hold)
	for h := range n.hold {
		lk := &t.ranks[n.hold[h].rid].lookup
		for j := from; j < min(to, int(n.hold[h].cut)); j++ {
			d := n.depth + uint32(j)
			lk.set(n.ext[j*H+h], ref{old, d}, ref{id, d})
		}
	}
}

// freeNode releases a node that has no holders and no children.
func (t *Tree) freeNode(id uint32) {
	t.unlink(id)
	t.blocks -= len(t.nodes[id].hashes)
	t.release(id)
}

// release returns unlinked node id's slot to the free list.
func (t *Tree) release(id uint32) {
	t.nodes[id] = node{}
	t.free = append(t.free, id)
	t.nnodes--
	t.touch(id)
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

// addHolder inserts rid as a holder of id with an empty prefix (cut 0; the
// caller places its first block at once) and returns its index.
func (t *Tree) addHolder(id, rid uint32, pext uint64, hasP bool) int {
	n := t.ownHold(id)
	L, H := len(n.hashes), len(n.hold)
	i := 0
	for i < H && n.hold[i].rid < rid {
		i++
	}
	n.hold = slices.Insert(n.hold, i, holder{rid: rid, pext: pext, hasP: hasP})
	ext := make([]uint64, L*(H+1))
	cnt := make([]uint32, L*(H+1))
	for j := 0; j < L; j++ {
		copy(ext[j*(H+1):], n.ext[j*H:j*H+i])
		copy(ext[j*(H+1)+i+1:], n.ext[j*H+i:(j+1)*H])
		copy(cnt[j*(H+1):], n.cnt[j*H:j*H+i])
		copy(cnt[j*(H+1)+i+1:], n.cnt[j*H+i:(j+1)*H])
	}
	if n.gb != nil {
		gb := make([]uint64, L*(H+1))
		for j := 0; j < L; j++ {
			copy(gb[j*(H+1):], n.gb[j*H:j*H+i])
			copy(gb[j*(H+1)+i+1:], n.gb[j*H+i:(j+1)*H])
		}
		n.gb = gb
	}
	n.ext, n.cnt = ext, cnt
	return i
}

// removeHolder drops holder h of id together with its lookup entries.
func (t *Tree) removeHolder(id uint32, h int) {
	n := t.ownHold(id)
	L, H := len(n.hashes), len(n.hold)
	hd := n.hold[h]
	rs := &t.ranks[hd.rid]
	for j := 0; j < int(hd.cut); j++ {
		x, c := n.ext[j*H+h], n.cnt[j*H+h]
		if n.gb != nil {
			t.adoptOrphans(hd.rid, n.gb[j*H+h])
		}
		for tier := Tier(0); tier < NumTiers; tier++ {
			switch (c >> (8 * tier)) & 0xff {
			case 0:
			case 0xff:
				delete(t.overflow, ovKey{hd.rid, tier, x})
				rs.tiers[tier]--
			default:
				rs.tiers[tier]--
			}
		}
		rs.lookup.del(x, ref{id, n.depth + uint32(j)})
	}
	t.entries -= int(hd.cut)
	n.hold = slices.Delete(n.hold, h, h+1)
	if H == 1 {
		n.ext, n.cnt, n.gb = nil, nil, nil
		return
	}
	ext := make([]uint64, L*(H-1))
	cnt := make([]uint32, L*(H-1))
	for j := 0; j < L; j++ {
		copy(ext[j*(H-1):], n.ext[j*H:j*H+h])
		copy(ext[j*(H-1)+h:], n.ext[j*H+h+1:(j+1)*H])
		copy(cnt[j*(H-1):], n.cnt[j*H:j*H+h])
		copy(cnt[j*(H-1)+h:], n.cnt[j*H+h+1:(j+1)*H])
	}
	if n.gb != nil {
		gb := make([]uint64, L*(H-1))
		for j := 0; j < L; j++ {
			copy(gb[j*(H-1):], n.gb[j*H:j*H+h])
			copy(gb[j*(H-1)+h:], n.gb[j*H+h+1:(j+1)*H])
		}
		n.gb = gb
	}
	n.ext, n.cnt = ext, cnt
}

func (t *Tree) tierCount(id uint32, h int, pos uint32, tier Tier) uint32 {
	n := &t.nodes[id]
	i := int(pos)*len(n.hold) + h
	c := (n.cnt[i] >> (8 * tier)) & 0xff
	if c == 0xff {
		c += t.overflow[ovKey{n.hold[h].rid, tier, n.ext[i]}]
	}
	return c
}

// incCount adds a copy of block pos of holder h in tier and reports
// whether the tier already held one.
func (t *Tree) incCount(id uint32, h int, pos uint32, tier Tier) (had bool) {
	n := &t.nodes[id]
	i := int(pos)*len(n.hold) + h
	switch (n.cnt[i] >> (8 * tier)) & 0xff {
	case 0xff:
		t.overflow[ovKey{n.hold[h].rid, tier, n.ext[i]}]++
		return true
	case 0:
		t.ranks[n.hold[h].rid].tiers[tier]++
		n.cnt[i] += 1 << (8 * tier)
		return false
	}
	n.cnt[i] += 1 << (8 * tier)
	return true
}

// decCount decrements and reports whether the block is now held in no tier.
func (t *Tree) decCount(id uint32, h int, pos uint32, tier Tier) (empty bool) {
	n := &t.nodes[id]
	i := int(pos)*len(n.hold) + h
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
	if (n.cnt[i]>>(8*tier))&0xff == 0 {
		t.ranks[n.hold[h].rid].tiers[tier]--
	}
	return n.cnt[i] == 0
}

// clearTier drops every copy of block pos of holder h in tier (which must
// hold one); the caller updates the runs or drops the block.
func (t *Tree) clearTier(id uint32, h int, pos uint32, tier Tier) {
	n := &t.nodes[id]
	i := int(pos)*len(n.hold) + h
	if (n.cnt[i]>>(8*tier))&0xff == 0xff {
		delete(t.overflow, ovKey{n.hold[h].rid, tier, n.ext[i]})
	}
	n.cnt[i] &^= 0xff << (8 * tier)
	t.ranks[n.hold[h].rid].tiers[tier]--
}

const (
	maskDevice = 0xff
	maskHost   = 0xffff
)

// updateRun adjusts holder h's device and host runs after the counts of
// block j (only) changed.
func (t *Tree) updateRun(id uint32, h int, j uint32) {
	n := &t.nodes[id]
	hd := n.hold[h]
	dev, host := n.runAfter(h, hd.dev, j, maskDevice), n.runAfter(h, hd.host, j, maskHost)
	if dev != hd.dev || host != hd.host {
		n = t.ownHold(id)
		n.hold[h].dev, n.hold[h].host = dev, host
	}
}

func (n *node) runAfter(h int, run, j, mask uint32) uint32 {
	H, cut := len(n.hold), n.hold[h].cut
	if j >= cut || n.cnt[int(j)*H+h]&mask == 0 {
		return min(run, j)
	}
	if j == run {
		for run < cut && n.cnt[int(run)*H+h]&mask != 0 {
			run++
		}
	}
	return run
}

// runFrom counts holder h's blocks held in a tier of mask from block 0.
func (n *node) runFrom(h int, mask uint32) uint32 {
	H := len(n.hold)
	r := uint32(0)
	for r < n.hold[h].cut && n.cnt[int(r)*H+h]&mask != 0 {
		r++
	}
	return r
}

// split cuts id's edge before position k (0 < k < L) into an upper node
// [0, k) and its only child, the lower node [k, L), which keeps id's
// children and the holders whose prefix reaches past k. One of the two keeps
// id; the other, a new node, is whichever costs fewer lookup rewrites (plus
// child moves).
func (t *Tree) split(id uint32, k int) (upper, lower uint32) {
	n := &t.nodes[id]
	L, H := len(n.hashes), len(n.hold)
	upCost, lowCost, lowH := 0, int(n.nchild), 0
	for _, hd := range n.hold {
		upCost += min(int(hd.cut), k)
		if int(hd.cut) > k {
			lowCost += int(hd.cut) - k
			lowH++
		}
	}
	keepUpper := lowCost <= upCost+1
	nid := t.allocNodeUnlinked(nil) // may grow t.nodes: take pointers after
	n = &t.nodes[id]
	up := node{hashes: slices.Clone(n.hashes[:k]), hold: make([]holder, H),
		ext: slices.Clone(n.ext[:k*H]), cnt: slices.Clone(n.cnt[:k*H]), depth: n.depth, stamp: t.stampOf(id)}
	low := node{hashes: slices.Clone(n.hashes[k:]), hold: make([]holder, 0, lowH),
		ext: make([]uint64, (L-k)*lowH), cnt: make([]uint32, (L-k)*lowH), depth: n.depth + uint32(k), stamp: t.stampOf(id)}
	if n.gb != nil {
		up.gb = slices.Clone(n.gb[:k*H])
		low.gb = make([]uint64, (L-k)*lowH)
	}
	for h, hd := range n.hold {
		up.hold[h] = holder{rid: hd.rid, cut: min(hd.cut, uint32(k)), dev: min(hd.dev, uint32(k)), host: min(hd.host, uint32(k)), pext: hd.pext, hasP: hd.hasP}
		if int(hd.cut) <= k {
			continue
		}
		c := len(low.hold)
		low.hold = append(low.hold, holder{rid: hd.rid, cut: hd.cut - uint32(k), pext: n.ext[(k-1)*H+h], hasP: true})
		for j := k; j < L; j++ {
			low.ext[(j-k)*lowH+c] = n.ext[j*H+h]
			low.cnt[(j-k)*lowH+c] = n.cnt[j*H+h]
			if n.gb != nil {
				low.gb[(j-k)*lowH+c] = n.gb[j*H+h]
			}
		}
	}
	for c := range low.hold {
		low.hold[c].dev = low.runFrom(c, maskDevice)
		low.hold[c].host = low.runFrom(c, maskHost)
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
	t.rewriteRefs(nid, id, 0, len(t.nodes[nid].hashes))
	return upper, lower
}

// setEdge gives id the edge, holders, depth and stamp of e, keeping id's
// links.
func (t *Tree) setEdge(id uint32, e *node) {
	n := &t.nodes[id]
	setHashes(n, e.hashes)
	n.hold, n.holdEp, n.ext, n.cnt, n.gb = e.hold, t.epoch, e.ext, e.cnt, e.gb
	n.depth, n.stamp, n.live = e.depth, e.stamp, true
	t.touch(id)
}

// mergeable reports whether id's only child c can join id's edge: id is
// not the root, every holder of id holds all of it, c has the same
// holders, and c continues each holder's chain from id's last block.
func (t *Tree) mergeable(id, c uint32) bool {
	na, nb := &t.nodes[id], &t.nodes[c]
	if id == 0 || len(na.hold) != len(nb.hold) {
		return false
	}
	L, H := len(na.hashes), len(na.hold)
	for h := range na.hold {
		if na.hold[h].cut != uint32(L) || na.hold[h].rid != nb.hold[h].rid ||
			!nb.hold[h].hasP || nb.hold[h].pext != na.ext[(L-1)*H+h] {
			return false
		}
	}
	return true
}

// tryMerge merges id with its only child, and its parent with id, when
// mergeable; it returns the node that now holds id's blocks and whether
// anything merged.
func (t *Tree) tryMerge(id uint32) (uint32, bool) {
	if id == 0 || !t.nodes[id].live {
		return id, false
	}
	merged := false
	if t.nodes[id].nchild == 1 && t.mergeable(id, t.nodes[id].first) {
		id, merged = t.merge(id, t.nodes[id].first), true
	}
	if p := t.nodes[id].parent; p != 0 && t.nodes[p].nchild == 1 && t.mergeable(p, id) {
		id, merged = t.merge(p, id), true
	}
	return id, merged
}

// merge joins id and its only child c into one edge and returns the node
// that holds it: id or c, whichever keeps more lookup entries in place.
func (t *Tree) merge(id, c uint32) uint32 {
	n, m := &t.nodes[id], &t.nodes[c]
	L1, L2 := len(n.hashes), len(m.hashes)
	H := len(n.hold)
	cCost := int(m.nchild)
	for _, hd := range m.hold {
		cCost += int(hd.cut)
	}
	keepN := cCost <= H*L1+1
	e := node{hashes: make([]uint64, 0, L1+L2), hold: slices.Clone(n.hold),
		ext: make([]uint64, 0, (L1+L2)*H), cnt: make([]uint32, 0, (L1+L2)*H),
		depth: n.depth, stamp: newer(t.stampOf(id), t.stampOf(c))}
	e.hashes = append(append(e.hashes, n.hashes...), m.hashes...)
	e.ext = append(append(e.ext, n.ext...), m.ext...) // block-major, same holder order
	e.cnt = append(append(e.cnt, n.cnt...), m.cnt...)
	if n.gb != nil || m.gb != nil {
		e.gb = make([]uint64, 0, (L1+L2)*H)
		e.gb = appendBits(appendBits(e.gb, n.gb, L1*H), m.gb, L2*H)
	}
	for h := range e.hold {
		mh := m.hold[h]
		hd := &e.hold[h]
		hd.cut += mh.cut
		if hd.dev == uint32(L1) {
			hd.dev += mh.dev
		}
		if hd.host == uint32(L1) {
			hd.host += mh.host
		}
	}
	t.unlink(c)
	keep, gone := id, c
	if keepN {
		t.moveChildren(c, id)
		t.setEdge(id, &e)
		t.rewriteRefs(id, c, L1, L1+L2)
	} else {
		keep, gone = c, id
		t.setEdge(c, &e)
		t.replaceChild(id, c)
		t.rewriteRefs(c, id, 0, L1)
	}
	t.release(gone)
	return keep
}

// tidy restores the invariants around id after its holders, prefixes or
// children changed: a leaf is trimmed to its longest holder, a leaf nobody
// holds is freed (and its parent tidied in turn), and edges merge where
// they can.
func (t *Tree) tidy(id uint32) {
	for id != 0 && t.nodes[id].live {
		n := &t.nodes[id]
		if n.nchild == 0 {
			longest := uint32(0)
			for _, hd := range n.hold {
				longest = max(longest, hd.cut)
			}
			if longest == 0 {
				p := n.parent
				t.freeNode(id)
				id = p
				continue
			}
			if L := uint32(len(n.hashes)); longest < L {
				H := uint32(len(n.hold))
				n.hashes = n.hashes[:longest]
				t.touch(id)
				n.ext = n.ext[:longest*H]
				n.cnt = n.cnt[:longest*H]
				if n.gb != nil {
					n.gb = n.gb[:longest*H]
				}
				t.blocks -= int(L - longest)
			}
		}
		var merged bool
		if id, merged = t.tryMerge(id); !merged {
			return
		}
	}
}

// appendBits appends gb, or n zeros for a nil gb.
func appendBits(dst, gb []uint64, n int) []uint64 {
	if gb != nil {
		return append(dst, gb...)
	}
	return append(dst, make([]uint64, n)...)
}

// appendGrow appends v, growing a full slice by a quarter rather than
// doubling it: edges extended one decoded block at a time would otherwise
// keep up to half their capacity unused.
func appendGrow[T any](s []T, v T) []T { return append(roomFor(s, 1), v) }

// roomFor returns s if it has room for k more elements, else a copy of s
// with a capacity a quarter larger (and 4), or k more if that is more.
func roomFor[T any](s []T, k int) []T {
	if len(s)+k <= cap(s) {
		return s
	}
	ns := make([]T, len(s), max(len(s)+len(s)/4+4, len(s)+k))
	copy(ns, s)
	return ns
}
