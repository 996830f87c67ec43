package indexer

import (
	"math/bits"
	"slices"
)

// kids is a node's children: a persistent hash trie (a HAMT) from the first
// local hash of each child edge to the child's node id. Matches that take
// no lock read a node's children through its published view (view.go), so
// the children a view names must never change under them; a persistent
// map lets the writer change a node's children without copying all of
// them, while every view keeps the trie it was published with.
//
// A trie node has 32 slots, of which bits says which are used, and holds
// one entry per used slot in slot order: a child (its key and id) or a
// deeper trie node holding every key of that slot. Level d reads the 5
// bits of the key's hash that a rotation by 5·(d+1) brings to the bottom,
// so 13 levels read all 64 bits: distinct keys, whose hashes are distinct
// (mix is a bijection), part by then. The hash is the key mixed with the
// tree's seed, random per tree, so keys crafted to share slots cannot make
// deep tries. A deeper trie node holds at least two keys (a lone key moves
// back up on delete).
//
// Copy on write, with in-place changes while unpublished: a trie node
// made in the tree's current publish epoch (Tree.epoch) is reachable from
// no published view, and the writer changes it in place; an older one may
// be, and is copied on its first change (the path from the root with it).
// Publishing moves the tree to the next epoch. A tree that never publishes
// (a Tree outside an Index) changes its tries in place throughout.
type kidNode struct {
	bits  uint32 // slot i used: its entry is ents[popcount(bits & (1<<i − 1))]
	epoch uint32 // Tree.epoch when made: changed in place while that lasts (0: never)
	ents  []kidEnt
}

type kidEnt struct {
	key uint64   // the child edge's first local hash (sub == nil)
	id  uint32   // the child (sub == nil)
	sub *kidNode // a deeper trie node holding every key of this slot
}

const (
	kidBits   = 5
	kidLevels = (64 + kidBits - 1) / kidBits
)

// kidSlot returns the slot of hash h at level d.
func kidSlot(h uint64, d int) uint32 {
	return uint32(bits.RotateLeft64(h, kidBits*(d+1))) & (1<<kidBits - 1)
}

// get returns the id of the child whose first local hash is key; h is
// key's hash (Tree.kidHash). It only reads, so it may run on a published
// trie while the writer makes the next one.
func (k *kidNode) get(key, h uint64) (uint32, bool) {
	for d := 0; k != nil && d < kidLevels; d++ {
		bit := uint32(1) << kidSlot(h, d)
		if k.bits&bit == 0 {
			return 0, false
		}
		e := &k.ents[bits.OnesCount32(k.bits&(bit-1))]
		if e.sub == nil {
			return e.id, e.key == key
		}
		k = e.sub
	}
	return 0, false
}

// own returns k if the writer may change it in place in epoch, else a
// copy made in epoch.
func (k *kidNode) own(epoch uint32) *kidNode {
	if k.epoch == epoch {
		return k
	}
	return &kidNode{bits: k.bits, epoch: epoch, ents: slices.Clone(k.ents)}
}

// kidPut returns the trie k with key (hash h) mapped to id, at level d.
func kidPut(k *kidNode, key, h uint64, id uint32, d int, epoch uint32, seed uint64) *kidNode {
	bit := uint32(1) << kidSlot(h, d)
	if k == nil {
		return &kidNode{bits: bit, epoch: epoch, ents: []kidEnt{{key: key, id: id}}}
	}
	i := bits.OnesCount32(k.bits & (bit - 1))
	if k.bits&bit == 0 {
		n := k.own(epoch)
		n.ents = slices.Insert(n.ents, i, kidEnt{key: key, id: id})
		n.bits |= bit
		return n
	}
	e := k.ents[i]
	n := k.own(epoch)
	switch {
	case e.sub != nil:
		n.ents[i].sub = kidPut(e.sub, key, h, id, d+1, epoch, seed)
	case e.key == key:
		n.ents[i].id = id
	default: // two keys in one slot: both go one level down
		sub := kidPut(nil, e.key, mix(e.key, seed), e.id, d+1, epoch, seed)
		n.ents[i] = kidEnt{sub: kidPut(sub, key, h, id, d+1, epoch, seed)}
	}
	return n
}

// kidDel returns the trie k without key (hash h), at level d (nil when it
// is left empty), and whether key was there. A trie node owned in epoch
// may come back as itself, changed.
func kidDel(k *kidNode, key, h uint64, d int, epoch uint32) (*kidNode, bool) {
	if k == nil {
		return nil, false
	}
	bit := uint32(1) << kidSlot(h, d)
	if k.bits&bit == 0 {
		return k, false
	}
	i := bits.OnesCount32(k.bits & (bit - 1))
	e := k.ents[i]
	var sub *kidNode
	if e.sub != nil {
		var found bool
		if sub, found = kidDel(e.sub, key, h, d+1, epoch); !found {
			return k, false
		}
	} else if e.key != key {
		return k, false
	}
	if sub == nil && k.bits == bit {
		return nil, true
	}
	n := k.own(epoch)
	switch {
	case sub == nil:
		n.ents = slices.Delete(n.ents, i, i+1)
		n.bits &^= bit
	case len(sub.ents) == 1 && sub.ents[0].sub == nil:
		n.ents[i] = sub.ents[0] // a lone key moves back up
	default:
		n.ents[i].sub = sub
	}
	return n, true
}

// seal sets the epoch of every trie node in k to 0, which is never the
// tree's: none is changed in place again (see Tree.rewind).
func (k *kidNode) seal() {
	if k == nil || k.epoch == 0 {
		return // a sealed node's subtries are sealed: they were made no later
	}
	k.epoch = 0
	for _, e := range k.ents {
		e.sub.seal()
	}
}

// each calls fn with every key and id in k, in no fixed order.
func (k *kidNode) each(fn func(key uint64, id uint32)) {
	if k == nil {
		return
	}
	for _, e := range k.ents {
		if e.sub != nil {
			e.sub.each(fn)
		} else {
			fn(e.key, e.id)
		}
	}
}

// bytes returns the heap bytes k holds: its trie nodes and their entries.
func (k *kidNode) bytes() int64 {
	if k == nil {
		return 0
	}
	b := int64(32) + int64(cap(k.ents))*24
	for _, e := range k.ents {
		b += e.sub.bytes()
	}
	return b
}

// kidHash is the hash of a child key in this tree's tries.
func (t *Tree) kidHash(key uint64) uint64 { return mix(key, t.kseed) }

// child returns the child of node id whose edge starts with local hash lh.
func (t *Tree) child(id uint32, lh uint64) (uint32, bool) {
	return t.nodes[id].kids.get(lh, t.kidHash(lh))
}

// setChild maps lh to c among id's children (adding or replacing it).
func (t *Tree) setChild(id uint32, lh uint64, c uint32) {
	n := &t.nodes[id]
	n.kids = kidPut(n.kids, lh, t.kidHash(lh), c, 0, t.epoch, t.kseed)
	t.touch(id)
}

// delChild removes lh from id's children.
func (t *Tree) delChild(id uint32, lh uint64) {
	n := &t.nodes[id]
	n.kids, _ = kidDel(n.kids, lh, t.kidHash(lh), 0, t.epoch)
	t.touch(id)
}
