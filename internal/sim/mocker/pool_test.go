package mocker

import (
	"errors"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
)

func toks(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func cat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

func mustPool(t *testing.T, total, bs int) *Pool {
	t.Helper()
	p, err := NewPool(total, bs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBlockHashIsNotLocalHash(t *testing.T) {
	t.Parallel()
	tk := toks(1, 8)
	eng := BlockHashes(tk, 4)
	loc := indexer.HashBlocks(nil, tk, 4, 0)
	if len(eng) != 2 || eng[0] == loc[0] || eng[1] == loc[1] {
		t.Fatalf("engine hashes %x, local %x", eng, loc)
	}
	if BlockHash(RootHash, tk[:4]) != eng[0] || BlockHash(eng[0], tk[4:]) != eng[1] {
		t.Fatal("hashes are not chained")
	}
	if BlockHashes(cat(toks(0, 4), tk[4:]), 4)[1] == eng[1] {
		t.Fatal("second block hash ignores the parent")
	}
}

func TestPoolPrefixReuse(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 16, 4)
	a, err := p.Alloc(toks(0, 10)) // 2 full + 1 partial
	if err != nil {
		t.Fatal(err)
	}
	evs := p.Events()
	h := BlockHashes(toks(0, 12), 4)
	if len(evs) != 1 || evs[0].Kind != wire.KindBlockStored || evs[0].HasParent ||
		!slices.Equal(evs[0].BlockHashes, h[:2]) || !slices.Equal(evs[0].TokenIDs, toks(0, 8)) || evs[0].BlockSize != 4 {
		t.Fatalf("first alloc events %+v", evs)
	}
	if a.CachedBlocks != 0 || a.NewBlocks != 2 || p.FreeBlocks() != 13 {
		t.Fatalf("alloc %+v, free %d", a, p.FreeBlocks())
	}
	// Concurrent request sharing the first 2 blocks, adding a third.
	b, err := p.Alloc(toks(0, 12))
	if err != nil {
		t.Fatal(err)
	}
	evs = p.Events()
	if b.CachedBlocks != 2 || b.NewBlocks != 1 || len(evs) != 1 || !evs[0].HasParent || evs[0].ParentHash != h[1] ||
		!slices.Equal(evs[0].BlockHashes, h[2:3]) || !slices.Equal(evs[0].TokenIDs, toks(8, 4)) {
		t.Fatalf("second alloc %+v events %+v", b, evs)
	}
	if got := p.Holds(); len(got) != 3 || got[h[0]] != 1 || got[h[2]] != 1 {
		t.Fatalf("holds %v", got)
	}
	p.Free(a)
	p.Free(b)
	p.Free(b) // no-op
	if p.FreeBlocks() != 16 {
		t.Fatalf("free %d after freeing all", p.FreeBlocks())
	}
	// Fully cached prompt: no events.
	c, _ := p.Alloc(toks(0, 8))
	if c.CachedBlocks != 2 || len(p.Events()) != 0 {
		t.Fatalf("cached alloc %+v", c)
	}
	p.Free(c)
}

func TestPoolLRUEvictionTailFirst(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 4, 2)
	x := toks(100, 6) // 3 blocks x0 x1 x2
	a, _ := p.Alloc(x)
	p.Free(a)
	hx := BlockHashes(x, 2)
	// Freed tail first: eviction order x2, x1, x0.
	if got := p.LRU(); !slices.Equal(got, []uint64{hx[2], hx[1], hx[0]}) {
		t.Fatalf("LRU %x, want %x", got, []uint64{hx[2], hx[1], hx[0]})
	}
	p.Events()
	// 3 new blocks: 1 empty, then evict x2 and x1.
	y := toks(200, 6)
	b, err := p.Alloc(y)
	if err != nil {
		t.Fatal(err)
	}
	evs := p.Events()
	var removed []uint64
	for _, ev := range evs {
		if ev.Kind == wire.KindBlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	if !slices.Equal(removed, []uint64{hx[2], hx[1]}) || evs[len(evs)-1].Kind != wire.KindBlockStored {
		t.Fatalf("events %+v", evs)
	}
	if got := p.Holds(); len(got) != 4 || got[hx[0]] != 1 || got[hx[2]] != 0 {
		t.Fatalf("holds %v", got)
	}
	// x0 is reused by a prompt sharing it while y is in use.
	c, err := p.Alloc(x[:2])
	if err != nil || c.CachedBlocks != 1 {
		t.Fatalf("alloc %+v %v", c, err)
	}
	// Capacity: everything in use, nothing fits.
	if _, err := p.Alloc(toks(300, 2)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("over capacity: %v", err)
	}
	if len(p.Events()) != 0 {
		t.Fatal("failed alloc queued events")
	}
	p.Free(b)
	p.Free(c)
	// A prompt larger than the pool never fits.
	if _, err := p.Alloc(toks(0, 10)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversized: %v", err)
	}
	// Hits that are in the LRU are not counted as evictable space: y is
	// cached (3 blocks) + x0; a prompt y0 y1 y2 + 2 new needs 2 evictions but
	// only x0 is evictable without touching its own hits.
	if _, err := p.Alloc(cat(y, toks(400, 4))); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("hits counted as space: %v", err)
	}
}

func TestPoolCapacityInvariant(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 8, 4)
	var live []*Alloc
	for i := range 300 {
		// Shared prefixes: 5 system prompts, varying suffixes.
		prompt := cat(toks(1000*(i%5), 8), toks(50000+i*7%23, 4+i%9))
		a, err := p.Alloc(prompt)
		if errors.Is(err, ErrNoSpace) {
			for _, x := range live {
				p.Free(x)
			}
			live = live[:0]
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, a)
		if len(live) > 2 {
			p.Free(live[0])
			live = live[1:]
		}
		used := 0
		for _, x := range live {
			used += len(x.blocks[0])
		}
		n := 0
		for _, c := range p.Holds() {
			n += c
		}
		if n > p.TotalBlocks() || p.FreeBlocks() > p.TotalBlocks() || p.lruLen+len(p.empty)+distinctUsed(p, live) != p.TotalBlocks() {
			t.Fatalf("step %d: cached %d, free %d, used %d, total %d", i, n, p.FreeBlocks(), used, p.TotalBlocks())
		}
	}
}

