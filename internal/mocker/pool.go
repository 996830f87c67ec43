package mocker

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/prefixd/prefixd/events"
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

// block is one physical KV block.
type block struct {
	hash       uint64 // valid when cached
	cached     bool   // holds a full, hashed block that is in the prefix cache
	refs       int    // requests using the block
	prev, next int32  // LRU links, valid when inLRU
	inLRU      bool
}

// Alloc is the set of blocks one request holds, from Pool.Alloc until
// Pool.Free.
type Alloc struct {
	blocks []int32 // in prompt order; the last may be a partial (unhashed) block
	gen    uint64  // the pool generation it belongs to; stale after Reset
	freed  bool
	// CachedBlocks is how many leading full blocks were prefix-cache hits.
	CachedBlocks int
	// NewBlocks is how many full blocks were computed and stored.
	NewBlocks int
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
//     new blocks' tokens).
//   - Free releases a request's blocks in reverse order (tail first, as
//     vLLM does), so that a prompt's last blocks are evicted before its
//     first; a cached block with no user goes to the LRU tail, an unhashed
//     one back to the empty blocks.
//   - Physical duplicates: the cache maps a hash to every physical block
//     that holds it, and evicting one copy emits one BlockRemoved, so count
//     semantics are kept. Because Alloc computes and caches a request's
//     blocks atomically (no two requests are mid-prefill at once),
//     duplicates only arise if a full block is missed after an earlier miss
//     in the same prompt while a copy is cached elsewhere, which chained
//     hashing and tail-first eviction make practically impossible. vLLM's
//     same-step duplicates are therefore not reproduced.
//
// A Pool is not safe for concurrent use.
type Pool struct {
	blockSize int
	blocks    []block
	empty     []int32            // stack of empty (unhashed, unused) block ids
	cache     map[uint64][]int32 // engine hash → physical blocks holding it
	head      int32              // least recently freed cached block
	tail      int32              // most recently freed cached block
	lruLen    int
	gen       uint64
	pending   []events.Event
}

// NewPool returns an empty pool of totalBlocks blocks of blockSize tokens.
func NewPool(totalBlocks, blockSize int) (*Pool, error) {
	if totalBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("mocker: pool: total blocks %d and block size %d must be positive", totalBlocks, blockSize)
	}
	p := &Pool{blockSize: blockSize, blocks: make([]block, totalBlocks)}
	p.reset()
	return p, nil
}

func (p *Pool) reset() {
	clear(p.blocks)
	p.empty = p.empty[:0]
	for i := len(p.blocks) - 1; i >= 0; i-- {
		p.empty = append(p.empty, int32(i))
	}
	p.cache = make(map[uint64][]int32)
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

// Alloc allocates the blocks of a request with prompt tokens, reusing the
// cached prefix. It queues the step's events (see Events). On ErrNoSpace
// nothing changes.
func (p *Pool) Alloc(tokens []uint32) (*Alloc, error) {
	hashes := BlockHashes(tokens, p.blockSize)
	hits := 0
	hitsInLRU := 0
	for _, h := range hashes {
		ids := p.cache[h]
		if len(ids) == 0 {
			break
		}
		if p.blocks[ids[0]].refs == 0 {
			hitsInLRU++
		}
		hits++
	}
	need := len(hashes) - hits
	if len(tokens)%p.blockSize != 0 {
		need++ // the partial last block
	}
	if need > len(p.empty)+p.lruLen-hitsInLRU {
		return nil, ErrNoSpace
	}
	a := &Alloc{blocks: make([]int32, 0, hits+need), gen: p.gen, CachedBlocks: hits, NewBlocks: len(hashes) - hits}
	for _, h := range hashes[:hits] {
		id := p.cache[h][0]
		b := &p.blocks[id]
		if b.refs == 0 {
			p.unlink(id)
		}
		b.refs++
		a.blocks = append(a.blocks, id)
	}
	for range need {
		id := p.take()
		p.blocks[id].refs = 1
		a.blocks = append(a.blocks, id)
	}
	if a.NewBlocks > 0 {
		ev := events.Event{
			Kind:        events.KindBlockStored,
			Tag:         events.TagBlockStored,
			BlockHashes: append([]uint64(nil), hashes[hits:]...),
			TokenIDs:    append([]uint32(nil), tokens[hits*p.blockSize:len(hashes)*p.blockSize]...),
			BlockSize:   p.blockSize,
			Medium:      "GPU",
		}
		if hits > 0 {
			ev.ParentHash, ev.HasParent = hashes[hits-1], true
		}
		for i, h := range hashes[hits:] {
			id := a.blocks[hits+i]
			p.blocks[id].hash, p.blocks[id].cached = h, true
			p.cache[h] = append(p.cache[h], id)
		}
		p.pending = append(p.pending, ev)
	}
	return a, nil
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
	ids := p.cache[b.hash]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(p.cache, b.hash)
	} else {
		p.cache[b.hash] = ids
	}
	p.pending = append(p.pending, events.Event{
		Kind:        events.KindBlockRemoved,
		Tag:         events.TagBlockRemoved,
		BlockHashes: []uint64{b.hash},
		Medium:      "GPU",
	})
	*b = block{}
	return id
}

// Free releases a's blocks, tail first. Freeing twice, or freeing an Alloc
// made before the last Reset, does nothing. Free queues no events.
func (p *Pool) Free(a *Alloc) {
	if a == nil || a.freed || a.gen != p.gen {
		return
	}
	a.freed = true
	for i := len(a.blocks) - 1; i >= 0; i-- {
		id := a.blocks[i]
		b := &p.blocks[id]
		b.refs--
		if b.refs > 0 {
			continue
		}
		if b.cached {
			p.pushTail(id)
		} else {
			*b = block{}
			p.empty = append(p.empty, id)
		}
	}
}

// Reset empties the cache, as vLLM's reset_prefix_cache (here forcibly:
// requests in flight lose their blocks, and their Allocs become stale), and
// queues AllBlocksCleared.
func (p *Pool) Reset() {
	p.reset()
	p.pending = append(p.pending, events.Event{Kind: events.KindAllBlocksCleared, Tag: events.TagAllBlocksCleared})
}

// Events returns and clears the queued events, in the order they happened.
func (p *Pool) Events() []events.Event {
	evs := p.pending
	p.pending = nil
	return evs
}

// Holds returns the engine's true prefix cache: engine hash → number of
// physical copies.
func (p *Pool) Holds() map[uint64]int {
	out := make(map[uint64]int, len(p.cache))
	for h, ids := range p.cache {
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
