package indexer

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// Snapshot is a copy of one tree as events: every rank's blocks as stores,
// parents before children, with each rank's watermark (the last batch seq
// applied) taken together with the state it describes. Restoring it and
// then applying each rank's batches from its watermark+1 gives the state of
// an uninterrupted stream.
type Snapshot struct {
	BlockSize  int
	Ranks      []RankWatermark
	Events     []DumpEvent
	Structural []DumpNode // edges no rank holds that lead to held blocks
	// Groups is the KV-cache group layout of the ranks of hybrid models
	// (see Group), with the blocks of their non-main groups. A rank not
	// listed has one group, 0 of full attention, held by Events.
	Groups []DumpGroup
}

// DumpGroup is one KV-cache group of a rank: the main one (whose blocks
// are the rank's Events) or another, with its blocks if tracked.
type DumpGroup struct {
	Rank      Rank
	Idx       int
	Attention Attention
	Kind      string
	Window    int
	Main      bool
	Tracked   bool // non-main groups: blocks tracked (the main group always is)
	Blocks    []DumpGroupBlock
}

// DumpGroupBlock is one block of a non-main group with its copy count in
// every tier.
type DumpGroupBlock struct {
	Hash   uint64
	Counts [NumTiers]uint32
}

// RankWatermark is a rank's last applied batch seq (if any).
type RankWatermark struct {
	Rank   Rank
	Seq    uint64
	HasSeq bool
	Digest uint64 // of the batch applied as Seq; 0 = unknown
	// Truncated: the rank had lost entries to the memory cap or its
	// capacity (Tree.Truncated); a restored rank keeps the flag.
	Truncated bool
	// Degraded and DegradedReason: whether the rank is known to hold a
	// strict subset of its engine's cache, and why (RankState.Degraded:
	// the stream layer's word, a foreign batch's, or its truncation); a
	// restored rank keeps it until the event that would lift it on the
	// replica that dumped it.
	Degraded       bool
	DegradedReason string
	// Shard is the index shard the rank was dumped from (see
	// Options.Shards): its events' nodes and the structural nodes of that
	// shard make one tree. 0 in a dump of one tree.
	Shard uint32
}

// DumpEvent stores Blocks for Rank: a run of one node's edge whose blocks
// share their fastest tier. Node, ParentNode and Offset place it exactly;
// readers that only know Dynamo's format resolve ParentHash instead.
type DumpEvent struct {
	Rank       Rank
	Tier       Tier
	ParentHash uint64
	HasParent  bool
	Blocks     []DumpBlock
	Node       uint32 // dump-local edge id
	ParentNode uint32 // 0 = root
	Offset     uint32 // position of Blocks[0] on the edge
}

// DumpBlock is one block of a DumpEvent with its copy count in every tier.
type DumpBlock struct {
	Hash       uint64 // engine hash
	TokensHash uint64 // local hash
	Counts     [NumTiers]uint32
}

// DumpNode is an edge held by no rank, in shard Shard (see
// RankWatermark.Shard).
type DumpNode struct {
	Node, ParentNode uint32
	Hashes           []uint64
	Shard            uint32
}

