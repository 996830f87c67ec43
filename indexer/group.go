package indexer

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// KV-cache groups (hybrid models).
//
// vLLM's hybrid KV-cache manager keeps one KV-cache group per attention
// type of a model that mixes them (Gemma 3: sliding-window and full
// attention; Llama 4: chunked local and full), numbered in the order the
// types first appear among the layers, and publishes one event stream per
// group: every block a request caches is stored once per group, under the
// same chained block hash, and each group evicts its copies on its own.
//
// The tree indexes one group per rank, its main group: the lowest-numbered
// full-attention group (Attention Full: full, MLA or sink full attention),
// whose holdings are prefix-closed like a single-group engine's. Every other
// group of the rank is learned from its stores; a group whose hit rule the
// index models (another full-attention group, or a sliding-window group
// with a window) also has its holdings tracked, as a set of engine hashes
// with copy counts per tier, so that Match can report the hit vLLM would
// grant (see grant). A sliding-window group's holdings are not
// prefix-closed (blocks leave as the window slides), which is why they are
// a set and not holders in the tree; and since block hashes are chained,
// the set needs no positions: the tree knows the rank's engine hash at
// every position below its main overlap (node.ext).

// Attention is how a KV-cache group's blocks make a prefix hit.
type Attention uint8

const (
	// AttentionFull is full attention (vLLM's full, MLA and sink full
	// attention): a hit of L blocks needs blocks 0..L-1. It is the zero
	// value, so that the ops of single-group engines are main-group ops.
	AttentionFull Attention = iota
	// AttentionSlidingWindow is sliding-window attention with a window of
	// Group.Window tokens (vLLM's sliding_window and sliding_window_mla).
	AttentionSlidingWindow
	// AttentionOther is an attention whose hit rule the index does not
	// model (chunked local attention, whose chunk size is not on the wire;
	// Mamba; cross and encoder-only attention; unknown kinds): the group is
	// learned but its blocks are not tracked, and it does not limit the hit.
	AttentionOther
	numAttention
)

var attentionNames = [numAttention]string{"full", "sliding_window", "other"}

func (a Attention) String() string {
	if a < numAttention {
		return attentionNames[a]
	}
	return fmt.Sprintf("attention(%d)", uint8(a))
}

// ParseAttention is the inverse of Attention.String.
func ParseAttention(s string) (Attention, bool) {
	for i, n := range attentionNames {
		if n == s {
			return Attention(i), true
		}
	}
	return 0, false
}

// Group names the KV-cache group of an op (vLLM's group_idx) and, on
// stores, what the group is. The zero Group is group 0 of full attention:
// what the events of a single-group engine, which name no group, mean.
//
// Routing, per rank: a store of a full-attention group numbered below the
// rank's main group (or of the first full-attention group the rank stores)
// makes that group the main one — a group first stored now held nothing
// before (its earlier stores would have been seen), so the previous main
// group's blocks move to a tracked set without loss. A store or remove of
// the main group goes to the tree; of another group, to its set (learning
// the group on its first store). A remove of a group the rank never stored
// is skipped as ReasonUnknownGroup, never applied to the main group. Clear
// (AllBlocksCleared) empties every group and forgets the layout.
type Group struct {
	Idx int // group_idx; 0 when the event names none
	// Attention, Kind and Window describe the group on stores; removes
	// name no kind, and the index routes them by Idx alone.
	Attention Attention
	Kind      string // kv_cache_spec_kind as sent, for display; "" if absent
	Window    int    // kv_cache_spec_sliding_window in tokens; 0 if absent
}

// MaxGroups is how many KV-cache groups the index learns per rank, the
// main one included; a store for a further group is skipped
// (ReasonUnknownGroup). vLLM's hybrid models have a handful (Gemma 3 27B:
// six sliding-window groups and one full-attention group).
const MaxGroups = 64