func distinctUsed(p *Pool, live []*Alloc) int {
	seen := map[int32]bool{}
	for _, a := range live {
		for _, bl := range a.blocks {
			for _, id := range bl {
				if id != nilBlock {
					seen[id] = true
				}
			}
		}
	}
	for id := range seen {
		if p.blocks[id].refs == 0 {
			panic("used block with no refs")
		}
	}
	return len(seen)
}

func TestPoolReset(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 8, 2)
	a, _ := p.Alloc(toks(0, 6))
	p.Events()
	p.Reset()
	evs := p.Events()
	if len(evs) != 1 || evs[0].Kind != wire.KindAllBlocksCleared {
		t.Fatalf("reset events %+v", evs)
	}
	if len(p.Holds()) != 0 || p.FreeBlocks() != 8 {
		t.Fatalf("after reset holds %v free %d", p.Holds(), p.FreeBlocks())
	}
	p.Free(a) // stale: no-op
	if p.FreeBlocks() != 8 || len(p.LRU()) != 0 {
		t.Fatalf("stale free changed the pool: free %d", p.FreeBlocks())
	}
	b, _ := p.Alloc(toks(0, 6))
	if b.CachedBlocks != 0 || len(p.Holds()) != 3 {
		t.Fatalf("after reset alloc %+v holds %v", b, p.Holds())
	}
}

