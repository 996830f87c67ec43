package mocker

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixd/prefixd/events/wire"
)

// ErrNoSpace is returned by Pool.Alloc when the pool cannot hold the
// request even after evicting every evictable cached block (blocks in use
// by other requests cannot be evicted). Engine.Serve then waits for
// running requests to free blocks, as vLLM queues the request.
var ErrNoSpace = errors.New("mocker: not enough free KV blocks")

// RootHash is the parent hash used to hash a prompt's first block (vLLM
// uses a random or PYTHONHASHSEED-derived NONE_HASH; the mocker uses a
// fixed value so that runs are reproducible).
const RootHash uint64 = 0x6d6f636b65722121 // "mocker!!"

// BlockHash is the mocker's engine block hash, in the spirit of vLLM's
// sha256 hashing with integer block hashes (vLLM PR #23673, with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default): the last 8 bytes,
// big-endian, of SHA-256(be64(parent) || le32(token_0) || … ||
// le32(token_{n-1})). It is deliberately unrelated to prefixd's XXH3 local
// hash, so that code navigating by engine hash instead of local hash fails
// tests.
func BlockHash(parent uint64, tokens []uint32) uint64 {
	buf := make([]byte, 8+4*len(tokens))
	binary.BigEndian.PutUint64(buf, parent)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[8+4*i:], t)
	}
	sum := sha256.Sum256(buf)
	return binary.BigEndian.Uint64(sum[24:])
}

// BlockHashes returns the chained engine hashes of tokens' full blocks,
// the first block hashed with RootHash as parent.
func BlockHashes(tokens []uint32, blockSize int) []uint64 {
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	parent := RootHash
	for i := range n {
		parent = BlockHash(parent, tokens[i*blockSize:(i+1)*blockSize])
		out[i] = parent
	}
	return out
}

const nilBlock = -1

// Group is one KV-cache group of a hybrid layout (NewHybridPool), as
// vLLM's hybrid KV-cache manager keeps one per attention type of a model
// (Gemma 3: sliding window and full attention), numbered in the order the
// types first appear among the layers — so group 0 may be sliding-window.
type Group struct {
	// Kind is the kv_cache_spec_kind: a full attention ("full_attention",
	// "mla_attention", "sink_full_attention") or a sliding window
	// ("sliding_window", "sliding_window_mla").
	Kind string
	// Window is the sliding window in tokens (sliding-window kinds only).
	Window int
}

// ParseGroups parses a hybrid layout written as comma-separated kinds,
// a sliding window with its window in tokens after a colon:
// "sliding_window:1024,sliding_window:1024,full_attention". "" is no
// layout (nil). NewHybridPool validates the layout.
func ParseGroups(s string) ([]Group, error) {
	if s == "" {
		return nil, nil
	}
	var out []Group
	for i, f := range strings.Split(s, ",") {
		kind, win, hasWin := strings.Cut(strings.TrimSpace(f), ":")
		g := Group{Kind: kind}
		if hasWin {
			w, err := strconv.Atoi(win)
			if err != nil {
				return nil, fmt.Errorf("mocker: group %d (%q): window: %w", i, f, err)
			}
			g.Window = w
		}
		out = append(out, g)
	}
	return out, nil
}

func (g Group) sliding() bool { return g.Kind == "sliding_window" || g.Kind == "sliding_window_mla" }

// need is how many blocks right before a hit's end a sliding-window group
// must hold: ceil((window-1)/block size), at least 1 (vLLM's
// SlidingWindowManager.find_longest_cache_hit).
func (g Group) need(bs int) int { return max(1, (g.Window-1+bs-1)/bs) }

// block is one physical KV block.
type block struct {
	hash       uint64 // valid when cached
	group      int    // the KV-cache group whose block it is, valid when cached
	cached     bool   // holds a full, hashed block that is in the prefix cache
	refs       int    // requests using the block
	prev, next int32  // LRU links, valid when inLRU
	inLRU      bool
}

// Alloc is the set of blocks one request holds, from Pool.Alloc until
// Pool.Free.
type Alloc struct {
	blocks   [][]int32 // per group, in prompt order (nilBlock: none); the last may be a partial (unhashed) block
	hashes   []uint64  // the prompt's full blocks' engine hashes
	tokens   []uint32  // the prompt (the caller's slice, read until the alloc is fully cached)
	stored   int       // leading full blocks in the cache: the hits, then those Cache stored
	windowed bool      // the sliding windows' skipped blocks were released
	gen      uint64    // the pool generation it belongs to; stale after Reset
	freed    bool
	// CachedBlocks is how many leading full blocks were prefix-cache hits.
	CachedBlocks int
	// NewBlocks is how many full blocks were (or are to be) computed and
	// stored.
	NewBlocks int
}

