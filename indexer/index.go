package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// PartitionKey names one index partition: a model and a routing group.
type PartitionKey struct {
	Model string
	Group string
}

func (k PartitionKey) String() string { return k.Model + ":" + k.Group }

// Options configure an Index. The zero value is an unbounded index.
type Options struct {
	// MaxEntries caps the indexed (block, rank) entries over all
	// partitions; 0 means no cap. When a write takes the total past it,
	// the least recently stored or matched leaves of the whole index go
	// first, whichever partition holds them, down to 31/32 of the cap
	// (see Index.ApplyBatch). MaxEntriesForMemory derives a cap from a
	// memory budget.
	MaxEntries int
	// WriteChunk bounds the blocks a batch applies under one hold of its
	// partition's write lock, so that a query waits for at most that
	// much work (see Index.ApplyBatch); 0 means DefaultWriteChunk.
	WriteChunk int
}

var (
	// ErrNoPartition: the partition was never added, or was removed.
	ErrNoPartition = errors.New("no such partition")
	// ErrBlockSizeConflict: a partition exists with another block size.
	ErrBlockSizeConflict = errors.New("block size conflicts with the partition's")
)

// Index is the concurrent prefix index: one Tree per partition. A batch
// is applied in holds of its partition's write lock of at most
// Options.WriteChunk blocks each, so a query waits for at most one such
// chunk, never for a whole batch; the chunks of concurrent batches (of
// different ranks) interleave, each batch's ops in order. Matchers run
// concurrently with each other. Snapshot sees every batch whole or not at
// all; Rank, Groups, Stats and Read may see a batch that runs
// concurrently with them half applied. All methods are safe for
// concurrent use.
//
// Lock order: a partition's gate before its mu, never the gate while
// holding mu; mu (the map's) is never held while waiting for a
// partition's lock, and a partition's lock never while taking another's;
// evictMu is taken with no partition lock held, and the evictor holds one
// partition lock at a time under it.
type Index struct {
	opts  Options
	mu    sync.RWMutex // guards parts (the map, not the partitions)
	parts map[PartitionKey]*partition
	total atomic.Int64 // Σ partition entries (as published by each partition)
	// clock is the LRU clock shared by every tree of a capped index, so
	// that stamps compare across partitions: each batch reserves two ticks
	// per op (see Tree.now).
	clock atomic.Uint32

	evictMu  sync.Mutex // serialises evictors; guards evictBuf and budgets
	evictBuf []leaf
	budgets  []int
}

type partition struct {
	blockSize int // immutable
	// gate is held shared by each ApplyBatch for the whole batch (across
	// the write-lock holds it is applied in, see Options.WriteChunk), and
	// exclusively by Snapshot, Restore and RemovePartition: it guards the
	// batch's atomicity (no snapshot sees a batch half applied) and
	// p.tree's identity while a batch runs. Taken before mu, never while
	// holding it.
	gate    sync.RWMutex
	mu      sync.RWMutex // guards tree and entries; held for at most Options.WriteChunk blocks of a batch at a time
	tree    *Tree
	entries int64 // tree.entries + tree.gentries as last added to Index.total
	// removed is set (under mu) by RemovePartition; a writer that found
	// the partition before then sees it once it holds mu and backs off.
	removed atomic.Bool
}

// New returns an empty index.
func New(opts Options) *Index {
	if opts.WriteChunk <= 0 {
		opts.WriteChunk = DefaultWriteChunk
	}
	return &Index{opts: opts, parts: make(map[PartitionKey]*partition)}
}

