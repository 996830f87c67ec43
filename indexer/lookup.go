package indexer

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"unsafe"
)

// lookup is one rank's table from engine hash to block (its ref): open
// addressing in groups of 7 slots, each group one 64-byte cache line (a
// control word and 7 refs), with 7-bit fingerprints matched a word at a
// time, as Go's own maps (SwissTable); and overflow counts in place of
// tombstones, as Facebook's F14.
//
// A slot holds only the block's ref, not the key: the engine hash is
// already in the tree (the holder's ext slot of the block). get reads it
// through the ref to confirm a slot whose fingerprint matches, and a
// rebuild re-reads the keys of the entries it moves from the tree.
// insert (of an absent key), set and del name the entry by key and
// current ref and compare only control bytes and refs, so they work while
// the tree is being rearranged (split and merge rewrite refs through set).
// The rules:
//
//   - get needs the entries it confirms to resolve to their keys for rank
//     rid (Tree.refKey), and insert (which may rebuild) needs the tree to
//     hold exactly the table's entries for rid in the nodes they name
//     (plus the one inserted): the tree consistent for the rank, as it is
//     between the tree's own operations;
//   - set and del need only the entry's key and its current ref.
//
// Layout. The entries live in sub-tables (table) of at most
// lookupMaxGroups groups each, so that the rebuild an insert may run
// (inside the shard's write lock) costs at most one sub-table's entries,
// however many the rank holds: extendible hashing, as Go's maps since Go
// 1.24. A small lookup is one sub-table, held in the lookup itself, with
// no directory; it may grow to lookupOneRatio times that size (its
// rebuild is cheaper per entry, see collect), and then splits at once
// into as many sub-tables (a power of two) as leave each about half full.
// A sub-table of the largest size that fills splits in two by one more
// bit of the hash. dir, a directory of 1<<depth entries indexed by the
// hash's top depth bits, names the sub-table of every hash prefix: a
// sub-table of local depth d is named by the 1<<(depth-d) consecutive
// entries that share its d-bit prefix. Each entry holds a copy of its
// sub-table's slice of groups (slots), so that a probe reads the
// directory and then the group, not a table header in between. Splits
// never merge back; the lookup shrinks only when reset.
//
// The hash is a seeded mix of the key (a bijection, so distinct keys have
// distinct hashes), the seed random per lookup, so crafted engine hashes
// cannot pile up in one sub-table or one group: the directory reads the
// hash's top bits, a sub-table of local depth d the bits after those d for
// the home group (hash<<d · groups >> 64, so a sub-table can have any
// number of groups) and the low 7 bits for the fingerprint. While the
// lookup is one sub-table, every rebuild renews the seed; once it has a
// directory the seed stays until reset (the directory is laid out by it).
//
// Groups. A group's control word holds its 7 slots' control bytes
// (ctrlEmpty or the fingerprint) and, in its top byte, its overflow
// count: how many entries whose probe passed the group, full, went on to
// a later group (saturating at 255, where it stays). An insert takes the
// first free slot from the home group on and counts itself in the groups
// it passes; a probe goes on past a group only while that group's count
// is not 0, so a miss usually reads its home group alone; a delete empties
// its slot and uncounts itself from the groups it had passed. So deletes
// leave no tombstones, and a sub-table is rebuilt only when its entries
// fill 6 of its 7 slots per group: it then grows (twice as large up to 32
// groups, then a quarter larger, lookupGrow; the only sub-table doubles up
// to lookupMaxGroups, see makeRoom), or at its most groups
// splits, each part sized for its entries at 70 % of the slots. A
// sub-table that fills while the lookup is below its peak (its share of
// the rank's entries fluctuating) grows by a sixteenth only (makeRoom).
//
// lookup is not safe for concurrent use; get may run concurrently with
// other gets.
type lookup struct {
	one   table      // the only sub-table while dir is nil
	dir   []dirEntry // nil, or 1<<depth entries by the hash's top depth bits
	depth uint8      // the directory's depth (≥ 1 when dir is not nil)
	// limit, if not 0, replaces lookupMaxGroups for this lookup: tests
	// set it low to drive many splits with few entries.
	limit int32
	n     int // entries, over all sub-tables
	peak  int // the most entries the lookup has held since it was reset
	seed  uint64
}

// group is 7 slots: control bytes and overflow count, and refs. 64 bytes.
type group struct {
	ctrl uint64
	refs [groupSlots]ref
}

