package indexer

import (
	"math/bits"
	"math/rand/v2"
)

// lookup is one rank's table from engine hash to block (its ref): an
// open-addressing hash table in groups of 8 slots, as Go's own maps
// (SwissTable), specialised so that a slot costs 9 bytes instead of 16 + 1
// (and Go's 7/8-full-then-double sizing).
//
// A slot holds only the block's ref, not the key: the engine hash is
// already in the tree (the holder's ext slot of the block). get reads it
// through the ref to confirm a slot whose 7-bit fingerprint matches, and
// a rebuild re-reads every key from the nodes the entries name. insert
// (of an absent key), set and del name the entry by key and current ref
// and compare only control bytes and refs, so they work while the tree is
// being rearranged (split and merge rewrite refs through set). The rules:
//
//   - get needs the entries it confirms to resolve to their keys for rank
//     rid (Tree.refKey), and insert (which may rebuild) needs the tree to
//     hold exactly the table's entries for rid in the nodes they name
//     (plus the one inserted): the tree consistent for the rank, as it is
//     between the tree's own operations;
//   - set and del need only the entry's key and its current ref.
//
// ctrl holds one control byte per slot, a group's 8 in one word: ctrlEmpty,
// ctrlDeleted (a tombstone), or the fingerprint (7 bits of the hash). A
// key's home group is hash·groups>>64, so the table can have any number of
// groups; probes go on group by group and end at a group with an empty
// slot. The hash is a seeded mix of the key, the seed random per table and
// renewed by every rebuild, so crafted engine hashes cannot pile up. A
// table holds at most 7/8 of its slots in entries and tombstones; past
// that it is rebuilt with the same size if the entries fill less than
// 15/16 of that (the rest tombstones), else larger: twice as large up to
// 32 groups, then a quarter larger (lookupGrow). It shrinks only when
// reset.
//
// lookup is not safe for concurrent use; get may run concurrently with
// other gets.
type lookup struct {
	ctrl []uint64 // one word per group: its 8 slots' control bytes
	refs []ref    // 8 per group
	n    int      // entries
	left int      // empty slots that inserts may still fill before a rebuild
	seed uint64
}

const (
	ctrlEmpty   = 0x80
	ctrlDeleted = 0xfe
	lsbs        = 0x0101010101010101
	msbs        = 0x8080808080808080
)

// len returns the number of entries.
func (lk *lookup) len() int { return lk.n }