// GroupState is what the index learned of one KV-cache group of a rank.
type GroupState struct {
	Idx       int
	Attention Attention
	Kind      string // kv_cache_spec_kind of the group's first store ("" if none was sent)
	Window    int    // sliding window in tokens (0: none sent)
	// Main: the group the tree indexes (Blocks and Tiers are then the
	// rank's RankState.Blocks and Tiers).
	Main bool
	// Tracked: the group's blocks are tracked — the main group, and
	// groups whose hit rule the index models (full attention, and sliding
	// window with a window, in the partition's block size). An untracked
	// group holds blocks the index does not know (Blocks 0) and does not
	// limit the granted hit, which is then an upper bound.
	Tracked bool
	// Need is how many blocks a sliding-window group must hold right
	// before the end of a hit: max(1, ceil((Window-1)/block size)).
	Need   int
	Blocks int           // blocks held, in any tier
	Tiers  [NumTiers]int // blocks held per tier (a block in two tiers counts in both)
}

// groupInfo is a group's identity as learned from its first store.
type groupInfo struct {
	idx    int
	att    Attention
	kind   string
	window int
}

func infoOf(g Group) groupInfo {
	return groupInfo{idx: g.Idx, att: g.Attention, kind: g.Kind, window: g.Window}
}

// groupSet is one non-main group of a rank.
type groupSet struct {
	groupInfo
	tracked bool
	bit     uint8             // tracked groups: the group's bit in node.gb
	need    uint32            // sliding window: blocks needed before a hit's end
	blocks  map[uint64]uint64 // engine hash → copies per tier, 16 bits each (tracked groups)
	tiers   [NumTiers]int
}

// rankGroups is the non-main groups of a rank; nil until it stores one.
type rankGroups struct {
	list    []groupSet    // sorted by idx; never the main group
	tiers   [NumTiers]int // Σ list[i].tiers
	entries int           // Σ len(list[i].blocks)
	tracked int           // groups in list with tracked holdings
	// orphans counts the entries of blocks the main group does not hold
	// (see Tree.orphans).
	orphans int
}

// Copy counts of group blocks are packed 16 bits per tier. A count that
// would pass groupCountMax stays there and marks the rank truncated (it
// then holds fewer copies than its engine).
const groupCountMax = 0xffff

func gcount(v uint64, tier Tier) uint32 { return uint32(v>>(16*tier)) & groupCountMax }

// groupTierMask[t] selects the counts of tiers 0..t: a block held in one
// of them is held "through" tier t (Device, Host, Disk of an Overlap;
// disk includes external).
var groupTierMask = [3]uint64{0xffff, 0xffff_ffff, ^uint64(0)}

// rule says whether the index tracks a group described by g whose blocks
// are blockSize tokens, and for a sliding window how many blocks a hit
// needs before its end.
func rule(g Group, partition, blockSize int) (tracked bool, need uint32) {
	if blockSize != partition {
		return false, 0
	}
	switch g.Attention {
	case AttentionFull:
		return true, 0
	case AttentionSlidingWindow:
		if g.Window <= 0 {
			return false, 0
		}
		n := (int64(g.Window) - 1 + int64(blockSize) - 1) / int64(blockSize)
		return true, uint32(min(max(n, 1), 1<<31))
	}
	return false, 0
}

// group returns rank rid's non-main group idx, or nil. With learn (a
// store of g with blocks of blockSize tokens; 0 for an offload, which
// names none reliably) it learns the group if the rank has room.
func (t *Tree) group(rid uint32, idx int, learn *Group, blockSize int) *groupSet {
	rs := &t.ranks[rid]
	if rs.groups == nil {
		if learn == nil {
			return nil
		}
		rs.groups = &rankGroups{}
	}
	rg := rs.groups
	i, found := slices.BinarySearchFunc(rg.list, idx, func(e groupSet, idx int) int { return cmp.Compare(e.idx, idx) })
	if found {
		return &rg.list[i]
	}
	if learn == nil || len(rg.list)+1 >= MaxGroups {
		return nil
	}
	if blockSize == 0 {
		blockSize = t.blockSize
	}
	tracked, need := rule(*learn, t.blockSize, blockSize)
	return t.addGroup(rid, infoOf(*learn), tracked, need)
}

