package indexer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
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
	// unbounded: sub-tables may have more groups than the limit (keys
	// crafted against the seed; see lookup.canSplit).
	unbounded bool
	// saturated: overflow counts may have saturated and no longer count
	// down (keys crafted against the seed).
	saturated bool
	// pastLimit are the sub-tables that grew past the limit when the
	// directory could not split them (see lookup.canSplit: it had as
	// many entries as the lookup); a few keys whose hashes share a
	// prefix under the lookup's random seed do that. tooBig records a
	// sub-table that grew past the limit while a split was allowed.
	pastLimit map[*table]bool
	tooBig    string
}

// newLookupHarness returns a harness whose lookup's sub-tables have at
// most limit groups (0: lookupMaxGroups).
func newLookupHarness(limit int32) *lookupHarness {
	return &lookupHarness{t: NewTree(16), lk: lookup{limit: limit}, model: map[uint64]ref{}, pastLimit: map[*table]bool{}}
}

func (h *lookupHarness) node(x uint64) ref {
	id := uint32(len(h.t.nodes))
	depth := uint32(len(h.t.nodes) % 7) // any depth: refs name (node, depth)
	h.t.nodes = append(h.t.nodes, node{live: true, depth: depth, hashes: []uint64{x},
		hold: []holder{{rid: 0, cut: 1}}, ext: []uint64{x}, cnt: []uint32{1}})
	return ref{id, depth}
}

func (h *lookupHarness) drop(r ref) { h.t.nodes[r.node].hold, h.t.nodes[r.node].ext = nil, nil }

// insert inserts x: for half the keys (by a bit of their hash, so
// either way for any key set) as a store does, a probe that makes room
// and then insertAt where it said, else through insert.
func (h *lookupHarness) insert(x uint64) {
	if mix(x, 7)&1 == 0 {
		r0, ok, a := h.lk.probe(h.t, 0, x)
		if ok {
			panic(fmt.Sprintf("probe(%#x) found %v for an absent key", x, r0))
		}
		r := h.node(x)
		rebuilt := h.rebuilt(x)
		h.lk.insertAt(h.t, 0, x, r, a)
		h.model[x] = r
		h.noteGrowth(rebuilt)
		return
	}
	r := h.node(x)
	rebuilt := h.rebuilt(x)
	h.lk.insert(h.t, 0, x, r)
	h.model[x] = r
	h.noteGrowth(rebuilt)
}

// rebuilt returns a func that reports, after x's insert, whether the
// insert rebuilt a sub-table (grew or split x's).
func (h *lookupHarness) rebuilt(x uint64) func() bool {
	lk := &h.lk
	if lk.dir == nil {
		return func() bool { return true }
	}
	_, tb := lk.find(lk.hash(x))
	groups := len(tb.g)
	return func() bool {
		_, now := lk.find(lk.hash(x))
		return lk.dir == nil || now != tb || len(now.g) != groups
	}
}

// noteGrowth, after an insert, records each sub-table that has grown past
// the limit if the insert rebuilt one: in pastLimit if the lookup may let
// it, else in tooBig. It may when the directory could not split the table
// (as many directory entries as the lookup had entries before the insert,
// or the deepest directory), or when the table holds at least a full
// table's entries at the limit: a split whose entries all fell on one
// side sizes that part for them.
func (h *lookupHarness) noteGrowth(rebuilt func() bool) {
	lk := &h.lk
	if lk.dir == nil || !rebuilt() {
		return
	}
	lk.eachTable(func(s *table) {
		if len(s.g) <= lk.maxGroups() || h.pastLimit[s] {
			return
		}
		if s.depth >= lk.depth && (len(lk.dir) >= lk.len()-1 || lk.depth >= 63) || s.n >= capacity(lk.maxGroups()) {
			h.pastLimit[s] = true
			return
		}
		if h.tooBig == "" {
			h.tooBig = fmt.Sprintf("a sub-table of depth %d grew to %d groups for %d entries, past the limit %d, while the directory (depth %d, %d entries for %d keys) could split it",
				s.depth, len(s.g), s.n, lk.maxGroups(), lk.depth, len(lk.dir), lk.len())
		}
	})
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
	h.checkLayout(tb)
}

