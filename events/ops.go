package events

import (
	"fmt"

	"github.com/prefixd/prefixd/indexer"
)

// Filter is why a decoded event is not indexed.
type Filter uint8

const (
	FilterUnknownTag    Filter = iota // an event type prefixd does not know
	FilterUnknownMedium               // a medium with no tier (fail closed)
	FilterRemote                      // locality REMOTE: not in this engine's cache
	FilterGroup                       // a KV-cache group other than the main one (group_idx ≠ 0)
	FilterKind                        // a KV-cache spec kind that is not main attention
	NumFilters
)

var filterNames = [NumFilters]string{"unknown_tag", "unknown_medium", "non_local_locality", "non_main_attention_group", "non_main_attention_kind"}

func (f Filter) String() string {
	if f < NumFilters {
		return filterNames[f]
	}
	return fmt.Sprintf("filter(%d)", uint8(f))
}

// mainAttention reports whether a kv_cache_spec_kind names the attention
// whose blocks are the prompt prefix prefixd indexes (absent counts as
// main); sliding-window, mamba, cross- and encoder-attention groups are
// filtered.
func mainAttention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// AppendOps converts the events of b into index ops appended to dst, and
// counts the events it filters out into filtered. The ops borrow b's
// slices: use them before b is decoded into again.
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
		case ev.HasGroupIdx && ev.GroupIdx != 0:
			f = FilterGroup
		case !mainAttention(ev.KVCacheSpecKind):
			f = FilterKind
		default:
			tier, ok := indexer.TierFromMedium(ev.Medium)
			if !ok {
				f = FilterUnknownMedium
				break
			}
			if ev.Kind == KindBlockRemoved {
				dst = append(dst, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: ev.BlockHashes, Tier: tier}})
				continue
			}
			dst = append(dst, indexer.Op{Kind: indexer.OpStore, Store: indexer.Stored{
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
// from its seed, so the event carries none: use only unsalted stores.
func EventFromOp(op indexer.Op) Event {
	switch op.Kind {
	case indexer.OpStore:
		s := op.Store
		return Event{Kind: KindBlockStored, BlockHashes: s.Hashes, ParentHash: s.Parent, HasParent: s.HasParent,
			TokenIDs: s.Tokens, BlockSize: s.BlockSize, Medium: mediumOf[s.Tier],
			GroupIdx: 0, HasGroupIdx: true, KVCacheSpecKind: "full_attention"}
	case indexer.OpRemove:
		return Event{Kind: KindBlockRemoved, BlockHashes: op.Remove.Hashes, Medium: mediumOf[op.Remove.Tier]}
	}
	return Event{Kind: KindAllBlocksCleared}
}