// Dump returns a snapshot of t. Events are ordered breadth first, so every
// event's parent edge comes before it; ranks are in (worker, dp rank)
// order.
func (t *Tree) Dump() *Snapshot {
	s := &Snapshot{BlockSize: t.blockSize}
	// Every event's blocks are consecutive parts of one array: t.entries
	// blocks in one allocation rather than a growing slice per event.
	all := make([]DumpBlock, 0, t.entries)
	for r, rid := range t.rankIDs {
		st := &t.ranks[rid]
		deg, why := st.degradedState()
		s.Ranks = append(s.Ranks, RankWatermark{Rank: r, Seq: st.seq, HasSeq: st.hasSeq, Digest: st.digest, Truncated: st.truncated,
			Degraded: deg, DegradedReason: why})
	}
	slices.SortFunc(s.Ranks, func(a, b RankWatermark) int { // a dump of one state is one byte string
		return cmp.Or(cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID), cmp.Compare(a.Rank.DPRank, b.Rank.DPRank))
	})
	for _, w := range s.Ranks {
		s.Groups = t.appendDumpGroups(s.Groups, w.Rank)
	}
	queue := []uint32{}
	for c := t.nodes[0].first; c != 0; c = t.nodes[c].next {
		queue = append(queue, c)
	}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		n := &t.nodes[id]
		for c := n.first; c != 0; c = t.nodes[c].next {
			queue = append(queue, c)
		}
		if len(n.hold) == 0 {
			s.Structural = append(s.Structural, DumpNode{Node: id, ParentNode: n.parent, Hashes: append([]uint64(nil), n.hashes...)})
			continue
		}
		H := len(n.hold)
		for h := range n.hold {
			hd := &n.hold[h]
			rank := t.ranks[hd.rid].rank
			var ev *DumpEvent
			start := 0
			for j := 0; j < int(hd.cut); j++ {
				var b DumpBlock
				b.Hash, b.TokensHash = n.ext[j*H+h], n.hashes[j]
				best := Tier(NumTiers)
				for tier := Tier(NumTiers - 1); ; tier-- {
					b.Counts[tier] = t.tierCount(id, h, uint32(j), tier)
					if b.Counts[tier] > 0 {
						best = tier
					}
					if tier == 0 {
						break
					}
				}
				if ev == nil || ev.Tier != best {
					e := DumpEvent{Rank: rank, Tier: best, Node: id, ParentNode: n.parent, Offset: uint32(j)}
					if j == 0 {
						e.ParentHash, e.HasParent = hd.pext, hd.hasP
					} else {
						e.ParentHash, e.HasParent = n.ext[(j-1)*H+h], true
					}
					s.Events = append(s.Events, e)
					ev = &s.Events[len(s.Events)-1]
					start = len(all)
				}
				all = append(all, b)
				ev.Blocks = all[start:len(all):len(all)]
			}
		}
	}
	return s
}

// appendDumpGroups appends r's KV-cache groups, unless r has the layout a
// snapshot without groups implies (at most a main group 0).
func (t *Tree) appendDumpGroups(dst []DumpGroup, r Rank) []DumpGroup {
	rs := &t.ranks[t.rankIDs[r]]
	if rs.groups == nil && (!rs.hasMain || rs.main.idx == 0) {
		return dst
	}
	if rs.hasMain {
		m := rs.main
		dst = append(dst, DumpGroup{Rank: r, Idx: m.idx, Attention: m.att, Kind: m.kind, Window: m.window, Main: true})
	}
	if rs.groups == nil {
		return dst
	}
	for i := range rs.groups.list {
		gs := &rs.groups.list[i]
		d := DumpGroup{Rank: r, Idx: gs.idx, Attention: gs.att, Kind: gs.kind, Window: gs.window, Tracked: gs.tracked}
		if len(gs.blocks) > 0 {
			d.Blocks = make([]DumpGroupBlock, 0, len(gs.blocks))
			for x, v := range gs.blocks {
				b := DumpGroupBlock{Hash: x}
				for tier := Tier(0); tier < NumTiers; tier++ {
					b.Counts[tier] = gcount(v, tier)
				}
				d.Blocks = append(d.Blocks, b)
			}
			slices.SortFunc(d.Blocks, func(a, b DumpGroupBlock) int { return cmp.Compare(a.Hash, b.Hash) })
		}
		dst = append(dst, d)
	}
	if rs.hasMain {
		// The main group in index order among the others.
		gs := dst[len(dst)-len(rs.groups.list)-1:]
		slices.SortStableFunc(gs, func(a, b DumpGroup) int { return cmp.Compare(a.Idx, b.Idx) })
	}
	return dst
}

