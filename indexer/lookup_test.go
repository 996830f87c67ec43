package indexer

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// lookupHarness drives a lookup against a Go map. Each key lives in a
// node of its own, held by rank 0 at position 0 (so the tree holds exactly
// the table's entries, as lookup requires); moving a key puts it in a new
// node, as a split or merge would, through set.
type lookupHarness struct {
	t     *Tree
	lk    lookup
	model map[uint64]ref
}

func newLookupHarness() *lookupHarness {
	return &lookupHarness{t: NewTree(16), model: map[uint64]ref{}}
}

func (h *lookupHarness) node(x uint64) ref {
	id := uint32(len(h.t.nodes))
	depth := uint32(len(h.t.nodes) % 7) // any depth: refs name (node, depth)
	h.t.nodes = append(h.t.nodes, node{live: true, depth: depth, hashes: []uint64{x},
		hold: []holder{{rid: 0, cut: 1}}, ext: []uint64{x}, cnt: []uint32{1}})
	return ref{id, depth}
}

func (h *lookupHarness) drop(r ref) { h.t.nodes[r.node].hold, h.t.nodes[r.node].ext = nil, nil }

func (h *lookupHarness) insert(x uint64) {
	r := h.node(x)
	h.lk.insert(h.t, 0, x, r)
	h.model[x] = r
}

func (h *lookupHarness) del(tb testing.TB, x uint64) {
	r := h.model[x]
	if !h.lk.del(x, r) {
		tb.Fatalf("del(%#x, %v): not found", x, r)
	}
	if h.lk.del(x, r) {
		tb.Fatalf("del(%#x, %v) twice: found", x, r)
	}
	h.drop(r)
	delete(h.model, x)
}

func (h *lookupHarness) move(tb testing.TB, x uint64) {
	old := h.model[x]
	r := h.node(x)
	if h.lk.set(x, ref{old.node + 1<<31, old.depth}, r) {
		tb.Fatalf("set(%#x) with a wrong old ref: found", x)
	}
	if !h.lk.set(x, old, r) {
		tb.Fatalf("set(%#x, %v): not found", x, old)
	}
	h.drop(old)
	h.model[x] = r
}

func (h *lookupHarness) check(tb testing.TB, probe uint64) {
	tb.Helper()
	want, in := h.model[probe]
	if got, ok := h.lk.get(h.t, 0, probe); ok != in || got != want {
		tb.Fatalf("get(%#x) = %v, %v; want %v, %v", probe, got, ok, want, in)
	}
	if h.lk.len() != len(h.model) {
		tb.Fatalf("len %d, want %d", h.lk.len(), len(h.model))
	}
}

func (h *lookupHarness) checkAll(tb testing.TB) {
	tb.Helper()
	seen := 0
	h.lk.each(func(r ref) {
		x := h.t.nodes[r.node].ext[0]
		if h.model[x] != r {
			tb.Fatalf("each: %v for %#x, want %v", r, x, h.model[x])
		}
		seen++
	})
	if seen != len(h.model) {
		tb.Fatalf("each saw %d entries, want %d", seen, len(h.model))
	}
	for x := range h.model {
		h.check(tb, x)
	}
	if used := 0; len(h.lk.ctrl) > 0 {
		for _, c := range h.lk.ctrl {
			for i := 0; i < 8; i++ {
				if b := (c >> (8 * i)) & 0xff; b != ctrlEmpty {
					used++
				}
			}
		}
		if used+h.lk.left != len(h.lk.ctrl)*8*7/8 {
			tb.Fatalf("%d slots used and %d left of %d", used, h.lk.left, len(h.lk.ctrl)*8)
		}
	}
}

// TestLookupMatchesMap runs random inserts, deletes, moves and gets on a
// lookup and a Go map, over key spaces small enough that keys come back
// after deletion, and compares them after every operation.
func TestLookupMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7))
		space := []uint64{4, 64, 1 << 10, 1 << 62}[seed%4]
		h := newLookupHarness()
		key := func() uint64 {
			k := rng.Uint64N(space)
			if seed%8 == 0 {
				k |= 0xffff << 48 // keys that agree in their high bits
			}
			return k
		}
		ops := 3000 + int(seed)*100
		for i := range ops {
			x := key()
			_, in := h.model[x]
			switch p := rng.IntN(10); {
			case !in && p < 5:
				h.insert(x)
			case in && p < 8:
				h.del(t, x)
			case in:
				h.move(t, x)
			}
			h.check(t, x)
			h.check(t, key())
			if i%500 == 0 {
				h.checkAll(t)
			}
		}
		h.checkAll(t)
	}
}

// TestLookupChurnStaysCompact keeps 5,000 entries in a lookup while
// 200,000 keys come and go: tombstones are recycled, and the table stays
// within the size growth would give it.
func TestLookupChurnStaysCompact(t *testing.T) {
	h := newLookupHarness()
	rng := rand.New(rand.NewPCG(3, 4))
	var live []uint64
	for len(live) < 5000 {
		x := rng.Uint64()
		h.insert(x)
		live = append(live, x)
	}
	peak := len(h.lk.refs)
	for range 200_000 {
		i := rng.IntN(len(live))
		h.del(t, live[i])
		live[i] = rng.Uint64()
		h.insert(live[i])
	}
	h.checkAll(t)
	if got := len(h.lk.refs); got > peak*5/4 || float64(len(live))/float64(got) < 0.6 {
		t.Fatalf("%d slots for %d entries after churn (%d after the fill)", got, len(live), peak)
	}
	t.Logf("%d entries: %d slots after the fill, %d after churn", len(live), peak, len(h.lk.refs))
}

// FuzzLookup interprets the input as operations on a lookup and a Go map
// and compares them.
func FuzzLookup(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 1, 2, 2})
	f.Add(make([]byte, 300))
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newLookupHarness()
		for len(data) >= 3 {
			op, k := data[0]%4, binary.LittleEndian.Uint16(data[1:3])
			data = data[3:]
			x := uint64(k%512) * 0x9e3779b97f4a7c15 // spread, but 512 distinct keys
			if k&0x8000 != 0 {
				x = uint64(k % 64) // small keys
			}
			_, in := h.model[x]
			switch {
			case op == 0 && !in:
				h.insert(x)
			case op == 1 && in:
				h.del(t, x)
			case op == 2 && in:
				h.move(t, x)
			}
			h.check(t, x)
		}
		h.checkAll(t)
	})
}