// Stored returns how many of the prompt's leading full blocks are in the
// cache: the hits and those Cache has stored since.
func (a *Alloc) Stored() int { return a.stored }

// BlockIDs returns the physical block ids group g holds for the prompt,
// in prompt order (a trailing partial block included; a sliding-window
// group's released blocks left out). The slice is the caller's.
func (a *Alloc) BlockIDs(g int) []int {
	if g < 0 || g >= len(a.blocks) {
		return nil
	}
	out := make([]int, 0, len(a.blocks[g]))
	for _, id := range a.blocks[g] {
		if id != nilBlock {
			out = append(out, int(id))
		}
	}
	return out
}

// Pool is a simulated vLLM KV block pool with prefix caching: TotalBlocks
// physical blocks of BlockSize tokens.
//
// Semantics (vLLM v1 BlockPool/KVCacheManager, simplified):
//   - A prompt is split into full blocks with chained engine hashes
//     (BlockHashes); a trailing partial block is allocated too but never
//     cached. Output tokens are not cached.
//   - The longest prefix of full blocks already cached is reused (ref count
//     +1; a block with no other user leaves the free LRU).
//   - The remaining blocks are taken from the empty blocks first and, when
//     there are none, by evicting the least recently freed cached block
//     (head of the LRU), which emits BlockRemoved for its hash.
//   - Newly filled full blocks are cached and emitted as ONE BlockStored
//     event per Alloc (parent = the last hit block's hash, if any; all the
//     new blocks' tokens). With chunked prefill (Admit, then Cache per
//     chunk, as vLLM's scheduler caches the full blocks of each scheduled
//     chunk) there is one BlockStored per chunk, each chained to the last.
//   - Free releases a request's blocks in reverse order (tail first, as
//     vLLM does), so that a prompt's last blocks are evicted before its
//     first; a cached block with no user goes to the LRU tail, an unhashed
//     one back to the empty blocks.
//   - Physical duplicates: the cache maps a hash to every physical block
//     that holds it, and evicting one copy emits one BlockRemoved, so count
//     semantics are kept. Alloc computes and caches a request's blocks
//     atomically; with Admit and Cache, two requests prefilling the same
//     prompt at once each compute the blocks neither found cached and each
//     store its own copy (vLLM's same-step duplicates), one BlockStored
//     per copy.
//
// A hybrid pool (NewHybridPool) keeps every group's blocks in the one pool
// and LRU, as vLLM's hybrid KV-cache manager does:
//   - A prompt's hit is the longest prefix every group serves (vLLM's
//     HybridKVCacheCoordinator.find_longest_cache_hit): a full-attention
//     group serves L blocks if it holds blocks 0..L-1; a sliding-window
//     group if it holds the need = ceil((window-1)/block size) blocks
//     before L (or, for L < need, all of 0..L-1).
//   - Each group takes the hit blocks it needs (a sliding-window group
//     only its last need), then allocates its own new blocks for the rest
//     of the prompt, group by group; each group's new full blocks are one
//     BlockStored with its group_idx, kv_cache_spec_kind and window. So a
//     block a group holds past the hit is computed again: a second copy.
//   - Right after the step, a sliding-window group frees the blocks that
//     left its window (vLLM's remove_skipped_blocks at the next step; they
//     stay cached, evictable first), the last of them first.
//   - Free releases every group's blocks, the last group's tail first;
//     an eviction's BlockRemoved names its block's group_idx.
//
// vLLM also caps a hit at the prompt length minus one token (the last
// token is recomputed for its logits); the mocker, like prefixd's index,
// counts hits over complete blocks.
//
// A Pool is not safe for concurrent use.
type Pool struct {
	blockSize int
	groups    []Group // nil: one full-attention group whose events name no group
	blocks    []block
	empty     []int32              // stack of empty (unhashed, unused) block ids
	cache     []map[uint64][]int32 // per group: engine hash → physical blocks holding it
	head      int32                // least recently freed cached block
	tail      int32                // most recently freed cached block
	lruLen    int
	gen       uint64
	pending   []wire.Event
}