// addGroup adds a non-main group to rank rid, which has none of that
// index.
func (t *Tree) addGroup(rid uint32, info groupInfo, tracked bool, need uint32) *groupSet {
	rs := &t.ranks[rid]
	if rs.groups == nil {
		rs.groups = &rankGroups{}
	}
	rg := rs.groups
	i, _ := slices.BinarySearchFunc(rg.list, info.idx, func(e groupSet, idx int) int { return cmp.Compare(e.idx, idx) })
	gs := groupSet{groupInfo: info, tracked: tracked, need: need}
	if tracked {
		gs.blocks = make(map[uint64]uint64)
		gs.bit = uint8(rg.tracked) // groups leave only all together (clearGroups)
		if rg.tracked++; rg.tracked == 1 {
			t.hybrid++
		}
	}
	rg.list = slices.Insert(rg.list, i, gs)
	return &rg.list[i]
}

// storeGroup routes a store (see Group).
func (t *Tree) storeGroup(r Rank, g *Group, s *Stored) error {
	if len(s.Hashes) == 0 {
		return nil
	}
	rid, known := t.rid(r)
	var rs *rankState
	if known {
		rs = &t.ranks[rid]
		if rs.hasMain && g.Idx == rs.main.idx {
			if rs.main.kind == "" { // learned from a snapshot without a layout
				rs.main.kind, rs.main.window = g.Kind, g.Window
			}
			return t.storeMain(r, rid, true, s)
		}
	}
	if g.Attention == AttentionFull && (!known || !rs.hasMain || g.Idx < rs.main.idx) &&
		(!known || t.group(rid, g.Idx, nil, 0) == nil) {
		if known && rs.hasMain {
			t.demoteMain(rid)
		}
		err := t.storeMain(r, rid, known, s)
		if rid, ok := t.rid(r); ok {
			rs := &t.ranks[rid]
			rs.main, rs.hasMain = infoOf(*g), true
		}
		return err
	}
	return t.storeSet(r, g, s)
}

// storeSet applies a store of a non-main group: every hash gets one more
// copy in the tier. Tokens and parent do not matter: vLLM names only the
// blocks a group caches (a sliding-window group skips those outside its
// window) with the tokens of the whole range.
func (t *Tree) storeSet(r Rank, g *Group, s *Stored) error {
	offload := len(s.Tokens) == 0 && s.Tier != TierDevice
	bs := s.BlockSize
	if offload {
		bs = 0
	}
	rid := t.rankID(r)
	t.clock += 2
	gs := t.group(rid, g.Idx, g, bs)
	if gs == nil {
		return t.fail(r, ReasonUnknownGroup, s.Hashes[0], len(s.Hashes))
	}
	if !gs.tracked {
		return nil
	}
	if !offload && s.BlockSize != t.blockSize {
		return t.fail(r, ReasonBlockSize, s.Hashes[0], len(s.Hashes))
	}
	rs := &t.ranks[rid]
	rg := rs.groups
	for _, x := range s.Hashes {
		v, ok := gs.blocks[x]
		switch gcount(v, s.Tier) {
		case groupCountMax:
			rs.truncated = true // this copy goes uncounted
			continue
		case 0:
			gs.tiers[s.Tier]++
			rg.tiers[s.Tier]++
		}
		if !ok {
			rg.entries++
			t.gentries++
			t.flipBit(rid, x, gs.bit, true)
		}
		gs.blocks[x] = v + 1<<(16*s.Tier)
	}
	return nil
}

// removeGroup routes a remove (see Group).
func (t *Tree) removeGroup(r Rank, g *Group, rm *Removed) error {
	rid, ok := t.rid(r)
	if !ok {
		return t.removeMain(r, 0, false, rm)
	}
	rs := &t.ranks[rid]
	if !rs.hasMain && rs.groups == nil {
		return t.removeMain(r, rid, true, rm) // nothing learned: the rank holds nothing
	}
	if rs.hasMain && g.Idx == rs.main.idx {
		return t.removeMain(r, rid, true, rm)
	}
	gs := t.group(rid, g.Idx, nil, 0)
	if gs == nil {
		if len(rm.Hashes) == 0 {
			return nil
		}
		return t.fail(r, ReasonUnknownGroup, rm.Hashes[0], len(rm.Hashes))
	}
	if !gs.tracked {
		return nil
	}
	rg := rs.groups
	missing, first := 0, uint64(0)
	for _, x := range rm.Hashes {
		v := gs.blocks[x]
		c := gcount(v, rm.Tier)
		if c == 0 {
			if missing == 0 {
				first = x
			}
			missing++
			continue
		}
		if c == 1 {
			gs.tiers[rm.Tier]--
			rg.tiers[rm.Tier]--
		}
		if v -= 1 << (16 * rm.Tier); v == 0 {
			delete(gs.blocks, x)
			rg.entries--
			t.gentries--
			t.flipBit(rid, x, gs.bit, false)
		} else {
			gs.blocks[x] = v
		}
	}
	if missing > 0 {
		return t.fail(r, ReasonBlockNotFound, first, missing)
	}
	return nil
}