// slots is what a probe of a sub-table reads: its groups.
type slots struct {
	g     []group
	depth uint8 // local depth: the sub-table holds the hashes of one depth-bit prefix
}

// table is one sub-table of a lookup.
type table struct {
	slots
	n int // entries
}

// dirEntry names the sub-table of one hash prefix: tb, and a copy of tb's
// slots (the same slice), which every change of tb's slice copies again
// (lookup.name).
type dirEntry struct {
	slots
	tb *table
}

const (
	groupSlots = 7
	ctrlEmpty  = 0x80
	lsbs       = 0x0001010101010101 // the 7 slots' bytes
	msbs       = 0x0080808080808080
	ovShift    = 56 // the overflow count's byte
	ovOne      = 1 << ovShift
	ovDown     = 1<<64 - ovOne // adding it takes ovOne away
	ovMax      = 0xff

	// lookupMaxGroups bounds a sub-table of a directory: at most 7 × 64
	// slots and 384 entries, which a rebuild re-reads from the tree ref by
	// ref (collect). The rebuild runs inside one insert, under the shard's
	// write lock: bounded, it bounds how long the shard's other writers
	// (and, before matches took no lock, queries) wait for one insert. 64
	// groups (4 KiB) are one of the allocator's size classes.
	lookupMaxGroups = 64
	// lookupOneRatio: the only sub-table of a lookup without a directory
	// may have lookupOneRatio × lookupMaxGroups groups. Its rebuild scans
	// the nodes its entries name (collect), 3–4 times cheaper per entry
	// than resolving refs one by one, so about as long; and the ranks of
	// up to ~1,500 entries pay for no directory at all.
	lookupOneRatio = 4
)

// emptyGroup is a group's control word with every slot empty and no
// overflow.
const emptyGroup = lsbs * ctrlEmpty

// capacity returns the most entries a sub-table of groups groups holds:
// 6 of every 7 slots.
func capacity(groups int) int { return groups * (groupSlots - 1) }

// len returns the number of entries.
func (lk *lookup) len() int { return lk.n }

func (lk *lookup) hash(x uint64) uint64 { return mix(x, lk.seed) }

// mix returns x mixed with seed: SplitMix64's finalizer on x^seed, a
// bijection of x whose every output bit depends on every input bit.
func mix(x, seed uint64) uint64 {
	x ^= seed
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// find returns the slots of hash h's sub-table and the sub-table.
func (lk *lookup) find(h uint64) (*slots, *table) {
	if lk.dir == nil {
		return &lk.one.slots, &lk.one
	}
	e := &lk.dir[h>>(64-lk.depth)]
	return &e.slots, e.tb
}

// maxGroups returns the most groups a sub-table of the directory has
// before it splits (the only sub-table, lookupOneRatio times as many).
func (lk *lookup) maxGroups() int {
	if lk.limit > 0 {
		return int(lk.limit)
	}
	return lookupMaxGroups
}

// start returns hash h's home group and fingerprint in s.
func (s *slots) start(h uint64) (int, uint64) {
	g, _ := bits.Mul64(h<<s.depth, uint64(len(s.g)))
	return int(g), h & 0x7f
}

// matchFP returns bit 7 set in each slot byte of c that may equal fp (a
// byte just above an equal one may match falsely: callers check the slot).
func matchFP(c, fp uint64) uint64 {
	v := c ^ (lsbs * fp)
	return (v - lsbs) &^ v & msbs
}

// matchEmpty returns bit 7 set in each empty slot byte of c.
func matchEmpty(c uint64) uint64 { return c & msbs }

// overflowed reports whether some entry's probe went on past the group of
// control word c.
func overflowed(c uint64) bool { return c>>ovShift != 0 }

// get returns x's ref. Slots whose fingerprint matches are checked
// against the tree's engine hash for rank rid.
func (lk *lookup) get(t *Tree, rid uint32, x uint64) (ref, bool) {
	r, ok, _ := lk.getAt(t, rid, x)
	return r, ok
}

// at is where a get found its key: its hash, group and slot. A del of the
// key that follows with no insert in between (which may rebuild) may pass
// it (delAt) and skip the probe.
type at struct {
	h    uint64
	g, i int
}

// getAt is get that also says where it found x.
func (lk *lookup) getAt(t *Tree, rid uint32, x uint64) (ref, bool, at) {
	if lk.n == 0 {
		return ref{}, false, at{}
	}
	h := lk.hash(x) // a sub-table of a lookup with entries has groups
	s, _ := lk.find(h)
	g, fp := s.start(h)
	for range s.g { // every group's count may be up: one round at most
		gr := &s.g[g]
		c := gr.ctrl
		for m := matchFP(c, fp); m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m) >> 3
			if k, ok := t.refKey(rid, gr.refs[i]); ok && k == x {
				return gr.refs[i], true, at{h, g, i}
			}
		}
		if !overflowed(c) {
			break
		}
		if g++; g == len(s.g) {
			g = 0
		}
	}
	return ref{}, false, at{}
}