// TestPoolHybrid: a hybrid pool publishes each group's blocks with its
// group, frees the blocks that left a sliding window, evicts any group's
// blocks from the one LRU, and grants the hit every group serves.
func TestPoolHybrid(t *testing.T) {
	t.Parallel()
	p, err := NewHybridPool(30, 2, []Group{{Kind: "sliding_window", Window: 3}, {Kind: "full_attention"}})
	if err != nil {
		t.Fatal(err)
	}
	x := toks(0, 8)
	h := BlockHashes(x, 2)
	a, err := p.Alloc(x)
	if err != nil {
		t.Fatal(err)
	}
	evs := p.Events()
	if len(evs) != 2 {
		t.Fatalf("events %+v, want one store per group", evs)
	}
	for g, ev := range evs {
		if ev.Kind != wire.KindBlockStored || !ev.HasGroupIdx || ev.GroupIdx != g || !slices.Equal(ev.BlockHashes, h) ||
			!slices.Equal(ev.TokenIDs, x) || ev.HasParent {
			t.Fatalf("group %d store %+v", g, ev)
		}
	}
	if evs[0].KVCacheSpecKind != "sliding_window" || !evs[0].HasSlidingWindow || evs[0].SlidingWindow != 3 ||
		evs[1].KVCacheSpecKind != "full_attention" || evs[1].HasSlidingWindow {
		t.Fatalf("group descriptions %+v", evs)
	}
	// A 3-token window needs 1 block before a hit's end; the blocks
	// before the window (0..2 of 8 tokens) were freed, last first.
	if got := p.LRU(); !slices.Equal(got, []uint64{h[2], h[1], h[0]}) {
		t.Fatalf("LRU %x, want the sliding-window group's %x", got, []uint64{h[2], h[1], h[0]})
	}
	if p.Hit(x) != 4 || p.Hit(x[:4]) != 2 || p.Main() != 1 {
		t.Fatalf("hits %d %d, main %d", p.Hit(x), p.Hit(x[:4]), p.Main())
	}
	p.Free(a)
	// 24 new blocks: 22 empty ones, then the LRU's first two — the
	// sliding-window group's blocks 2 and 1.
	b, err := p.Alloc(toks(100, 24))
	if err != nil {
		t.Fatal(err)
	}
	var removed []uint64
	for _, ev := range p.Events() {
		if ev.Kind == wire.KindBlockRemoved {
			if !ev.HasGroupIdx || ev.GroupIdx != 0 {
				t.Fatalf("remove %+v, want group 0", ev)
			}
			removed = append(removed, ev.BlockHashes...)
		}
	}
	if !slices.Equal(removed, []uint64{h[2], h[1]}) {
		t.Fatalf("removed %x, want %x", removed, []uint64{h[2], h[1]})
	}
	if got := p.GroupHolds(0); got[h[1]] != 0 || got[h[0]] != 1 || got[h[3]] != 1 {
		t.Fatalf("group 0 holds %v", got)
	}
	if got := p.Holds(); len(got) != 4+12 {
		t.Fatalf("main group holds %d blocks, want 16", len(got))
	}
	// Two blocks: the full-attention group holds both, but the sliding
	// window needs block 1, gone: the hit is the one block block 0 serves.
	if got := p.Hit(x[:4]); got != 1 {
		t.Fatalf("hit of 2 blocks %d, want 1", got)
	}
	if got := p.Hit(x); got != 4 {
		t.Fatalf("hit of 4 blocks %d, want 4 (block 3 serves it)", got)
	}
	c, err := p.Alloc(x[:4])
	if err != nil || c.CachedBlocks != 1 {
		t.Fatalf("alloc %+v %v", c, err)
	}
	p.Free(b)
	p.Free(c)
	for _, bad := range [][]Group{
		{{Kind: "sliding_window", Window: 4}},
		{{Kind: "sliding_window"}, {Kind: "full_attention"}},
		{{Kind: "mamba"}, {Kind: "full_attention"}},
	} {
		if _, err := NewHybridPool(8, 2, bad); err == nil {
			t.Errorf("layout %+v accepted", bad)
		}
	}
}

func TestParseGroups(t *testing.T) {
	t.Parallel()
	got, err := ParseGroups("sliding_window:1024, sliding_window_mla:8,full_attention")
	want := []Group{{Kind: "sliding_window", Window: 1024}, {Kind: "sliding_window_mla", Window: 8}, {Kind: "full_attention"}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseGroups: %+v %v", got, err)
	}
	if g, err := ParseGroups(""); g != nil || err != nil {
		t.Fatalf("empty layout: %+v %v", g, err)
	}
	if _, err := ParseGroups("sliding_window:wide,full_attention"); err == nil {
		t.Fatal("a window that is no number parsed")
	}
}

