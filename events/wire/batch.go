package wire

import "strconv"

// Kind is the type of an engine KV-cache event.
type Kind uint8

// Event kinds. The zero Kind is not a valid event kind.
const (
	// KindBlockStored: full blocks entered the engine's prefix cache.
	KindBlockStored Kind = iota + 1
	// KindBlockRemoved: blocks were evicted.
	KindBlockRemoved
	// KindAllBlocksCleared: the engine reset its prefix cache; the source
	// (worker, rank) holds nothing afterwards.
	KindAllBlocksCleared
	// KindUnknown: an event whose tag this codec does not know. Only
	// Event.Tag is set; the body was skipped.
	KindUnknown
)

// Tag names of the known event kinds as they appear on the wire (the array
// element 0, or the value of the map key "type").
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// String returns the wire tag of a known kind, "Unknown" for KindUnknown and
// "Kind(n)" otherwise.
func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return TagBlockStored
	case KindBlockRemoved:
		return TagBlockRemoved
	case KindAllBlocksCleared:
		return TagAllBlocksCleared
	case KindUnknown:
		return "Unknown"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Era selects the event encoding an Encoder writes. The Decoder accepts both
// eras in any mix, per event.
type Era uint8

const (
	// EraMap writes events as tagged maps {"type": tag, field: value, …},
	// as vLLM does since PR #42892 (v0.26.0+). It is the zero Era.
	EraMap Era = iota
	// EraArray writes events as tagged positional arrays
	// ["BlockStored", …], as vLLM did before PR #42892.
	EraArray
)

// String returns "map", "array" or "Era(n)".
func (e Era) String() string {
	switch e {
	case EraMap:
		return "map"
	case EraArray:
		return "array"
	}
	return "Era(" + strconv.Itoa(int(e)) + ")"
}

// HashType selects how an Encoder writes block hashes. The Decoder accepts
// every form (any integer width, signed or unsigned, and bin; see
// docs/wire.md) regardless.
type HashType uint8

const (
	// HashInt writes a hash as an unsigned msgpack integer of the smallest
	// width, as vLLM does by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
	// It is the zero HashType.
	HashInt HashType = iota
	// HashBytes writes a hash as a 32-byte bin: 24 zero bytes followed by the
	// 8-byte hash big-endian, so that it normalises back to the same uint64.
	// vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 writes the full sha256
	// digest instead, which a uint64 cannot carry: such payloads decode
	// correctly but are not reproduced byte for byte.
	HashBytes
	// HashSigned writes a hash as the smallest signed msgpack integer of
	// int64(hash), as SGLang and vLLM before v0.10.2 do (negative values
	// appear as negative fixint or d0–d3).
	HashSigned
)

// String returns "int", "bytes", "signed" or "HashType(n)".
func (h HashType) String() string {
	switch h {
	case HashInt:
		return "int"
	case HashBytes:
		return "bytes"
	case HashSigned:
		return "signed"
	}
	return "HashType(" + strconv.Itoa(int(h)) + ")"
}