// AddPartition creates partition k with blockSize tokens per block, or
// checks that an existing one has that block size.
func (ix *Index) AddPartition(k PartitionKey, blockSize int) error {
	if blockSize <= 0 {
		return fmt.Errorf("partition %v: block size %d must be positive", k, blockSize)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if p, ok := ix.parts[k]; ok && !p.removed.Load() {
		if p.blockSize != blockSize {
			return fmt.Errorf("partition %v: block size %d, have %d: %w", k, blockSize, p.blockSize, ErrBlockSizeConflict)
		}
		return nil
	}
	ix.parts[k] = &partition{blockSize: blockSize, tree: ix.adopt(NewTree(blockSize))}
	return nil
}

// adopt makes t one of the index's trees: on the shared LRU clock, with
// every node stamped now, when the index is capped.
func (ix *Index) adopt(t *Tree) *Tree {
	if ix.opts.MaxEntries > 0 {
		t.trackLRU = true
		t.shared = &ix.clock
		t.clock = ix.clock.Load()
		now := t.now()
		for id := range t.nodes {
			t.nodes[id].stamp = now
		}
	}
	return t
}

// BlockSize returns partition k's block size.
func (ix *Index) BlockSize(k PartitionKey) (int, error) {
	p, err := ix.partition(k)
	if err != nil {
		return 0, err
	}
	return p.blockSize, nil
}

func (ix *Index) partition(k PartitionKey) (*partition, error) {
	ix.mu.RLock()
	p, ok := ix.parts[k]
	ix.mu.RUnlock()
	if !ok || p.removed.Load() {
		return nil, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	return p, nil
}

// lock returns partition k write-locked, or ErrNoPartition.
func (ix *Index) lock(k PartitionKey) (*partition, error) {
	p, err := ix.partition(k)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.removed.Load() {
		p.mu.Unlock()
		return nil, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	return p, nil
}

// Partitions returns the partition keys, unordered.
func (ix *Index) Partitions() []PartitionKey {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]PartitionKey, 0, len(ix.parts))
	for k, p := range ix.parts {
		if !p.removed.Load() {
			out = append(out, k)
		}
	}
	return out
}

// Entries returns the indexed (block, rank) entries over all partitions,
// as the memory cap counts them.
func (ix *Index) Entries() int { return int(ix.total.Load()) }

// MaxEntries returns the configured cap (Options.MaxEntries; 0 = none).
func (ix *Index) MaxEntries() int { return ix.opts.MaxEntries }

// RemovePartition drops partition k with everything in it — its tree, its
// ranks and their watermarks — and its entries from the index total. A
// partition added again under k starts empty and may have another block
// size. It returns ErrNoPartition if k does not exist. Writes to k that
// race with the removal either complete before it or fail with
// ErrNoPartition.
func (ix *Index) RemovePartition(k PartitionKey) error {
	_, err := ix.removePartition(k, false)
	return err
}

// RemoveEmptyPartition removes partition k (as RemovePartition) only if no
// rank is known there (RankCount is 0), checked atomically with the
// removal, and reports whether it did.
func (ix *Index) RemoveEmptyPartition(k PartitionKey) (bool, error) {
	return ix.removePartition(k, true)
}

func (ix *Index) removePartition(k PartitionKey, ifEmpty bool) (bool, error) {
	p, err := ix.partition(k)
	if err != nil {
		return false, err
	}
	p.gate.Lock() // no batch in flight
	defer p.gate.Unlock()
	p.mu.Lock()
	if p.removed.Load() {
		p.mu.Unlock()
		return false, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	if ifEmpty && len(p.tree.rankIDs) > 0 {
		p.mu.Unlock()
		return false, nil
	}
	p.removed.Store(true)
	ix.total.Add(-p.entries)
	p.entries = 0
	p.mu.Unlock()
	ix.mu.Lock()
	if ix.parts[k] == p { // not already replaced by a new AddPartition
		delete(ix.parts, k)
	}
	ix.mu.Unlock()
	return true, nil
}

// RankCount returns how many ranks partition k knows: ranks that hold
// blocks, have a watermark or have a capacity.
func (ix *Index) RankCount(k PartitionKey) (int, error) {
	p, err := ix.partition(k)
	if err != nil {
		return 0, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.tree.rankIDs), nil
}

// SetRankCapacity limits how many blocks rank r of partition k may hold in
// each tier, over all its KV-cache groups (an engine's groups share its
// block pool; 0 in a tier: unlimited there; the zero Capacity removes the
// limit). After every batch for r, and at once if r already holds more,
// r's least recently used blocks in a tier past its limit are dropped down
// to 31/32 of it (Tree.EnforceCapacity), counted as ReasonRankCapacity,
// and r is marked truncated. Set it before r's first batch; it lasts until
// RemoveRank (RemoveWorker) or RemovePartition, and Restore keeps it.
func (ix *Index) SetRankCapacity(k PartitionKey, r Rank, c Capacity) error {
	p, err := ix.lock(k)
	if err != nil {
		return err
	}
	p.tree.SetCapacity(r, c)
	ix.publish(p)
	p.mu.Unlock()
	return nil
}

// BatchResult tells what applying one batch skipped.
type BatchResult struct {
	// Skipped counts blocks not applied, by reason, and blocks the batch
	// made the index drop: Skipped[ReasonRankCapacity] from the batch's
	// rank, Skipped[ReasonEvicted] by the memory cap from any partition
	// (Stats counts each where it happened).
	Skipped [NumReasons]uint64
	// Redundant counts the blocks of the batch's redundant stores:
	// device copies of blocks the rank already held there, on the chain
	// it already held (see Tree.Redundant). They were applied.
	Redundant uint64
	Errs      []error // the *OpError of each op that skipped blocks
}

// Apply applies the ops of one engine batch for rank r in order and records
// seq as r's watermark, atomically with respect to Snapshot and Match.
func (ix *Index) Apply(k PartitionKey, r Rank, seq uint64, ops []Op) (BatchResult, error) {
	return ix.ApplyBatch(k, r, Mark{Seq: seq}, ops)
}

// Mark is what a batch records for its rank together with its ops, under
// the same lock, so that a Snapshot sees a rank's state as of one batch:
// the watermark (the batch's seq and the digest of its payload) and the
// stream layer's word on the rank after it — degraded (its history is
// known to be incomplete) and why.
type Mark struct {
	Seq, Digest uint64
	Degraded    bool
	Reason      string // why it is degraded; "" when it is not
	// Foreign: the batch came on another rank's stream, stamped with r by
	// a publisher that carries several ranks. r's watermark is not that
	// stream's and stays as it is; Degraded marks r degraded (until an
	// AllBlocksCleared of r empties it) but a foreign batch never lifts
	// the flag r's own stream set.
	Foreign bool
}

// ApplyBatch is Apply that records m with the batch (see Mark and
// Tree.SetWatermarkDigest). It releases the partition's write lock after
// every Options.WriteChunk blocks (an op of more blocks is applied in
// pieces, with the effect and the counts of the whole op), so queries and
// other ranks' batches run in between; BatchResult counts only this
// batch. After the ops it enforces r's capacity (SetRankCapacity). Then, with partition k's lock released, if
// the index is over its cap it evicts the least recently stored or
// matched leaves of the whole index (Index.evict); so the cap may be
// exceeded briefly by batches in flight, never by a returned one.
func (ix *Index) ApplyBatch(k PartitionKey, r Rank, m Mark, ops []Op) (BatchResult, error) {
	var res BatchResult
	p, err := ix.partition(k)
	if err != nil {
		return res, err
	}
	// The gate, shared for the whole batch, keeps Snapshot, Restore and
	// RemovePartition out until the batch is applied: p.tree stays t, and
	// a dump never sees the batch half applied.
	p.gate.RLock()
	p.mu.Lock()
	if p.removed.Load() {
		p.mu.Unlock()
		p.gate.RUnlock()
		return res, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	t, chunk := p.tree, ix.opts.WriteChunk
	if t.shared != nil {
		// Reserve two ticks per op piece on the shared clock; the stores
		// of the batch stamp within them (see Tree.now).
		var n uint32
		for i := range ops {
			n += 2 * uint32(max(1, (opBlocks(&ops[i])+chunk-1)/chunk))
		}
		t.clock = ix.clock.Add(n) - n
	}
	before, redundant := t.counts, t.redundant
	// yield ends one hold of the write lock and starts the next: what the
	// hold skipped and found redundant is the batch's, and the batch's
	// clock cursor is put back for its next stores.
	yield := func() {
		for i := range res.Skipped {
			res.Skipped[i] += t.counts[i] - before[i]
		}
		res.Redundant += t.redundant - redundant
		clock := t.clock
		p.mu.Unlock()
		p.mu.Lock()
		t.clock = clock
		before, redundant = t.counts, t.redundant
	}
	budget := chunk
	for i := range ops {
		op := &ops[i]
		var err error
		if n := t.pieces(r, op, chunk); n > 1 {
			if budget < chunk {
				yield()
			}
			err = t.applyPieces(r, op, chunk, yield)
			budget = chunk - (opBlocks(op) - (n-1)*chunk)
		} else {
			err = t.Apply(r, *op)
			budget -= max(1, opBlocks(op))
		}
		if err != nil {
			res.Errs = append(res.Errs, err)
		}
		if budget <= 0 && i+1 < len(ops) {
			yield()
			budget = chunk
		}
	}
	rid := t.rankID(r)
	rs := &t.ranks[rid]
	switch {
	case !m.Foreign:
		rs.seq, rs.hasSeq, rs.digest = m.Seq, true, m.Digest
		rs.degraded, rs.degradedWhy = m.Degraded, m.Reason
	case m.Degraded && rs.foreignWhy == "":
		rs.foreignWhy = m.Reason
	}
	t.enforceCapacity(rid)
	for i := range res.Skipped {
		res.Skipped[i] += t.counts[i] - before[i]
	}
	res.Redundant += t.redundant - redundant
	over := ix.publish(p)
	p.mu.Unlock()
	p.gate.RUnlock()
	if over {
		res.Skipped[ReasonEvicted] += ix.evict()
	}
	return res, nil
}

// opBlocks is how many blocks op stores or removes.
func opBlocks(op *Op) int {
	switch op.Kind {
	case OpStore:
		return len(op.Store.Hashes)
	case OpRemove:
		return len(op.Remove.Hashes)
	}
	return 0
}

// publish adds p's entry change to the index total and reports whether
// the total is now over the cap. p.mu must be held.
func (ix *Index) publish(p *partition) (over bool) {
	n := int64(p.tree.entries + p.tree.gentries)
	total := ix.total.Add(n - p.entries)
	p.entries = n
	return ix.opts.MaxEntries > 0 && total > int64(ix.opts.MaxEntries)
}

// evict brings the index total down to 31/32 of the cap, evicting the
// least recently stored or matched leaves first, whichever partition they
// are in, and returns the entries evicted. It must be called with no
// partition lock held.
//
// A round reads every partition's leaves and their ages on the shared
// clock, one partition at a time under its read lock; picks the oldest
// leaves of the whole index that cover the excess, which gives an age
// threshold and a budget of entries per partition; then takes each
// partition's write lock in turn and evicts its leaves at least that old,
// oldest first, up to its budget (evictOld). Writes that happen between
// the two steps only make leaves younger (skipped) or add new ones (left
// for the next round); rounds repeat while the total is still over the
// low-water mark and the last one made progress.
func (ix *Index) evict() uint64 {
	max := int64(ix.opts.MaxEntries)
	low := max - max/32
	ix.evictMu.Lock()
	defer ix.evictMu.Unlock()
	var dropped uint64
	if ix.total.Load() <= max {
		return 0 // another writer's evictor got there first
	}
	for round := 0; round < 8; round++ {
		over := ix.total.Load() - low
		if over <= 0 {
			break
		}
		ix.mu.RLock()
		parts := make([]*partition, 0, len(ix.parts))
		for _, p := range ix.parts {
			parts = append(parts, p)
		}
		ix.mu.RUnlock()
		now := ix.clock.Load() + 1 // as Tree.now
		cands := ix.evictBuf[:0]
		for i, p := range parts {
			p.mu.RLock()
			if !p.removed.Load() {
				cands = p.tree.appendLeaves(cands, uint32(i), now)
			}
			p.mu.RUnlock()
		}
		ix.evictBuf = cands
		slices.SortFunc(cands, func(a, b leaf) int { return cmp.Compare(b.age, a.age) })
		ix.budgets = slices.Grow(ix.budgets[:0], len(parts))[:len(parts)]
		clear(ix.budgets)
		var minAge uint32
		for sum := int64(0); len(cands) > 0 && sum < over; cands = cands[1:] {
			ix.budgets[cands[0].part] += int(cands[0].entries)
			sum += int64(cands[0].entries)
			minAge = cands[0].age
		}
		progress := false
		for i, p := range parts {
			if ix.budgets[i] == 0 {
				continue
			}
			p.mu.Lock()
			if !p.removed.Load() {
				if d := p.tree.evictOld(now, minAge, ix.budgets[i]); d > 0 {
					dropped += uint64(d)
					progress = true
				}
				ix.publish(p)
			}
			p.mu.Unlock()
		}
		if !progress {
			break
		}
	}
	return dropped
}

// mutate runs f on partition k's tree under its write lock (for removals
// and clears that come from outside an engine batch).
func (ix *Index) mutate(k PartitionKey, f func(*Tree)) error {
	p, err := ix.lock(k)
	if err != nil {
		return err
	}
	f(p.tree)
	ix.publish(p)
	p.mu.Unlock()
	return nil
}

// Clear drops every block of r in partition k and clears r's truncated
// flag (its watermark and capacity stay).
func (ix *Index) Clear(k PartitionKey, r Rank) error {
	return ix.mutate(k, func(t *Tree) { t.Clear(r) })
}

// Reset starts rank r of partition k over, as the stream layer does when
// the rank's history is lost or a new engine incarnation begins: its
// blocks and its watermark go, its capacity stays, and it is recorded as
// degraded (with why) or not, in one step — a Snapshot never sees the
// old watermark over the emptied blocks, nor the blocks without the
// flag.
func (ix *Index) Reset(k PartitionKey, r Rank, degraded bool, reason string) error {
	return ix.mutate(k, func(t *Tree) {
		t.Clear(r)
		rs := &t.ranks[t.rankID(r)]
		rs.seq, rs.hasSeq, rs.digest = 0, false, 0
		rs.degraded, rs.degradedWhy = degraded, reason
	})
}

// RemoveRank removes r from partition k: its blocks, its watermark, its
// capacity and its truncated flag.
func (ix *Index) RemoveRank(k PartitionKey, r Rank) error {
	return ix.mutate(k, func(t *Tree) { t.RemoveRank(r) })
}

// RemoveWorker removes every rank of worker id from every partition.
func (ix *Index) RemoveWorker(id uint64) {
	for _, k := range ix.Partitions() {
		_ = ix.mutate(k, func(t *Tree) { t.RemoveWorker(id) })
	}
}

// Match appends to dst the overlap of each rank with the local block
// hashes q in partition k. dst is the caller's; Match keeps no reference.
func (ix *Index) Match(k PartitionKey, q []uint64, dst []Overlap) ([]Overlap, error) {
	p, err := ix.partition(k)
	if err != nil {
		return dst, err
	}
	p.mu.RLock()
	dst = p.tree.Match(q, dst)
	p.mu.RUnlock()
	return dst, nil
}

var hashPool = sync.Pool{New: func() any { s := make([]uint64, 0, 1024); return &s }}

// MatchTokens hashes tokens (complete blocks only, with seed from
// Seed(lora, namespace)) and matches them in partition k.
func (ix *Index) MatchTokens(k PartitionKey, tokens []uint32, seed uint64, dst []Overlap) ([]Overlap, error) {
	p, err := ix.partition(k)
	if err != nil {
		return dst, err
	}
	bp := hashPool.Get().(*[]uint64)
	q := HashBlocks((*bp)[:0], tokens, p.blockSize, seed)
	p.mu.RLock()
	dst = p.tree.Match(q, dst)
	p.mu.RUnlock()
	*bp = q
	hashPool.Put(bp)
	return dst, nil
}

// Snapshot dumps partition k; the watermarks describe exactly the state
// dumped.
func (ix *Index) Snapshot(k PartitionKey) (*Snapshot, error) {
	p, err := ix.partition(k)
	if err != nil {
		return nil, err
	}
	p.gate.Lock() // every batch whole or not at all
	defer p.gate.Unlock()
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tree.Dump(), nil
}

// Restore replaces partition k (created if missing) with the snapshot.
// Capacities set on the partition's ranks (SetRankCapacity) carry over
// and are enforced on the restored state; each rank's truncated flag is
// the snapshot's.
func (ix *Index) Restore(k PartitionKey, s *Snapshot) error {
	t, err := Restore(s)
	if err != nil {
		return fmt.Errorf("partition %v: %w", k, err)
	}
	ix.adopt(t)
	for {
		ix.mu.Lock()
		p, ok := ix.parts[k]
		if !ok || p.removed.Load() {
			p, ok = &partition{blockSize: t.blockSize, tree: t}, false
			ix.parts[k] = p
		}
		ix.mu.Unlock()
		p.gate.Lock() // no batch in flight on the tree replaced
		p.mu.Lock()
		if p.removed.Load() {
			p.mu.Unlock()
			p.gate.Unlock()
			continue // removed since we found it: add it again
		}
		if ok {
			if p.blockSize != t.blockSize {
				p.mu.Unlock()
				p.gate.Unlock()
				return fmt.Errorf("partition %v: snapshot block size %d, have %d: %w", k, t.blockSize, p.blockSize, ErrBlockSizeConflict)
			}
			for r, rid := range p.tree.rankIDs {
				if c := p.tree.ranks[rid].limit; c != (Capacity{}) {
					t.SetCapacity(r, c)
				}
			}
			p.tree = t
		}
		over := ix.publish(p)
		p.mu.Unlock()
		p.gate.Unlock()
		if over {
			ix.evict()
		}
		return nil
	}
}

// PartitionStats describes one partition.
type PartitionStats struct {
	Key       PartitionKey
	BlockSize int
	TreeStats
	Counts [NumReasons]uint64
	// Redundant counts the blocks of redundant stores the partition
	// applied since it was made or restored (Tree.Redundant).
	Redundant uint64
}

// Stats describes every partition, unordered.
func (ix *Index) Stats() []PartitionStats {
	var out []PartitionStats
	for _, k := range ix.Partitions() {
		p, err := ix.partition(k)
		if err != nil {
			continue
		}
		p.mu.RLock()
		out = append(out, PartitionStats{Key: k, BlockSize: p.blockSize, TreeStats: p.tree.Stats(), Counts: p.tree.counts, Redundant: p.tree.redundant})
		p.mu.RUnlock()
	}
	return out
}

// RankState is what the index knows of one rank in one partition. The
// zero value is an unknown rank.
type RankState struct {
	Blocks    int // blocks held, in any tier, by the rank's main KV-cache group (see Index.Groups)
	Watermark uint64
	HasSeq    bool
	Digest    uint64
	// Tiers counts the main group's blocks held in each tier (see
	// Tree.RankTierBlocks). A capacity bounds these plus the other
	// groups' (GroupState.Tiers).
	Tiers    [NumTiers]int
	Capacity Capacity // as set by SetRankCapacity
	// Truncated: since the rank was first seen or last cleared (Clear,
	// an AllBlocksCleared op, RemoveRank) the index dropped some of its
	// entries, in any KV-cache group, other than by its engine's events —
	// to the memory cap or to its capacity — so they are a strict subset
	// of what the engine holds. The stream layer reports such a rank
	// degraded.
	Truncated bool
	// Degraded and DegradedReason are the stream layer's word on the rank
	// as of its last batch or reset (Mark, Reset); a rank restored from a
	// dump has the dumping replica's.
	Degraded       bool
	DegradedReason string
	// RedundantBlocks counts the blocks of the rank's redundant stores
	// (see Tree.Redundant) since the partition first saw the rank: a
	// Clear, an AllBlocksCleared op or a Reset keeps it, RemoveRank
	// forgets it, and a rank restored from a dump starts at 0. A rising
	// count means the engine re-reports cached blocks (vLLM's
	// kv_cache_report_mode="full"), or computed blocks twice at once.
	RedundantBlocks uint64
}

// Rank reports what partition k knows of r.
func (ix *Index) Rank(k PartitionKey, r Rank) (RankState, error) {
	p, err := ix.partition(k)
	if err != nil {
		return RankState{}, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	t := p.tree
	rid, ok := t.rankIDs[r]
	if !ok {
		return RankState{}, nil
	}
	rs := &t.ranks[rid]
	deg, why := rs.degradedState()
	return RankState{Blocks: rs.lookup.len(), Watermark: rs.seq, HasSeq: rs.hasSeq, Digest: rs.digest,
		Tiers: rs.tiers, Capacity: rs.limit, Truncated: rs.truncated, Degraded: deg, DegradedReason: why,
		RedundantBlocks: rs.redundant}, nil
}

// Groups returns what partition k learned of r's KV-cache groups (see
// Tree.Groups): nil for a rank with no stores, one main group for a
// single-group engine, several for a hybrid model. The slice is the
// caller's.
func (ix *Index) Groups(k PartitionKey, r Rank) ([]GroupState, error) {
	p, err := ix.partition(k)
	if err != nil {
		return nil, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tree.Groups(r), nil
}

// Read runs f on partition k's tree under the read lock, for inspection
// (tests, status tools). f must not keep the tree or modify it.
func (ix *Index) Read(k PartitionKey, f func(t *Tree)) error {
	p, err := ix.partition(k)
	if err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	f(p.tree)
	return nil
}

// RemoveWorkerFrom removes every rank of worker id from partition k,
// including ranks learned only from batches' data_parallel_rank.
func (ix *Index) RemoveWorkerFrom(k PartitionKey, id uint64) error {
	return ix.mutate(k, func(t *Tree) { t.RemoveWorker(id) })
}
