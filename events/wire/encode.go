package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// Encoder writes Batches as KVEventBatch payloads byte-identical to what
// vLLM's msgspec encoder produces for the same values (msgspec
// src/msgspec/_core.c: array_like structs write every field, omit_defaults
// map structs leave out fields equal to their default, ints take the
// smallest form), for use by test publishers and golden tests. The zero
// Encoder writes the map era with integer hashes (vLLM v0.26+ defaults). An
// Encoder holds no state besides its options and is safe for concurrent use
// if not modified.
//
// Layout:
//
//   - Envelope (both eras): always the 3-element array [ts, events, rank]
//     with ts as float64 (cb) and rank as the smallest int, or nil when
//     !HasDPRank (msgspec never trims array_like structs).
//   - EraMap: "type" first, then BlockStored's fields in vLLM's declaration
//     order: block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium, lora_name (always written, nil when absent), then,
//     only when set, event_version, extra_keys, group_idx,
//     kv_cache_spec_kind, kv_cache_spec_sliding_window, locality,
//     ownership, session_id, cache_salt. BlockRemoved: type, block_hashes,
//     medium, then when set event_version, group_idx, kv_cache_spec_kind,
//     kv_cache_spec_sliding_window, locality, ownership, session_id (vLLM
//     declares group_idx, locality, ownership in that order; the position of
//     the others is prefixd's choice). cache_salt is written only when it is
//     not already implied by extra_keys, so that decoding gives it back.
//   - EraArray: BlockStored [tag, hashes, parent|nil, tokens, block_size,
//     lora_id|nil, medium|nil, lora_name|nil] (vLLM after lora_name, PR
//     #27577, and before extra_keys, PR #33304), BlockRemoved [tag, hashes,
//     medium|nil]; with Wide, BlockStored adds extra_keys|nil,
//     group_idx|nil, kv_cache_spec_kind|nil, sliding_window|nil (12
//     elements) and BlockRemoved adds group_idx|nil (4 elements).
//   - AllBlocksCleared is {"type": tag} or [tag]; a KindUnknown event is
//     written the same way with its Tag.
//   - Integers use the smallest form (non-negative values unsigned, as
//     msgspec does), strings the smallest str header.
//
// Fields an event's kind does not have are ignored. Fields the kind has but
// the chosen array layout cannot carry are an error rather than silently
// dropped.
type Encoder struct {
	Era  Era
	Hash HashType
	// Wide selects, in EraArray, the last array-era layout (12-element
	// BlockStored, 4-element BlockRemoved) instead of the 8/3-element one.
	Wide bool
	// Map16 writes BlockStored maps with a map16 header (de 00 NN), as
	// msgspec does when the producer's struct declares 16 or more entries
	// (e.g. the variant with event_version). Without it the header is the
	// smallest form, which matches vLLM main as of 2026-09 (fixmap).
	Map16 bool
}

// AppendBatch appends the encoding of b to dst and returns the extended
// buffer. On error dst is returned unchanged (truncated to its original
// length).
//
// HashBytes cannot reproduce a real vLLM bytes-mode payload byte for byte:
// an Event keeps only the normalised uint64 of each hash, not the 32-byte
// digest, so the encoder writes 24 zero bytes followed by the hash.
func (e *Encoder) AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	start := len(dst)
	if e.Era != EraMap && e.Era != EraArray {
		return dst, fmt.Errorf("events: encode: invalid %v", e.Era)
	}
	if e.Hash > HashSigned {
		return dst, fmt.Errorf("events: encode: invalid %v", e.Hash)
	}
	if uint64(len(b.Events)) > math.MaxUint32 {
		return dst, errors.New("events: encode: too many events")
	}
	dst = msgp.AppendArrayHeader(dst, 3)
	dst = msgp.AppendFloat64(dst, b.TS)
	dst = msgp.AppendArrayHeader(dst, uint32(len(b.Events)))
	for i := range b.Events {
		ev := &b.Events[i]
		var err error
		if e.Era == EraMap {
			dst, err = e.appendMapEvent(dst, ev)
		} else {
			dst, err = e.appendArrayEvent(dst, ev)
		}
		if err != nil {
			return dst[:start], fmt.Errorf("events: encode event %d (%v): %w", i, ev.Kind, err)
		}
	}
	if b.HasDPRank {
		dst = appendInt(dst, int64(b.DPRank))
	} else {
		dst = msgp.AppendNil(dst)
	}
	return dst, nil
}