// demoteMain moves rank rid's tree holdings (its main group's) into a
// tracked set for that group, leaving the rank with no main group.
func (t *Tree) demoteMain(rid uint32) {
	rs := &t.ranks[rid]
	old := Group{Idx: rs.main.idx, Attention: rs.main.att, Kind: rs.main.kind, Window: rs.main.window}
	rs.hasMain = false
	gs := t.group(rid, old.Idx, &old, t.blockSize)
	rs = &t.ranks[rid]
	trunc := rs.truncated
	if gs != nil && gs.tracked {
		rg := rs.groups
		t.eachEntry(rid, func(x uint64, rf ref) {
			l := t.locOf(rf)
			h := t.holderIndex(l.node, rid)
			var v uint64
			for tier := Tier(0); tier < NumTiers; tier++ {
				c := t.tierCount(l.node, h, l.pos, tier)
				if c > groupCountMax {
					c, trunc = groupCountMax, true
				}
				if c > 0 {
					gs.tiers[tier]++
					rg.tiers[tier]++
				}
				v |= uint64(c) << (16 * tier)
			}
			gs.blocks[x] = v
			rg.entries++
			t.gentries++
		})
	} else if rs.lookup.len() > 0 {
		trunc = true // no room for the group: its blocks are dropped
	}
	t.clearMain(rid)
	rs = &t.ranks[rid]
	rs.truncated = trunc
	if rg := rs.groups; rg != nil { // the main group is empty: every entry is an orphan
		t.norphans += rg.entries - rg.orphans
		rg.orphans = rg.entries
	}
}

// dropGroupEntry removes engine hash x from every tracked group of rank
// rid (all tiers) and returns how many entries went.
func (t *Tree) dropGroupEntry(rid uint32, x uint64) int {
	rg := t.ranks[rid].groups
	if rg == nil || rg.entries == 0 {
		return 0
	}
	n := 0
	for i := range rg.list {
		gs := &rg.list[i]
		v, ok := gs.blocks[x]
		if !ok {
			continue
		}
		for tier := Tier(0); tier < NumTiers; tier++ {
			if gcount(v, tier) > 0 {
				gs.tiers[tier]--
				rg.tiers[tier]--
			}
		}
		delete(gs.blocks, x)
		t.flipBit(rid, x, gs.bit, false)
		n++
	}
	rg.entries -= n
	t.gentries -= n
	return n
}

// clearGroupTier drops every copy of x in tier from rank rid's tracked
// groups and returns how many groups held one there.
func (t *Tree) clearGroupTier(rid uint32, x uint64, tier Tier) int {
	rg := t.ranks[rid].groups
	if rg == nil || rg.tiers[tier] == 0 {
		return 0
	}
	n := 0
	for i := range rg.list {
		gs := &rg.list[i]
		v, ok := gs.blocks[x]
		if !ok || gcount(v, tier) == 0 {
			continue
		}
		gs.tiers[tier]--
		rg.tiers[tier]--
		n++
		if v &^= groupCountMax << (16 * tier); v == 0 {
			delete(gs.blocks, x)
			rg.entries--
			t.gentries--
			t.flipBit(rid, x, gs.bit, false)
		} else {
			gs.blocks[x] = v
		}
	}
	return n
}

// groupCopies counts rank rid's tracked groups that hold x in tier.
func (t *Tree) groupCopies(rid uint32, x uint64, tier Tier) int {
	rg := t.ranks[rid].groups
	if rg == nil || rg.tiers[tier] == 0 {
		return 0
	}
	n := 0
	for i := range rg.list {
		if gcount(rg.list[i].blocks[x], tier) > 0 {
			n++
		}
	}
	return n
}