// TestPoolAdmitCacheIsAlloc: Admit followed by Cache of the whole prompt
// is Alloc, event for event, across a workload that evicts.
func TestPoolAdmitCacheIsAlloc(t *testing.T) {
	t.Parallel()
	for _, groups := range [][]Group{nil, gemmaLike} {
		whole, err := NewHybridPool(40, testBS, groups)
		if err != nil {
			t.Fatal(err)
		}
		split, _ := NewHybridPool(40, testBS, groups)
		for n := range 200 {
			tk := workload(n).TokenIDs
			a, errA := whole.Alloc(tk)
			b, errB := split.Admit(tk)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("request %d: Alloc %v, Admit %v", n, errA, errB)
			}
			if errA != nil {
				continue
			}
			split.Cache(b, len(tk)/testBS)
			if ea, eb := whole.Events(), split.Events(); !slices.EqualFunc(ea, eb, eventEqual) {
				t.Fatalf("request %d: Alloc events %+v, Admit+Cache %+v", n, ea, eb)
			}
			whole.Free(a)
			split.Free(b)
		}
		if !mapsEqual(whole.Holds(), split.Holds()) || whole.FreeBlocks() != split.FreeBlocks() {
			t.Fatal("the pools diverged")
		}
	}
}

func eventEqual(a, b wire.Event) bool {
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && slices.Equal(a.TokenIDs, b.TokenIDs) &&
		a.HasParent == b.HasParent && a.ParentHash == b.ParentHash && a.GroupIdx == b.GroupIdx && a.HasGroupIdx == b.HasGroupIdx
}

func mapsEqual(a, b map[uint64]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestPoolChunkedCache: Cache stores a prompt chunk by chunk, each chunk
// one BlockStored chained to the last; a request admitted between chunks
// hits only what is stored and computes its own copy of the rest (vLLM's
// duplicates), and freeing a partly stored alloc returns its unstored
// blocks to the empty ones.
func TestPoolChunkedCache(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 16, 4)
	prompt := toks(0, 21) // 5 full blocks and a partial
	h := BlockHashes(prompt, 4)
	a, err := p.Admit(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if evs := p.Events(); len(evs) != 0 || len(p.Holds()) != 0 || p.FreeBlocks() != 10 {
		t.Fatalf("Admit stored %v (events %+v), free %d", p.Holds(), evs, p.FreeBlocks())
	}
	p.Cache(a, 2)
	evs := p.Events()
	if len(evs) != 1 || evs[0].HasParent || !slices.Equal(evs[0].BlockHashes, h[:2]) || !slices.Equal(evs[0].TokenIDs, prompt[:8]) {
		t.Fatalf("first chunk: %+v", evs)
	}
	p.Cache(a, 1) // already stored: nothing
	if len(p.Events()) != 0 || a.Stored() != 2 {
		t.Fatal("Cache of stored blocks stored again")
	}
	b, err := p.Admit(prompt)
	if err != nil || b.CachedBlocks != 2 {
		t.Fatalf("second request hit %d blocks (%v), want the 2 stored", b.CachedBlocks, err)
	}
	p.Cache(a, 99)
	evs = p.Events()
	if len(evs) != 1 || !evs[0].HasParent || evs[0].ParentHash != h[1] || !slices.Equal(evs[0].BlockHashes, h[2:]) ||
		!slices.Equal(evs[0].TokenIDs, prompt[8:20]) {
		t.Fatalf("second chunk: %+v", evs)
	}
	p.Cache(b, 5)
	if evs := p.Events(); len(evs) != 1 || !slices.Equal(evs[0].BlockHashes, h[2:]) {
		t.Fatalf("the second request's copy: %+v", evs)
	}
	holds := p.Holds()
	if holds[h[0]] != 1 || holds[h[1]] != 1 || holds[h[2]] != 2 || holds[h[4]] != 2 {
		t.Fatalf("holds %v: want blocks 2-4 held twice", holds)
	}
	if ids := a.BlockIDs(0); len(ids) != 6 {
		t.Fatalf("BlockIDs %v, want 6 (5 full and a partial)", ids)
	}
	c, err := p.Admit(toks(100, 8))
	if err != nil {
		t.Fatal(err)
	}
	p.Cache(c, 1)
	p.Free(c) // block 1 unstored: back to the empty blocks, block 0 to the LRU
	if got := p.LRU(); len(got) != 1 || got[0] != BlockHashes(toks(100, 8), 4)[0] {
		t.Fatalf("LRU %x after freeing a partly stored alloc", got)
	}
	p.Reset()
	p.Events()
	p.Cache(a, 5) // stale: nothing
	if len(p.Events()) != 0 || len(p.Holds()) != 0 {
		t.Fatal("a stale alloc cached after Reset")
	}
}
