package indexer

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"unsafe"
)

// Reason names why (part of) an event was not applied, or why entries left
// the index other than by an engine event. Tree counts each.
type Reason uint8

const (
	ReasonParentNotFound Reason = iota // store whose parent the rank does not hold (incl. evicted parents)
	ReasonBlockNotFound                // remove of a block (in that tier) the rank does not hold
	ReasonSelfReference                // store repeating a hash or its parent
	ReasonBlockSize                    // store whose block size differs from the partition's
	ReasonShortTokens                  // store whose token ids do not cover its blocks
	ReasonOffloadUnknown               // offload of a block the rank does not hold
	ReasonHashConflict                 // engine hash already names another block of the rank
	ReasonEvicted                      // entries evicted by the memory cap
	ReasonRankCapacity                 // blocks dropped from a tier to keep a rank within its capacity
	ReasonUnknownGroup                 // remove of a KV-cache group the rank never stored, or a group past MaxGroups
	NumReasons
)

var reasonNames = [NumReasons]string{
	"parent_not_found", "block_not_found", "self_reference", "block_size",
	"short_tokens", "offload_unknown", "hash_conflict", "evicted", "rank_capacity",
	"unknown_group",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

var reasonErrs = [NumReasons]error{
	ErrParentNotFound, ErrBlockNotFound, ErrSelfReference, ErrBlockSize,
	ErrShortTokens, ErrOffloadUnknown, ErrHashConflict, nil, nil,
	ErrUnknownGroup,
}

// OpError reports blocks of one event that were not applied. Blocks before
// the failure (and, for removes, other blocks of the event) were applied.
type OpError struct {
	Rank   Rank
	Reason Reason
	Hash   uint64 // the first engine hash concerned
	Blocks int    // how many blocks of the event were skipped
}

func (e *OpError) Error() string {
	return fmt.Sprintf("rank %v: %v (hash %#x, %d blocks skipped)", e.Rank, reasonErrs[e.Reason], e.Hash, e.Blocks)
}

func (e *OpError) Unwrap() error { return reasonErrs[e.Reason] }

// Overlap is how far one rank already caches a query, in blocks. The tiers
// are cumulative: Device counts leading blocks held on the device, Host those
// held on the device or in host memory, Disk those held in any tier, so
// Device ≤ Host ≤ Disk ≤ Upper.
//
// For a rank of a hybrid model (several KV-cache groups, see Group) the
// tiers are the hit vLLM's hybrid coordinator would grant: the longest
// prefix that the main group holds and that every other tracked group
// allows (docs/index.md, "Hybrid models"). Upper is the main group's own
// run in any tier — what the rank would grant if its other groups held
// everything, and for a rank with no other tracked group, Disk.
type Overlap struct {
	Rank   Rank
	Device uint32
	Host   uint32
	Disk   uint32
	Upper  uint32
}

// loc is where a block sits: node and position on its edge.
type loc struct{ node, pos uint32 }

// ref is what a rank's lookup stores for a block: its node and its depth
// (blocks from the root). Depths do not change when edges split or merge,
// so only the part of an edge that moves to another node id needs its refs
// rewritten, and split and merge move the cheaper part.
type ref struct{ node, depth uint32 }

// holder is one rank's hold on a prefix [0, cut) of a node's edge. Its
// per-block engine hashes and tier counts live in node.ext and node.cnt.
type holder struct {
	rid  uint32
	cut  uint32 // blocks [0, cut) of the edge are held; 1 ≤ cut ≤ edge length
	dev  uint32 // leading blocks held on the device (≤ cut)
	host uint32 // leading blocks held on the device or in host memory (≤ cut)
	// pext is the rank's engine hash of the block before this edge, as the
	// engine named it when storing; kept so dumps can name the parent even
	// when the rank no longer holds that block.
	pext uint64
	hasP bool
}

// node is one edge of the compressed tree: a run of blocks (local hashes).
// Each holder holds a prefix of the edge; a store or remove that would
// leave a rank holding anything but a prefix splits the edge first. A leaf
// is never longer than its longest holder, and a node that no rank holds
// has children (otherwise it is freed).
type node struct {
	parent uint32
	nchild uint32
	first  uint32 // first child (0 = none), doubly linked through next/prev
	next   uint32
	prev   uint32
	stamp  uint32   // LRU clock of the last store or match (atomic when matched)
	depth  uint32   // blocks from the root to this edge's first block
	mark   uint32   // Tree.markEpoch when lookupNodes last listed the node (in padding: free)
	hashes []uint64 // local hashes along the edge; empty only at the root
	hold   []holder // sorted by rid
	ext    []uint64 // block-major: ext[j*H+h] is holder h's engine hash of block j (0 past its cut)
	cnt    []uint32 // block-major tier counts, 8 bits per tier (see Tree.overflow); 0 past the cut
	// gb, block-major like ext, caches which tracked non-main KV-cache
	// groups of holder h's rank hold block j (bit groupSet.bit, any
	// tier); nil when every bit is 0 (no holder of a hybrid rank). The
	// groups' sets are the truth; gb spares Match their lookups.
	gb   []uint64
	kids *kidNode // the children by their first local hash (kids.go)
	// dirty: the Tree.epoch in which the node was last touched (view.go);
	// holdEp: the epoch in which hold was made (the writer changes it in
	// place only in that epoch); pubHi: the longest prefix of the hashes
	// array ever published.
	dirty  uint32
	holdEp uint32
	pubHi  uint32
	live   bool
}

type rankState struct {
	rank   Rank
	lookup lookup // engine hash → block
	seq    uint64
	hasSeq bool
	// digest identifies the batch applied as seq (the stream layer's xxh3
	// of its payload; 0 = unknown), so a restored rank can check that the
	// engine still has that batch before resuming after it.
	digest uint64
	// tiers counts the blocks held in each tier (a block with copies in
	// two tiers counts in both).
	tiers [NumTiers]int
	limit Capacity // 0 in a tier: unlimited there
	// truncated: the rank lost entries other than by its engine's events
	// (memory cap, capacity) since it was created or last cleared.
	truncated bool
	// main is the KV-cache group the tree holds for the rank (hasMain:
	// learned from a store); groups, the others (nil if none). See Group.
	main    groupInfo
	hasMain bool
	groups  *rankGroups
	// degraded is the stream layer's word, recorded with each batch and
	// reset (Mark, Index.Reset): the rank's history is known to be
	// incomplete, and why. It travels in dumps.
	degraded    bool
	degradedWhy string
	// foreignWhy: a batch of another rank's stream that carried r's
	// events was degraded (Mark.Foreign), and why; "" if none was since
	// r was last cleared.
	foreignWhy string
	// redundant counts the blocks of the rank's redundant stores since
	// the rank was first seen (see Tree.Redundant); Clear keeps it.
	redundant uint64
}

// degradedState is the rank's degraded flag and reason: its own stream's
// word, or else a foreign batch's, or else its truncation. It is the one
// truth every view of the flag reads (the API's workers, dumps, metrics).
func (rs *rankState) degradedState() (bool, string) {
	switch {
	case rs.degraded:
		return true, rs.degradedWhy
	case rs.foreignWhy != "":
		return true, rs.foreignWhy
	case rs.truncated:
		return true, TruncatedReason
	}
	return false, ""
}

// TruncatedReason is the degraded reason of a rank whose only fault is
// that the index dropped some of its blocks itself (Tree.Truncated).
const TruncatedReason = "truncated: the index dropped some of its blocks (the memory cap, or more than its capacity)"

type ovKey struct {
	rid  uint32
	tier Tier
	ext  uint64
}

// Tree is the prefix index of one partition (one model and routing group,
// one block size): a path-compressed radix tree over local block hashes.
//
// Tree is not safe for concurrent use, except that Match may run
// concurrently with other Match calls; Index adds the locking.
type Tree struct {
	blockSize int
	nodes     []node // nodes[0] is the root
	free      []uint32
	// kseed seeds the hashes of the children tries (kids.go); epoch
	// counts publishes of the views (view.go), and pub is the published
	// side, nil for a tree that publishes none.
	kseed     uint64
	epoch     uint32
	pub       *publisher
	rankIDs   map[Rank]uint32
	memo      rankMemo // the rank found last in rankIDs (rid)
	ranks     []rankState
	freeRanks []uint32
	overflow  map[ovKey]uint32 // tier counts beyond 255

	entries  int // Σ holder cuts: indexed (block, rank) pairs
	gentries int // Σ ranks' rankGroups.entries: (block, rank, group) pairs of non-main groups
	norphans int // Σ ranks' rankGroups.orphans
	hybrid   int // ranks with a tracked non-main group (Match then computes grants)
	blocks   int // Σ edge lengths
	nnodes   int

	// clock is the LRU clock: each store advances it by two and stamps
	// the nodes it touches with it; matches stamp with now(). Standalone,
	// Match reads it atomically; in a capped Index, shared is the
	// index-wide clock (so stamps compare across partitions), now() reads
	// that instead, and the Index sets clock before each batch to the
	// start of the ticks it reserved (see Index.ApplyBatch).
	clock    uint32
	shared   *atomic.Uint32
	trackLRU bool // Match stamps the nodes it visits
	counts   [NumReasons]uint64
	// redundant counts the blocks of redundant stores (see Redundant).
	redundant uint64
	// piece: storeMain is applying a piece of a larger store
	// (applyPieces), whose redundant blocks it adds to pieceRed instead of
	// the counts. Set only by the writer applying the pieces, while it
	// holds the tree.
	piece    bool
	pieceRed uint64
	localBuf []uint64
	// sink keeps what warm loaded.
	sink    uint64
	touched []uint32
	// markEpoch and lookupBuf: scratch of lookup rebuilds (lookupNodes).
	markEpoch uint32
	lookupBuf []uint32
	sortBuf   []uint64
	trimBuf   []trimCand
}

// NewTree returns an empty tree for blocks of blockSize tokens.
func NewTree(blockSize int) *Tree {
	t := &Tree{
		blockSize: blockSize,
		nodes:     make([]node, 1, 64),
		kseed:     rand.Uint64(),
		epoch:     1,
		rankIDs:   make(map[Rank]uint32),
		overflow:  make(map[ovKey]uint32),
	}
	t.nodes[0].live = true
	return t
}

// BlockSize is the number of tokens per block of this partition.
func (t *Tree) BlockSize() int { return t.blockSize }

// Counts returns how many blocks were skipped or evicted, by reason.
func (t *Tree) Counts() [NumReasons]uint64 { return t.counts }

// Redundant returns how many blocks of redundant stores the tree has
// applied, over all ranks, since it was made (a restored tree starts at
// 0). A redundant store is a device-tier BlockStored, with the tokens of
// all its blocks, of a rank's main KV-cache group, every block of which
// the rank already held on the device as the next block of the chain the
// event continues: its parent (or the root, for an event without one)
// and then each of its hashes in order — so the event applied whole,
// adding one more device copy to every block and no new block. Events
// with a new block, a block held only in other tiers, a skipped block
// (hash_conflict, short_tokens, …), a store of another tier or an
// offload never count; an event counts all its blocks or none.
//
// vLLM sends such stores for a request with kv_cache_report_mode="full"
// (it re-reports the prefix-cache hits it reused), so a redundant store
// is most likely that; but two requests that computed the same blocks
// at once leave vLLM with real duplicate physical copies, which look the
// same. They are applied as copies either way; only their blocks are
// counted (docs/wire.md).
func (t *Tree) Redundant() uint64 { return t.redundant }

// RankRedundant returns how many blocks of redundant stores (see
// Redundant) r has sent since the tree first saw it: Clear and
// AllBlocksCleared keep the count, RemoveRank forgets it.
func (t *Tree) RankRedundant(r Rank) uint64 {
	if rid, ok := t.rankIDs[r]; ok {
		return t.ranks[rid].redundant
	}
	return 0
}

// TreeStats describes the size of a tree.
type TreeStats struct {
	// Entries counts indexed (block, rank) pairs, and (block, rank,
	// group) pairs of the non-main KV-cache groups of hybrid models
	// (GroupEntries of them): what the memory cap counts.
	Entries      int
	GroupEntries int
	Blocks       int // distinct block positions (prefix paths)
	Nodes        int // compressed edges
	Ranks        int
	Bytes        int64 // estimated heap bytes
}

// Stats reports the tree's size. It walks the nodes: O(nodes).
func (t *Tree) Stats() TreeStats {
	// Estimate: node structs, edge hashes and capacity, per-slot engine hash
	// and count, holder headers, children tries, published views (a view,
	// its holders' runs and its slot in the view chunks), and Go map slots
	// at their average load.
	b := int64(len(t.nodes)) * int64(unsafe.Sizeof(node{}))
	for i := range t.nodes {
		n := &t.nodes[i]
		b += int64(cap(n.hashes))*8 + int64(cap(n.ext))*8 + int64(cap(n.cnt))*4 + int64(cap(n.hold))*32 + int64(cap(n.gb))*8
		b += n.kids.bytes()
		if t.pub != nil && n.live {
			b += int64(unsafe.Sizeof(view{}))
		}
	}
	if t.pub != nil {
		b += int64(len(t.pub.chunks)) * int64(unsafe.Sizeof(viewChunk{}))
	}
	for i := range t.ranks {
		b += t.ranks[i].lookup.bytes() // rank lookups: 64-byte groups of 7 slots, directories
	}
	b += int64(t.gentries) * 30 // group sets: 16-byte slots
	return TreeStats{Entries: t.entries + t.gentries, GroupEntries: t.gentries, Blocks: t.blocks, Nodes: t.nnodes, Ranks: len(t.rankIDs), Bytes: b}
}

// RankBlocks returns how many blocks r holds (in any tier) in its main
// KV-cache group (see Groups for the others).
func (t *Tree) RankBlocks(r Rank) int {
	if rid, ok := t.rankIDs[r]; ok {
		return t.ranks[rid].lookup.len()
	}
	return 0
}

// Ranks returns the ranks that hold blocks or have a watermark, unordered.
func (t *Tree) Ranks() []Rank {
	out := make([]Rank, 0, len(t.rankIDs))
	for r := range t.rankIDs {
		out = append(out, r)
	}
	return out
}

// Holds reports the tier counts of engine hash h for rank r.
func (t *Tree) Holds(r Rank, h uint64) (counts [NumTiers]uint32, ok bool) {
	rid, ok := t.rankIDs[r]
	if !ok {
		return counts, false
	}
	r0, ok := t.ranks[rid].lookup.get(t, rid, h)
	if !ok {
		return counts, false
	}
	l := t.locOf(r0)
	hi := t.holderIndex(l.node, rid)
	for tier := Tier(0); tier < NumTiers; tier++ {
		counts[tier] = t.tierCount(l.node, hi, l.pos, tier)
	}
	return counts, true
}

// Watermark returns the last batch sequence number applied for r.
func (t *Tree) Watermark(r Rank) (seq uint64, ok bool) {
	if rid, found := t.rankIDs[r]; found {
		return t.ranks[rid].seq, t.ranks[rid].hasSeq
	}
	return 0, false
}

// WatermarkDigest returns the digest recorded with r's watermark (0 if none).
func (t *Tree) WatermarkDigest(r Rank) uint64 {
	if rid, found := t.rankIDs[r]; found {
		return t.ranks[rid].digest
	}
	return 0
}

// SetWatermarkDigest records seq as the last batch applied for r, and the
// digest of that batch.
func (t *Tree) SetWatermarkDigest(r Rank, seq, digest uint64) {
	rid := t.rankID(r)
	t.ranks[rid].seq, t.ranks[rid].hasSeq, t.ranks[rid].digest = seq, true, digest
}

// SetWatermark records seq as the last batch applied for r.
func (t *Tree) SetWatermark(r Rank, seq uint64) {
	rid := t.rankID(r)
	t.ranks[rid].seq, t.ranks[rid].hasSeq = seq, true
}

// RankTierBlocks returns how many blocks r holds in each tier (a block
// with copies in several tiers counts in each).
func (t *Tree) RankTierBlocks(r Rank) [NumTiers]int {
	if rid, ok := t.rankIDs[r]; ok {
		return t.ranks[rid].tiers
	}
	return [NumTiers]int{}
}

// Truncated reports whether r lost entries other than by its engine's own
// events — to the memory cap (Evict) or to its capacity (EnforceCapacity)
// — since r was first seen or last cleared (Clear, AllBlocksCleared). A
// truncated rank's entries are a strict subset of what its engine holds.
func (t *Tree) Truncated(r Rank) bool {
	if rid, ok := t.rankIDs[r]; ok {
		return t.ranks[rid].truncated
	}
	return false
}

// now returns the LRU clock's current time: one tick after the last store
// (stores advance the clock by two), so that a match stamps the nodes it
// visits as more recent than every store before it and less recent than
// every store after it.
func (t *Tree) now() uint32 {
	if t.shared != nil {
		return t.shared.Load() + 1
	}
	return atomic.LoadUint32(&t.clock) + 1
}

// age is how many clock ticks ago stamp was, as of now; a stamp newer than
// now (written after now was read) has age 0. The clock may wrap: ages
// are exact below 2³¹ ticks.
func age(now, stamp uint32) uint32 {
	if d := now - stamp; int32(d) > 0 {
		return d
	}
	return 0
}

// newer returns the more recent of two stamps.
func newer(a, b uint32) uint32 {
	if int32(a-b) >= 0 {
		return a
	}
	return b
}

// rankMemo is a rank and its id.
type rankMemo struct {
	r  Rank
	id uint32
	ok bool
}

// rid returns r's id, if r is known: a batch's ops name one rank, which
// the memo spares them a map lookup each. It writes the memo, so only
// writers call it (readers under the read lock use rankIDs).
func (t *Tree) rid(r Rank) (uint32, bool) {
	if t.memo.ok && t.memo.r == r {
		return t.memo.id, true
	}
	id, ok := t.rankIDs[r]
	if ok {
		t.memo = rankMemo{r, id, true}
	}
	return id, ok
}

func (t *Tree) rankID(r Rank) uint32 {
	if rid, ok := t.rid(r); ok {
		return rid
	}
	rid := allocSlot(&t.ranks, &t.freeRanks)
	t.ranks[rid] = rankState{rank: r}
	t.rankIDs[r] = rid
	t.touchRanks()
	return rid
}

// ---- events ----

// Apply applies one op for rank r, to the KV-cache group op.Group names
// (see Group). The returned error (an *OpError, or nil) describes blocks
// that were skipped; the rest of the op was applied.
func (t *Tree) Apply(r Rank, op Op) error { return t.apply(r, &op) }

// apply is Apply with op by reference (an Op is 168 bytes).
func (t *Tree) apply(r Rank, op *Op) error {
	switch op.Kind {
	case OpStore:
		return t.storeGroup(r, &op.Group, &op.Store)
	case OpRemove:
		return t.removeGroup(r, &op.Group, &op.Remove)
	case OpClear:
		t.Clear(r)
		return nil
	}
	return fmt.Errorf("rank %v: unknown op kind %d", r, op.Kind)
}

func (t *Tree) fail(r Rank, reason Reason, h uint64, blocks int) error {
	t.counts[reason] += uint64(blocks)
	return &OpError{Rank: r, Reason: reason, Hash: h, Blocks: blocks}
}

// warm loads the lookup groups that r's stores and removes among ops will
// probe first (see lookup.warm), so that their cache misses overlap: an
// engine's events are of one or two blocks each (a request's new blocks,
// an eviction), and each block's probe is a miss in a table far larger
// than the caches; one after another, each waited for its own. Warming
// the removes' engine hashes too (a second miss each, through the ref)
// made the replay slower: those loads wait for the groups'.
func (t *Tree) warm(r Rank, ops []Op) {
	rid, ok := t.rid(r)
	if !ok {
		return
	}
	lk := &t.ranks[rid].lookup
	for i := range ops {
		switch op := &ops[i]; op.Kind {
		case OpStore:
			t.sink += lk.warm(op.Store.Hashes)
		case OpRemove:
			t.sink += lk.warm(op.Remove.Hashes)
		}
	}
}

// Store applies a BlockStored event of KV-cache group 0, full attention
// (the zero Group), for r: Apply of an OpStore with no Group.
func (t *Tree) Store(r Rank, s Stored) error { return t.storeGroup(r, &Group{}, &s) }

// storeMain applies a store of r's main group to the tree. rid is r's
// slot if known (the caller looked it up); an unknown rank gets one only
// once the store is valid.
func (t *Tree) storeMain(r Rank, rid uint32, known bool, s *Stored) error {
	t.clock += 2 // odd ticks are for matches (see now)
	if len(s.Tokens) == 0 && s.Tier != TierDevice {
		return t.offload(r, rid, known, s)
	}
	if s.BlockSize != t.blockSize {
		return t.fail(r, ReasonBlockSize, s.Hashes[0], len(s.Hashes))
	}
	// A piece of a larger store (pieces.go) was checked with the whole
	// store: its hashes are part of the whole's, its parent the one before.
	if !t.piece && t.selfReferencing(s) {
		return t.fail(r, ReasonSelfReference, s.Hashes[0], len(s.Hashes))
	}
	if !known {
		rid = t.rankID(r)
	}
	lk := &t.ranks[rid].lookup
	cur := loc{0, ^uint32(0)} // the last placed block; at the root, before its (empty) edge
	prevExt, hasPrev := s.Parent, s.HasParent
	if s.HasParent {
		pr, ok := lk.get(t, rid, s.Parent)
		if !ok {
			return t.fail(r, ReasonParentNotFound, s.Parent, len(s.Hashes))
		}
		cur = t.locOf(pr)
	}
	usable := min(len(s.Hashes), len(s.Tokens)/t.blockSize)
	t.localBuf = HashBlocks(t.localBuf[:0], s.Tokens[:usable*t.blockSize], t.blockSize, s.Seed)
	local := t.localBuf
	t.touched = t.touched[:0]
	// red: every block so far was a device copy of a block the rank held
	// on the device, as the next block of its chain (see Redundant).
	red := s.Tier == TierDevice && usable == len(s.Hashes)
	var err error
	for i := 0; i < usable; i++ {
		x := s.Hashes[i]
		xr, ok, slot := lk.probe(t, rid, x)
		if ok {
			// A copy of a block the rank holds: it must be the next block.
			l := t.locOf(xr)
			if !t.isNext(cur, l, local[i]) {
				err = t.fail(r, ReasonHashConflict, x, len(s.Hashes)-i)
				break
			}
			h := t.holderIndex(l.node, rid)
			if !t.incCount(l.node, h, l.pos, s.Tier) {
				red = false
			}
			t.afterCount(l, h)
			cur, prevExt, hasPrev = l, x, true
			continue
		}
		red = false
		tgt := t.descend(cur, local[i], rid)
		h := t.holderIndex(tgt.node, rid)
		if h < 0 && tgt.pos == 0 {
			h = t.addHolder(tgt.node, rid, prevExt, hasPrev)
		}
		n := &t.nodes[tgt.node]
		if h < 0 || n.hold[h].cut != tgt.pos {
			// The rank holds this block under another engine hash.
			err = t.fail(r, ReasonHashConflict, x, len(s.Hashes)-i)
			break
		}
		n = t.ownHold(tgt.node)
		i0 := int(tgt.pos)*len(n.hold) + h
		n.ext[i0] = x
		n.cnt[i0] = 1 << (8 * s.Tier)
		if rg := t.ranks[rid].groups; rg != nil && rg.entries > 0 {
			m := t.groupMask(rg, x)
			t.setBits(tgt.node, i0, m)
			n := bits.OnesCount64(m) // entries that are orphans no more
			rg.orphans -= n
			t.norphans -= n
		}
		t.ranks[rid].tiers[s.Tier]++
		n.hold[h].cut++
		t.entries++
		lk.insertAt(t, rid, x, ref{tgt.node, n.depth + tgt.pos}, slot)
		t.afterCount(tgt, h)
		if k := len(t.touched); k == 0 || t.touched[k-1] != tgt.node {
			t.touched = append(t.touched, tgt.node)
		}
		cur, prevExt, hasPrev = tgt, x, true
	}
	for _, id := range t.touched {
		t.tidy(id)
	}
	if red && err == nil {
		n := uint64(len(s.Hashes))
		if t.piece {
			t.pieceRed += n // the whole op decides (applyPieces)
		} else {
			t.redundant += n
			t.ranks[rid].redundant += n
		}
	}
	if err == nil && usable < len(s.Hashes) {
		err = t.fail(r, ReasonShortTokens, s.Hashes[usable], len(s.Hashes)-usable)
	}
	return err
}

// afterCount updates holder h's runs after the counts at l changed.
func (t *Tree) afterCount(l loc, h int) {
	t.updateRun(l.node, h, l.pos)
	t.nodes[l.node].stamp = t.clock
}

// isNext reports whether block l (with local hash lh) directly follows cur.
func (t *Tree) isNext(cur, l loc, lh uint64) bool {
	n := &t.nodes[l.node]
	if n.hashes[l.pos] != lh {
		return false
	}
	if l.pos > 0 {
		return l.node == cur.node && l.pos == cur.pos+1
	}
	return n.parent == cur.node && cur.pos+1 == uint32(len(t.nodes[cur.node].hashes))
}

// descend finds or makes the position of the block with local hash lh
// right after cur, which rid holds: the next block of cur's edge, the first
// block of a child, a new block appended to rid's own leaf, or a new child.
func (t *Tree) descend(cur loc, lh uint64, rid uint32) loc {
	L := uint32(len(t.nodes[cur.node].hashes))
	next := cur.pos + 1
	if next < L {
		if t.nodes[cur.node].hashes[next] == lh {
			return loc{cur.node, next}
		}
		cur.node, _ = t.split(cur.node, int(next))
		L = next
	}
	if c, ok := t.child(cur.node, lh); ok {
		return loc{c, 0}
	}
	if n := &t.nodes[cur.node]; cur.node != 0 && n.nchild == 0 {
		// cur is rid's last block of a leaf: extend the edge. Other
		// holders keep their shorter prefixes.
		appendHash(n, lh)
		t.touch(cur.node)
		for range n.hold {
			n.ext = appendGrow(n.ext, 0)
			n.cnt = appendGrow(n.cnt, 0)
			if n.gb != nil {
				n.gb = appendGrow(n.gb, 0)
			}
		}
		t.blocks++
		return loc{cur.node, L}
	}
	return loc{t.allocNode(cur.node, []uint64{lh}), 0}
}

// selfReferencing reports whether s repeats one of its hashes or holds
// its parent among them. A short event is compared pairwise; a longer one
// goes through a hash set (Tree.repeats: O(n)), or, if the set gives up
// on a long probe, is sorted.
func (t *Tree) selfReferencing(s *Stored) bool {
	hs := s.Hashes
	if len(hs) <= 16 {
		for i, h := range hs {
			if s.HasParent && h == s.Parent {
				return true
			}
			for _, g := range hs[:i] {
				if g == h {
					return true
				}
			}
		}
		return false
	}
	if dup, ok := t.repeats(hs, s.Parent, s.HasParent, repeatsMaxProbe); ok {
		return dup
	}
	t.sortBuf = append(t.sortBuf[:0], hs...)
	slices.Sort(t.sortBuf)
	for i := 1; i < len(t.sortBuf); i++ {
		if t.sortBuf[i] == t.sortBuf[i-1] {
			return true
		}
	}
	if s.HasParent {
		_, found := slices.BinarySearch(t.sortBuf, s.Parent)
		return found
	}
	return false
}

// offload adds s.Tier to blocks r already holds (an offload event carries
// no tokens); unknown blocks are skipped and counted.
func (t *Tree) offload(r Rank, rid uint32, known bool, s *Stored) error {
	if !known {
		return t.fail(r, ReasonOffloadUnknown, s.Hashes[0], len(s.Hashes))
	}
	lk := &t.ranks[rid].lookup
	missing, first := 0, uint64(0)
	for _, x := range s.Hashes {
		xr, ok := lk.get(t, rid, x)
		if !ok {
			if missing == 0 {
				first = x
			}
			missing++
			continue
		}
		l := t.locOf(xr)
		h := t.holderIndex(l.node, rid)
		t.incCount(l.node, h, l.pos, s.Tier)
		t.afterCount(l, h)
	}
	if missing > 0 {
		return t.fail(r, ReasonOffloadUnknown, first, missing)
	}
	return nil
}

// Remove applies a BlockRemoved event of KV-cache group 0 (the zero
// Group) for r: one copy of each hash leaves the tier. Hashes r does not
// hold there are skipped and counted.
func (t *Tree) Remove(r Rank, rm Removed) error { return t.removeGroup(r, &Group{}, &rm) }

// removeMain applies a remove of r's main group to the tree; rid is r's
// slot if known.
func (t *Tree) removeMain(r Rank, rid uint32, known bool, rm *Removed) error {
	if !known {
		if len(rm.Hashes) == 0 {
			return nil
		}
		return t.fail(r, ReasonBlockNotFound, rm.Hashes[0], len(rm.Hashes))
	}
	lk := &t.ranks[rid].lookup
	missing, first := 0, uint64(0)
	for _, x := range rm.Hashes {
		xr, ok, a := lk.getAt(t, rid, x)
		h := -1
		var l loc
		if ok {
			l = t.locOf(xr)
			h = t.holderIndex(l.node, rid)
		}
		if h < 0 || t.tierCount(l.node, h, l.pos, rm.Tier) == 0 {
			if missing == 0 {
				first = x
			}
			missing++
			continue
		}
		if !t.decCount(l.node, h, l.pos, rm.Tier) {
			t.updateRun(l.node, h, l.pos)
			continue
		}
		t.dropBlock(rid, l, h, &a)
	}
	if missing > 0 {
		return t.fail(r, ReasonBlockNotFound, first, missing)
	}
	return nil
}

// dropBlock takes block l (now held in no tier) from holder h = rid. The
// common eviction, the last block of the rank's prefix, only shortens the
// prefix; a block inside it splits the edge after the block first. a, if
// not nil, is where the rank's lookup holds the block (a split rewrites
// refs in place: slots do not move).
func (t *Tree) dropBlock(rid uint32, l loc, h int, a *at) {
	id := l.node
	if l.pos+1 < t.nodes[id].hold[h].cut {
		id, _ = t.split(id, int(l.pos)+1)
		h = t.holderIndex(id, rid)
	}
	n := t.ownHold(id)
	i := int(l.pos)*len(n.hold) + h
	if lk := &t.ranks[rid].lookup; a != nil {
		lk.delAt(*a)
	} else {
		lk.del(n.ext[i], ref{id, n.depth + l.pos})
	}
	n.ext[i], n.cnt[i] = 0, 0
	if n.gb != nil {
		t.adoptOrphans(rid, n.gb[i])
		n.gb[i] = 0
	}
	hd := &n.hold[h]
	hd.cut--
	hd.dev, hd.host = min(hd.dev, hd.cut), min(hd.host, hd.cut)
	t.entries--
	if hd.cut == 0 {
		t.removeHolder(id, h)
	}
	t.tidy(id)
}

// Clear drops every block r holds (AllBlocksCleared), in every KV-cache
// group, forgets its groups and clears its truncated flag; its watermark
// and capacity stay.
func (t *Tree) Clear(r Rank) {
	rid, ok := t.rid(r)
	if !ok {
		return
	}
	t.clearRank(rid)
}

func (t *Tree) clearRank(rid uint32) {
	t.clearMain(rid)
	t.clearGroups(rid)
	rs := &t.ranks[rid]
	rs.truncated, rs.main, rs.hasMain, rs.foreignWhy = false, groupInfo{}, false, ""
}

// clearMain drops rid's tree holdings (its main group's blocks).
func (t *Tree) clearMain(rid uint32) {
	lk := &t.ranks[rid].lookup
	t.touched = append(t.touched[:0], t.lookupNodes(lk)...)
	lk.reset() // removeHolder's deletes then find nothing
	for _, id := range t.touched {
		if h := t.holderIndex(id, rid); h >= 0 {
			t.removeHolder(id, h)
		}
	}
	for _, id := range t.touched {
		t.tidy(id)
	}
	t.ranks[rid].tiers = [NumTiers]int{}
}

// RemoveRank drops r's blocks and forgets r (its watermark, capacity and
// truncated flag).
func (t *Tree) RemoveRank(r Rank) {
	rid, ok := t.rid(r)
	if !ok {
		return
	}
	t.clearRank(rid)
	delete(t.rankIDs, r)
	t.memo = rankMemo{}
	t.ranks[rid] = rankState{}
	t.freeRanks = append(t.freeRanks, rid)
	t.touchRanks()
}

// RemoveWorker removes every rank of worker id.
func (t *Tree) RemoveWorker(id uint64) {
	for r := range t.rankIDs {
		if r.WorkerID == id {
			t.RemoveRank(r)
		}
	}
}