// warm loads the home groups of keys xs, so that the processor fetches
// them together (their loads depend on nothing but xs) before the gets
// and inserts of the keys, each of which would otherwise wait for its own
// line in turn; it returns a value of the lines, which the caller keeps
// so that the loads are not dropped.
func (lk *lookup) warm(xs []uint64) uint64 {
	if lk.n == 0 {
		return 0
	}
	var acc uint64
	for _, x := range xs {
		h := lk.hash(x)
		s, _ := lk.find(h)
		g, _ := s.start(h)
		acc += s.g[g].ctrl
	}
	return acc
}

// slot returns the group and slot in s of the entry with hash h and ref
// r, or -1.
func (s *slots) slot(h uint64, r ref) (int, int) {
	if len(s.g) == 0 {
		return -1, -1
	}
	g, fp := s.start(h)
	for range s.g {
		gr := &s.g[g]
		for m := matchFP(gr.ctrl, fp); m != 0; m &= m - 1 {
			if i := bits.TrailingZeros64(m) >> 3; gr.refs[i] == r {
				return g, i
			}
		}
		if !overflowed(gr.ctrl) {
			break
		}
		if g++; g == len(s.g) {
			g = 0
		}
	}
	return -1, -1
}

// set changes the ref of the entry with key x and ref old to r, and
// reports whether it was there.
func (lk *lookup) set(x uint64, old, r ref) bool {
	h := lk.hash(x)
	s, _ := lk.find(h)
	g, i := s.slot(h, old)
	if g < 0 {
		return false
	}
	s.g[g].refs[i] = r
	return true
}

// del removes the entry with key x and ref r, and reports whether it was
// there. Its slot becomes empty, and the groups its probe passed count
// one overflow fewer (but a saturated count).
func (lk *lookup) del(x uint64, r ref) bool {
	h := lk.hash(x)
	s, _ := lk.find(h)
	g, i := s.slot(h, r)
	if g < 0 {
		return false
	}
	lk.delAt(at{h, g, i})
	return true
}

// delAt removes the entry a getAt found at a (see at).
func (lk *lookup) delAt(a at) {
	h, g, i := a.h, a.g, a.i
	s, tb := lk.find(h)
	gr := &s.g[g]
	gr.ctrl = gr.ctrl&^(0xff<<(8*i)) | ctrlEmpty<<(8*i)
	gr.refs[i] = ref{}
	home, _ := s.start(h)
	s.count(home, g, ovDown)
	tb.n--
	lk.n--
}

// probe is getAt for a store's block x (its loop is getAt's with the
// free slot noted, kept apart so that a remove's get does not note it):
// the lookup first makes room for an insert (its rebuild needs the tree
// as the lookup has it, so before the block changes the tree), and when x
// is absent, the at it returns says where insertAt puts x: its hash, and
// the first free slot of its probe (g < 0 if the probe saw none).
func (lk *lookup) probe(t *Tree, rid uint32, x uint64) (ref, bool, at) {
	h := lk.hash(x)
	s, tb := lk.find(h)
	for tb.n >= capacity(len(tb.g)) {
		lk.makeRoom(t, rid, tb, h, ref{})
		// The seed may have changed, and a split moves x's hash prefix
		// to a new sub-table (one that may be full in turn).
		h = lk.hash(x)
		s, tb = lk.find(h)
	}
	g, fp := s.start(h)
	free := at{h: h, g: -1}
	for range s.g {
		gr := &s.g[g]
		c := gr.ctrl
		for m := matchFP(c, fp); m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m) >> 3
			if k, ok := t.refKey(rid, gr.refs[i]); ok && k == x {
				return gr.refs[i], true, at{h, g, i}
			}
		}
		if m := matchEmpty(c); m != 0 && free.g < 0 {
			free.g, free.i = g, bits.TrailingZeros64(m)>>3
		}
		if !overflowed(c) {
			break
		}
		if g++; g == len(s.g) {
			g = 0
		}
	}
	return ref{}, false, free
}