func (lk *lookup) hash(x uint64) uint64 {
	x ^= lk.seed
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// start returns x's home group and fingerprint.
func (lk *lookup) start(x uint64) (int, uint64) {
	h := lk.hash(x)
	g, _ := bits.Mul64(h, uint64(len(lk.ctrl)))
	return int(g), h & 0x7f
}

// matchFP returns a bit 7 set in each byte of c that may equal fp (a byte
// just above an equal one may match falsely: callers check the slot).
func matchFP(c, fp uint64) uint64 {
	v := c ^ (lsbs * fp)
	return (v - lsbs) &^ v & msbs
}

// matchEmpty returns bit 7 set in each empty byte of c.
func matchEmpty(c uint64) uint64 { return c &^ (c << 6) & msbs }

// get returns x's ref. Slots whose fingerprint matches are checked
// against the tree's engine hash for rank rid.
func (lk *lookup) get(t *Tree, rid uint32, x uint64) (ref, bool) {
	if lk.n == 0 {
		return ref{}, false
	}
	g, fp := lk.start(x)
	for {
		c := lk.ctrl[g]
		for m := matchFP(c, fp); m != 0; m &= m - 1 {
			i := g*8 + bits.TrailingZeros64(m)>>3
			if k, ok := t.refKey(rid, lk.refs[i]); ok && k == x {
				return lk.refs[i], true
			}
		}
		if matchEmpty(c) != 0 {
			return ref{}, false
		}
		if g++; g == len(lk.ctrl) {
			g = 0
		}
	}
}

// slot returns the index of the entry with key x and ref r, or -1.
func (lk *lookup) slot(x uint64, r ref) int {
	if lk.n == 0 {
		return -1
	}
	g, fp := lk.start(x)
	for {
		c := lk.ctrl[g]
		for m := matchFP(c, fp); m != 0; m &= m - 1 {
			if i := g*8 + bits.TrailingZeros64(m)>>3; lk.refs[i] == r {
				return i
			}
		}
		if matchEmpty(c) != 0 {
			return -1
		}
		if g++; g == len(lk.ctrl) {
			g = 0
		}
	}
}

// set changes the ref of the entry with key x and ref old to r, and
// reports whether it was there.
func (lk *lookup) set(x uint64, old, r ref) bool {
	i := lk.slot(x, old)
	if i < 0 {
		return false
	}
	lk.refs[i] = r
	return true
}

// del removes the entry with key x and ref r, and reports whether it was
// there. Its slot becomes empty if its group has an empty slot (no probe
// then passes the group), else a tombstone.
func (lk *lookup) del(x uint64, r ref) bool {
	i := lk.slot(x, r)
	if i < 0 {
		return false
	}
	g, shift := i/8, uint(i%8)*8
	b := uint64(ctrlDeleted)
	if matchEmpty(lk.ctrl[g]) != 0 {
		b = ctrlEmpty
		lk.left++
	}
	lk.ctrl[g] = lk.ctrl[g]&^(0xff<<shift) | b<<shift
	lk.refs[i] = ref{}
	lk.n--
	return true
}

// insert adds x → r; x must be absent, and the tree must already hold it
// at r (see lookup: a rebuild reads the rank's entries from the tree).
func (lk *lookup) insert(t *Tree, rid uint32, x uint64, r ref) {
	if lk.left == 0 {
		size := len(lk.ctrl)
		if lk.n >= size*8*7/8*15/16 { // too few tombstones to make room: grow
			size = lookupGrow(size)
		}
		lk.rebuild(t, rid, size, r)
	}
	if !lk.place(x, r) {
		lk.left--
	}
	lk.n++
}

// lookupGrow returns the group count after groups: double up to 32
// groups (256 slots, where rebuilding often costs more than the room),
// then a quarter more.
func lookupGrow(groups int) int {
	if groups < 32 {
		return max(2*groups, 1)
	}
	return groups + groups/4
}

// place puts x → r into the first free slot of its probe and reports
// whether that slot was a tombstone (else it was empty).
func (lk *lookup) place(x uint64, r ref) (tomb bool) {
	g, fp := lk.start(x)
	for {
		c := lk.ctrl[g]
		if m := c & msbs; m != 0 { // empty or deleted
			k := bits.TrailingZeros64(m) - 7 // the slot's byte starts at bit k
			tomb = (c>>k)&0xff == ctrlDeleted
			lk.ctrl[g] = c&^(0xff<<k) | fp<<k
			lk.refs[g*8+k>>3] = r
			return tomb
		}
		if g++; g == len(lk.ctrl) {
			g = 0
		}
	}
}

// rebuild makes the table groups groups of 8 slots with a new seed and
// puts the entries back. It reads them from the tree: every block rank
// rid holds in a node that an entry names, which is every entry; skip's
// block (in the tree already, not yet in the table) is left out for
// insert to place. Scanning those nodes' ext columns costs far less than
// resolving every ref on its own.
func (lk *lookup) rebuild(t *Tree, rid uint32, groups int, skip ref) {
	nodes := t.lookupNodes(lk)
	*lk = lookup{ctrl: make([]uint64, groups), refs: make([]ref, groups*8), seed: rand.Uint64(), left: groups * 8 * 7 / 8}
	for i := range lk.ctrl {
		lk.ctrl[i] = lsbs * ctrlEmpty
	}
	for _, id := range nodes {
		n := &t.nodes[id]
		h := t.holderIndex(id, rid)
		if h < 0 {
			continue
		}
		H := len(n.hold)
		for j := 0; j < int(n.hold[h].cut); j++ {
			if r := (ref{id, n.depth + uint32(j)}); r != skip && lk.left > 0 {
				lk.place(n.ext[j*H+h], r)
				lk.left--
				lk.n++
			}
		}
	}
}

// lookupNodes returns the distinct nodes that lk's entries name (in
// t.lookupBuf, valid until the next call).
func (t *Tree) lookupNodes(lk *lookup) []uint32 {
	t.markEpoch++
	if t.markEpoch == 0 { // wrapped: no stale mark may equal the epoch
		for i := range t.nodes {
			t.nodes[i].mark = 0
		}
		t.markEpoch = 1
	}
	buf := t.lookupBuf[:0]
	last := ^uint32(0)
	lk.each(func(r ref) {
		if id := r.node; id != last && int(id) < len(t.nodes) && t.nodes[id].mark != t.markEpoch {
			t.nodes[id].mark = t.markEpoch
			buf = append(buf, id)
			last = id
		}
	})
	t.lookupBuf = buf
	return buf
}

// reset empties the table and frees its slots.
func (lk *lookup) reset() { *lk = lookup{} }

// each calls fn with every entry's ref, in slot order. fn must not change
// the table.
func (lk *lookup) each(fn func(r ref)) {
	for g, c := range lk.ctrl {
		for m := ^c & msbs; m != 0; m &= m - 1 {
			fn(lk.refs[g*8+bits.TrailingZeros64(m)>>3])
		}
	}
}

// eachEntry calls fn with the engine hash and ref of every block rank rid
// holds in the tree (its lookup's entries, keys read from the tree). fn
// must not change the lookup.
func (t *Tree) eachEntry(rid uint32, fn func(x uint64, r ref)) {
	t.ranks[rid].lookup.each(func(r ref) {
		if x, ok := t.refKey(rid, r); ok {
			fn(x, r)
		}
	})
}

// refKey returns the engine hash rank rid's block r has in the tree, or
// false if r does not name a block rid holds.
func (t *Tree) refKey(rid uint32, r ref) (uint64, bool) {
	if int(r.node) >= len(t.nodes) {
		return 0, false
	}
	n := &t.nodes[r.node]
	pos := r.depth - n.depth
	h := t.holderIndex(r.node, rid)
	if h < 0 || pos >= n.hold[h].cut {
		return 0, false
	}
	return n.ext[int(pos)*len(n.hold)+h], true
}
