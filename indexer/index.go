package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
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
	// shard's write lock, so that the shard's other writers take turns
	// with it and matches see its progress (it publishes when it lets
	// go, see Index.ApplyBatch); 0 means DefaultWriteChunk.
	WriteChunk int
	// Shards is how many trees each partition spreads its ranks over,
	// each behind its own locks: batches of ranks in different shards are
	// applied in parallel, and a match walks every shard. 0 means
	// DefaultShards(); at most MaxShards. A partition restored from a
	// snapshot of more shards keeps the snapshot's (see Index.Restore).
	Shards int
}

// MaxShards bounds Options.Shards and the shards a snapshot may describe.
const MaxShards = 256

// DefaultShards is the shard count of Options' zero value, from
// GOMAXPROCS as it is when the index is made: one per core, at most 8.
// Every shard costs a match one more edge walk: scoring an 8,192-token
// prompt took 1.43× the time of hashing it with one shard, 1.53× with 2,
// 1.73× with 4, 2.04× with 8 (BenchmarkIndexScore8192). But writers of
// ranks that share a shard take turns, and with fewer shards than cores
// they queue on its lock: on the Mooncake benchmark (a goroutine per
// rank, as the daemon applies) one shard at two cores applied 2.6–4.8M
// ops/s against 12.0–12.8M at one core, while 2 shards applied 13.3–16.6M
// and 8 shards 22.0–24.1M (docs/benchmarks.md). One shard per core keeps
// writes from falling below one core's rate at the least cost to reads.
func DefaultShards() int { return min(runtime.GOMAXPROCS(0), 8) }

var (
	// ErrNoPartition: the partition was never added, or was removed.
	ErrNoPartition = errors.New("no such partition")
	// ErrBlockSizeConflict: a partition exists with another block size.
	ErrBlockSizeConflict = errors.New("block size conflicts with the partition's")
)

// Index is the concurrent prefix index. Each partition spreads its ranks
// over Options.Shards trees (shards), each behind its own write lock: a
// rank lives in one shard, assigned when the partition first sees it, to
// the shard with the fewest ranks; so batches of ranks in different shards
// run in parallel, and a match walks every shard and appends what each
// finds (a rank's overlap comes from its one shard). A batch is applied in
// holds of its shard's write lock of at most Options.WriteChunk blocks
// each, and the tree publishes what each hold changed as it ends; matches
// take no lock and read the published views (Tree.matchViews), so they
// never wait for a writer, and see each shard as of the end of one hold.
// The chunks of concurrent batches (of different ranks in one shard)
// interleave, each batch's ops in order. Snapshot sees every batch whole
// or not at all; Rank, Groups, Stats and Read may see a batch that runs
// concurrently with them half applied. All methods are safe for
// concurrent use.
//
// Lock order: a partition's gate before its shards' mu, never the gate
// while holding a mu; several shards' mu only in shard order, and only
// with the gate held exclusively (RemovePartition, Restore); mu (the
// map's) is never held while waiting for a partition's lock; evictMu is
// taken with no partition lock held, and the evictor holds one shard lock
// at a time under it.
type Index struct {
	opts  Options
	mu    sync.RWMutex // guards parts (the map, not the partitions)
	parts map[PartitionKey]*partition
	total atomic.Int64 // Σ shard entries (as published by each shard)
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
	// the write-lock holds it is applied in, see Options.WriteChunk) and by
	// every other write to one rank; exclusively by Snapshot, Restore,
	// RemovePartition and the removal of ranks. It guards the batch's
	// atomicity (no snapshot sees a batch half applied), the shards'
	// identity and the ranks' assignment to shards while a write runs.
	// Taken before any shard's mu, never while holding one.
	gate sync.RWMutex
	// shards is replaced (never modified) with the gate held exclusively;
	// matches load it without the gate.
	shards atomic.Pointer[[]*shard]
	// where maps each rank the partition knows to its shard's index. It
	// is copied on write: ranks are assigned rarely and looked up by every
	// batch. Assigning takes amu with the gate held shared; removing a
	// rank takes the gate exclusively.
	where atomic.Pointer[map[Rank]int]
	amu   sync.Mutex
	// removed is set by RemovePartition with the gate held exclusively
	// and every shard's mu; a writer that found the partition before then
	// sees it once it holds the gate, an evictor once it holds a shard's
	// mu, and backs off.
	removed atomic.Bool
}