// appendInt writes v in msgspec's smallest form: non-negative values as
// positive fixint/cc/cd/ce/cf (msgp.AppendInt64 would use d0–d3), negative
// values as negative fixint/d0–d3.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

func appendStrOrNil(dst []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}

func appendIntOrNil(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return msgp.AppendNil(dst)
	}
	return appendInt(dst, v)
}

var zero24 [24]byte

func (e *Encoder) appendHash(dst []byte, h uint64) []byte {
	switch e.Hash {
	case HashBytes:
		dst = append(dst, 0xc4, 32) // bin8, 32 bytes
		dst = append(dst, zero24[:]...)
		return binary.BigEndian.AppendUint64(dst, h)
	case HashSigned:
		return appendInt(dst, int64(h))
	}
	return msgp.AppendUint64(dst, h)
}

func (e *Encoder) appendHashes(dst []byte, hs []uint64) ([]byte, error) {
	if uint64(len(hs)) > math.MaxUint32 {
		return dst, errors.New("too many block hashes")
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = e.appendHash(dst, h)
	}
	return dst, nil
}

func (e *Encoder) appendParent(dst []byte, ev *Event) []byte {
	if !ev.HasParent {
		return msgp.AppendNil(dst)
	}
	return e.appendHash(dst, ev.ParentHash)
}

func appendTokens(dst []byte, ts []uint32) ([]byte, error) {
	if uint64(len(ts)) > math.MaxUint32 {
		return dst, errors.New("too many token ids")
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(ts)))
	for _, t := range ts {
		dst = msgp.AppendUint32(dst, t)
	}
	return dst, nil
}

// appendExtraKeys writes ExtraKeysRaw verbatim after checking that it is
// exactly one msgpack element.
func appendExtraKeys(dst []byte, raw []byte) ([]byte, error) {
	if len(raw) == 0 {
		return msgp.AppendNil(dst), nil
	}
	rest, err := skip(raw)
	if err != nil || len(rest) != 0 {
		return dst, errors.New("ExtraKeysRaw is not exactly one msgpack element")
	}
	return append(dst, raw...), nil
}

// saltKey reports whether ev needs an explicit cache_salt key: it has a salt
// that extra_keys does not already imply.
func saltKey(ev *Event) bool {
	if ev.CacheSalt == "" {
		return false
	}
	s, ok := extraKeysSalt(ev.ExtraKeysRaw)
	return !ok || string(s) != ev.CacheSalt
}