// insertAt adds x → r where a probe of x (absent) said (a), with no
// insert since; as insert, the tree must already hold x at r.
func (lk *lookup) insertAt(t *Tree, rid uint32, x uint64, r ref, a at) {
	if a.g < 0 {
		lk.insert(t, rid, x, r)
		return
	}
	s, tb := lk.find(a.h)
	home, fp := s.start(a.h)
	s.count(home, a.g, ovOne) // the groups before the free slot are full
	gr := &s.g[a.g]
	gr.ctrl = gr.ctrl&^(0xff<<(8*a.i)) | fp<<(8*a.i)
	gr.refs[a.i] = r
	tb.n++
	lk.n++
	lk.peak = max(lk.peak, lk.n)
}

// insert adds x → r; x must be absent, and the tree must already hold it
// at r (see lookup: a rebuild reads the rank's entries from the tree).
// If x's sub-table is full, it is rebuilt larger or split first
// (makeRoom), which costs at most one sub-table's entries.
func (lk *lookup) insert(t *Tree, rid uint32, x uint64, r ref) {
	h := lk.hash(x)
	_, tb := lk.find(h)
	for tb.n >= capacity(len(tb.g)) {
		lk.makeRoom(t, rid, tb, h, r)
		// The seed may have changed, and a split moves x's hash prefix
		// to a new sub-table (one that may be full in turn).
		h = lk.hash(x)
		_, tb = lk.find(h)
	}
	tb.place(h, r)
	tb.n++
	lk.n++
	lk.peak = max(lk.peak, lk.n)
}

// count adds d (ovOne, or ovDown to take one away) to the overflow
// counts of groups from up to (not including) to, the groups a probe
// from from passes before group to; a saturated count stays.
func (s *slots) count(from, to int, d uint64) {
	for p := from; p != to; {
		if c := &s.g[p].ctrl; *c>>ovShift != ovMax {
			*c += d
		}
		if p++; p == len(s.g) {
			p = 0
		}
	}
}

// place puts the entry with hash h and ref r into the first free slot of
// its probe, counting it in the full groups it passes. s must have a
// free slot.
func (s *slots) place(h uint64, r ref) {
	g, fp := s.start(h)
	for {
		gr := &s.g[g]
		if m := matchEmpty(gr.ctrl); m != 0 {
			k := bits.TrailingZeros64(m) - 7 // the slot's byte starts at bit k
			gr.ctrl = gr.ctrl&^(0xff<<k) | fp<<k
			gr.refs[k>>3] = r
			return
		}
		if gr.ctrl>>ovShift != ovMax {
			gr.ctrl += ovOne
		}
		if g++; g == len(s.g) {
			g = 0
		}
	}
}

// lookupGrow returns the group count after groups: double up to 32
// groups (224 slots, where rebuilding often costs more than the room),
// then a quarter more.
func lookupGrow(groups int) int {
	if groups < 32 {
		return max(2*groups, 1)
	}
	return groups + groups/4
}

// grownTo returns the group count a full sub-table of groups groups (<
// limit) grows to: lookupGrow's, but limit if that is within an eighth of
// limit (rather than a rebuild for a few more groups).
func grownTo(groups, limit int) int {
	if g := lookupGrow(groups); g < limit-limit/8 {
		return g
	}
	return limit
}

// groupsFor returns the size of a sub-table made for n entries: the
// fewest groups that hold them in 70 % of their slots (a full table's
// entries after a quarter's growth), or 80 % if tight, or limit if that
// is fewer but still has room for one more.
func groupsFor(n, limit int, tight bool) int {
	g := max((n*10+48)/49, 1) // ⌈n / (0.7 × 7)⌉
	if tight {
		g = max((n*5+27)/28, 1) // ⌈n / (0.8 × 7)⌉
	}
	if g > limit && n < capacity(limit) {
		g = limit
	}
	return g
}

// hashRef is an entry as makeRoom moves it: its hash and ref.
type hashRef struct {
	h uint64
	r ref
}

// hashRefPool holds makeRoom's scratch lists of entries (*[]hashRef, at
// most a sub-table's worth). Trees of different partitions rebuild
// concurrently, so the scratch is not the tree's.
var hashRefPool = sync.Pool{New: func() any { return new([]hashRef) }}

