package indexer

import (
	"errors"
	"fmt"
)

// Rank identifies one data-parallel rank of one worker: the owner of every
// index entry. The zero DPRank is the first (or only) rank.
type Rank struct {
	WorkerID uint64
	DPRank   uint32
}

func (r Rank) String() string { return fmt.Sprintf("%d/%d", r.WorkerID, r.DPRank) }

// Tier is a storage tier of a cached block. Lower tiers are faster; a query
// reports reach through each tier cumulatively (device ≤ host ≤ disk).
type Tier uint8

const (
	TierDevice   Tier = iota // GPU memory ("GPU", empty or absent medium)
	TierHost                 // CPU / pinned host memory
	TierDisk                 // local disk, NVMe, storage
	TierExternal             // remote or shared storage; scored with disk
	NumTiers     = 4
)

var tierNames = [NumTiers]string{"device", "host_pinned", "disk", "external"}

// String returns the Dynamo storage_tier name of t.
func (t Tier) String() string {
	if int(t) < len(tierNames) {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier is the inverse of Tier.String.
func ParseTier(s string) (Tier, bool) {
	for i, n := range tierNames {
		if n == s {
			return Tier(i), true
		}
	}
	return 0, false
}

// TierFromMedium maps an engine's medium string to a tier. ok is false for a
// medium prefixd does not know; such events must be dropped (fail closed).
func TierFromMedium(medium string) (t Tier, ok bool) {
	switch medium {
	case "", "GPU", "DEVICE":
		return TierDevice, true
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return TierHost, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return TierExternal, true
	}
	return 0, false
}

// OpKind says which field of an Op is meaningful.
type OpKind uint8

const (
	OpStore  OpKind = iota + 1 // Op.Store
	OpRemove                   // Op.Remove
	OpClear                    // no payload: clear the rank
)

// Op is one index mutation for one rank, decoded from an engine event.
// Slices are borrowed: the index copies what it keeps and never retains them.
type Op struct {
	Kind OpKind
	// Group is the KV-cache group of a store or remove. The zero Group
	// (group 0, full attention) is what a single-group engine's events
	// mean; see Group for how the index routes the others.
	Group  Group
	Store  Stored
	Remove Removed
}

// Stored says that a rank cached Hashes (engine hashes, one per full block,
// in prompt order) holding Tokens, after the block Parent.
type Stored struct {
	Parent    uint64 // engine hash of the block before Hashes[0]; valid if HasParent
	HasParent bool
	Hashes    []uint64
	// Tokens are the token ids of all blocks, BlockSize per block. Empty
	// Tokens with a non-device tier is an offload event: it only adds Tier
	// to blocks the rank already holds.
	Tokens    []uint32
	BlockSize int // as reported by the engine; must equal the partition's
	Tier      Tier
	Seed      uint64 // hash seed from Seed(loraName, cacheNamespace)
}

// Removed says that a rank evicted one copy of each of Hashes from Tier.
type Removed struct {
	Hashes []uint64
	Tier   Tier
}

// Sentinel errors; Apply wraps them with the rank and hash involved.
var (
	ErrParentNotFound = errors.New("parent block not found")
	ErrBlockNotFound  = errors.New("block not found")
	ErrSelfReference  = errors.New("self-referencing store")
	ErrBlockSize      = errors.New("block size mismatch")
	ErrShortTokens    = errors.New("token ids shorter than blocks")
	ErrOffloadUnknown = errors.New("offload of a block the rank does not hold")
	ErrHashConflict   = errors.New("engine hash already names another block")
	ErrEvictedParent  = errors.New("parent block was evicted by the memory cap")
	ErrUnknownGroup   = errors.New("KV-cache group unknown to the rank")
)
