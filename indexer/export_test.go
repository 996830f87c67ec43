package indexer

import (
	"fmt"
	"sync/atomic"
)

// CheckGroupBits checks node.gb against the groups' sets: for every
// holder's block, the bits of the tracked groups of its rank that hold it,
// and no bits past a holder's cut or for a rank without groups; and the
// orphan counts.
func CheckGroupBits(t *Tree) error {
	for id := 1; id < len(t.nodes); id++ {
		n := &t.nodes[id]
		if !n.live {
			continue
		}
		if n.gb != nil && len(n.gb) != len(n.ext) {
			return fmt.Errorf("node %d: %d group bit slots for %d blocks", id, len(n.gb), len(n.ext))
		}
		H := len(n.hold)
		for h, hd := range n.hold {
			rs := &t.ranks[hd.rid]
			for j := 0; j < len(n.hashes); j++ {
				var got, want uint64
				if n.gb != nil {
					got = n.gb[j*H+h]
				}
				if j < int(hd.cut) && rs.groups != nil {
					want = t.groupMask(rs.groups, n.ext[j*H+h])
				}
				if got != want {
					return fmt.Errorf("node %d holder %v block %d (hash %#x): group bits %b, want %b", id, rs.rank, j, n.ext[j*H+h], got, want)
				}
			}
		}
	}
	total := 0
	for rid := range t.ranks {
		rs := &t.ranks[rid]
		if rs.groups == nil {
			continue
		}
		n := 0
		for i := range rs.groups.list {
			for x := range rs.groups.list[i].blocks {
				if _, ok := rs.lookup.get(t, uint32(rid), x); !ok {
					n++
				}
			}
		}
		if n != rs.groups.orphans {
			return fmt.Errorf("rank %v: %d orphan group entries, counted %d", rs.rank, n, rs.groups.orphans)
		}
		total += n
	}
	if total != t.norphans {
		return fmt.Errorf("%d orphan group entries, the tree counts %d", total, t.norphans)
	}
	return nil
}

// ApplyInPieces applies op for r as Index.ApplyBatch would with a write
// chunk of chunk blocks, calling yield between pieces. stop is what the
// pieces read before each block after their first (nil: never stop
// early; see Tree.stop): yield may change it. Lookup rebuilds run before
// the block whose insert needs them, as ApplyBatch runs them.
func ApplyInPieces(t *Tree, r Rank, op Op, chunk int, stop *atomic.Int32, yield func()) error {
	if t.pieces(r, &op, chunk) > 0 {
		return t.applyPieces(r, &op, chunk, &holdCtl{stop: stop, quantum: 1, win: new(window)}, yield)
	}
	return t.Apply(r, op)
}