// checkLayout checks the directory and the sub-tables: the directory has
// 1<<depth entries, names each sub-table in one aligned run as long as its
// depth gives, and holds its slots; every entry is in the sub-table its
// hash selects, with its fingerprint; each sub-table's counts match its
// control bytes, and, unless h.unbounded (crafted keys may make tables
// grow past the limit), no sub-table has more groups than the limit.
func (h *lookupHarness) checkLayout(tb testing.TB) {
	tb.Helper()
	lk := &h.lk
	if lk.dir != nil {
		if len(lk.dir) != 1<<lk.depth || lk.depth == 0 {
			tb.Fatalf("directory of %d entries at depth %d", len(lk.dir), lk.depth)
		}
		if lk.one.g != nil || lk.one.n != 0 {
			tb.Fatalf("a directory, and %d entries in the lookup's own table", lk.one.n)
		}
		seen := map[*table]bool{}
		for i := 0; i < len(lk.dir); {
			s := lk.dir[i].tb
			if s.depth > lk.depth || s.depth == 0 || seen[s] {
				tb.Fatalf("directory entry %d: sub-table of depth %d (directory %d), seen before %v", i, s.depth, lk.depth, seen[s])
			}
			seen[s] = true
			span := 1 << (lk.depth - s.depth)
			if i%span != 0 {
				tb.Fatalf("directory entry %d: sub-table of depth %d starts a run unaligned to %d", i, s.depth, span)
			}
			for j := i; j < i+span; j++ {
				e := &lk.dir[j]
				if e.tb != s || e.depth != s.depth || len(e.g) != len(s.g) || &e.g[0] != &s.g[0] {
					tb.Fatalf("directory entries %d and %d: one run of depth %d, not the same sub-table and slots", i, j, s.depth)
				}
			}
			i += span
		}
	}
	n := 0
	lk.eachTable(func(s *table) {
		full := 0
		// over[g]: the entries whose probe passed group g, full.
		over := make([]int, len(s.g))
		for g := range s.g {
			gr := &s.g[g]
			for i := range groupSlots {
				b := (gr.ctrl >> (8 * i)) & 0xff
				if b == ctrlEmpty {
					if gr.refs[i] != (ref{}) {
						tb.Fatalf("group %d slot %d: empty, ref %v", g, i, gr.refs[i])
					}
					continue
				}
				if b&0x80 != 0 {
					tb.Fatalf("group %d slot %d: control byte %#x", g, i, b)
				}
				full++
				x := h.t.nodes[gr.refs[i].node].ext[0]
				hx := lk.hash(x)
				if _, got := lk.find(hx); got != s {
					tb.Fatalf("key %#x in a sub-table of depth %d, its hash selects another", x, s.depth)
				}
				home, fp := s.start(hx)
				if b != fp {
					tb.Fatalf("key %#x: fingerprint %#x, control byte %#x", x, fp, b)
				}
				for p := home; p != g; p = (p + 1) % len(s.g) {
					over[p]++
				}
			}
		}
		for g := range s.g {
			c := int(s.g[g].ctrl >> ovShift)
			if c != over[g] && !(c == ovMax && over[g] >= ovMax) && !(c == ovMax && h.saturated) {
				tb.Fatalf("group %d: overflow count %d, %d entries passed it", g, c, over[g])
			}
		}
		if full != s.n || full > capacity(len(s.g)) {
			tb.Fatalf("sub-table of %d groups: %d entries counted %d (capacity %d)", len(s.g), full, s.n, capacity(len(s.g)))
		}
		limit := lk.maxGroups()
		if lk.dir == nil {
			limit *= lookupOneRatio
		}
		if !h.unbounded && len(s.g) > limit && !h.pastLimit[s] {
			tb.Fatalf("sub-table of %d groups, more than the limit %d", len(s.g), limit)
		}
		n += s.n
	})
	if n != lk.len() {
		tb.Fatalf("sub-tables hold %d entries, the lookup counts %d", n, lk.len())
	}
	if h.tooBig != "" && !h.unbounded {
		tb.Fatal(h.tooBig)
	}
}