func (e *Encoder) appendMapEvent(dst []byte, ev *Event) ([]byte, error) {
	var err error
	switch ev.Kind {
	case KindBlockStored:
		needSalt := saltKey(ev)
		n := 8 // type + the 7 fields without a default
		for _, set := range [...]bool{
			ev.EventVersion != 0, len(ev.ExtraKeysRaw) > 0, ev.HasGroupIdx,
			ev.KVCacheSpecKind != "", ev.HasSlidingWindow, ev.Locality != "",
			ev.Ownership != "", ev.SessionID != "", needSalt,
		} {
			if set {
				n++
			}
		}
		if e.Map16 {
			dst = append(dst, 0xde, 0, byte(n))
		} else {
			dst = msgp.AppendMapHeader(dst, uint32(n))
		}
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, TagBlockStored)
		dst = msgp.AppendString(dst, "block_hashes")
		if dst, err = e.appendHashes(dst, ev.BlockHashes); err != nil {
			return dst, err
		}
		dst = msgp.AppendString(dst, "parent_block_hash")
		dst = e.appendParent(dst, ev)
		dst = msgp.AppendString(dst, "token_ids")
		if dst, err = appendTokens(dst, ev.TokenIDs); err != nil {
			return dst, err
		}
		dst = msgp.AppendString(dst, "block_size")
		dst = appendInt(dst, int64(ev.BlockSize))
		dst = msgp.AppendString(dst, "lora_id")
		dst = appendIntOrNil(dst, ev.LoraID, ev.HasLoraID)
		dst = msgp.AppendString(dst, "medium")
		dst = appendStrOrNil(dst, ev.Medium)
		dst = msgp.AppendString(dst, "lora_name")
		dst = appendStrOrNil(dst, ev.LoraName)
		if ev.EventVersion != 0 {
			dst = msgp.AppendString(dst, "event_version")
			dst = appendInt(dst, int64(ev.EventVersion))
		}
		if len(ev.ExtraKeysRaw) > 0 {
			dst = msgp.AppendString(dst, "extra_keys")
			if dst, err = appendExtraKeys(dst, ev.ExtraKeysRaw); err != nil {
				return dst, err
			}
		}
		dst = e.appendMapTail(dst, ev)
		if needSalt {
			dst = msgp.AppendString(dst, "cache_salt")
			dst = msgp.AppendString(dst, ev.CacheSalt)
		}
	case KindBlockRemoved:
		n := 3 // type, block_hashes, medium
		for _, set := range [...]bool{
			ev.EventVersion != 0, ev.HasGroupIdx, ev.KVCacheSpecKind != "",
			ev.HasSlidingWindow, ev.Locality != "", ev.Ownership != "", ev.SessionID != "",
		} {
			if set {
				n++
			}
		}
		dst = msgp.AppendMapHeader(dst, uint32(n))
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, TagBlockRemoved)
		dst = msgp.AppendString(dst, "block_hashes")
		if dst, err = e.appendHashes(dst, ev.BlockHashes); err != nil {
			return dst, err
		}
		dst = msgp.AppendString(dst, "medium")
		dst = appendStrOrNil(dst, ev.Medium)
		if ev.EventVersion != 0 {
			dst = msgp.AppendString(dst, "event_version")
			dst = appendInt(dst, int64(ev.EventVersion))
		}
		dst = e.appendMapTail(dst, ev)
	case KindAllBlocksCleared:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, TagAllBlocksCleared)
	case KindUnknown:
		if kindOf([]byte(ev.Tag)) != KindUnknown {
			return dst, fmt.Errorf("KindUnknown event has the known tag %q", ev.Tag)
		}
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, ev.Tag)
	default:
		return dst, fmt.Errorf("invalid %v", ev.Kind)
	}
	return dst, nil
}

// appendMapTail writes the optional fields shared by BlockStored and
// BlockRemoved maps, each only when set.
func (e *Encoder) appendMapTail(dst []byte, ev *Event) []byte {
	if ev.HasGroupIdx {
		dst = msgp.AppendString(dst, "group_idx")
		dst = appendInt(dst, int64(ev.GroupIdx))
	}
	if ev.KVCacheSpecKind != "" {
		dst = msgp.AppendString(dst, "kv_cache_spec_kind")
		dst = msgp.AppendString(dst, ev.KVCacheSpecKind)
	}
	if ev.HasSlidingWindow {
		dst = msgp.AppendString(dst, "kv_cache_spec_sliding_window")
		dst = appendInt(dst, int64(ev.SlidingWindow))
	}
	if ev.Locality != "" {
		dst = msgp.AppendString(dst, "locality")
		dst = msgp.AppendString(dst, ev.Locality)
	}
	if ev.Ownership != "" {
		dst = msgp.AppendString(dst, "ownership")
		dst = msgp.AppendString(dst, ev.Ownership)
	}
	if ev.SessionID != "" {
		dst = msgp.AppendString(dst, "session_id")
		dst = msgp.AppendString(dst, ev.SessionID)
	}
	return dst
}