// groupMask returns the bits of rg's tracked groups that hold x.
func (t *Tree) groupMask(rg *rankGroups, x uint64) uint64 {
	var m uint64
	for i := range rg.list {
		gs := &rg.list[i]
		if gs.tracked {
			if _, ok := gs.blocks[x]; ok {
				m |= 1 << gs.bit
			}
		}
	}
	return m
}

// setBits sets node id's group bits at slot i.
func (t *Tree) setBits(id uint32, i int, m uint64) {
	n := &t.nodes[id]
	if n.gb == nil {
		if m == 0 {
			return
		}
		n.gb = make([]uint64, len(n.ext), cap(n.ext))
	}
	n.gb[i] = m
}

// flipBit records that a group entry for x of rank rid was created (on)
// or deleted: it sets or clears the group's bit of the main group's block
// x, or, if the main group does not hold x, counts the orphan.
func (t *Tree) flipBit(rid uint32, x uint64, bit uint8, on bool) {
	rs := &t.ranks[rid]
	rf, ok := rs.lookup.get(t, rid, x)
	if !ok {
		d := -1
		if on {
			d = 1
		}
		rs.groups.orphans += d
		t.norphans += d
		return
	}
	l := t.locOf(rf)
	n := &t.nodes[l.node]
	i := int(l.pos)*len(n.hold) + t.holderIndex(l.node, rid)
	var m uint64
	if n.gb != nil {
		m = n.gb[i]
	}
	if on {
		m |= 1 << bit
	} else {
		m &^= 1 << bit
	}
	t.setBits(l.node, i, m)
}

// clearGroups forgets rank rid's non-main groups and their blocks.
func (t *Tree) clearGroups(rid uint32) {
	rs := &t.ranks[rid]
	if rs.groups == nil {
		return
	}
	t.gentries -= rs.groups.entries
	t.norphans -= rs.groups.orphans
	if rs.groups.tracked > 0 {
		t.hybrid--
	}
	rs.groups = nil
}

// adoptOrphans counts a main-group block leaving rank rid with group bits
// m: its groups' entries become orphans.
func (t *Tree) adoptOrphans(rid uint32, m uint64) {
	if m != 0 {
		n := bits.OnesCount64(m)
		t.ranks[rid].groups.orphans += n
		t.norphans += n
	}
}

// orphans counts group entries of blocks the rank's main group does not
// hold: a match never reads them (the grant looks only at positions the
// main group holds), so the memory cap and capacities drop them first.
func (t *Tree) orphans() int { return t.norphans }

// dropOrphans drops up to budget orphan entries, all their tiers (tier
// < 0), or their copies in tier, marking their ranks truncated, and
// returns how many entries (tier < 0) or tier copies went. With rid ≥ 0
// only that rank's.
func (t *Tree) dropOrphans(budget int, rid int, tier Tier, all bool) int {
	dropped := 0
	for id := range t.ranks {
		if dropped >= budget {
			break
		}
		if rid >= 0 && id != rid {
			continue
		}
		rs := &t.ranks[id]
		rg := rs.groups
		if rg == nil || rg.orphans == 0 {
			continue
		}
		for i := range rg.list {
			gs := &rg.list[i]
			for x, v := range gs.blocks {
				if dropped >= budget || rg.orphans == 0 {
					break
				}
				if _, ok := rs.lookup.get(t, uint32(id), x); ok {
					continue
				}
				if all {
					dropped += t.dropGroupEntry(uint32(id), x)
				} else if gcount(v, tier) > 0 {
					dropped += t.clearGroupTier(uint32(id), x, tier)
				}
				rs.truncated = true
			}
		}
	}
	return dropped
}

// Groups returns what the tree learned of r's KV-cache groups, by group
// index: the main group (if learned) and every other group. It is nil for
// a rank that stored nothing since it was first seen or cleared. The
// slice is the caller's.
func (t *Tree) Groups(r Rank) []GroupState {
	rid, ok := t.rankIDs[r]
	if !ok {
		return nil
	}
	rs := &t.ranks[rid]
	var out []GroupState
	if rs.hasMain {
		out = append(out, GroupState{Idx: rs.main.idx, Attention: rs.main.att, Kind: rs.main.kind, Window: rs.main.window,
			Main: true, Tracked: true, Blocks: rs.lookup.len(), Tiers: rs.tiers})
	}
	if rs.groups != nil {
		for i := range rs.groups.list {
			gs := &rs.groups.list[i]
			out = append(out, GroupState{Idx: gs.idx, Attention: gs.att, Kind: gs.kind, Window: gs.window,
				Tracked: gs.tracked, Need: int(gs.need), Blocks: len(gs.blocks), Tiers: gs.tiers})
		}
	}
	slices.SortFunc(out, func(a, b GroupState) int { return cmp.Compare(a.Idx, b.Idx) })
	return out
}

