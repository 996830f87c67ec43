package indexer

import (
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sync"
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
// chunk of chunk blocks, calling yield between pieces.
func ApplyInPieces(t *Tree, r Rank, op Op, chunk int, yield func()) error {
	if t.pieces(r, &op, chunk) > 0 {
		return t.applyPieces(r, &op, chunk, yield)
	}
	return t.Apply(r, op)
}

// EnableViews makes t publish views, as an Index's trees do.
func EnableViews(t *Tree) { t.enableViews() }

// NearEpochWrap moves t's publish epoch to n publishes before it wraps
// (as after 2³² publishes), keeping what is published unchanged.
func NearEpochWrap(t *Tree, n uint32) {
	t.rewind() // no holder array or trie node is the current epoch's
	t.epoch = -n
}

// PublishViews publishes what changed since the last publish.
func PublishViews(t *Tree) { t.publishViews() }

// MatchViews matches q on t's published views, with no lock; ok is false
// where Index would match under the read lock.
func MatchViews(t *Tree, q []uint64, dst []Overlap) ([]Overlap, bool) {
	return t.matchViews(q, dst)
}

// ViewStats returns how many publishes t made, and how many match walks
// publishes made repeat or sent to the read lock.
func ViewStats(t *Tree) (publishes, retries, fallbacks uint64) {
	return t.pub.publishes.Load(), t.pub.retries.Load(), t.pub.fallbacks.Load()
}

// viewCopy is what a published view held when CheckViews saw it.
type viewCopy struct {
	hashes []uint64
	hold   []holder
	kids   map[uint64]uint32
}

// published holds, per tree, copies of the views CheckViews last saw.
var published sync.Map // *Tree → map[*view]viewCopy

// CheckViews checks, right after a publish, that every node's published
// view is the node (edge, holders, children, and no view for a free id),
// that the ranks and flags are the tree's, that no holder array or trie
// node a view reaches is the current epoch's (the writer's to change in
// place), and that every view published when it was last called still
// holds what it held then: the writer changed no published memory.
func CheckViews(t *Tree) error {
	if old, ok := published.Load(t); ok {
		for v, c := range old.(map[*view]viewCopy) {
			got := map[uint64]uint32{}
			v.kids.each(func(k uint64, id uint32) { got[k] = id })
			if !slices.Equal(v.hashes, c.hashes) || !slices.Equal(v.hold, c.hold) || !maps.Equal(got, c.kids) {
				return fmt.Errorf("a published view changed: %x %+v %v, was %x %+v %v", v.hashes, v.hold, got, c.hashes, c.hold, c.kids)
			}
		}
	}
	copies := map[*view]viewCopy{}
	defer published.Store(t, copies)
	p := t.pub
	if len(p.dirty) != 0 {
		return fmt.Errorf("%d nodes touched since the last publish", len(p.dirty))
	}
	st := p.state.Load()
	if st.hybrid != (t.hybrid > 0) || st.trackLRU != t.trackLRU {
		return fmt.Errorf("published hybrid %v, trackLRU %v; the tree's %v, %v", st.hybrid, st.trackLRU, t.hybrid > 0, t.trackLRU)
	}
	if len(st.ranks) != len(t.ranks) {
		return fmt.Errorf("%d ranks published, the tree has %d", len(st.ranks), len(t.ranks))
	}
	for rid := range t.ranks {
		if st.ranks[rid] != t.ranks[rid].rank {
			return fmt.Errorf("rank id %d published as %v, the tree's is %v", rid, st.ranks[rid], t.ranks[rid].rank)
		}
	}
	for id := 0; id < len(st.chunks)*viewChunkLen; id++ {
		v := st.view(uint32(id))
		if id >= len(t.nodes) || !t.nodes[id].live {
			if v != nil {
				return fmt.Errorf("node %d: free, but published", id)
			}
			continue
		}
		n := &t.nodes[id]
		if v == nil {
			return fmt.Errorf("node %d: no view", id)
		}
		if !slices.Equal(v.hashes, n.hashes) {
			return fmt.Errorf("node %d: view's edge %x, the node's %x", id, v.hashes, n.hashes)
		}
		if !slices.Equal(v.hold, n.hold) {
			return fmt.Errorf("node %d: view's holders %+v, the node's %+v", id, v.hold, n.hold)
		}
		if n.holdEp == t.epoch {
			return fmt.Errorf("node %d: holders of the current epoch published", id)
		}
		want := map[uint64]uint32{}
		for c := n.first; c != 0; c = t.nodes[c].next {
			want[t.nodes[c].hashes[0]] = c
		}
		got := map[uint64]uint32{}
		if err := checkKids(v.kids, t.kseed, nil, t.epoch, got); err != nil {
			return fmt.Errorf("node %d children: %w", id, err)
		}
		copies[v] = viewCopy{slices.Clone(v.hashes), slices.Clone(v.hold), got}
		if !maps.Equal(got, want) {
			return fmt.Errorf("node %d: children %v in the view, %v in the tree", id, got, want)
		}
	}
	if len(st.chunks)*viewChunkLen < len(t.nodes) {
		return fmt.Errorf("views for %d node ids, the tree has %d", len(st.chunks)*viewChunkLen, len(t.nodes))
	}
	return nil
}

// checkKids checks trie node k at level len(path), reached through the
// slots in path, and adds its keys to got.
func checkKids(k *kidNode, seed uint64, path []uint32, epoch uint32, got map[uint64]uint32) error {
	d := len(path)
	if k == nil {
		return nil
	}
	if d >= kidLevels {
		return fmt.Errorf("a trie of more than %d levels", kidLevels)
	}
	if k.epoch == epoch {
		return fmt.Errorf("trie node of the current epoch %d published", epoch)
	}
	if bits.OnesCount32(k.bits) != len(k.ents) {
		return fmt.Errorf("%d slots used, %d entries", bits.OnesCount32(k.bits), len(k.ents))
	}
	i := 0
	for slot := uint32(0); slot < 1<<kidBits; slot++ {
		if k.bits&(1<<slot) == 0 {
			continue
		}
		e := k.ents[i]
		i++
		if e.sub == nil {
			h := mix(e.key, seed)
			for l, want := range append(path, slot) {
				if kidSlot(h, l) != want {
					return fmt.Errorf("key %#x in slot %d at level %d, its hash says %d", e.key, want, l, kidSlot(h, l))
				}
			}
			if _, dup := got[e.key]; dup {
				return fmt.Errorf("key %#x twice", e.key)
			}
			got[e.key] = e.id
			continue
		}
		before := len(got)
		if err := checkKids(e.sub, seed, append(slices.Clip(path), slot), epoch, got); err != nil {
			return err
		}
		if len(got)-before < 2 {
			return fmt.Errorf("a deeper trie node with %d keys", len(got)-before)
		}
	}
	return nil
}