// NewPool returns an empty pool of totalBlocks blocks of blockSize tokens.
func NewPool(totalBlocks, blockSize int) (*Pool, error) {
	return NewHybridPool(totalBlocks, blockSize, nil)
}

// NewHybridPool returns an empty pool whose blocks serve the KV-cache
// groups of a hybrid layout, in group_idx order; with no groups, it is
// NewPool's single-group pool. A layout needs a full-attention group, and
// every sliding-window group a positive window.
func NewHybridPool(totalBlocks, blockSize int, groups []Group) (*Pool, error) {
	if totalBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("mocker: pool: total blocks %d and block size %d must be positive", totalBlocks, blockSize)
	}
	full := len(groups) == 0
	for i, g := range groups {
		switch {
		case g.sliding():
			if g.Window <= 0 {
				return nil, fmt.Errorf("mocker: pool: group %d (%s): window %d must be positive", i, g.Kind, g.Window)
			}
		case fullAttention(g.Kind):
			full = true
		default:
			return nil, fmt.Errorf("mocker: pool: group %d: kind %q is neither full attention nor a sliding window", i, g.Kind)
		}
	}
	if !full {
		return nil, fmt.Errorf("mocker: pool: a hybrid layout needs a full-attention group")
	}
	p := &Pool{blockSize: blockSize, groups: slices.Clone(groups), blocks: make([]block, totalBlocks)}
	p.reset()
	return p, nil
}

func fullAttention(kind string) bool {
	return kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention"
}

// ngroups is the number of KV-cache groups (1 for a single-group pool).
func (p *Pool) ngroups() int { return max(1, len(p.groups)) }

func (p *Pool) group(g int) Group {
	if p.groups == nil {
		return Group{Kind: "full_attention"}
	}
	return p.groups[g]
}

// Main returns the group_idx of the lowest-numbered full-attention group:
// the one prefixd's index holds (0 for a single-group pool).
func (p *Pool) Main() int {
	for g := range p.groups {
		if fullAttention(p.groups[g].Kind) {
			return g
		}
	}
	return 0
}

func (p *Pool) reset() {
	clear(p.blocks)
	p.empty = p.empty[:0]
	for i := len(p.blocks) - 1; i >= 0; i-- {
		p.empty = append(p.empty, int32(i))
	}
	p.cache = make([]map[uint64][]int32, p.ngroups())
	for g := range p.cache {
		p.cache[g] = make(map[uint64][]int32)
	}
	p.head, p.tail, p.lruLen = nilBlock, nilBlock, 0
	p.gen++
}

// BlockSize returns the tokens per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// TotalBlocks returns the number of physical blocks.
func (p *Pool) TotalBlocks() int { return len(p.blocks) }

// FreeBlocks returns how many blocks a new request could use: the empty
// blocks plus the evictable cached ones.
func (p *Pool) FreeBlocks() int { return len(p.empty) + p.lruLen }

// Usage returns the fraction of blocks in use by requests (vLLM's
// kv_cache_usage: evictable cached blocks count as free).
func (p *Pool) Usage() float64 { return 1 - float64(p.FreeBlocks())/float64(len(p.blocks)) }

// Hit returns how many leading full blocks of tokens the pool would serve
// from its prefix cache now (Alloc's CachedBlocks), without changing it.
func (p *Pool) Hit(tokens []uint32) int { return p.hit(BlockHashes(tokens, p.blockSize)) }

// HitBlocks is Hit for a prompt given by its engine block hashes
// (BlockHashes): how many of them the pool would serve now.
func (p *Pool) HitBlocks(hashes []uint64) int { return p.hit(hashes) }

// hit is the longest prefix of hashes that every group serves: each group
// in turn cuts the candidate length to the longest it serves within it,
// until none cuts it.
func (p *Pool) hit(hashes []uint64) int {
	L := len(hashes)
	for {
		prev := L
		for g := range p.cache {
			gr := p.group(g)
			if !gr.sliding() {
				n := 0
				for n < L && len(p.cache[g][hashes[n]]) > 0 {
					n++
				}
				L = n
				continue
			}
			need, run, found := gr.need(p.blockSize), 0, false
			for i := L - 1; i >= 0; i-- {
				if len(p.cache[g][hashes[i]]) == 0 {
					run = 0
					continue
				}
				if run++; run == need {
					L, found = i+need, true
					break
				}
			}
			if !found {
				L = run
			}
		}
		if L == prev {
			return L
		}
	}
}

