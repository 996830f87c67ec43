package indexer_test

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// This file holds a brute-force reference model of indexer.Tree, written
// from the index semantics (not from tree.go), and small helpers shared by
// the tree tests.

// pathFP extends the fingerprint of a path of local block hashes by one
// block (splitmix64 finaliser over the running value). The model keys paths
// by fingerprint; a 64-bit collision among the few thousand paths of a test
// is not a practical concern.
func pathFP(prev, h uint64) uint64 {
	x := prev ^ (h + 0x9e3779b97f4a7c15 + (prev << 6) + (prev >> 2))
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// refPath is an interned path of local block hashes from the root: equal
// paths are the same *refPath. The root is nil.
type refPath struct {
	parent *refPath
	hash   uint64 // the last block's local hash
	fp     uint64
	depth  int
}

// hashes returns the path's local hashes from the root.
func (p *refPath) hashes() []uint64 {
	out := make([]uint64, p.depth)
	for ; p != nil; p = p.parent {
		out[p.depth-1] = p.hash
	}
	return out
}

func (p *refPath) fingerprint() uint64 {
	if p == nil {
		return 0
	}
	return p.fp
}

// refEntry is one block held by one rank: its path and its copy count per
// tier.
type refEntry struct {
	path   *refPath
	counts [indexer.NumTiers]uint32
}

func (e *refEntry) empty() bool { return e.counts == [indexer.NumTiers]uint32{} }

// refRank is one rank's state in the model.
type refRank struct {
	entries map[uint64]*refEntry // engine hash → entry; every entry has a count > 0
	byPath  map[uint64]uint64    // fingerprint of the entry's path → engine hash
	seq     uint64
	hasSeq  bool
	// redundant counts the blocks of redundant stores: device stores
	// that applied whole and only added a device copy to blocks the rank
	// held on the device.
	redundant uint64
}

// refModel is the reference: per rank, a map of engine hash → (path, counts).
type refModel struct {
	blockSize int
	paths     map[uint64]*refPath // interned paths by fingerprint
	ranks     map[indexer.Rank]*refRank
	counts    [indexer.NumReasons]uint64
	redundant uint64 // Σ the ranks' redundant, including ranks since removed
}

func newRefModel(blockSize int) *refModel {
	return &refModel{blockSize: blockSize, paths: make(map[uint64]*refPath), ranks: make(map[indexer.Rank]*refRank)}
}

// child returns the interned path p ++ [h].
func (m *refModel) child(p *refPath, h uint64) *refPath {
	fp := pathFP(p.fingerprint(), h)
	c := m.paths[fp]
	if c == nil {
		c = &refPath{parent: p, hash: h, fp: fp}
		if p != nil {
			c.depth = p.depth + 1
		} else {
			c.depth = 1
		}
		m.paths[fp] = c
	}
	return c
}

func (m *refModel) rank(r indexer.Rank) *refRank {
	rr := m.ranks[r]
	if rr == nil {
		rr = &refRank{entries: make(map[uint64]*refEntry), byPath: make(map[uint64]uint64)}
		m.ranks[r] = rr
	}
	return rr
}

// entry returns r's entry for engine hash h, or nil.
func (m *refModel) entry(r indexer.Rank, h uint64) *refEntry {
	if rr := m.ranks[r]; rr != nil {
		return rr.entries[h]
	}
	return nil
}

// fail counts blocks skipped for reason and returns the error the tree is
// expected to return (nil when nothing was skipped).
func (m *refModel) fail(r indexer.Rank, reason indexer.Reason, h uint64, blocks int) *indexer.OpError {
	if blocks == 0 {
		return nil
	}
	m.counts[reason] += uint64(blocks)
	return &indexer.OpError{Rank: r, Reason: reason, Hash: h, Blocks: blocks}
}

// Store applies a BlockStored event as the semantics define it.
func (m *refModel) Store(r indexer.Rank, s indexer.Stored) *indexer.OpError {
	if len(s.Hashes) == 0 {
		return nil
	}
	if len(s.Tokens) == 0 && s.Tier != indexer.TierDevice {
		// Offload: add the tier to blocks the rank already holds.
		missing, first := 0, uint64(0)
		for _, h := range s.Hashes {
			e := m.entry(r, h)
			if e == nil {
				if missing == 0 {
					first = h
				}
				missing++
				continue
			}
			e.counts[s.Tier]++
		}
		return m.fail(r, indexer.ReasonOffloadUnknown, first, missing)
	}
	if s.BlockSize != m.blockSize {
		return m.fail(r, indexer.ReasonBlockSize, s.Hashes[0], len(s.Hashes))
	}
	for i, h := range s.Hashes {
		if (s.HasParent && h == s.Parent) || slices.Contains(s.Hashes[:i], h) {
			return m.fail(r, indexer.ReasonSelfReference, s.Hashes[0], len(s.Hashes))
		}
	}
	rr := m.rank(r)
	var path *refPath
	if s.HasParent {
		p := rr.entries[s.Parent]
		if p == nil {
			return m.fail(r, indexer.ReasonParentNotFound, s.Parent, len(s.Hashes))
		}
		path = p.path
	}
	usable := min(len(s.Hashes), len(s.Tokens)/m.blockSize)
	local := indexer.HashBlocks(nil, s.Tokens[:usable*m.blockSize], m.blockSize, s.Seed)
	redundant := s.Tier == indexer.TierDevice && usable == len(s.Hashes)
	for i := 0; i < usable; i++ {
		path = m.child(path, local[i])
		x := s.Hashes[i]
		e := rr.entries[x]
		if other, ok := rr.byPath[path.fp]; (e != nil && e.path != path) || (ok && other != x) {
			return m.fail(r, indexer.ReasonHashConflict, x, len(s.Hashes)-i)
		}
		if e == nil {
			e = &refEntry{path: path}
			rr.entries[x] = e
			rr.byPath[path.fp] = x
		}
		if e.counts[indexer.TierDevice] == 0 {
			redundant = false
		}
		e.counts[s.Tier]++
	}
	if redundant {
		rr.redundant += uint64(len(s.Hashes))
		m.redundant += uint64(len(s.Hashes))
	}
	if usable < len(s.Hashes) {
		return m.fail(r, indexer.ReasonShortTokens, s.Hashes[usable], len(s.Hashes)-usable)
	}
	return nil
}

// Remove applies a BlockRemoved event: one copy of each hash leaves the tier.
func (m *refModel) Remove(r indexer.Rank, rm indexer.Removed) *indexer.OpError {
	missing, first := 0, uint64(0)
	for _, h := range rm.Hashes {
		e := m.entry(r, h)
		if e == nil || e.counts[rm.Tier] == 0 {
			if missing == 0 {
				first = h
			}
			missing++
			continue
		}
		e.counts[rm.Tier]--
		if e.empty() {
			rr := m.ranks[r]
			delete(rr.entries, h)
			delete(rr.byPath, e.path.fp)
		}
	}
	return m.fail(r, indexer.ReasonBlockNotFound, first, missing)
}

// Clear drops every entry of r; r stays known with its watermark.
func (m *refModel) Clear(r indexer.Rank) {
	if rr := m.ranks[r]; rr != nil {
		clear(rr.entries)
		clear(rr.byPath)
	}
}

// RemoveRank drops r's entries and forgets r.
func (m *refModel) RemoveRank(r indexer.Rank) { delete(m.ranks, r) }

// RemoveWorker removes every rank of worker id.
func (m *refModel) RemoveWorker(id uint64) {
	for r := range m.ranks {
		if r.WorkerID == id {
			delete(m.ranks, r)
		}
	}
}

// SetWatermark records seq for r, making r known.
func (m *refModel) SetWatermark(r indexer.Rank, seq uint64) {
	rr := m.rank(r)
	rr.seq, rr.hasSeq = seq, true
}

// Match returns every rank's cumulative runs along q, sorted by rank.
func (m *refModel) Match(q []uint64) []indexer.Overlap {
	fps := make([]uint64, len(q))
	var fp uint64
	for i, h := range q {
		fp = pathFP(fp, h)
		fps[i] = fp
	}
	var out []indexer.Overlap
	for r, rr := range m.ranks {
		ov := indexer.Overlap{Rank: r}
		devOn, hostOn := true, true
		for _, fp := range fps {
			h, ok := rr.byPath[fp]
			if !ok {
				break
			}
			c := rr.entries[h].counts
			devOn = devOn && c[indexer.TierDevice] > 0
			hostOn = hostOn && (c[indexer.TierDevice] > 0 || c[indexer.TierHost] > 0)
			if devOn {
				ov.Device++
			}
			if hostOn {
				ov.Host++
			}
			ov.Disk++
		}
		ov.Upper = ov.Disk
		if ov.Disk > 0 {
			out = append(out, ov)
		}
	}
	sortOverlaps(out)
	return out
}

// Entries is the number of (rank, block) pairs.
func (m *refModel) Entries() int {
	n := 0
	for _, rr := range m.ranks {
		n += len(rr.entries)
	}
	return n
}

// Blocks is the number of distinct paths held by some rank, closed under
// prefixes.
func (m *refModel) Blocks() int {
	seen := make(map[uint64]struct{})
	for _, rr := range m.ranks {
		for _, e := range rr.entries {
			// A present prefix was inserted with all of its own prefixes.
			for p := e.path; p != nil; p = p.parent {
				if _, ok := seen[p.fp]; ok {
					break
				}
				seen[p.fp] = struct{}{}
			}
		}
	}
	return len(seen)
}

// sortedRanks returns the known ranks in order.
func (m *refModel) sortedRanks() []indexer.Rank {
	out := make([]indexer.Rank, 0, len(m.ranks))
	for r := range m.ranks {
		out = append(out, r)
	}
	slices.SortFunc(out, cmpRank)
	return out
}

// sortedHashes returns r's engine hashes in order.
func (m *refModel) sortedHashes(r indexer.Rank) []uint64 {
	rr := m.ranks[r]
	if rr == nil {
		return nil
	}
	out := make([]uint64, 0, len(rr.entries))
	for h := range rr.entries {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// maximalPaths returns the distinct entry paths that are not a proper
// prefix of another entry path, in a deterministic order.
func (m *refModel) maximalPaths() [][]uint64 {
	inner := make(map[*refPath]bool)
	held := make(map[*refPath]bool)
	for _, rr := range m.ranks {
		for _, e := range rr.entries {
			held[e.path] = true
			for p := e.path.parent; p != nil && !inner[p]; p = p.parent {
				inner[p] = true
			}
		}
	}
	var out [][]uint64
	for p := range held {
		if !inner[p] {
			out = append(out, p.hashes())
		}
	}
	slices.SortFunc(out, slices.Compare)
	return out
}

// ---- comparison helpers ----

func cmpRank(a, b indexer.Rank) int {
	return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
}

func sortOverlaps(o []indexer.Overlap) {
	slices.SortFunc(o, func(a, b indexer.Overlap) int { return cmpRank(a.Rank, b.Rank) })
}

// match runs tr.Match and sorts the result by rank.
func match(tr *indexer.Tree, q []uint64) []indexer.Overlap {
	out := tr.Match(q, nil)
	sortOverlaps(out)
	return out
}

// sameOverlaps compares two rank-sorted overlap lists; nil equals empty.
func sameOverlaps(a, b []indexer.Overlap) bool {
	return len(a) == len(b) && (len(a) == 0 || slices.Equal(a, b))
}

// checkOpError reports whether got is the error want describes: nil for
// nil, else an *indexer.OpError with the same fields that unwraps to the
// reason's sentinel.
func checkOpError(got error, want *indexer.OpError) error {
	if want == nil {
		if got != nil {
			return fmt.Errorf("error %v, want nil", got)
		}
		return nil
	}
	var oe *indexer.OpError
	if !errors.As(got, &oe) {
		return fmt.Errorf("error %v, want %v", got, want)
	}
	if *oe != *want {
		return fmt.Errorf("error %+v, want %+v", *oe, *want)
	}
	if !errors.Is(got, reasonSentinel[want.Reason]) {
		return fmt.Errorf("error %v does not wrap %v", got, reasonSentinel[want.Reason])
	}
	return nil
}

var reasonSentinel = map[indexer.Reason]error{
	indexer.ReasonParentNotFound: indexer.ErrParentNotFound,
	indexer.ReasonBlockNotFound:  indexer.ErrBlockNotFound,
	indexer.ReasonSelfReference:  indexer.ErrSelfReference,
	indexer.ReasonBlockSize:      indexer.ErrBlockSize,
	indexer.ReasonShortTokens:    indexer.ErrShortTokens,
	indexer.ReasonOffloadUnknown: indexer.ErrOffloadUnknown,
	indexer.ReasonHashConflict:   indexer.ErrHashConflict,
}

// compareTree checks every observable of tr against m for the probe
// queries and returns the first difference found.
func compareTree(tr *indexer.Tree, m *refModel, probes [][]uint64, extraRanks []indexer.Rank) error {
	st := tr.Stats()
	if want := m.Entries(); st.Entries != want {
		return fmt.Errorf("Stats().Entries = %d, model %d", st.Entries, want)
	}
	if want := m.Blocks(); st.Blocks != want {
		return fmt.Errorf("Stats().Blocks = %d, model %d", st.Blocks, want)
	}
	if st.Nodes > st.Blocks || (st.Nodes == 0) != (st.Blocks == 0) {
		return fmt.Errorf("Stats().Nodes = %d with %d blocks", st.Nodes, st.Blocks)
	}
	if want := len(m.ranks); st.Ranks != want {
		return fmt.Errorf("Stats().Ranks = %d, model %d", st.Ranks, want)
	}
	got := tr.Ranks()
	slices.SortFunc(got, cmpRank)
	if want := m.sortedRanks(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		return fmt.Errorf("Ranks() = %v, model %v", got, want)
	}
	if got, want := tr.Counts(), m.counts; got != want {
		return fmt.Errorf("Counts() = %v, model %v", got, want)
	}
	if got, want := tr.Redundant(), m.redundant; got != want {
		return fmt.Errorf("Redundant() = %d, model %d", got, want)
	}
	for _, r := range extraRanks {
		if _, known := m.ranks[r]; !known {
			if n := tr.RankBlocks(r); n != 0 {
				return fmt.Errorf("RankBlocks(%v) = %d for an unknown rank", r, n)
			}
			if _, ok := tr.Watermark(r); ok {
				return fmt.Errorf("Watermark(%v) set for an unknown rank", r)
			}
		}
	}
	if err := compareRanks(tr, m, m.sortedRanks()); err != nil {
		return err
	}
	for _, q := range probes {
		got, want := match(tr, q), m.Match(q)
		if !sameOverlaps(got, want) {
			return fmt.Errorf("Match(%x) = %v, model %v", q, got, want)
		}
		for _, o := range got {
			if !(o.Device <= o.Host && o.Host <= o.Disk && int(o.Disk) <= len(q)) {
				return fmt.Errorf("Match(%x): overlap %+v not cumulative", q, o)
			}
		}
	}
	return nil
}

// compareRanks compares what tr holds of each of ranks with the model.
func compareRanks(tr *indexer.Tree, m *refModel, ranks []indexer.Rank) error {
	for _, r := range ranks {
		rr := m.ranks[r]
		if n := tr.RankBlocks(r); n != len(rr.entries) {
			return fmt.Errorf("RankBlocks(%v) = %d, model %d", r, n, len(rr.entries))
		}
		if n := tr.RankRedundant(r); n != rr.redundant {
			return fmt.Errorf("RankRedundant(%v) = %d, model %d", r, n, rr.redundant)
		}
		seq, ok := tr.Watermark(r)
		if ok != rr.hasSeq || seq != rr.seq {
			return fmt.Errorf("Watermark(%v) = %d, %v; model %d, %v", r, seq, ok, rr.seq, rr.hasSeq)
		}
		var tiers [indexer.NumTiers]int
		for _, e := range rr.entries {
			for tier, c := range e.counts {
				if c > 0 {
					tiers[tier]++
				}
			}
		}
		if got := tr.RankTierBlocks(r); got != tiers {
			return fmt.Errorf("RankTierBlocks(%v) = %v, model %v", r, got, tiers)
		}
		for _, h := range m.sortedHashes(r) {
			c, ok := tr.Holds(r, h)
			if !ok || c != rr.entries[h].counts {
				return fmt.Errorf("Holds(%v, %#x) = %v, %v; model %v", r, h, c, ok, rr.entries[h].counts)
			}
		}
		for _, h := range []uint64{0, 1, 2, 3, 4, 5, 6, ^uint64(0)} {
			if rr.entries[h] == nil {
				if c, ok := tr.Holds(r, h); ok {
					return fmt.Errorf("Holds(%v, %#x) = %v, true; model holds nothing", r, h, c)
				}
			}
		}
	}
	return nil
}

// compareShards is compareTree over the trees of a sharded partition
// (Index.Read), whose ranks are disjoint: the counts summed, each rank
// checked in its tree, and each probe's overlaps gathered from all.
func compareShards(trees []*indexer.Tree, m *refModel, probes [][]uint64, extraRanks []indexer.Rank) error {
	if len(trees) == 1 {
		return compareTree(trees[0], m, probes, extraRanks)
	}
	var entries, nranks int
	var counts [indexer.NumReasons]uint64
	var redundant uint64
	var got []indexer.Rank
	home := map[indexer.Rank]*indexer.Tree{}
	for _, tr := range trees {
		st := tr.Stats()
		entries += st.Entries
		nranks += st.Ranks
		for i, n := range tr.Counts() {
			counts[i] += n
		}
		redundant += tr.Redundant()
		for _, r := range tr.Ranks() {
			if home[r] != nil {
				return fmt.Errorf("rank %v in two shards", r)
			}
			home[r] = tr
			got = append(got, r)
		}
	}
	if want := m.Entries(); entries != want {
		return fmt.Errorf("Σ Stats().Entries = %d, model %d", entries, want)
	}
	if want := len(m.ranks); nranks != want {
		return fmt.Errorf("Σ Stats().Ranks = %d, model %d", nranks, want)
	}
	slices.SortFunc(got, cmpRank)
	if want := m.sortedRanks(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		return fmt.Errorf("Ranks() = %v, model %v", got, want)
	}
	if counts != m.counts {
		return fmt.Errorf("Σ Counts() = %v, model %v", counts, m.counts)
	}
	if redundant != m.redundant {
		return fmt.Errorf("Σ Redundant() = %d, model %d", redundant, m.redundant)
	}
	for _, r := range extraRanks {
		if _, known := m.ranks[r]; !known && home[r] != nil {
			return fmt.Errorf("shard holds unknown rank %v", r)
		}
	}
	for _, r := range m.sortedRanks() {
		if err := compareRanks(home[r], m, []indexer.Rank{r}); err != nil {
			return err
		}
	}
	for _, q := range probes {
		var got []indexer.Overlap
		for _, tr := range trees {
			got = tr.Match(q, got)
		}
		sortOverlaps(got)
		if want := m.Match(q); !sameOverlaps(got, want) {
			return fmt.Errorf("Match(%x) = %v, model %v", q, got, want)
		}
	}
	return nil
}

// ---- small builders for hand-written tests ----

// blockTokens returns the tokens of blocks with the given ids: block id v
// is v*bs, v*bs+1, …, so distinct ids give distinct local hashes.
func blockTokens(bs int, ids ...uint32) []uint32 {
	out := make([]uint32, 0, bs*len(ids))
	for _, v := range ids {
		for j := 0; j < bs; j++ {
			out = append(out, v*uint32(bs)+uint32(j))
		}
	}
	return out
}

// hashRange returns the engine hashes base, base+1, …, base+n-1.
func hashRange(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

// treeAndModel drives a Tree and the reference model in lockstep for the
// hand-written tests, failing at the first divergence in an event's error.
type treeAndModel struct {
	t  testing.TB
	tr *indexer.Tree
	m  *refModel
}

func newTreeAndModel(t testing.TB, blockSize int) *treeAndModel {
	return &treeAndModel{t: t, tr: indexer.NewTree(blockSize), m: newRefModel(blockSize)}
}

// store applies s to both and returns the tree's error.
func (tm *treeAndModel) store(r indexer.Rank, s indexer.Stored) error {
	tm.t.Helper()
	want := tm.m.Store(r, s)
	got := tm.tr.Store(r, s)
	if err := checkOpError(got, want); err != nil {
		tm.t.Fatalf("Store(%v, %+v): %v", r, s, err)
	}
	return got
}

// remove applies rm to both and returns the tree's error.
func (tm *treeAndModel) remove(r indexer.Rank, rm indexer.Removed) error {
	tm.t.Helper()
	want := tm.m.Remove(r, rm)
	got := tm.tr.Remove(r, rm)
	if err := checkOpError(got, want); err != nil {
		tm.t.Fatalf("Remove(%v, %+v): %v", r, rm, err)
	}
	return got
}

// check compares every observable with the model, probing qs.
func (tm *treeAndModel) check(qs ...[]uint64) {
	tm.t.Helper()
	probes := append(tm.m.maximalPaths(), qs...)
	if err := compareTree(tm.tr, tm.m, probes, nil); err != nil {
		tm.t.Fatal(err)
	}
}