// Event is one decoded engine event.
//
// Ownership: the slices (BlockHashes, TokenIDs, ExtraKeysRaw) are owned by
// the Batch that holds the Event and are overwritten by the next Decode into
// that Batch; copy them to keep them. Strings are ordinary immutable Go
// strings (never aliases of the payload) and may be kept.
//
// Absent values: a field that is missing, or nil on the wire, decodes to its
// zero value; the Has* flags distinguish "absent" from zero where the
// difference matters. Empty strings and nil strings are not distinguished.
//
// Which fields are filled depends on Kind: BlockStored may use all of them;
// BlockRemoved uses BlockHashes, Medium, GroupIdx, KVCacheSpecKind,
// SlidingWindow, Locality, Ownership, SessionID and EventVersion;
// AllBlocksCleared and KindUnknown use only Kind and Tag.
type Event struct {
	Kind Kind
	// Tag is the tag as sent. For known kinds it is the canonical constant
	// (TagBlockStored, …); for KindUnknown it is the unrecognised tag.
	Tag string

	// BlockHashes are the engine's block hashes normalised to uint64
	// (width-agnostic ints, negative ints reinterpreted as two's complement,
	// bin/str → last 8 bytes big-endian, as vLLM's int mode truncates its
	// sha256 digest). One per full block, in prompt order.
	BlockHashes []uint64
	// ParentHash is the normalised hash of the block before BlockHashes[0];
	// valid only when HasParent (nil on the wire = first block of a prompt).
	ParentHash uint64
	HasParent  bool

	// TokenIDs are the tokens of the stored blocks (normally
	// len(BlockHashes)*BlockSize of them; not validated here).
	TokenIDs  []uint32
	BlockSize int

	// LoraID is vLLM's deprecated integer adapter id (array position 5).
	// Caveat: in a 6-element array a Dynamo-mocker group_idx is
	// indistinguishable from a lora_id and decodes as LoraID (harmless:
	// lora_id never influences hashing).
	LoraID    int64
	HasLoraID bool
	// Medium is the storage tier ("GPU", "CPU", "CPU_PINNED", "DISK", …);
	// "" when nil or absent, which means GPU.
	Medium   string
	LoraName string
	// CacheSalt is the map key "cache_salt" (SGLang's map events, or the
	// "cache_salt" of the metadata map SGLang appends at array position 7)
	// when present and non-empty; otherwise the first string with the prefix
	// "dynamo-cache-salt:" (prefix stripped) among the first block's
	// extra_keys; otherwise "".
	CacheSalt string
	// ExtraKeysRaw is the msgpack encoding of extra_keys exactly as received
	// (one entry per block: a tuple of multimodal hashes, LoRA name, cache
	// salt… or nil). Empty when extra_keys is nil or absent. The Encoder
	// writes it back verbatim, so it must hold exactly one msgpack object.
	ExtraKeysRaw []byte

	GroupIdx    int
	HasGroupIdx bool
	// KVCacheSpecKind is e.g. "full_attention", "sliding_window", "mamba";
	// "" when absent.
	KVCacheSpecKind  string
	SlidingWindow    int // kv_cache_spec_sliding_window
	HasSlidingWindow bool
	// Locality is "LOCAL" or "REMOTE" relative to the publisher; "" when
	// absent.
	Locality  string
	Ownership string
	SessionID string
	// EventVersion is the map key "event_version" of one vLLM variant of
	// BlockStored (declared default 1, so msgspec omits it when 1). 0 means
	// absent.
	EventVersion int
}

// Batch is one decoded KVEventBatch.
//
// A Batch is reusable: Decode resets it and reuses the Events backing array
// and every Event's slices, so decoding similar batches into the same Batch
// allocates nothing in the steady state. The zero Batch is ready to use. A
// Batch is not safe for concurrent use.
type Batch struct {
	// TS is the publisher's wall-clock time in seconds. Use the sequence
	// number, not TS, for ordering.
	TS     float64
	Events []Event
	// DPRank is the batch's data_parallel_rank, valid when HasDPRank. A
	// nil or absent rank leaves HasDPRank false (use the configured rank).
	DPRank    int32
	HasDPRank bool
	// Unknown counts events with a tag this codec does not know. Decode
	// skips them and does not keep them in Events; UnknownTag is the first
	// such tag, for reporting. (The Encoder still writes KindUnknown events
	// found in Events, so tests can produce them.)
	Unknown    int
	UnknownTag string
	// Skipped counts the events Decode could not decode and left out of
	// Events (see Skips): a batch with skipped events still decodes.
	Skipped Skips
}

// SkipKind is what a skipped event was, as far as its tag tells.
type SkipKind uint8

// The kinds of skipped events.
const (
	// SkipUntagged: the event has no readable tag (it is not a tagged
	// array or map, or its tag is not a string), so it may have been a
	// BlockRemoved or an AllBlocksCleared.
	SkipUntagged SkipKind = iota
	SkipStored            // a BlockStored
	SkipRemoved           // a BlockRemoved
	SkipCleared           // an AllBlocksCleared
	NumSkipKinds
)

var skipKindNames = [NumSkipKinds]string{"untagged", "stored", "removed", "cleared"}

// String returns "untagged", "stored", "removed" or "cleared" (a stable
// metric label), or "SkipKind(n)".
func (k SkipKind) String() string {
	if k < NumSkipKinds {
		return skipKindNames[k]
	}
	return "SkipKind(" + strconv.Itoa(int(k)) + ")"
}

// SkipReasons are the DecodeError reasons an event can be skipped for, in
// the order of Skips.N's second index: a value of the wrong type or range
// in a known position (ReasonHash, ReasonToken, ReasonField), or an event
// that is not a tagged array or map or is too short for its kind
// (ReasonEvent). Structural damage (truncation, invalid msgpack) leaves
// the end of the event unknown and fails the whole batch instead.
var SkipReasons = [NumSkipReasons]string{ReasonEvent, ReasonHash, ReasonToken, ReasonField}

// NumSkipReasons is len(SkipReasons).
const NumSkipReasons = 4

