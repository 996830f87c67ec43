package indexer

import "fmt"

// CheckGroupBits checks node.gb against the groups' sets: for every
// holder's block, the bits of the tracked groups of its rank that hold it,
// and no bits past a holder's cut or for a rank without groups.
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
	return nil
}