// arrayUnsupported names the first field of ev, of those its kind has, that
// the array layout cannot carry, or returns "".
func (e *Encoder) arrayUnsupported(ev *Event) string {
	switch {
	case ev.EventVersion != 0:
		return "event_version"
	case ev.Locality != "":
		return "locality"
	case ev.Ownership != "":
		return "ownership"
	case ev.SessionID != "":
		return "session_id"
	case ev.KVCacheSpecKind != "" && (!e.Wide || ev.Kind == KindBlockRemoved):
		return "kv_cache_spec_kind"
	case ev.HasSlidingWindow && (!e.Wide || ev.Kind == KindBlockRemoved):
		return "kv_cache_spec_sliding_window"
	case ev.HasGroupIdx && !e.Wide:
		return "group_idx"
	}
	if ev.Kind != KindBlockStored {
		return ""
	}
	switch {
	case len(ev.ExtraKeysRaw) > 0 && !e.Wide:
		return "extra_keys"
	case saltKey(ev):
		return "cache_salt"
	}
	return ""
}

func (e *Encoder) appendArrayEvent(dst []byte, ev *Event) ([]byte, error) {
	var err error
	switch ev.Kind {
	case KindBlockStored, KindBlockRemoved:
		if f := e.arrayUnsupported(ev); f != "" {
			return dst, fmt.Errorf("field %s cannot be written in the array era (Wide=%v)", f, e.Wide)
		}
	}
	switch ev.Kind {
	case KindBlockStored:
		n := uint32(8)
		if e.Wide {
			n = 12
		}
		dst = msgp.AppendArrayHeader(dst, n)
		dst = msgp.AppendString(dst, TagBlockStored)
		if dst, err = e.appendHashes(dst, ev.BlockHashes); err != nil {
			return dst, err
		}
		dst = e.appendParent(dst, ev)
		if dst, err = appendTokens(dst, ev.TokenIDs); err != nil {
			return dst, err
		}
		dst = appendInt(dst, int64(ev.BlockSize))
		dst = appendIntOrNil(dst, ev.LoraID, ev.HasLoraID)
		dst = appendStrOrNil(dst, ev.Medium)
		dst = appendStrOrNil(dst, ev.LoraName)
		if e.Wide {
			if dst, err = appendExtraKeys(dst, ev.ExtraKeysRaw); err != nil {
				return dst, err
			}
			dst = appendIntOrNil(dst, int64(ev.GroupIdx), ev.HasGroupIdx)
			dst = appendStrOrNil(dst, ev.KVCacheSpecKind)
			dst = appendIntOrNil(dst, int64(ev.SlidingWindow), ev.HasSlidingWindow)
		}
	case KindBlockRemoved:
		n := uint32(3)
		if e.Wide {
			n = 4
		}
		dst = msgp.AppendArrayHeader(dst, n)
		dst = msgp.AppendString(dst, TagBlockRemoved)
		if dst, err = e.appendHashes(dst, ev.BlockHashes); err != nil {
			return dst, err
		}
		dst = appendStrOrNil(dst, ev.Medium)
		if e.Wide {
			dst = appendIntOrNil(dst, int64(ev.GroupIdx), ev.HasGroupIdx)
		}
	case KindAllBlocksCleared:
		dst = msgp.AppendArrayHeader(dst, 1)
		dst = msgp.AppendString(dst, TagAllBlocksCleared)
	case KindUnknown:
		if kindOf([]byte(ev.Tag)) != KindUnknown {
			return dst, fmt.Errorf("KindUnknown event has the known tag %q", ev.Tag)
		}
		dst = msgp.AppendArrayHeader(dst, 1)
		dst = msgp.AppendString(dst, ev.Tag)
	default:
		return dst, fmt.Errorf("invalid %v", ev.Kind)
	}
	return dst, nil
}