// restoreGroups sets the ranks' KV-cache groups from s.Groups, after
// their tree blocks were restored.
func (t *Tree) restoreGroups(s *Snapshot) error {
	for i := range s.Groups {
		g := &s.Groups[i]
		if g.Attention >= numAttention {
			return fmt.Errorf("restore: rank %v group %d: attention %d", g.Rank, g.Idx, g.Attention)
		}
		rid := t.rankID(g.Rank)
		rs := &t.ranks[rid]
		if (rs.hasMain && rs.main.idx == g.Idx) || t.group(rid, g.Idx, nil, 0) != nil {
			return fmt.Errorf("restore: rank %v has group %d twice", g.Rank, g.Idx)
		}
		n := 1
		if rs.groups != nil {
			n += len(rs.groups.list)
		}
		if rs.hasMain {
			n++
		}
		if n > MaxGroups {
			return fmt.Errorf("restore: rank %v has more than %d groups", g.Rank, MaxGroups)
		}
		info := groupInfo{idx: g.Idx, att: g.Attention, kind: g.Kind, window: g.Window}
		if g.Main {
			if rs.hasMain || g.Attention != AttentionFull || len(g.Blocks) > 0 {
				return fmt.Errorf("restore: rank %v: group %d cannot be its main group", g.Rank, g.Idx)
			}
			rs.main, rs.hasMain = info, true
			continue
		}
		tracked, need := rule(Group{Idx: g.Idx, Attention: g.Attention, Window: g.Window}, t.blockSize, t.blockSize)
		if g.Tracked && !tracked || !g.Tracked && len(g.Blocks) > 0 {
			return fmt.Errorf("restore: rank %v group %d: blocks of an untracked group", g.Rank, g.Idx)
		}
		gs := t.addGroup(rid, info, g.Tracked, need)
		rg := t.ranks[rid].groups
		for _, b := range g.Blocks {
			if _, dup := gs.blocks[b.Hash]; dup {
				return fmt.Errorf("restore: rank %v group %d holds hash %#x twice", g.Rank, g.Idx, b.Hash)
			}
			var v uint64
			for tier, c := range b.Counts {
				if c > groupCountMax {
					return fmt.Errorf("restore: rank %v group %d block %#x: %d copies", g.Rank, g.Idx, b.Hash, c)
				}
				if c > 0 {
					gs.tiers[tier]++
					rg.tiers[tier]++
				}
				v |= uint64(c) << (16 * tier)
			}
			if v == 0 {
				return fmt.Errorf("restore: rank %v group %d block %#x has no copies", g.Rank, g.Idx, b.Hash)
			}
			gs.blocks[b.Hash] = v
			rg.entries++
			t.gentries++
		}
	}
	for rid := range t.ranks {
		rs := &t.ranks[rid]
		if rs.lookup.len() > 0 && !rs.hasMain {
			if t.group(uint32(rid), 0, nil, 0) != nil {
				return fmt.Errorf("restore: rank %v holds blocks but has no main group", rs.rank)
			}
			rs.main, rs.hasMain = groupInfo{}, true
		}
		if rg := rs.groups; rg != nil && rg.entries > 0 {
			rg.orphans = rg.entries
			t.eachEntry(uint32(rid), func(x uint64, rf ref) {
				l := t.locOf(rf)
				n := &t.nodes[l.node]
				m := t.groupMask(rg, x)
				t.setBits(l.node, int(l.pos)*len(n.hold)+t.holderIndex(l.node, uint32(rid)), m)
				rg.orphans -= bits.OnesCount64(m)
			})
			t.norphans += rg.orphans
		}
	}
	return nil
}

