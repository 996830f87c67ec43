package indexer

import "sync/atomic"

type active struct {
	rid            uint32
	dev, host, any uint32
	devOn, hostOn  bool
}

// Match appends to dst the overlap of every rank whose main KV-cache group
// holds at least the first block of the query q (local block hashes), in
// blocks. A rank's run ends at the first block it does not hold; for a rank
// with other tracked groups (a hybrid model) the tiers are the hit vLLM
// would grant (see Overlap and Tree.grant). Match does not modify the tree
// except for LRU stamps (atomically), so concurrent Match calls are safe.
// It allocates nothing unless hybrid ranks are matched along a path of
// more than 32 edges.
func (t *Tree) Match(q []uint64, dst []Overlap) []Overlap {
	if len(q) == 0 {
		return dst
	}
	id, ok := t.child(0, q[0])
	if !ok {
		return dst
	}
	var buf [128]active // on the stack; more ranks on the first edge spill to the heap
	act := buf[:0]
	var clock uint32
	if t.trackLRU {
		clock = t.now()
	}
	// path: the edges visited, which a hybrid rank's grant reads its
	// engine hashes from; nil (not recorded) without hybrid ranks.
	var path []uint32
	if t.hybrid > 0 {
		var pbuf [32]uint32
		path = pbuf[:0]
	}
	depth := 0
	for first := true; ; first = false {
		if path != nil {
			path = append(path, id)
		}
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
				if path == nil {
					dst = t.emit(dst, a)
				} else {
					dst = t.emitHybrid(dst, a, path)
				}
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
			c := min(hd.cut, uint32(k))
			a.any += c
			if !full || c < uint32(L) {
				if path == nil {
					dst = t.emit(dst, a)
				} else {
					dst = t.emitHybrid(dst, a, path)
				}
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
		id, ok = t.child(id, q[depth])
		if !ok {
			break
		}
	}
	for _, a := range act {
		if path == nil {
			dst = t.emit(dst, a)
		} else {
			dst = t.emitHybrid(dst, a, path)
		}
	}
	return dst
}

// emit appends a's overlap (small enough to inline: a partition with
// hybrid ranks, which has a path, goes through emitHybrid instead).
//
// It fills the new element in place: Overlap has more than four fields,
// so a composite literal would be built on the stack and copied (14%
// slower on BenchmarkLLMDCompareMatchOnly).
func (t *Tree) emit(dst []Overlap, a active) []Overlap {
	if a.any == 0 {
		return dst
	}
	n := len(dst)
	if n < cap(dst) {
		dst = dst[:n+1]
	} else {
		dst = append(dst, Overlap{})
	}
	o := &dst[n]
	o.Rank, o.Device, o.Host, o.Disk, o.Upper = t.ranks[a.rid].rank, a.dev, a.host, a.any, a.any
	return dst
}

// emitHybrid appends a's overlap, the grant for a hybrid rank.
func (t *Tree) emitHybrid(dst []Overlap, a active, path []uint32) []Overlap {
	if a.any == 0 {
		return dst
	}
	rs := &t.ranks[a.rid]
	o := Overlap{Rank: rs.rank, Device: a.dev, Host: a.host, Disk: a.any, Upper: a.any}
	if rs.groups != nil && rs.groups.tracked > 0 {
		t.grant(&o, a.rid, rs.groups, path)
	}
	return append(dst, o)
}