// GroupHolds reports the copy counts per tier of engine hash h in r's
// non-main group idx (false if the group is the main one, unknown or
// untracked, or does not hold h; see Holds for the main group).
func (t *Tree) GroupHolds(r Rank, idx int, h uint64) (counts [NumTiers]uint32, ok bool) {
	rid, known := t.rankIDs[r]
	if !known {
		return counts, false
	}
	gs := t.group(rid, idx, nil, 0)
	if gs == nil || !gs.tracked {
		return counts, false
	}
	v, ok := gs.blocks[h]
	for tier := Tier(0); tier < NumTiers; tier++ {
		counts[tier] = gcount(v, tier)
	}
	return counts, ok
}

// ---- the granted hit ----

// grant sets o's tiers to the hit vLLM's hybrid coordinator would grant
// rank rid, whose main group holds the query's blocks along path up to o's
// runs (o.Device, o.Host, o.Disk on entry).
//
// The rule (vLLM vllm/v1/core/kv_cache_coordinator.py,
// HybridKVCacheCoordinator.find_longest_cache_hit, with
// vllm/v1/core/single_type_kv_cache_manager.py,
// FullAttentionManager.find_longest_cache_hit and
// SlidingWindowManager.find_longest_cache_hit): starting from the longest
// hit allowed, each group in turn cuts the candidate length L to the
// longest hit it can serve within L, until no group cuts it. A
// full-attention group serves L if it holds blocks 0..L-1. A
// sliding-window group scans right to left from block L-1 for the first
// run of need = ceil((window-1)/block size) consecutive held blocks (need
// taken as at least 1); a run at blocks i..i+need-1 serves i+need blocks;
// with no such run it serves the blocks it holds from block 0 (all of
// 0..L-1 when L < need and it holds them all). Each of these is the
// longest L' ≤ L the group serves, and each group's servable lengths do
// not depend on the others, so the fixed point is the longest L at most
// the main group's run that every group serves; the order of the groups
// does not matter. Blocks are the partition's size in every tracked
// group, so vLLM's alignment to the scheduler block is a no-op. Each
// tier applies the rule to the copies in that tier or faster.
func (t *Tree) grant(o *Overlap, rid uint32, rg *rankGroups, path []uint32) {
	c := extCursor{t: t, path: path, rid: rid, i: -1}
	// With device copies only in the groups, node.gb (any tier) says
	// what each group holds on the device; otherwise the sets answer.
	fast := rg.tiers[TierHost] == 0 && rg.tiers[TierDisk] == 0 && rg.tiers[TierExternal] == 0
	dev := t.grantTier(&c, rg, o.Device, 0, fast)
	// Without slower copies in the groups, a tier whose main run is the
	// faster tier's grants what that tier grants.
	host := dev
	if rg.tiers[TierHost] > 0 || o.Host != o.Device {
		host = t.grantTier(&c, rg, o.Host, 1, fast)
	}
	disk := host
	if rg.tiers[TierDisk] > 0 || rg.tiers[TierExternal] > 0 || o.Disk != o.Host {
		disk = t.grantTier(&c, rg, o.Disk, 2, fast)
	}
	o.Device, o.Host, o.Disk = dev, host, disk
}

