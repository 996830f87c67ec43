package indexer

import (
	"cmp"
	"math"
	"slices"
)

// Evict drops whole leaves, least recently stored or matched first, until
// the tree holds at most target entries (TreeStats.Entries), and returns
// how many entries it dropped (counted as ReasonEvicted). Evicting a leaf
// removes every rank's hold on it, with their lookup entries and counts,
// and the ranks' entries for those blocks in their other KV-cache groups,
// and marks those ranks truncated, so the tree still holds a subset of
// what the engines cache; a later store whose parent was evicted is
// dropped as ReasonParentNotFound. Before any leaf, it drops the entries
// of non-main groups whose block the rank's main group does not hold
// (orphans: a match never reads them).
func (t *Tree) Evict(target int) int {
	return t.evictOld(t.now(), 0, t.entries+t.gentries-target)
}

// orphanAge is the age the evictor gives orphan group entries: older than
// any leaf (ages are below 2³¹).
const orphanAge = ^uint32(0)

// evictOld drops orphan group entries, then leaves that are at least
// minAge ticks old as of now, oldest first, until it has dropped at least
// budget entries or no leaf is that old, and returns the entries dropped.
// Leaves that their evicted children leave behind are candidates in turn.
func (t *Tree) evictOld(now, minAge uint32, budget int) int {
	before := t.entries + t.gentries
	if t.gentries > 0 && budget > 0 {
		t.dropOrphans(budget, -1, 0, true)
	}
	for before-t.entries-t.gentries < budget {
		cand := t.sortBuf[:0]
		for id := 1; id < len(t.nodes); id++ {
			if n := &t.nodes[id]; n.live && n.nchild == 0 {
				if a := age(now, t.stampOf(uint32(id))); a >= minAge {
					cand = append(cand, uint64(^a)<<32|uint64(id)) // oldest first
				}
			}
		}
		t.sortBuf = cand
		if len(cand) == 0 {
			break
		}
		slices.Sort(cand)
		progress := false
		for _, c := range cand {
			if before-t.entries-t.gentries >= budget {
				break
			}
			id := uint32(c)
			n := &t.nodes[id]
			if !n.live || n.nchild != 0 || age(now, t.stampOf(id)) < minAge {
				continue // merged away, no longer a leaf, or touched again
			}
			for len(n.hold) > 0 {
				h := len(n.hold) - 1
				rid := n.hold[h].rid
				t.ranks[rid].truncated = true
				if t.ranks[rid].groups != nil {
					H := len(n.hold)
					for j := 0; j < int(n.hold[h].cut); j++ {
						t.dropGroupEntry(rid, n.ext[j*H+h])
					}
				}
				t.removeHolder(id, h)
			}
			t.tidy(id)
			progress = true
		}
		if !progress {
			break
		}
	}
	dropped := before - t.entries - t.gentries
	t.counts[ReasonEvicted] += uint64(dropped)
	return dropped
}

// leaf is one evictable leaf as the Index's evictor sees it: how old it
// is, how many entries evicting it drops, and the partition it is in.
type leaf struct {
	age     uint32
	entries uint32
	part    uint32
}

// appendLeaves appends every leaf of t with its age as of now, tagged with
// part, and the orphan group entries as one leaf of orphanAge. It only
// reads the tree (stamps atomically), so it may run under a read lock
// alongside matches.
func (t *Tree) appendLeaves(dst []leaf, part, now uint32) []leaf {
	if t.gentries > 0 {
		if n := t.orphans(); n > 0 {
			dst = append(dst, leaf{age: orphanAge, entries: uint32(min(uint64(n), math.MaxUint32)), part: part})
		}
	}
	for id := 1; id < len(t.nodes); id++ {
		n := &t.nodes[id]
		if !n.live || n.nchild != 0 {
			continue
		}
		var e uint32
		for _, hd := range n.hold {
			e += hd.cut
		}
		dst = append(dst, leaf{age: age(now, t.stampOf(uint32(id))), entries: e, part: part})
	}
	return dst
}

// Capacity limits a rank's blocks per tier, indexed by Tier (a block with
// copies in several tiers counts in each). 0 in a tier means unlimited
// there; the zero Capacity limits nothing.
type Capacity [NumTiers]int

// SetCapacity sets r's capacity (creating r if the tree does not know it
// yet) and enforces it at once; it returns the blocks dropped. The
// capacity lasts until RemoveRank; Clear keeps it.
func (t *Tree) SetCapacity(r Rank, c Capacity) int {
	rid := t.rankID(r)
	t.ranks[rid].limit = c
	if c != (Capacity{}) {
		t.trackLRU = true // capacity trims by recency, matches included
	}
	return t.enforceCapacity(rid)
}

// Capacity returns r's capacity (the zero Capacity if none is set).
func (t *Tree) Capacity(r Rank) Capacity {
	if rid, ok := t.rankIDs[r]; ok {
		return t.ranks[rid].limit
	}
	return Capacity{}
}