// shard is one of a partition's trees and its lock.
type shard struct {
	// mu guards tree's writable side (everything but the published
	// views): writers hold it for at most Options.WriteChunk blocks of a
	// batch at a time, and publish the tree's views before they let go
	// (unlock). Matches take no lock (Tree.matchViews), except in a tree
	// with a hybrid rank, where they take it shared.
	mu      sync.RWMutex
	tree    *Tree
	entries int64    // tree.entries + tree.gentries as last added to Index.total
	ranks   int      // ranks assigned to the shard (under the partition's amu, or its gate held exclusively)
	_       [64]byte // keeps the next shard's lock off this cache line
}

// unlock publishes the views of what the holder of s.mu changed and
// releases it.
func (s *shard) unlock() {
	s.tree.publishViews()
	s.mu.Unlock()
}

// match appends q's overlaps in s's tree: from its published views, with
// no lock, or under the read lock when the tree has a hybrid rank (or,
// rarely, publishes keep the views moving).
func (s *shard) match(q []uint64, dst []Overlap) []Overlap {
	if d, ok := s.tree.matchViews(q, dst); ok {
		return d
	}
	s.mu.RLock()
	dst = s.tree.Match(q, dst)
	s.mu.RUnlock()
	return dst
}

// New returns an empty index.
func New(opts Options) *Index {
	if opts.WriteChunk <= 0 {
		opts.WriteChunk = DefaultWriteChunk
	}
	if opts.Shards <= 0 {
		opts.Shards = DefaultShards()
	}
	opts.Shards = min(opts.Shards, MaxShards)
	return &Index{opts: opts, parts: make(map[PartitionKey]*partition)}
}

// newPartition returns a partition whose shards are trees, then empty
// ones up to n, with the trees' ranks assigned to them.
func (ix *Index) newPartition(blockSize, n int, trees []*Tree) *partition {
	p := &partition{blockSize: blockSize}
	ss := make([]*shard, max(n, len(trees)))
	where := map[Rank]int{}
	for i := range ss {
		ss[i] = &shard{}
		if i < len(trees) {
			ss[i].tree = trees[i]
		} else {
			ss[i].tree = ix.adopt(NewTree(blockSize))
		}
		for r := range ss[i].tree.rankIDs {
			where[r] = i
			ss[i].ranks++
		}
	}
	p.shards.Store(&ss)
	p.where.Store(&where)
	return p
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
	ix.parts[k] = ix.newPartition(blockSize, ix.opts.Shards, nil)
	return nil
}