// makeRoom rebuilds tb, the full sub-table of hash h, so that it (or,
// after a split, the part that h falls in) has room for an insert:
// larger, or split once it has its most groups (lookupMaxGroups, or
// lookupOneRatio times that for the only sub-table, which splits into as
// many parts as leave each part half full at lookupMaxGroups). skip is
// the block being inserted (in the tree already, not in the table; ref{},
// which names no block, for none).
func (lk *lookup) makeRoom(t *Tree, rid uint32, tb *table, h uint64, skip ref) {
	if lk.dir == nil {
		lk.seed = rand.Uint64() // every entry is rehashed: renew the seed
	}
	buf := hashRefPool.Get().(*[]hashRef)
	defer hashRefPool.Put(buf)
	ents := lk.collect(t, rid, tb, skip, (*buf)[:0])
	*buf = ents[:0]
	groups, limit, splitBits := len(tb.g), lk.maxGroups(), 1
	if lk.dir == nil {
		limit *= lookupOneRatio
		for len(ents)>>splitBits > capacity(lk.maxGroups())/2 && splitBits < maxSplitBits {
			splitBits++
		}
	}
	// drift: the lookup holds fewer entries than it once did, so tb
	// fills by churn, its share of the entries fluctuating, not by the
	// rank's growth (the sub-tables never shrink: they have held this
	// many before). Churn at a steady size may fill such sub-tables again
	// and again; growing each by a quarter (or splitting it into halves at
	// 70 %) every time would leave the lookup ever larger. It grows by a
	// sixteenth instead (its halves are sized for 80 %).
	drift := lk.dir != nil && lk.n < lk.peak
	switch {
	case groups < limit && drift:
		groups = min(groups+max(groups/16, 1), limit)
	case groups < limit && lk.dir == nil && groups < lk.maxGroups():
		// The only sub-table doubles up to lookupMaxGroups groups (384
		// entries): growing by a quarter from 32 groups (42 and 54
		// groups after the allocator's rounding), a rank growing from
		// 193 to 384 entries (a rank joining a cached prefix, or a new
		// one) is rebuilt twice more, at 252 and 324 entries. Doubling
		// costs a rank that stops there up to 2 KiB; most of a fleet's
		// entries are in ranks with a directory, whose sub-tables still
		// grow by a quarter.
		groups = max(2*groups, 1)
	case groups < limit:
		groups = grownTo(groups, limit)
	case lk.canSplit(tb):
		lk.split(tb, h, ents, splitBits, drift)
		return
	default: // see canSplit
		groups = lookupGrow(groups)
	}
	lk.n += len(ents) - tb.n
	tb.fill(groups, limit, ents)
	if lk.dir != nil {
		lk.name(h, tb)
	}
}

// collect appends tb's entries to ents, their keys read from the tree
// and hashed with lk's seed. skip (in the tree, not in tb) is left out.
//
// The only sub-table holds every block the rank holds in the nodes its
// entries name, and scanning those nodes' ext columns costs less than
// resolving every ref on its own. A sub-table of a directory holds only
// the blocks whose hash it covers: the nodes hold the other sub-tables'
// blocks too (as many as the rank's, for long edges), so each of its
// refs is resolved on its own (Tree.refExt), at a cost bounded by the
// sub-table's entries, not the rank's. An entry whose ref does not
// resolve is dropped (the tree is not consistent: a bug).
func (lk *lookup) collect(t *Tree, rid uint32, tb *table, skip ref, ents []hashRef) []hashRef {
	if lk.dir != nil {
		// In two passes: the first finds each key's place in its node's
		// ext column, the second reads the keys. The second pass's loads
		// (most of them cache misses) do not wait on one another, so
		// the processor overlaps them; in one pass each waited behind the
		// holder search of its own ref.
		start := len(ents)
		for g := range tb.g {
			gr := &tb.g[g]
			for m := ^gr.ctrl & msbs; m != 0; m &= m - 1 {
				r := gr.refs[bits.TrailingZeros64(m)>>3]
				if i, ok := t.refExt(rid, r); ok {
					ents = append(ents, hashRef{uint64(i), r})
				}
			}
		}
		for i := start; i < len(ents); i++ {
			e := &ents[i]
			e.h = lk.hash(t.nodes[e.r.node].ext[e.h])
		}
		return ents
	}
	for _, id := range t.lookupNodes(lk) {
		n := &t.nodes[id]
		h := t.holderIndex(id, rid)
		if h < 0 {
			continue
		}
		H := len(n.hold)
		for j := 0; j < int(n.hold[h].cut); j++ {
			if r := (ref{id, n.depth + uint32(j)}); r != skip {
				ents = append(ents, hashRef{lk.hash(n.ext[j*H+h]), r})
			}
		}
	}
	return ents
}

