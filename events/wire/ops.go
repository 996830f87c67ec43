package wire

import (
	"fmt"

	"github.com/prefixd/prefixd/indexer"
)

// Filter is why a decoded event is not indexed.
type Filter uint8

// Events of every KV-cache group pass: the index learns each rank's groups
// and indexes its main one (see indexer.Group).
const (
	FilterUnknownTag    Filter = iota // an event type prefixd does not know
	FilterUnknownMedium               // a medium with no tier (fail closed)
	FilterRemote                      // locality REMOTE: not in this engine's cache
	NumFilters
)

var filterNames = [NumFilters]string{"unknown_tag", "unknown_medium", "non_local_locality"}

func (f Filter) String() string {
	if f < NumFilters {
		return filterNames[f]
	}
	return fmt.Sprintf("filter(%d)", uint8(f))
}

// mainAttention reports whether a kv_cache_spec_kind names full
// attention, whose blocks are a prompt prefix held from its first block
// (absent counts as such: single-group engines).
func mainAttention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// groupOf is the KV-cache group an event names. A store describes its
// group: full attention (vLLM's full, MLA and sink full attention; an
// absent kind in group 0 or with no group_idx, as single-group engines
// send), sliding window (sliding_window, sliding_window_mla, with
// kv_cache_spec_sliding_window), or another attention, whose hit rule the
// index does not model — chunked local attention (its chunk size is not
// on the wire), mamba, cross and encoder-only attention, unknown kinds, and
// an absent kind in a group other than 0 (vLLM releases between PRs
// #37688 and #40984 sent group_idx without the kind). A remove names only
// its group_idx.
func groupOf(ev *Event) indexer.Group {
	var g indexer.Group
	if ev.HasGroupIdx {
		g.Idx = ev.GroupIdx
	}
	if ev.Kind == KindBlockRemoved {
		return g
	}
	g.Kind = ev.KVCacheSpecKind
	if ev.HasSlidingWindow {
		g.Window = ev.SlidingWindow
	}
	switch {
	case g.Kind == "" && g.Idx != 0:
		g.Attention = indexer.AttentionOther
	case mainAttention(g.Kind):
		g.Attention = indexer.AttentionFull
	case g.Kind == "sliding_window" || g.Kind == "sliding_window_mla":
		g.Attention = indexer.AttentionSlidingWindow
	default:
		g.Attention = indexer.AttentionOther
	}
	return g
}

// AppendOps converts the events of b into index ops appended to dst, and
// counts the events it filters out into filtered. Every KV-cache group's
// events become ops, each with its indexer.Group: the index routes them
// (the main group to its tree, the others to per-group sets) by what it
// learned of the rank's groups, so AppendOps keeps no state. The ops
// borrow b's slices: use them before b is decoded into again.
func AppendOps(dst []indexer.Op, b *Batch, filtered *[NumFilters]uint64) []indexer.Op {
	for i := range b.Events {
		ev := &b.Events[i]
		var f Filter
		switch {
		case ev.Kind == KindAllBlocksCleared:
			dst = append(dst, indexer.Op{Kind: indexer.OpClear})
			continue
		case ev.Kind != KindBlockStored && ev.Kind != KindBlockRemoved:
			f = FilterUnknownTag
		case ev.Locality == "REMOTE":
			f = FilterRemote
		default:
			tier, ok := indexer.TierFromMedium(ev.Medium)
			if !ok {
				f = FilterUnknownMedium
				break
			}
			if ev.Kind == KindBlockRemoved {
				dst = append(dst, indexer.Op{Kind: indexer.OpRemove, Group: groupOf(ev), Remove: indexer.Removed{Hashes: ev.BlockHashes, Tier: tier}})
				continue
			}
			dst = append(dst, indexer.Op{Kind: indexer.OpStore, Group: groupOf(ev), Store: indexer.Stored{
				Parent: ev.ParentHash, HasParent: ev.HasParent,
				Hashes: ev.BlockHashes, Tokens: ev.TokenIDs, BlockSize: ev.BlockSize,
				Tier: tier, Seed: indexer.Seed(ev.LoraName, ev.CacheSalt),
			}})
			continue
		}
		if filtered != nil {
			filtered[f]++
		}
	}
	return dst
}

// mediumOf is the medium string an engine would send for tier t.
var mediumOf = [indexer.NumTiers]string{"GPU", "CPU", "DISK", "EXTERNAL"}

// EventFromOp returns the engine event that AppendOps turns into op: what
// a test publisher or the mocker sends for an index mutation. Slices are
// shared with op. A store's LoRA and namespace salt cannot be recovered
// from its seed, so the event carries none: use only unsalted stores. A
// store names its group as vLLM does (group_idx, kv_cache_spec_kind — op's,
// or for none "full_attention" or "sliding_window" by its attention — and
// the window if any); a remove names its group_idx if not 0.
func EventFromOp(op indexer.Op) Event {
	g := op.Group
	switch op.Kind {
	case indexer.OpStore:
		s := op.Store
		kind := g.Kind
		if kind == "" {
			switch g.Attention {
			case indexer.AttentionFull:
				kind = "full_attention"
			case indexer.AttentionSlidingWindow:
				kind = "sliding_window"
			}
		}
		return Event{Kind: KindBlockStored, BlockHashes: s.Hashes, ParentHash: s.Parent, HasParent: s.HasParent,
			TokenIDs: s.Tokens, BlockSize: s.BlockSize, Medium: mediumOf[s.Tier],
			GroupIdx: g.Idx, HasGroupIdx: true, KVCacheSpecKind: kind,
			SlidingWindow: g.Window, HasSlidingWindow: g.Window != 0}
	case indexer.OpRemove:
		return Event{Kind: KindBlockRemoved, BlockHashes: op.Remove.Hashes, Medium: mediumOf[op.Remove.Tier],
			GroupIdx: g.Idx, HasGroupIdx: g.Idx != 0}
	}
	return Event{Kind: KindAllBlocksCleared}
}