// from is the first hit block group g takes for a hit of L blocks: a
// sliding-window group needs only the blocks in its window.
func (p *Pool) from(g, L int) int {
	if gr := p.group(g); gr.sliding() {
		return max(0, L-gr.need(p.blockSize))
	}
	return 0
}

// Alloc allocates the blocks of a request with prompt tokens, reusing the
// cached prefix, and caches every new full block at once (Admit, then
// Cache of the whole prompt). It queues the step's events (see Events).
// On ErrNoSpace nothing changes.
func (p *Pool) Alloc(tokens []uint32) (*Alloc, error) {
	a, err := p.Admit(tokens)
	if err != nil {
		return nil, err
	}
	p.Cache(a, len(a.hashes))
	return a, nil
}

// Admit allocates the blocks of a request with prompt tokens: the cached
// prefix is reused (its blocks are the hits), the rest are taken from the
// empty blocks or by eviction, and are not cached until Cache stores them
// (as vLLM caches a block once the step that computes it is scheduled).
// It queues the evictions' BlockRemoved. On ErrNoSpace nothing changes.
// tokens must not change until the alloc is fully cached or freed.
func (p *Pool) Admit(tokens []uint32) (*Alloc, error) {
	return p.AdmitHashed(tokens, BlockHashes(tokens, p.blockSize))
}

// AdmitHashed is Admit of a prompt whose engine block hashes
// (BlockHashes(tokens, block size)) the caller already has; the alloc
// keeps hashes, which must not change either.
func (p *Pool) AdmitHashed(tokens []uint32, hashes []uint64) (*Alloc, error) {
	hits := p.hit(hashes)
	total := (len(tokens) + p.blockSize - 1) / p.blockSize
	need, hitsInLRU := 0, 0
	for g := range p.cache {
		need += total - hits
		for i := p.from(g, hits); i < hits; i++ {
			if p.blocks[p.cache[g][hashes[i]][0]].refs == 0 {
				hitsInLRU++
			}
		}
	}
	if need > len(p.empty)+p.lruLen-hitsInLRU {
		return nil, ErrNoSpace
	}
	a := &Alloc{blocks: make([][]int32, p.ngroups()), hashes: hashes, tokens: tokens, stored: hits,
		gen: p.gen, CachedBlocks: hits, NewBlocks: len(hashes) - hits}
	for g := range p.cache { // every group's hits first, then the new blocks (vLLM's two phases)
		bl := make([]int32, total)
		for i := range bl {
			bl[i] = nilBlock
		}
		for i := p.from(g, hits); i < hits; i++ {
			id := p.cache[g][hashes[i]][0]
			b := &p.blocks[id]
			if b.refs == 0 {
				p.unlink(id)
			}
			b.refs++
			bl[i] = id
		}
		a.blocks[g] = bl
	}
	for g := range p.cache {
		for i := hits; i < total; i++ {
			id := p.take()
			p.blocks[id].refs = 1
			a.blocks[g][i] = id
		}
	}
	return a, nil
}

// Cache stores a's leading full blocks up to n (of its prompt's), those
// not stored yet, in the cache: one BlockStored per group, chained to the
// last block stored before. Once every full block is stored, each
// sliding-window group releases the blocks that left its window (vLLM
// frees them at the next step), the last first. A freed or stale alloc
// (one from before a Reset) caches nothing.
func (p *Pool) Cache(a *Alloc, n int) {
	if a == nil || a.freed || a.gen != p.gen {
		return
	}
	n = min(max(n, 0), len(a.hashes))
	if from := a.stored; n > from {
		for g := range p.cache {
			ev := wire.Event{
				Kind:        wire.KindBlockStored,
				Tag:         wire.TagBlockStored,
				BlockHashes: append([]uint64(nil), a.hashes[from:n]...),
				TokenIDs:    append([]uint32(nil), a.tokens[from*p.blockSize:n*p.blockSize]...),
				BlockSize:   p.blockSize,
				Medium:      "GPU",
			}
			if from > 0 {
				ev.ParentHash, ev.HasParent = a.hashes[from-1], true
			}
			if p.groups != nil {
				gr := p.groups[g]
				ev.GroupIdx, ev.HasGroupIdx, ev.KVCacheSpecKind = g, true, gr.Kind
				if gr.sliding() {
					ev.SlidingWindow, ev.HasSlidingWindow = gr.Window, true
				}
			}
			for i, h := range a.hashes[from:n] {
				id := a.blocks[g][from+i]
				p.blocks[id].hash, p.blocks[id].group, p.blocks[id].cached = h, g, true
				p.cache[g][h] = append(p.cache[g][h], id)
			}
			p.pending = append(p.pending, ev)
		}
		a.stored = n
	}
	if a.stored < len(a.hashes) || a.windowed {
		return
	}
	a.windowed = true
	total := len(a.blocks[0])
	for g := range p.cache {
		gr := p.group(g)
		if !gr.sliding() {
			continue
		}
		skipped := max(0, len(a.tokens)-gr.Window+1) / p.blockSize
		for i := min(skipped, total) - 1; i >= 0; i-- {
			if id := a.blocks[g][i]; id != nilBlock {
				p.release(id)
				a.blocks[g][i] = nilBlock
			}
		}
	}
}