// adopt makes t one of the index's trees: on the index's LRU clock (with
// every node stamped now, when the index is capped), publishing views for
// matches that take no lock.
func (ix *Index) adopt(t *Tree) *Tree {
	t.shared = &ix.clock
	t.clock = ix.clock.Load()
	if ix.opts.MaxEntries > 0 {
		t.trackLRU = true
		now := t.now()
		for id := range t.nodes {
			t.nodes[id].stamp = now
		}
	}
	t.enableViews()
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

// Shards returns how many shards partition k has.
func (ix *Index) Shards(k PartitionKey) (int, error) {
	p, err := ix.partition(k)
	if err != nil {
		return 0, err
	}
	return len(*p.shards.Load()), nil
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

// enter returns partition k with its gate held, shared or exclusively
// (excl), or ErrNoPartition; leave releases the gate.
func (ix *Index) enter(k PartitionKey, excl bool) (*partition, error) {
	p, err := ix.partition(k)
	if err != nil {
		return nil, err
	}
	if excl {
		p.gate.Lock()
	} else {
		p.gate.RLock()
	}
	if p.removed.Load() {
		p.leave(excl)
		return nil, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	return p, nil
}

func (p *partition) leave(excl bool) {
	if excl {
		p.gate.Unlock()
	} else {
		p.gate.RUnlock()
	}
}

// shardOf returns r's shard. If r has none it assigns r to the shard with
// the fewest ranks (the lowest-numbered of those) when assign is set, and
// returns nil when it is not. The gate must be held.
func (p *partition) shardOf(r Rank, assign bool) *shard {
	ss := *p.shards.Load()
	if i, ok := (*p.where.Load())[r]; ok {
		return ss[i]
	}
	if !assign {
		return nil
	}
	p.amu.Lock()
	defer p.amu.Unlock()
	old := *p.where.Load()
	if i, ok := old[r]; ok {
		return ss[i]
	}
	best := 0
	for i, s := range ss {
		if s.ranks < ss[best].ranks {
			best = i
		}
	}
	where := make(map[Rank]int, len(old)+1)
	for q, i := range old {
		where[q] = i
	}
	where[r] = best
	ss[best].ranks++
	p.where.Store(&where)
	return ss[best]
}

// forget drops the assignment of every rank its shard's tree no longer
// knows. The gate must be held exclusively.
func (p *partition) forget() {
	old := *p.where.Load()
	ss := *p.shards.Load()
	where := make(map[Rank]int, len(old))
	for r, i := range old {
		if _, ok := ss[i].tree.rankIDs[r]; ok {
			where[r] = i
		} else {
			ss[i].ranks--
		}
	}
	p.where.Store(&where)
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

// Options returns the index's options with the defaults filled in.
func (ix *Index) Options() Options { return ix.opts }

// RemovePartition drops partition k with everything in it — its trees,
// its ranks and their watermarks — and its entries from the index total.
// A partition added again under k starts empty and may have another block
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
	p, err := ix.enter(k, true) // no write in flight
	if err != nil {
		return false, err
	}
	defer p.leave(true)
	if ifEmpty && len(*p.where.Load()) > 0 {
		return false, nil
	}
	ss := *p.shards.Load()
	for _, s := range ss {
		s.mu.Lock()
	}
	p.removed.Store(true)
	for _, s := range ss {
		ix.total.Add(-s.entries)
		s.entries = 0
		s.mu.Unlock()
	}
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
	p, err := ix.enter(k, false)
	if err != nil {
		return 0, err
	}
	defer p.leave(false)
	return len(*p.where.Load()), nil
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
	return ix.mutateRank(k, r, true, func(t *Tree) { t.SetCapacity(r, c) })
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
// Tree.SetWatermarkDigest). It takes the write lock of r's shard only, so
// batches of ranks in other shards run in parallel, and releases it after
// every Options.WriteChunk blocks (an op of more blocks is applied in
// pieces, with the effect and the counts of the whole op), so queries and
// other ranks' batches run in between; BatchResult counts only this
// batch. After the ops it enforces r's capacity (SetRankCapacity). Then,
// with the lock released, if the index is over its cap it evicts the
// least recently stored or matched leaves of the whole index
// (Index.evict); so the cap may be exceeded briefly by batches in flight,
// never by a returned one.
func (ix *Index) ApplyBatch(k PartitionKey, r Rank, m Mark, ops []Op) (BatchResult, error) {
	var res BatchResult
	// The gate, shared for the whole batch, keeps Snapshot, Restore,
	// RemovePartition and rank removals out until the batch is applied:
	// the shard's tree stays t, r stays in it, and a dump never sees the
	// batch half applied.
	p, err := ix.enter(k, false)
	if err != nil {
		return res, err
	}
	s := p.shardOf(r, true)
	s.mu.Lock()
	t, chunk := s.tree, ix.opts.WriteChunk
	// Reserve two ticks per op piece on the index's clock; the stores of
	// the batch stamp within them (see Tree.now).
	var n uint32
	for i := range ops {
		n += 2 * uint32(max(1, (opBlocks(&ops[i])+chunk-1)/chunk))
	}
	t.clock = ix.clock.Add(n) - n
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
		s.unlock()
		s.mu.Lock()
		t.clock = clock
		before, redundant = t.counts, t.redundant
	}
	budget := chunk
	for i := range ops {
		if i%warmOps == 0 {
			t.warm(r, ops[i:min(i+warmOps, len(ops))])
		}
		op := &ops[i]
		var err error
		if n := t.pieces(r, op, chunk); n > 0 {
			if budget < chunk {
				yield()
			}
			err = t.applyPieces(r, op, chunk, yield)
			budget = chunk - (opBlocks(op) - (n-1)*chunk)
		} else {
			err = t.apply(r, op)
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
	over := ix.count(s)
	s.unlock()
	p.leave(false)
	if over {
		res.Skipped[ReasonEvicted] += ix.evict()
	}
	return res, nil
}

// warmOps: ApplyBatch warms the lookup groups of this many ops at a time
// (Tree.warm). 16 ops are 30-odd blocks on the Mooncake replay.
const warmOps = 16

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

// count adds s's entry change to the index total and reports whether
// the total is now over the cap. s.mu must be held.
func (ix *Index) count(s *shard) (over bool) {
	n := int64(s.tree.entries + s.tree.gentries)
	total := ix.total.Add(n - s.entries)
	s.entries = n
	return ix.opts.MaxEntries > 0 && total > int64(ix.opts.MaxEntries)
}

// evict brings the index total down to 31/32 of the cap, evicting the
// least recently stored or matched leaves first, whichever partition and
// shard hold them, and returns the entries evicted. It must be called
// with no partition lock held.
//
// A round reads every shard's leaves and their ages on the shared clock,
// one shard at a time under its read lock; picks the oldest leaves of the
// whole index that cover the excess, which gives an age threshold and a
// budget of entries per shard; then takes each shard's write lock in turn
// and evicts its leaves at least that old, oldest first, up to its budget
// (evictOld). Writes that happen between the two steps only make leaves
// younger (skipped) or add new ones (left for the next round); rounds
// repeat while the total is still over the low-water mark and the last
// one made progress.
func (ix *Index) evict() uint64 {
	max := int64(ix.opts.MaxEntries)
	low := max - max/32
	ix.evictMu.Lock()
	defer ix.evictMu.Unlock()
	var dropped uint64
	if ix.total.Load() <= max {
		return 0 // another writer's evictor got there first
	}
	type unit struct {
		p *partition
		s *shard
	}
	var units []unit
	for round := 0; round < 8; round++ {
		over := ix.total.Load() - low
		if over <= 0 {
			break
		}
		units = units[:0]
		ix.mu.RLock()
		for _, p := range ix.parts {
			for _, s := range *p.shards.Load() {
				units = append(units, unit{p, s})
			}
		}
		ix.mu.RUnlock()
		now := ix.clock.Load() + 1 // as Tree.now
		cands := ix.evictBuf[:0]
		for i, u := range units {
			u.s.mu.RLock()
			if !u.p.removed.Load() {
				cands = u.s.tree.appendLeaves(cands, uint32(i), now)
			}
			u.s.mu.RUnlock()
		}
		ix.evictBuf = cands
		slices.SortFunc(cands, func(a, b leaf) int { return cmp.Compare(b.age, a.age) })
		ix.budgets = slices.Grow(ix.budgets[:0], len(units))[:len(units)]
		clear(ix.budgets)
		var minAge uint32
		for sum := int64(0); len(cands) > 0 && sum < over; cands = cands[1:] {
			ix.budgets[cands[0].part] += int(cands[0].entries)
			sum += int64(cands[0].entries)
			minAge = cands[0].age
		}
		progress := false
		for i, u := range units {
			if ix.budgets[i] == 0 {
				continue
			}
			u.s.mu.Lock()
			if !u.p.removed.Load() {
				if d := u.s.tree.evictOld(now, minAge, ix.budgets[i]); d > 0 {
					dropped += uint64(d)
					progress = true
				}
				ix.count(u.s)
			}
			u.s.unlock()
		}
		if !progress {
			break
		}
	}
	return dropped
}

// mutateRank runs f on the tree of r's shard in partition k under its
// write lock, for writes to one rank that come from outside an engine
// batch. If r has no shard it assigns one when assign is set; otherwise f
// does not run.
func (ix *Index) mutateRank(k PartitionKey, r Rank, assign bool, f func(*Tree)) error {
	p, err := ix.enter(k, false)
	if err != nil {
		return err
	}
	s := p.shardOf(r, assign)
	if s == nil {
		p.leave(false)
		return nil
	}
	s.mu.Lock()
	f(s.tree)
	over := ix.count(s)
	s.unlock()
	p.leave(false)
	if over {
		ix.evict()
	}
	return nil
}

// removeRanks runs f, which removes ranks, on every shard's tree of
// partition k with the gate held exclusively (no write in flight, so a
// rank removed leaves no batch behind in its shard), then forgets the
// ranks removed.
func (ix *Index) removeRanks(k PartitionKey, f func(*Tree)) error {
	p, err := ix.enter(k, true)
	if err != nil {
		return err
	}
	defer p.leave(true)
	for _, s := range *p.shards.Load() {
		s.mu.Lock()
		f(s.tree)
		ix.count(s)
		s.unlock()
	}
	p.forget()
	return nil
}

// Clear drops every block of r in partition k and clears r's truncated
// flag (its watermark and capacity stay).
func (ix *Index) Clear(k PartitionKey, r Rank) error {
	return ix.mutateRank(k, r, false, func(t *Tree) { t.Clear(r) })
}

// Reset starts rank r of partition k over, as the stream layer does when
// the rank's history is lost or a new engine incarnation begins: its
// blocks and its watermark go, its capacity stays, and it is recorded as
// degraded (with why) or not, in one step — a Snapshot never sees the
// old watermark over the emptied blocks, nor the blocks without the
// flag.
func (ix *Index) Reset(k PartitionKey, r Rank, degraded bool, reason string) error {
	return ix.mutateRank(k, r, true, func(t *Tree) {
		t.Clear(r)
		rs := &t.ranks[t.rankID(r)]
		rs.seq, rs.hasSeq, rs.digest = 0, false, 0
		rs.degraded, rs.degradedWhy = degraded, reason
	})
}

// RemoveRank removes r from partition k: its blocks, its watermark, its
// capacity and its truncated flag. It waits for the partition's writes in
// flight.
func (ix *Index) RemoveRank(k PartitionKey, r Rank) error {
	return ix.removeRanks(k, func(t *Tree) { t.RemoveRank(r) })
}

// RemoveWorker removes every rank of worker id from every partition.
func (ix *Index) RemoveWorker(id uint64) {
	for _, k := range ix.Partitions() {
		_ = ix.RemoveWorkerFrom(k, id)
	}
}

// RemoveWorkerFrom removes every rank of worker id from partition k,
// including ranks learned only from batches' data_parallel_rank. It waits
// for the partition's writes in flight.
func (ix *Index) RemoveWorkerFrom(k PartitionKey, id uint64) error {
	return ix.removeRanks(k, func(t *Tree) { t.RemoveWorker(id) })
}

// Match appends to dst the overlap of each rank with the local block
// hashes q in partition k. dst is the caller's; Match keeps no reference.
// It takes no lock (each shard's published views, see Tree.matchViews),
// so it never waits for a writer; a Match concurrent
// with a Restore of k may see some shards restored and others not.
func (ix *Index) Match(k PartitionKey, q []uint64, dst []Overlap) ([]Overlap, error) {
	p, err := ix.partition(k)
	if err != nil {
		return dst, err
	}
	return p.match(q, dst), nil
}

// match matches q in every shard, none of which it waits for (see
// shard.match).
func (p *partition) match(q []uint64, dst []Overlap) []Overlap {
	for _, s := range *p.shards.Load() {
		dst = s.match(q, dst)
	}
	return dst
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
	dst = p.match(q, dst)
	*bp = q
	hashPool.Put(bp)
	return dst, nil
}

// Snapshot dumps partition k; the watermarks describe exactly the state
// dumped. The shards' dumps are merged into one snapshot: node ids are
// unique over the shards, and each rank and structural node names its
// shard (RankWatermark.Shard, DumpNode.Shard), so that Restore rebuilds
// the same shards.
func (ix *Index) Snapshot(k PartitionKey) (*Snapshot, error) {
	p, err := ix.enter(k, true) // every batch whole or not at all
	if err != nil {
		return nil, err
	}
	defer p.leave(true)
	ss := *p.shards.Load()
	dumps := make([]*Snapshot, len(ss))
	for i, s := range ss {
		s.mu.RLock()
		dumps[i] = s.tree.Dump()
		s.mu.RUnlock()
	}
	return mergeSnapshots(dumps), nil
}

// Restore replaces partition k (created if missing) with the snapshot, in
// as many shards as Options.Shards or the snapshot names, whichever is
// more, each rank in the shard the snapshot names. Capacities set on the
// partition's ranks (SetRankCapacity) carry over and are enforced on the
// restored state; each rank's truncated flag is the snapshot's.
func (ix *Index) Restore(k PartitionKey, s *Snapshot) error {
	sections, err := splitSnapshot(s)
	if err != nil {
		return fmt.Errorf("partition %v: %w", k, err)
	}
	trees := make([]*Tree, len(sections))
	for i, sec := range sections {
		t, err := Restore(sec)
		if err != nil {
			if len(sections) > 1 {
				err = fmt.Errorf("shard %d: %w", i, err)
			}
			return fmt.Errorf("partition %v: %w", k, err)
		}
		trees[i] = ix.adopt(t)
	}
	for {
		ix.mu.Lock()
		p, ok := ix.parts[k]
		if !ok || p.removed.Load() {
			p, ok = ix.newPartition(s.BlockSize, ix.opts.Shards, nil), false
			ix.parts[k] = p
		}
		ix.mu.Unlock()
		p.gate.Lock() // no write in flight on the trees replaced
		if p.removed.Load() {
			p.gate.Unlock()
			continue // removed since we found it: add it again
		}
		if ok && p.blockSize != s.BlockSize {
			p.gate.Unlock()
			return fmt.Errorf("partition %v: snapshot block size %d, have %d: %w", k, s.BlockSize, p.blockSize, ErrBlockSizeConflict)
		}
		over := ix.install(p, trees)
		p.gate.Unlock()
		if over {
			ix.evict()
		}
		return nil
	}
}

// install makes trees p's shards (with empty ones up to Options.Shards),
// carries the capacities of p's ranks over, and reports whether the index
// is now over its cap. p's gate must be held exclusively.
func (ix *Index) install(p *partition, trees []*Tree) (over bool) {
	// np builds the shards and their ranks' assignment; p takes them.
	np := ix.newPartition(p.blockSize, ix.opts.Shards, trees)
	old := *p.shards.Load()
	for _, s := range old {
		s.mu.Lock()
		for r, rid := range s.tree.rankIDs {
			if c := s.tree.ranks[rid].limit; c != (Capacity{}) {
				np.shardOf(r, true).tree.SetCapacity(r, c)
			}
		}
		ix.total.Add(-s.entries)
		s.entries = 0
	}
	ss := *np.shards.Load()
	for _, s := range ss {
		ix.count(s)
		s.tree.publishViews() // the capacities set: no match has seen the tree yet
	}
	p.where.Store(np.where.Load())
	p.shards.Store(&ss)
	for _, s := range old {
		s.mu.Unlock()
	}
	return ix.opts.MaxEntries > 0 && ix.total.Load() > int64(ix.opts.MaxEntries)
}

// PartitionStats describes one partition: its shards' trees summed
// (TreeStats.Blocks and Nodes count a prefix once per shard that holds
// it).
type PartitionStats struct {
	Key       PartitionKey
	BlockSize int
	Shards    int
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
		ss := *p.shards.Load()
		ps := PartitionStats{Key: k, BlockSize: p.blockSize, Shards: len(ss)}
		for _, s := range ss {
			s.mu.RLock()
			st := s.tree.Stats()
			ps.Entries += st.Entries
			ps.GroupEntries += st.GroupEntries
			ps.Blocks += st.Blocks
			ps.Nodes += st.Nodes
			ps.Ranks += st.Ranks
			ps.Bytes += st.Bytes
			for i, n := range s.tree.counts {
				ps.Counts[i] += n
			}
			ps.Redundant += s.tree.redundant
			s.mu.RUnlock()
		}
		out = append(out, ps)
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
	// as of its last batch or reset (Mark, Reset), or a foreign batch's,
	// or else, for a truncated rank, TruncatedReason: whether the rank is
	// known to hold a strict subset of its engine's cache, and why. A rank
	// restored from a dump has the dumping replica's.
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
	var out RankState
	err := ix.ReadRank(k, r, func(t *Tree) {
		rid, ok := t.rankIDs[r]
		if !ok {
			return
		}
		rs := &t.ranks[rid]
		deg, why := rs.degradedState()
		out = RankState{Blocks: rs.lookup.len(), Watermark: rs.seq, HasSeq: rs.hasSeq, Digest: rs.digest,
			Tiers: rs.tiers, Capacity: rs.limit, Truncated: rs.truncated, Degraded: deg, DegradedReason: why,
			RedundantBlocks: rs.redundant}
	})
	return out, err
}

// Groups returns what partition k learned of r's KV-cache groups (see
// Tree.Groups): nil for a rank with no stores, one main group for a
// single-group engine, several for a hybrid model. The slice is the
// caller's.
func (ix *Index) Groups(k PartitionKey, r Rank) ([]GroupState, error) {
	var out []GroupState
	err := ix.ReadRank(k, r, func(t *Tree) { out = t.Groups(r) })
	return out, err
}

// Read runs f on each of partition k's trees in turn (one per shard; a
// rank is in one of them), each under its read lock, for inspection
// (tests, status tools). f must not keep a tree or modify it.
func (ix *Index) Read(k PartitionKey, f func(t *Tree)) error {
	p, err := ix.enter(k, false)
	if err != nil {
		return err
	}
	defer p.leave(false)
	for _, s := range *p.shards.Load() {
		s.mu.RLock()
		f(s.tree)
		s.mu.RUnlock()
	}
	return nil
}

// ReadRank runs f, under its read lock, on the tree of partition k that
// holds r; on the first shard's if r is unknown (where r holds nothing).
// f must not keep the tree or modify it.
func (ix *Index) ReadRank(k PartitionKey, r Rank, f func(t *Tree)) error {
	p, err := ix.enter(k, false)
	if err != nil {
		return err
	}
	defer p.leave(false)
	s := p.shardOf(r, false)
	if s == nil {
		s = (*p.shards.Load())[0]
	}
	s.mu.RLock()
	f(s.tree)
	s.mu.RUnlock()
	return nil
}