// slots returns the lookup's slots, over all sub-tables.
func (h *lookupHarness) slots() int {
	n := 0
	h.lk.eachTable(func(s *table) { n += len(s.g) * groupSlots })
	return n
}

// TestLookupMatchesMap runs random inserts, deletes, moves and gets on a
// lookup and a Go map, over key spaces small enough that keys come back
// after deletion, and compares them after every operation. Sub-tables are
// limited to 1–16 groups in most runs, so that they split many times.
func TestLookupMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7))
		space := []uint64{4, 64, 1 << 10, 1 << 62}[seed%4]
		limit := []int32{0, 1, 2, 4, 16}[seed%5]
		h := newLookupHarness(limit)
		h.unbounded = limit == 1 || limit == 2 // the directory reaches one pointer per entry: see canSplit
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
		if limit == 4 && space > 64 && h.lk.depth < 4 {
			t.Fatalf("seed %d: %d entries in sub-tables of 4 groups, directory depth only %d", seed, h.lk.len(), h.lk.depth)
		}
	}
}

// TestLookupLarge grows a lookup with the default sub-table size to
// 200,000 entries, deleting and moving some on the way, and compares it
// with a Go map: the directory splits many times, every sub-table stays
// within the limit, and the slots per entry stay those of a single
// table's growth.
func TestLookupLarge(t *testing.T) {
	h := newLookupHarness(0)
	rng := rand.New(rand.NewPCG(5, 6))
	var live []uint64
	for len(h.model) < 200_000 {
		x := rng.Uint64()
		h.insert(x)
		live = append(live, x)
		switch p := rng.IntN(10); {
		case p == 0:
			i := rng.IntN(len(live))
			h.del(t, live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		case p == 1:
			h.move(t, live[rng.IntN(len(live))])
		}
		h.check(t, x)
		h.check(t, rng.Uint64())
		if len(h.model)%50_000 == 0 {
			h.checkAll(t)
		}
	}
	h.checkAll(t)
	tables := 0
	h.lk.eachTable(func(*table) { tables++ })
	perEntry := float64(h.slots()) / float64(h.lk.len())
	t.Logf("%d entries: %d sub-tables, directory of %d, %.3f slots per entry, %.2f B per entry",
		h.lk.len(), tables, len(h.lk.dir), perEntry, float64(h.lk.bytes())/float64(h.lk.len()))
	if tables < 100 || h.lk.depth < 7 {
		t.Fatalf("%d entries in %d sub-tables, directory depth %d: it did not split", h.lk.len(), tables, h.lk.depth)
	}
	if perEntry > 1.45 {
		t.Fatalf("%.3f slots per entry", perEntry)
	}
}

// TestLookupSmallHasNoDirectory checks that a lookup stays one sub-table,
// in the lookup itself, until that sub-table reaches its limit
// (lookupOneRatio × lookupMaxGroups groups: 1,536 entries): 84 % of that
// takes no directory (and 64 bytes a group of 7 slots); 105 % takes a
// directory, into which the table split in 8 parts at once (each about
// half a full sub-table).
func TestLookupSmallHasNoDirectory(t *testing.T) {
	h := newLookupHarness(0)
	rng := rand.New(rand.NewPCG(8, 8))
	one := capacity(lookupOneRatio * lookupMaxGroups)
	for range one * 84 / 100 {
		h.insert(rng.Uint64())
	}
	h.checkAll(t)
	if h.lk.dir != nil || h.lk.bytes() != int64(h.slots()/groupSlots)*64 {
		t.Fatalf("%d entries: a directory of %d, %d bytes for %d slots", h.lk.len(), len(h.lk.dir), h.lk.bytes(), h.slots())
	}
	for range one * 21 / 100 {
		h.insert(rng.Uint64())
	}
	h.checkAll(t)
	if h.lk.dir == nil || h.lk.depth != 3 {
		t.Fatalf("%d entries: a directory of %d entries", h.lk.len(), len(h.lk.dir))
	}
	h.lk.reset()
	h.model = map[uint64]ref{}
	h.checkAll(t)
	if h.lk.dir != nil || h.lk.bytes() != 0 {
		t.Fatalf("after reset: a directory of %d, %d bytes", len(h.lk.dir), h.lk.bytes())
	}
}

// TestLookupSmallDoubles checks how a lookup without a directory grows:
// it doubles up to lookupMaxGroups groups, so a rank growing to 384
// entries (a rank joining a cached prefix) is rebuilt 6 times, and then
// grows by about a quarter, so a large rank's single table stays close to
// its entries.
func TestLookupSmallDoubles(t *testing.T) {
	h := newLookupHarness(0)
	rng := rand.New(rand.NewPCG(9, 9))
	var sizes []int
	for h.lk.dir == nil {
		h.insert(rng.Uint64())
		if g := len(h.lk.one.g); h.lk.dir == nil && (len(sizes) == 0 || g != sizes[len(sizes)-1]) {
			sizes = append(sizes, g)
		}
	}
	h.checkAll(t)
	if want := []int{1, 2, 4, 8, 16, 32, lookupMaxGroups}; len(sizes) < len(want) || !slices.Equal(sizes[:len(want)], want) {
		t.Fatalf("sizes %v, want them to begin %v", sizes, want)
	}
	for i := 7; i < len(sizes); i++ {
		// fill takes the groups the allocator rounds a quarter's growth to.
		g := sizes[i-1]
		if most := cap(slices.Grow([]group(nil), g+g/4)); sizes[i] > most {
			t.Errorf("sizes %v: %d groups grew to %d, more than a quarter's %d", sizes, g, sizes[i], most)
		}
	}
}

// unhash returns the key whose lk.hash is y (the mix is a bijection; this
// is its inverse).
func unhash(lk *lookup, y uint64) uint64 {
	y ^= y>>31 ^ y>>62
	y *= inverse(0x94d049bb133111eb)
	y ^= y>>27 ^ y>>54
	y *= inverse(0xbf58476d1ce4e5b9)
	y ^= y>>30 ^ y>>60
	return y ^ lk.seed
}

// inverse returns the multiplicative inverse of odd c modulo 2⁶⁴ (Newton:
// each step doubles the correct low bits).
func inverse(c uint64) uint64 {
	v := c // correct to 3 bits for odd c
	for range 5 {
		v *= 2 - c*v
	}
	return v
}

// probeGroups returns the most groups a get of a key of h's model visits.
func (h *lookupHarness) probeGroups() int {
	worst := 0
	for x, r := range h.model {
		hx := h.lk.hash(x)
		s, _ := h.lk.find(hx)
		g, _ := s.start(hx)
		for k := 1; ; k++ {
			if slices.Contains(s.g[g].refs[:], r) {
				worst = max(worst, k)
				break
			}
			g = (g + 1) % len(s.g)
		}
	}
	return worst
}

// TestLookupAdversarialKeys inserts key sets crafted against the hash:
// keys that a fixed (unseeded) mix would send to one sub-table and one
// group, keys that differ only in a few high or low bits. The seeded hash
// spreads them: sub-tables stay within the limit, probes short and the
// slots per entry those of random keys.
func TestLookupAdversarialKeys(t *testing.T) {
	unseeded := &lookup{}
	for _, c := range []struct {
		name string
		key  func(i uint64) uint64
	}{
		{"unseeded-collisions", func(i uint64) uint64 { return unhash(unseeded, i) }}, // hash 0, 1, 2, … without a seed
		{"high-bits", func(i uint64) uint64 { return i << 44 }},
		{"low-bits", func(i uint64) uint64 { return i }},
		{"stride", func(i uint64) uint64 { return i * 1 << 32 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newLookupHarness(16)
			for i := range uint64(100_000) {
				h.insert(c.key(i))
			}
			h.checkAll(t)
			perEntry := float64(h.slots()) / float64(h.lk.len())
			probe := h.probeGroups()
			t.Logf("%d entries, directory of %d, %.3f slots per entry, probes ≤ %d groups", h.lk.len(), len(h.lk.dir), perEntry, probe)
			if perEntry > 1.5 || probe > 16 || len(h.lk.dir) > h.lk.len()/16 {
				t.Fatalf("%.3f slots per entry, probes up to %d groups, a directory of %d for %d entries", perEntry, probe, len(h.lk.dir), h.lk.len())
			}
		})
	}
	if got := unhash(unseeded, 12345); unseeded.hash(got) != 12345 {
		t.Fatalf("unhash is not the hash's inverse: hash(unhash(12345)) = %d", unseeded.hash(got))
	}
}

// TestLookupKeysCraftedAgainstSeed inserts keys crafted with the lookup's
// own seed (which an attacker does not know) to share the top 40 bits of
// their hash: splits cannot separate them, and the directory stops
// doubling at one pointer per entry while their sub-table grows past the
// limit. The lookup still matches the map.
func TestLookupKeysCraftedAgainstSeed(t *testing.T) {
	h := newLookupHarness(4)
	rng := rand.New(rand.NewPCG(1, 2))
	for h.lk.dir == nil {
		h.insert(rng.Uint64())
	}
	h.unbounded, h.saturated = true, true
	prefix := rng.Uint64() &^ (1<<24 - 1)
	for i := range uint64(20_000) {
		h.insert(unhash(&h.lk, prefix|i))
		if i%1000 == 0 {
			h.insert(rng.Uint64()) // and some ordinary keys
		}
	}
	h.checkAll(t)
	t.Logf("%d entries, directory of %d (depth %d)", h.lk.len(), len(h.lk.dir), h.lk.depth)
	if len(h.lk.dir) > 2*h.lk.len() {
		t.Fatalf("a directory of %d for %d entries", len(h.lk.dir), h.lk.len())
	}
	for x := range h.model {
		if rng.IntN(2) == 0 {
			h.del(t, x)
		}
	}
	h.checkAll(t)
}

// TestLookupChurnStaysCompact keeps 5,000 (one sub-table), then 50,000
// (a directory of them) entries in a lookup while 200,000 keys come and
// go: the sub-tables stay within the size growth would give them.
func TestLookupChurnStaysCompact(t *testing.T) {
	for _, size := range []int{5000, 50_000} {
		h := newLookupHarness(0)
		rng := rand.New(rand.NewPCG(3, uint64(size)))
		var live []uint64
		for len(live) < size {
			x := rng.Uint64()
			h.insert(x)
			live = append(live, x)
		}
		peak := h.slots()
		for range 200_000 {
			i := rng.IntN(len(live))
			h.del(t, live[i])
			live[i] = rng.Uint64()
			h.insert(live[i])
		}
		h.checkAll(t)
		if got := h.slots(); got > peak*5/4 || float64(len(live))/float64(got) < 0.6 {
			t.Fatalf("%d slots for %d entries after churn (%d after the fill)", got, len(live), peak)
		}
		t.Logf("%d entries: %d slots after the fill, %d after churn", len(live), peak, h.slots())
	}
}

// FuzzLookup interprets the input as operations on a lookup and a Go map
// and compares them. The first byte picks the sub-table limit: 1–3
// groups (splits every few inserts) or the default.
func FuzzLookup(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 1, 2, 2})
	f.Add(make([]byte, 300))
	seed := make([]byte, 3000)
	for i := range seed {
		seed[i] = byte(i * 7)
	}
	seed[0] = 2
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		limit := int32(data[0] % 4)
		h := newLookupHarness(limit)
		h.unbounded = limit > 0 && limit < 3 // see TestLookupMatchesMap
		data = data[1:]
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