// take returns an unused block: an empty one, or else the LRU head,
// evicted from the cache (queuing BlockRemoved). The caller checked that
// one exists.
func (p *Pool) take() int32 {
	if n := len(p.empty); n > 0 {
		id := p.empty[n-1]
		p.empty = p.empty[:n-1]
		return id
	}
	id := p.head
	p.unlink(id)
	b := &p.blocks[id]
	cache := p.cache[b.group]
	ids := cache[b.hash]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(cache, b.hash)
	} else {
		cache[b.hash] = ids
	}
	ev := wire.Event{
		Kind:        wire.KindBlockRemoved,
		Tag:         wire.TagBlockRemoved,
		BlockHashes: []uint64{b.hash},
		Medium:      "GPU",
	}
	if p.groups != nil {
		ev.GroupIdx, ev.HasGroupIdx = b.group, true
	}
	p.pending = append(p.pending, ev)
	*b = block{}
	return id
}

// release drops one reference to block id: a cached block with no user
// goes to the LRU tail, an unhashed one back to the empty blocks.
func (p *Pool) release(id int32) {
	b := &p.blocks[id]
	b.refs--
	if b.refs > 0 {
		return
	}
	if b.cached {
		p.pushTail(id)
	} else {
		*b = block{}
		p.empty = append(p.empty, id)
	}
}

// Free releases a's blocks, tail first (the last group's first). Freeing
// twice, or freeing an Alloc made before the last Reset, does nothing.
// Free queues no events.
func (p *Pool) Free(a *Alloc) {
	if a == nil || a.freed || a.gen != p.gen {
		return
	}
	a.freed = true
	for g := len(a.blocks) - 1; g >= 0; g-- {
		for i := len(a.blocks[g]) - 1; i >= 0; i-- {
			if id := a.blocks[g][i]; id != nilBlock {
				p.release(id)
			}
		}
	}
}

// Reset empties the cache, as vLLM's reset_prefix_cache (here forcibly:
// requests in flight lose their blocks, and their Allocs become stale), and
// queues AllBlocksCleared.
func (p *Pool) Reset() {
	p.reset()
	p.pending = append(p.pending, wire.Event{Kind: wire.KindAllBlocksCleared, Tag: wire.TagAllBlocksCleared})
}

// Events returns and clears the queued events, in the order they happened.
func (p *Pool) Events() []wire.Event {
	evs := p.pending
	p.pending = nil
	return evs
}

// Holds returns the engine's true prefix cache in its main group (Main;
// the only group of a single-group pool): engine hash → number of
// physical copies.
func (p *Pool) Holds() map[uint64]int { return p.GroupHolds(p.Main()) }

// GroupHolds returns group g's true prefix cache: engine hash → number of
// physical copies (empty for a group the pool does not have).
func (p *Pool) GroupHolds(g int) map[uint64]int {
	out := map[uint64]int{}
	if g < 0 || g >= len(p.cache) {
		return out
	}
	for h, ids := range p.cache[g] {
		out[h] = len(ids)
	}
	return out
}

// LRU returns the hashes of the evictable cached blocks, least recently
// freed first (the eviction order), for tests.
func (p *Pool) LRU() []uint64 {
	out := make([]uint64, 0, p.lruLen)
	for id := p.head; id != nilBlock; id = p.blocks[id].next {
		out = append(out, p.blocks[id].hash)
	}
	return out
}

func (p *Pool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != nilBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nilBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inLRU = nilBlock, nilBlock, false
	p.lruLen--
}

func (p *Pool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inLRU = p.tail, nilBlock, true
	if p.tail != nilBlock {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.lruLen++
}
