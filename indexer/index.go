package indexer

import (
	"errors"
	"fmt"
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
	// partitions; 0 means no cap. Past it, the partition being written
	// evicts its least recently used leaves down to 31/32 of the cap.
	MaxEntries int
}

var (
	// ErrNoPartition: the partition was never added.
	ErrNoPartition = errors.New("no such partition")
	// ErrBlockSizeConflict: a partition exists with another block size.
	ErrBlockSizeConflict = errors.New("block size conflicts with the partition's")
)

// Index is the concurrent prefix index: one Tree per partition. Writers to
// a partition are serialised; matchers run concurrently with each other.
// All methods are safe for concurrent use.
type Index struct {
	opts  Options
	mu    sync.RWMutex // guards parts (the map, not the partitions)
	parts map[PartitionKey]*partition
	total atomic.Int64 // Σ partition entries
}

type partition struct {
	mu      sync.RWMutex // guards tree
	tree    *Tree
	entries int64 // tree.entries as of the last write; guarded by mu
}

// New returns an empty index.
func New(opts Options) *Index {
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
	if p, ok := ix.parts[k]; ok {
		if bs := p.tree.BlockSize(); bs != blockSize {
			return fmt.Errorf("partition %v: block size %d, have %d: %w", k, blockSize, bs, ErrBlockSizeConflict)
		}
		return nil
	}
	ix.parts[k] = &partition{tree: ix.newTree(blockSize)}
	return nil
}

func (ix *Index) newTree(blockSize int) *Tree {
	t := NewTree(blockSize)
	t.trackLRU = ix.opts.MaxEntries > 0
	return t
}

// BlockSize returns partition k's block size.
func (ix *Index) BlockSize(k PartitionKey) (int, error) {
	p, err := ix.partition(k)
	if err != nil {
		return 0, err
	}
	return p.tree.BlockSize(), nil // immutable after creation
}

func (ix *Index) partition(k PartitionKey) (*partition, error) {
	ix.mu.RLock()
	p, ok := ix.parts[k]
	ix.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	return p, nil
}

// Partitions returns the partition keys, unordered.
func (ix *Index) Partitions() []PartitionKey {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]PartitionKey, 0, len(ix.parts))
	for k := range ix.parts {
		out = append(out, k)
	}
	return out
}

// BatchResult tells what applying one batch skipped.
type BatchResult struct {
	Skipped [NumReasons]uint64 // blocks not applied (or evicted), by reason
	Errs    []error            // the *OpError of each op that skipped blocks
}

// Apply applies the ops of one engine batch for rank r in order and records
// seq as r's watermark, atomically with respect to Snapshot and Match.
func (ix *Index) Apply(k PartitionKey, r Rank, seq uint64, ops []Op) (BatchResult, error) {
	return ix.ApplyBatch(k, r, seq, 0, ops)
}

// ApplyBatch is Apply that also records the batch's digest with the
// watermark (see Tree.SetWatermarkDigest).
func (ix *Index) ApplyBatch(k PartitionKey, r Rank, seq, digest uint64, ops []Op) (BatchResult, error) {
	var res BatchResult
	p, err := ix.partition(k)
	if err != nil {
		return res, err
	}
	p.mu.Lock()
	before := p.tree.counts
	for i := range ops {
		if err := p.tree.Apply(r, ops[i]); err != nil {
			res.Errs = append(res.Errs, err)
		}
	}
	p.tree.SetWatermarkDigest(r, seq, digest)
	ix.settle(p)
	for i := range res.Skipped {
		res.Skipped[i] = p.tree.counts[i] - before[i]
	}
	p.mu.Unlock()
	return res, nil
}

// settle publishes p's entry count and enforces the cap. p.mu must be held.
func (ix *Index) settle(p *partition) {
	n := int64(p.tree.entries)
	total := ix.total.Add(n - p.entries)
	p.entries = n
	if max := int64(ix.opts.MaxEntries); max > 0 && total > max {
		over := total - (max - max/32)
		p.tree.Evict(int(max64(0, n-over)))
		n = int64(p.tree.entries)
		ix.total.Add(n - p.entries)
		p.entries = n
	}
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// mutate runs f on partition k's tree under its write lock (for removals
// and clears that come from outside an engine batch).
func (ix *Index) mutate(k PartitionKey, f func(*Tree)) error {
	p, err := ix.partition(k)
	if err != nil {
		return err
	}
	p.mu.Lock()
	f(p.tree)
	ix.settle(p)
	p.mu.Unlock()
	return nil
}

// Clear drops every block of r in partition k (its watermark stays).
func (ix *Index) Clear(k PartitionKey, r Rank) error {
	return ix.mutate(k, func(t *Tree) { t.Clear(r) })
}

// RemoveRank removes r from partition k: its blocks and its watermark.
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
	q := HashBlocks((*bp)[:0], tokens, p.tree.BlockSize(), seed)
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
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tree.Dump(), nil
}

// Restore replaces partition k (created if missing) with the snapshot.
func (ix *Index) Restore(k PartitionKey, s *Snapshot) error {
	t, err := Restore(s)
	if err != nil {
		return fmt.Errorf("partition %v: %w", k, err)
	}
	t.trackLRU = ix.opts.MaxEntries > 0
	ix.mu.Lock()
	p, ok := ix.parts[k]
	if !ok {
		p = &partition{tree: t}
		ix.parts[k] = p
	}
	ix.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok && p.tree.BlockSize() != t.BlockSize() {
		return fmt.Errorf("partition %v: snapshot block size %d, have %d: %w", k, t.BlockSize(), p.tree.BlockSize(), ErrBlockSizeConflict)
	}
	p.tree = t
	ix.settle(p)
	return nil
}

// PartitionStats describes one partition.
type PartitionStats struct {
	Key       PartitionKey
	BlockSize int
	TreeStats
	Counts [NumReasons]uint64
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
		out = append(out, PartitionStats{Key: k, BlockSize: p.tree.BlockSize(), TreeStats: p.tree.Stats(), Counts: p.tree.counts})
		p.mu.RUnlock()
	}
	return out
}

// RankState is what the index knows of one rank in one partition.
type RankState struct {
	Blocks    int
	Watermark uint64
	HasSeq    bool
	Digest    uint64
}

// Rank reports r's block count and watermark in partition k.
func (ix *Index) Rank(k PartitionKey, r Rank) (RankState, error) {
	p, err := ix.partition(k)
	if err != nil {
		return RankState{}, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	seq, ok := p.tree.Watermark(r)
	return RankState{Blocks: p.tree.RankBlocks(r), Watermark: seq, HasSeq: ok, Digest: p.tree.WatermarkDigest(r)}, nil
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

// RemovePartition drops partition k and everything it holds. Removing a
// missing partition is ErrNoPartition.
func (ix *Index) RemovePartition(k PartitionKey) error {
	ix.mu.Lock()
	p, ok := ix.parts[k]
	delete(ix.parts, k)
	ix.mu.Unlock()
	if !ok {
		return fmt.Errorf("partition %v: %w", k, ErrNoPartition)
	}
	p.mu.Lock()
	ix.total.Add(-p.entries)
	p.entries = 0
	p.mu.Unlock()
	return nil
}

// RemoveWorkerFrom removes every rank of worker id from partition k,
// including ranks learned only from batches' data_parallel_rank.
func (ix *Index) RemoveWorkerFrom(k PartitionKey, id uint64) error {
	return ix.mutate(k, func(t *Tree) { t.RemoveWorker(id) })
}