// EnforceCapacity trims r in every tier where it holds more blocks than
// its capacity allows (counting every KV-cache group's: they share the
// engine's pool), down to 31/32 of the limit (so that a rank at its
// limit is not trimmed again on every store), and returns the blocks
// dropped from their tiers (counted as ReasonRankCapacity; r becomes
// truncated). Within a tier it drops r's least recently stored or matched
// blocks first, tail first: the blocks of r's oldest edges, deeper edges
// first among equally old ones, from the end of r's hold on each. A block
// with copies in other tiers keeps them and stays indexed; a block left in
// no tier leaves the index as a BlockRemoved would take it. Other groups'
// copies go first where the main group does not hold the block, then with
// the main group's block (see trimTier). Tree does not call it by itself:
// Index calls it after each batch.
func (t *Tree) EnforceCapacity(r Rank) int {
	if rid, ok := t.rankIDs[r]; ok {
		return t.enforceCapacity(rid)
	}
	return 0
}

func (t *Tree) enforceCapacity(rid uint32) int {
	rs := &t.ranks[rid]
	if rs.limit == (Capacity{}) {
		return 0
	}
	dropped := 0
	for tier := Tier(0); tier < NumTiers; tier++ {
		if lim := rs.limit[tier]; lim > 0 && t.rankTier(rid, tier) > lim {
			dropped += t.trimTier(rid, tier, lim-lim/32)
		}
	}
	return dropped
}

// rankTier counts rid's blocks in tier over all its KV-cache groups: an
// engine's groups share its block pool, so its capacity bounds the sum.
func (t *Tree) rankTier(rid uint32, tier Tier) int {
	rs := &t.ranks[rid]
	n := rs.tiers[tier]
	if rs.groups != nil {
		n += rs.groups.tiers[tier]
	}
	return n
}

// trimCand is an edge that a rank being trimmed holds.
type trimCand struct{ age, depth, id uint32 }

// trimTier drops rid's oldest blocks in tier until it holds target there
// (over all its groups): first copies in non-main groups of blocks its
// main group does not hold (a match never reads them), then main-group
// blocks, oldest first, each with the copies its other groups hold in the
// tier (they serve no hit once the main group's copy is gone).
func (t *Tree) trimTier(rid uint32, tier Tier, target int) int {
	need := t.rankTier(rid, tier) - target
	if need <= 0 {
		return 0
	}
	dropped := 0
	if rg := t.ranks[rid].groups; rg != nil && rg.tiers[tier] > 0 {
		dropped = t.dropOrphans(need, int(rid), tier, false)
	}
	if dropped < need {
		dropped += t.trimMain(rid, tier, need-dropped)
	}
	if dropped > 0 {
		t.ranks[rid].truncated = true
		t.counts[ReasonRankCapacity] += uint64(dropped)
	}
	return dropped
}

// trimMain drops rid's oldest main-group blocks in tier, with their other
// groups' copies there, until at least need copies went, and returns how
// many did.
func (t *Tree) trimMain(rid uint32, tier Tier, need int) int {
	now := t.now()
	cand := t.trimBuf[:0]
	for id := 1; id < len(t.nodes); id++ {
		if n := &t.nodes[id]; n.live && len(n.hold) > 0 && t.holderIndex(uint32(id), rid) >= 0 {
			cand = append(cand, trimCand{age(now, t.stampOf(uint32(id))), n.depth, uint32(id)})
		}
	}
	slices.SortFunc(cand, func(a, b trimCand) int {
		return cmp.Or(cmp.Compare(b.age, a.age), cmp.Compare(b.depth, a.depth), cmp.Compare(a.id, b.id))
	})
	t.trimBuf = cand
	// Choose the blocks before changing anything (drops split and merge
	// edges), then find each again by its engine hash.
	mask := uint32(0xff) << (8 * tier)
	victims := t.localBuf[:0]
	got := 0
	for _, c := range cand {
		n := &t.nodes[c.id]
		h := t.holderIndex(c.id, rid)
		H := len(n.hold)
		for j := int(n.hold[h].cut) - 1; j >= 0 && got < need; j-- {
			if n.cnt[j*H+h]&mask != 0 {
				x := n.ext[j*H+h]
				victims = append(victims, x)
				got += 1 + t.groupCopies(rid, x, tier)
			}
		}
		if got >= need {
			break
		}
	}
	t.localBuf = victims
	lk := &t.ranks[rid].lookup
	for _, x := range victims {
		t.clearGroupTier(rid, x, tier)
		xr, _ := lk.get(t, rid, x)
		l := t.locOf(xr)
		h := t.holderIndex(l.node, rid)
		t.clearTier(l.node, h, l.pos, tier)
		if n := &t.nodes[l.node]; n.cnt[int(l.pos)*len(n.hold)+h] == 0 {
			t.dropBlock(rid, l, h, nil)
		} else {
			t.updateRun(l.node, h, l.pos)
		}
	}
	return got
}
