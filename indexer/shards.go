package indexer

import (
	"cmp"
	"fmt"
	"slices"
)

// A partition's snapshot describes all its shards in one Snapshot (see
// Index.Snapshot): the shards' dumps concatenated, each shard's node ids
// moved past the previous shards' so that ids are unique, and each rank
// and structural node tagged with its shard. A snapshot of one shard is
// exactly that shard's Tree.Dump, so a dump of an unsharded partition
// has the shape it had before shards existed; the prefixes that several
// shards hold appear once per shard, as sibling edges under the root or
// under each other that a single tree could not hold, which is why
// restoring goes by shard (splitSnapshot).

// mergeSnapshots merges the dumps of a partition's shards, in shard order.
// The dumps are modified and their slices reused.
func mergeSnapshots(dumps []*Snapshot) *Snapshot {
	if len(dumps) == 1 {
		return dumps[0]
	}
	out := &Snapshot{BlockSize: dumps[0].BlockSize}
	// base is the id the shard's node ids are moved past: the largest id
	// of the shards before it. Tree node ids are indices into the tree's
	// nodes, so the sum over shards stays far below 2³² (each node takes
	// over 160 bytes).
	var base uint32
	for i, d := range dumps {
		var top uint32
		for j := range d.Ranks {
			d.Ranks[j].Shard = uint32(i)
		}
		for j := range d.Events {
			ev := &d.Events[j]
			top = max(top, ev.Node)
			ev.Node += base
			if ev.ParentNode != 0 {
				ev.ParentNode += base
			}
		}
		for j := range d.Structural {
			n := &d.Structural[j]
			top = max(top, n.Node)
			n.Node += base
			if n.ParentNode != 0 {
				n.ParentNode += base
			}
			n.Shard = uint32(i)
		}
		out.Ranks = append(out.Ranks, d.Ranks...)
		out.Events = append(out.Events, d.Events...)
		out.Structural = append(out.Structural, d.Structural...)
		out.Groups = append(out.Groups, d.Groups...)
		base += top
	}
	// A dump of one state is one byte string: ranks in (worker, dp rank)
	// order, their groups in that order (each rank's in its own order).
	byRank := func(a, b Rank) int {
		return cmp.Or(cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
	}
	slices.SortFunc(out.Ranks, func(a, b RankWatermark) int { return byRank(a.Rank, b.Rank) })
	slices.SortStableFunc(out.Groups, func(a, b DumpGroup) int { return byRank(a.Rank, b.Rank) })
	return out
}

// splitSnapshot splits s into one snapshot per shard it names (see
// mergeSnapshots), each one tree's: its ranks, their events and groups,
// and its structural nodes. Events and groups of a rank s does not list
// go with shard 0. It returns s itself when s names shard 0 only.
func splitSnapshot(s *Snapshot) ([]*Snapshot, error) {
	n := uint32(1)
	shardOf := make(map[Rank]uint32, len(s.Ranks))
	for _, w := range s.Ranks {
		if w.Shard >= MaxShards {
			return nil, fmt.Errorf("restore: rank %v: shard %d, want below %d", w.Rank, w.Shard, MaxShards)
		}
		if i, dup := shardOf[w.Rank]; dup && i != w.Shard {
			return nil, fmt.Errorf("restore: rank %v in shards %d and %d", w.Rank, i, w.Shard)
		}
		shardOf[w.Rank] = w.Shard
		n = max(n, w.Shard+1)
	}
	for _, d := range s.Structural {
		if d.Shard >= MaxShards {
			return nil, fmt.Errorf("restore: structural node %d: shard %d, want below %d", d.Node, d.Shard, MaxShards)
		}
		n = max(n, d.Shard+1)
	}
	if n == 1 {
		return []*Snapshot{s}, nil
	}
	out := make([]*Snapshot, n)
	for i := range out {
		out[i] = &Snapshot{BlockSize: s.BlockSize}
	}
	for _, w := range s.Ranks {
		o := out[w.Shard]
		o.Ranks = append(o.Ranks, w)
	}
	for _, ev := range s.Events {
		o := out[shardOf[ev.Rank]]
		o.Events = append(o.Events, ev)
	}
	for _, d := range s.Structural {
		o := out[d.Shard]
		o.Structural = append(o.Structural, d)
	}
	for _, g := range s.Groups {
		o := out[shardOf[g.Rank]]
		o.Groups = append(o.Groups, g)
	}
	return out, nil
}