// fill makes tb a sub-table of about groups groups (with its depth)
// holding ents, which must fit in capacity(groups).
// The directory entries naming tb, if any, are the caller's to update.
//
// The allocator rounds the groups up to its size class; the table uses
// the rounding as more groups (the memory is taken either way, and Stats
// counts it), unless that would take it past limit.
func (tb *table) fill(groups, limit int, ents []hashRef) {
	gs := slices.Grow([]group(nil), groups)
	if g := cap(gs); g <= max(groups, limit) {
		groups = g
	}
	*tb = table{slots: slots{g: gs[:groups], depth: tb.depth}, n: len(ents)}
	for i := range tb.g {
		tb.g[i].ctrl = emptyGroup
	}
	for _, e := range ents {
		tb.place(e.h, e.r)
	}
}

// canSplit reports whether tb may split. A split of a sub-table as deep
// as the directory doubles the directory. The keys' hashes are distinct,
// and random to anyone without the seed, so a split halves the entries;
// but keys crafted against a known seed could share a long prefix, and
// then the directory would double again and again. It doubles only while
// it has fewer entries than the lookup; past that tb grows beyond
// lookupMaxGroups instead (a larger rebuild, as a single table has, rather
// than unbounded memory).
func (lk *lookup) canSplit(tb *table) bool {
	return lk.dir == nil || tb.depth < lk.depth || len(lk.dir) < lk.n && lk.depth < 63
}

// maxSplitBits bounds the bits one split divides a sub-table by.
const maxSplitBits = 4

// split replaces tb, the full sub-table of hash h, by 1<<k sub-tables k
// levels deeper (k ≤ maxSplitBits), holding ents (tb's entries) by the
// next k bits of their hashes, doubling the directory first as often as
// the parts' depth needs. tight sizes the parts for 80 % of their slots
// (see groupsFor).
func (lk *lookup) split(tb *table, h uint64, ents []hashRef, k int, tight bool) {
	if lk.dir == nil {
		// The only sub-table becomes a directory of depth 0 naming it,
		// doubled at once. tb is &lk.one, cleared below: no pointer to it
		// outlives the split.
		lk.dir = []dirEntry{{tb.slots, tb}}
	}
	d := int(tb.depth)
	for int(lk.depth) < d+k {
		dir := make([]dirEntry, 2*len(lk.dir))
		for i, e := range lk.dir {
			dir[2*i], dir[2*i+1] = e, e
		}
		lk.dir, lk.depth = dir, lk.depth+1
	}
	part := func(x uint64) int { return int(x << d >> (64 - k)) } // the k bits after tb's prefix
	var counts [1 << maxSplitBits]int
	for _, e := range ents {
		counts[part(e.h)]++
	}
	lk.n += len(ents) - tb.n
	limit := lk.maxGroups()
	var parts [1 << maxSplitBits]*table
	prefix := h &^ (^uint64(0) >> d) // h's top d bits name tb (any h, when d is 0)
	for p := range 1 << k {
		parts[p] = &table{slots: slots{depth: uint8(d + k)}}
		parts[p].fill(groupsFor(counts[p], limit, tight), limit, nil)
		lk.name(prefix|uint64(p)<<(64-d-k), parts[p]) // its slice is set: entries fill it in place
	}
	for _, e := range ents {
		s := parts[part(e.h)]
		s.place(e.h, e.r)
		s.n++
	}
	if tb == &lk.one {
		lk.one = table{}
	}
}