// Restore builds a tree from a snapshot made by Dump. It checks the
// snapshot's consistency and returns an error rather than a tree that
// differs from the one dumped.
func Restore(s *Snapshot) (*Tree, error) {
	if s.BlockSize <= 0 {
		return nil, fmt.Errorf("restore: block size %d", s.BlockSize)
	}
	type edge struct {
		parent uint32
		hashes []uint64
		set    []bool
	}
	edges := map[uint32]*edge{}
	order := []uint32{}
	getEdge := func(id, parent uint32) (*edge, error) {
		if id == 0 {
			return nil, fmt.Errorf("restore: event on the root")
		}
		e, ok := edges[id]
		if !ok {
			e = &edge{parent: parent}
			edges[id] = e
			order = append(order, id)
		} else if e.parent != parent {
			return nil, fmt.Errorf("restore: node %d has parents %d and %d", id, e.parent, parent)
		}
		return e, nil
	}
	total := 0
	for _, d := range s.Structural {
		total += len(d.Hashes)
	}
	for i := range s.Events {
		total += len(s.Events[i].Blocks)
	}
	place := func(e *edge, pos int, h uint64) error {
		if pos >= total {
			return fmt.Errorf("restore: position %d beyond the %d blocks dumped", pos, total)
		}
		for len(e.hashes) <= pos {
			e.hashes = append(e.hashes, 0)
			e.set = append(e.set, false)
		}
		if e.set[pos] && e.hashes[pos] != h {
			return fmt.Errorf("restore: conflicting tokens hashes at position %d", pos)
		}
		e.hashes[pos], e.set[pos] = h, true
		return nil
	}
	for _, d := range s.Structural {
		e, err := getEdge(d.Node, d.ParentNode)
		if err != nil {
			return nil, err
		}
		for j, h := range d.Hashes {
			if err := place(e, j, h); err != nil {
				return nil, err
			}
		}
	}
	for i := range s.Events {
		ev := &s.Events[i]
		e, err := getEdge(ev.Node, ev.ParentNode)
		if err != nil {
			return nil, err
		}
		for j, b := range ev.Blocks {
			if err := place(e, int(ev.Offset)+j, b.TokensHash); err != nil {
				return nil, fmt.Errorf("node %d: %w", ev.Node, err)
			}
		}
	}
	t := NewTree(s.BlockSize)
	ids := map[uint32]uint32{0: 0}
	var create func(id uint32, depth int) (uint32, error)
	create = func(id uint32, depth int) (uint32, error) {
		if nid, ok := ids[id]; ok {
			return nid, nil
		}
		e, ok := edges[id]
		if !ok {
			return 0, fmt.Errorf("restore: unknown parent node %d", id)
		}
		if depth > len(edges) {
			return 0, fmt.Errorf("restore: node %d is its own ancestor", id)
		}
		for j, ok := range e.set {
			if !ok {
				return 0, fmt.Errorf("restore: node %d has no block at position %d", id, j)
			}
		}
		if len(e.hashes) == 0 {
			return 0, fmt.Errorf("restore: node %d is empty", id)
		}
		p, err := create(e.parent, depth+1)
		if err != nil {
			return 0, err
		}
		if _, dup := t.child(p, e.hashes[0]); dup {
			return 0, fmt.Errorf("restore: node %d duplicates a sibling", id)
		}
		nid := t.allocNode(p, e.hashes)
		ids[id] = nid
		return nid, nil
	}
	for _, id := range order {
		if _, err := create(id, 0); err != nil {
			return nil, err
		}
	}
	for _, w := range s.Ranks {
		rid := t.rankID(w.Rank)
		rs := &t.ranks[rid]
		rs.seq, rs.hasSeq, rs.digest, rs.truncated = w.Seq, w.HasSeq, w.Digest, w.Truncated
		rs.degraded, rs.degradedWhy = w.Degraded, w.DegradedReason
		if w.Truncated && w.DegradedReason == TruncatedReason {
			rs.degraded, rs.degradedWhy = false, "" // the truncation's, kept as such
		}
	}
	for i := range s.Events {
		ev := &s.Events[i]
		nid := ids[ev.Node]
		rid := t.rankID(ev.Rank)
		h := t.holderIndex(nid, rid)
		if h < 0 {
			h = t.addHolder(nid, rid, 0, false)
		}
		if ev.Offset == 0 {
			t.nodes[nid].hold[h].pext, t.nodes[nid].hold[h].hasP = ev.ParentHash, ev.HasParent
		}
		rs := &t.ranks[rid]
		lk := &rs.lookup
		n := &t.nodes[nid]
		H := len(n.hold)
		for j, b := range ev.Blocks {
			pos := int(ev.Offset) + j
			if pos != int(n.hold[h].cut) {
				return nil, fmt.Errorf("restore: rank %v holds node %d from position %d, not a prefix", ev.Rank, ev.Node, pos)
			}
			if _, dup := lk.get(t, rid, b.Hash); dup {
				return nil, fmt.Errorf("restore: rank %v holds hash %#x twice", ev.Rank, b.Hash)
			}
			i := pos*H + h
			n.ext[i] = b.Hash
			for tier, c := range b.Counts {
				if c > 0 {
					rs.tiers[tier]++
				}
				if c > 0xff {
					t.overflow[ovKey{rid, Tier(tier), b.Hash}] = c - 0xff
					c = 0xff
				}
				n.cnt[i] |= c << (8 * tier)
			}
			if n.cnt[i] == 0 {
				return nil, fmt.Errorf("restore: rank %v block %#x has no copies", ev.Rank, b.Hash)
			}
			n.hold[h].cut++ // before the insert, which may read the tree
			lk.insert(t, rid, b.Hash, ref{nid, n.depth + uint32(pos)})
			t.entries++
		}
	}
	for id := 1; id < len(t.nodes); id++ {
		n := &t.nodes[id]
		longest := uint32(0)
		for h := range n.hold {
			if n.hold[h].cut == 0 {
				return nil, fmt.Errorf("restore: rank %v holds nothing of node %d", t.ranks[n.hold[h].rid].rank, id)
			}
			longest = max(longest, n.hold[h].cut)
			n.hold[h].dev = n.runFrom(h, maskDevice)
			n.hold[h].host = n.runFrom(h, maskHost)
		}
		if n.nchild == 0 && longest != uint32(len(n.hashes)) {
			return nil, fmt.Errorf("restore: leaf node %d has %d blocks no rank holds", id, uint32(len(n.hashes))-longest)
		}
	}
	if err := t.restoreGroups(s); err != nil {
		return nil, err
	}
	return t, nil
}