// grantTier returns the longest hit within bound that every tracked group
// of rg serves through tier level (0 device, 1 host, 2 disk), reading the
// groups' holdings from node.gb (fast) or their sets.
func (t *Tree) grantTier(c *extCursor, rg *rankGroups, bound uint32, level int, fast bool) uint32 {
	if fast {
		return grantBits(c, rg, bound)
	}
	mask := groupTierMask[level]
	held := func(gs *groupSet, p uint32) bool { return gs.blocks[c.hash(p)]&mask != 0 }
	L := bound
	var runs [MaxGroups]uint32 // full-attention groups: their run from block 0, within bound
	for pass := 0; L > 0; pass++ {
		prev := L
		for i := range rg.list {
			gs := &rg.list[i]
			if !gs.tracked {
				continue
			}
			switch gs.att {
			case AttentionFull:
				if pass == 0 {
					n := uint32(0)
					for n < bound && held(gs, n) {
						n++
					}
					runs[i] = n
				}
				L = min(L, runs[i])
			case AttentionSlidingWindow:
				run := uint32(0)
				hit := uint32(0)
				for p := int64(L) - 1; p >= 0; p-- {
					if !held(gs, uint32(p)) {
						run = 0
						continue
					}
					if run++; run >= gs.need {
						hit = uint32(p) + gs.need
						break
					}
				}
				if run < gs.need {
					hit = run // no run of need blocks: the blocks held from block 0
				}
				L = hit
			}
			if L == 0 {
				return 0
			}
		}
		if L == prev {
			break
		}
	}
	return L
}

// grantBits is grantTier reading every group's holdings of a position at
// once from node.gb: one pass over the positions serves all groups.
func grantBits(c *extCursor, rg *rankGroups, bound uint32) uint32 {
	var full, sliding uint64 // bits of the tracked groups of each kind
	var need [MaxGroups]uint32
	for i := range rg.list {
		gs := &rg.list[i]
		switch {
		case !gs.tracked:
		case gs.att == AttentionFull:
			full |= 1 << gs.bit
		case gs.att == AttentionSlidingWindow:
			sliding |= 1 << gs.bit
			need[gs.bit] = gs.need
		}
	}
	L := bound
	if full != 0 {
		// Full attention: the run from block 0 that every such group holds.
		n := uint32(0)
		for n < L && c.bits(n)&full == full {
			n++
		}
		L = n
	}
	for L > 0 && sliding != 0 {
		// Each sliding-window group's longest hit within L: the first run
		// of need held blocks scanning right to left, else its run from
		// block 0; all groups in one scan.
		var run [MaxGroups]uint32
		hit := L
		open := sliding // groups whose run of need blocks is not found yet
		for p := int64(L) - 1; p >= 0 && open != 0; p-- {
			m := c.bits(uint32(p))
			for o := open; o != 0; o &= o - 1 {
				b := bits.TrailingZeros64(o)
				if m&(1<<b) == 0 {
					run[b] = 0
					continue
				}
				if run[b]++; run[b] >= need[b] {
					hit = min(hit, uint32(p)+need[b])
					open &^= 1 << b
				}
			}
		}
		for o := open; o != 0; o &= o - 1 {
			hit = min(hit, run[bits.TrailingZeros64(o)]) // the blocks held from block 0
		}
		if hit == L {
			break
		}
		L = hit
	}
	return L
}

// extCursor reads one rank's engine hashes along the nodes of a query's
// path, by position. Scans move by one position at a time, so it keeps
// the current node.
type extCursor struct {
	t    *Tree
	path []uint32
	rid  uint32
	i    int // index in path of the current node; -1 before the first read
	n    *node
	h    int // the rank's holder index in n
}

// slot returns the index of position p in its node's block-major arrays.
func (c *extCursor) slot(p uint32) int {
	if c.i < 0 {
		c.seek(0)
	}
	for p < c.n.depth {
		c.seek(c.i - 1)
	}
	for p >= c.n.depth+uint32(len(c.n.hashes)) {
		c.seek(c.i + 1)
	}
	return int(p-c.n.depth)*len(c.n.hold) + c.h
}

// hash returns the rank's engine hash of position p.
func (c *extCursor) hash(p uint32) uint64 { return c.n.ext[c.slot(p)] }

// bits returns the rank's group bits of position p.
func (c *extCursor) bits(p uint32) uint64 {
	i := c.slot(p)
	if c.n.gb == nil {
		return 0
	}
	return c.n.gb[i]
}

func (c *extCursor) seek(i int) {
	c.i = i
	id := c.path[i]
	c.n = &c.t.nodes[id]
	c.h = c.t.holderIndex(id, c.rid)
}