// name points the directory entries of tb's hash prefix — h's top
// tb.depth bits — at tb, with copies of its slots.
func (lk *lookup) name(h uint64, tb *table) {
	span := 1 << (lk.depth - tb.depth)
	lo := int(h>>(64-lk.depth)) &^ (span - 1)
	for i := lo; i < lo+span; i++ {
		lk.dir[i] = dirEntry{tb.slots, tb}
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

// reset empties the lookup and frees its slots.
func (lk *lookup) reset() { *lk = lookup{limit: lk.limit} }

// eachTable calls fn with every sub-table once, in directory order.
func (lk *lookup) eachTable(fn func(tb *table)) {
	if lk.dir == nil {
		fn(&lk.one)
		return
	}
	for i := 0; i < len(lk.dir); i += 1 << (lk.depth - lk.dir[i].depth) {
		fn(lk.dir[i].tb)
	}
}

// each calls fn with every entry's ref, sub-table by sub-table in slot
// order. fn must not change the lookup.
func (lk *lookup) each(fn func(r ref)) {
	lk.eachTable(func(tb *table) {
		for g := range tb.g {
			gr := &tb.g[g]
			for m := ^gr.ctrl & msbs; m != 0; m &= m - 1 {
				fn(gr.refs[bits.TrailingZeros64(m)>>3])
			}
		}
	})
}

// bytes returns the heap bytes lk holds: 64 per group of 7 slots, and
// with a directory its entries and the sub-tables' headers.
func (lk *lookup) bytes() int64 {
	var b int64
	lk.eachTable(func(tb *table) {
		b += int64(cap(tb.g)) * int64(unsafe.Sizeof(group{}))
		if tb != &lk.one {
			b += int64(unsafe.Sizeof(*tb))
		}
	})
	return b + int64(cap(lk.dir))*int64(unsafe.Sizeof(dirEntry{}))
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

// refExt returns the index in its node's ext of rank rid's block r, or
// false if r does not name a block rid holds: refKey without reading the
// key (get's hot path keeps refKey in one piece).
func (t *Tree) refExt(rid uint32, r ref) (int, bool) {
	if int(r.node) >= len(t.nodes) {
		return 0, false
	}
	n := &t.nodes[r.node]
	pos := r.depth - n.depth
	h := t.holderIndex(r.node, rid)
	if h < 0 || pos >= n.hold[h].cut {
		return 0, false
	}
	return int(pos)*len(n.hold) + h, true
}

// repeatsMaxProbe is the longest probe repeats makes before it gives up.
// Linear probing in a set at most a quarter full, with slots that no
// input can aim at, makes runs of about 15 slots at the longest for 4,096
// hashes (ln m / (α − 1 − ln α) for m slots at load α); 64 happens by bad
// luck only, and bounds the work any hashes cause at 64 probes a hash. A
// variable so that a test can make Tree.selfReferencing give up and sort.
var repeatsMaxProbe = 64

// repeats reports whether hs repeats a hash, or holds parent if
// hasParent (dup); ok is false if it gave up, having made a probe longer
// than maxProbe, and the caller must decide another way.
//
// The hashes go into an open-addressing set, linear probing, in
// t.sortBuf (reused): a power of two of at least four times as many slots
// as hashes (a quarter full at most, a probe's first slot is mostly free,
// which the processor then predicts: 1.6 times as fast as half full). A
// hash's slot is the top bits of it mixed with a seed drawn at random for
// every call (whoever sends the hashes cannot know the seed, so crafted
// hashes collide no more than random ones do; a bare multiply-shift would
// leave arithmetic progressions in runs that linear probing handles
// badly). 0 marks an empty slot, so the hash 0 is tracked apart. The
// parent is looked up once all the hashes are in.
func (t *Tree) repeats(hs []uint64, parent uint64, hasParent bool, maxProbe int) (dup, ok bool) {
	if len(hs) == 0 {
		return false, true
	}
	k := bits.Len(uint(4*len(hs) - 1)) // 1<<k ≥ 4·len(hs)
	size := 1 << k
	set := slices.Grow(t.sortBuf[:0], size)[:size]
	clear(set)
	t.sortBuf = set
	seed := rand.Uint64()
	zero := false
	for _, x := range hs {
		if x == 0 {
			if zero {
				return true, true
			}
			zero = true
			continue
		}
		j := int(mix(x, seed) >> (64 - k))
		for p := 0; set[j] != 0; p++ {
			if set[j] == x {
				return true, true
			}
			if p == maxProbe {
				return false, false
			}
			j = (j + 1) & (size - 1)
		}
		set[j] = x
	}
	if !hasParent {
		return false, true
	}
	if parent == 0 {
		return zero, true
	}
	for j, p := int(mix(parent, seed)>>(64-k)), 0; set[j] != 0; j, p = (j+1)&(size-1), p+1 {
		if set[j] == parent {
			return true, true
		}
		if p == maxProbe {
			return false, false
		}
	}
	return false, true
}
