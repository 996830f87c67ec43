package indexer

import "slices"

// Evict drops whole leaves, least recently stored or matched first, until
// the tree holds at most target entries, and returns how many entries it
// dropped (counted as ReasonEvicted). Evicting a leaf removes every rank's
// hold on it, with their lookup entries and counts, so the tree still holds
// a subset of what the engines cache; a later store whose parent was
// evicted is dropped as ReasonParentNotFound.
func (t *Tree) Evict(target int) int {
	before := t.entries
	for t.entries > target {
		cand := t.sortBuf[:0]
		for id := 1; id < len(t.nodes); id++ {
			if n := &t.nodes[id]; n.live && n.nchild == 0 {
				cand = append(cand, uint64(n.stamp)<<32|uint64(id))
			}
		}
		if len(cand) == 0 {
			break
		}
		slices.Sort(cand)
		for _, c := range cand {
			if t.entries <= target {
				break
			}
			id := uint32(c)
			n := &t.nodes[id]
			if !n.live || n.nchild != 0 {
				continue // merged away or no longer a leaf
			}
			for len(n.hold) > 0 {
				t.removeHolder(id, len(n.hold)-1)
			}
			t.tidy(id)
		}
		t.sortBuf = cand
	}
	dropped := before - t.entries
	t.counts[ReasonEvicted] += uint64(dropped)
	return dropped
}