// Skips describes the events of one batch that Decode skipped. The zero
// Skips is empty.
type Skips struct {
	// N counts the skipped events by kind and by reason (indexed like
	// SkipReasons).
	N [NumSkipKinds][NumSkipReasons]int
	// First is the first skipped event's error (reason, offset in the
	// payload, cause); nil when nothing was skipped.
	First *DecodeError
	// Last is where the last skipped event was: the number of events of
	// Events decoded before it. (A skip before an AllBlocksCleared of the
	// same batch leaves nothing missing.)
	Last int
}

// Total returns the number of skipped events.
func (s *Skips) Total() int {
	n := 0
	for k := range s.N {
		for _, c := range s.N[k] {
			n += c
		}
	}
	return n
}

// Kind returns the number of skipped events of kind k.
func (s *Skips) Kind(k SkipKind) int {
	n := 0
	for _, c := range s.N[k] {
		n += c
	}
	return n
}

// Lossy reports whether a skipped event may have removed blocks: a
// BlockRemoved, an AllBlocksCleared, or an event whose tag could not be
// read. Applying the rest of such a batch could leave blocks indexed that
// the engine no longer has; a batch whose skipped events are all
// BlockStored is not lossy (the index then misses blocks the engine has,
// a strict subset).
func (s *Skips) Lossy() bool {
	return s.Kind(SkipUntagged)+s.Kind(SkipRemoved)+s.Kind(SkipCleared) > 0
}

// Reset empties b, keeping its allocated storage for reuse.
func (b *Batch) Reset() {
	b.TS = 0
	b.Events = b.Events[:0]
	b.DPRank = 0
	b.HasDPRank = false
	b.Unknown = 0
	b.UnknownTag = ""
	b.Skipped = Skips{}
}

// next extends b.Events by one event, reusing a previously allocated slot
// (and its slices) when there is one. It returns the slot, reset, and the
// strings the slot held before, which the decoder reuses when the new value
// is equal to avoid allocating.
func (b *Batch) next() (*Event, prevStrings) {
	if n := len(b.Events); n < cap(b.Events) {
		b.Events = b.Events[:n+1]
	} else {
		b.Events = append(b.Events, Event{})
	}
	ev := &b.Events[len(b.Events)-1]
	prev := prevStrings{
		tag:       ev.Tag,
		loraName:  ev.LoraName,
		cacheSalt: ev.CacheSalt,
		ownership: ev.Ownership,
		sessionID: ev.SessionID,
		medium:    ev.Medium,
		kind:      ev.KVCacheSpecKind,
		locality:  ev.Locality,
	}
	*ev = Event{
		BlockHashes:  ev.BlockHashes[:0],
		TokenIDs:     ev.TokenIDs[:0],
		ExtraKeysRaw: ev.ExtraKeysRaw[:0],
	}
	return ev, prev
}

// prevStrings are the strings an Event slot held before it was reset.
type prevStrings struct {
	tag, loraName, cacheSalt, ownership, sessionID, medium, kind, locality string
}

// intern returns b as a string without allocating when b is one of the
// well-known wire strings or equals prev (the value the same slot held in the
// previous batch); otherwise it allocates.
func intern(b []byte, prev string) string {
	// The compiler does not allocate for string(b) in a switch or comparison.
	switch string(b) {
	case "":
		return ""
	case TagBlockStored:
		return TagBlockStored
	case TagBlockRemoved:
		return TagBlockRemoved
	case TagAllBlocksCleared:
		return TagAllBlocksCleared
	// media (vLLM, SGLang, Dynamo's tier table)
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "CPU_TIER1":
		return "CPU_TIER1"
	case "CPU_TIER2":
		return "CPU_TIER2"
	case "DISK":
		return "DISK"
	case "NVME":
		return "NVME"
	case "STORAGE":
		return "STORAGE"
	case "EXTERNAL":
		return "EXTERNAL"
	case "NETWORK":
		return "NETWORK"
	case "SHARED":
		return "SHARED"
	// locality
	case "LOCAL":
		return "LOCAL"
	case "REMOTE":
		return "REMOTE"
	// kv_cache_spec_kind
	case "full_attention":
		return "full_attention"
	case "mla_attention":
		return "mla_attention"
	case "sliding_window":
		return "sliding_window"
	case "sliding_window_mla":
		return "sliding_window_mla"
	case "mamba":
		return "mamba"
	case "chunked_local_attention":
		return "chunked_local_attention"
	case "sink_full_attention":
		return "sink_full_attention"
	case "encoder_only_attention":
		return "encoder_only_attention"
	case "cross_attention":
		return "cross_attention"
	}
	if string(b) == prev {
		return prev
	}
	return string(b)
}
