package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// ErrMalformed is matched, with errors.Is, by every error Decode returns.
var ErrMalformed = errors.New("events: malformed payload")

// DecodeError.Reason values. They are stable and suitable as a metric label
// (…_dropped_total{reason}).
const (
	// ReasonTruncated: the payload ends inside an element, or a header claims
	// more elements than the remaining bytes can hold.
	ReasonTruncated = "truncated"
	// ReasonEnvelope: the batch is not an array of at least 2 elements or a
	// map with an "events" key, or ts, events or the rank has the wrong type.
	ReasonEnvelope = "envelope"
	// ReasonEvent: an event is not an array or map, has no string tag, is
	// too short for its kind, or contains invalid msgpack.
	ReasonEvent = "event"
	// ReasonHash: a block or parent hash has a type no engine sends for a
	// hash (float, bool, map, array, ext, or nil in block_hashes).
	ReasonHash = "hash"
	// ReasonToken: a token id is not an integer in [0, 2^32-1].
	ReasonToken = "token"
	// ReasonField: another known field has the wrong type or is out of
	// range.
	ReasonField = "field"
	// ReasonTrailing: bytes follow the batch.
	ReasonTrailing = "trailing"
)

// DecodeError describes why a payload was rejected. It matches ErrMalformed
// with errors.Is and unwraps to the underlying cause (io.ErrUnexpectedEOF for
// ReasonTruncated).
type DecodeError struct {
	Reason string // one of the Reason* constants
	Offset int    // byte offset in the payload of the offending element
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("events: malformed payload (%s) at offset %d: %v", e.Reason, e.Offset, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Is reports whether target is ErrMalformed.
func (e *DecodeError) Is(target error) bool { return target == ErrMalformed }

// Decoder decodes vLLM KVEventBatch payloads (msgpack, every era; the
// accepted forms are listed in docs/wire.md). The zero Decoder is ready to
// use. A Decoder is reusable but not safe for concurrent use; use one per
// goroutine.
type Decoder struct {
	r reader
}

// Decode decodes one payload into b, replacing b's previous contents and
// reusing b's storage (see Batch). payload is not retained: b holds no
// reference to it after Decode returns.
//
// Accepted input:
//
//   - Envelope: an array [ts, events] or [ts, events, rank], further elements
//     skipped; ts a float64, float32 or int; rank an int or nil. Or a map
//     keyed "ts", "events" (required) and "data_parallel_rank" (aliases
//     "dp_rank", "attn_dp_rank"), other keys skipped.
//   - Each event independently either a tagged array or a tagged map (see
//     Event for the fields). Arrays: positions in vLLM's declaration order
//     with length guards, since older vLLMs declare fewer fields
//     (BlockStored [tag, block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//     kv_cache_spec_kind, kv_cache_spec_sliding_window], BlockRemoved [tag,
//     block_hashes, medium, group_idx]); a map at BlockStored position 7 is
//     SGLang's metadata struct ("cache_salt", "session_id") instead of
//     lora_name; from position 5 of a BlockStored, a
//     string selects the Dynamo mocker's compact layout [.., block_size,
//     medium, group_idx], and in a BlockRemoved an int at position 2 is the
//     mocker's group_idx. Maps: "type" may be anywhere; fields by name;
//     unknown keys skipped.
//   - Unknown tags are counted in Batch.Unknown (the first one's tag in
//     Batch.UnknownTag); their bodies are skipped, they are not kept in
//     Events, and decoding continues.
//   - nil for any field means absent.
//
// Skipped events: an event that is well-formed msgpack but cannot be
// decoded (a value of the wrong type or range in a known position, e.g. a
// float block hash or a map where a string belongs; an event that is not a
// tagged array or map; a tag that is not a string; too few elements for its
// kind) is left out of Events and counted in b.Skipped by the kind its tag
// named and the reason; the rest of the batch is decoded and Decode returns
// nil. Whether the rest may be applied is the caller's decision: see
// Skips.Lossy (a skipped BlockRemoved, AllBlocksCleared or untagged event
// may have removed blocks; a skipped BlockStored only leaves the index a
// subset).
//
// Errors: damage that leaves the end of an event unknown (truncation, an
// invalid msgpack byte), and anything wrong outside the events (the
// envelope, ts, the rank, trailing bytes) fail the whole batch with a
// *DecodeError matching ErrMalformed, and b is left empty.
//
// Hostile input: Decode never panics, and checks every header's element
// count against the remaining bytes before growing anything (every msgpack
// element takes at least one byte), so a header claiming 2^32-1 elements
// costs nothing. Memory is bounded by the payload: at most 8 bytes of
// BlockHashes or 4 bytes of TokenIDs per payload byte, a copy of extra_keys,
// and one Event (about 290 bytes on 64-bit platforms) per event, where the
// smallest event takes 2 bytes. A skipped event costs a counter; only the
// first one's error is built. Hence a payload of N bytes can make Events
// grow to roughly 150×N (300×N transiently while the slice doubles);
// subscribers must cap the frame size (e.g. ZMQ_MAXMSGSIZE).
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	d.r = reader{p: payload, n: len(payload)}
	b.Reset()
	d.r.envelope(b)
	if d.r.err == nil && len(d.r.p) != 0 {
		d.r.fail(ReasonTrailing, d.r.p, fmt.Errorf("%d bytes after the batch", len(d.r.p)))
	}
	err := d.r.err
	d.r = reader{} // do not retain the payload
	if err == errQuiet {
		// Never: events resolves every quiet failure.
		err = &DecodeError{Reason: ReasonEvent, Offset: 0, Err: errors.New("unresolved skipped event")}
	}
	if err != nil {
		b.Reset()
		return err
	}
	return nil
}

// reader is a cursor over a payload with a sticky first error: once err is
// set, every method is a no-op (until events clears it to skip an event).
type reader struct {
	p   []byte // unread input
	n   int    // length of the whole payload, for offsets
	err error
	// quiet is set once the batch has skipped an event: the first skip's
	// error is kept (Skips.First), later ones need only their reason, so
	// fail records it in qreason without building an error.
	quiet   bool
	qreason string
}

// errQuiet is r.err for a failure recorded quietly (its reason in
// qreason); events either skips the event or replaces it with a full
// error, so Decode never returns it.
var errQuiet = &DecodeError{Reason: ReasonEvent, Err: errors.New("skipped event")}

// fail records the first error. at is the input starting at the offending
// element.
func (r *reader) fail(reason string, at []byte, err error) {
	if r.err != nil {
		return
	}
	if errors.Is(err, errShort) {
		reason = ReasonTruncated
	}
	if r.quiet && reason != ReasonTruncated {
		r.err, r.qreason = errQuiet, reason
		return
	}
	r.err = &DecodeError{Reason: reason, Offset: r.n - len(at), Err: err}
}

// failEvent fails for reason with an error built only when it is kept
// (not quiet): the cheap path for the failures a stream of tiny bogus
// events can repeat.
func (r *reader) failEvent(reason string, at []byte, mk func() error) {
	if r.err != nil {
		return
	}
	if r.quiet {
		r.err, r.qreason = errQuiet, reason
		return
	}
	r.fail(reason, at, mk())
}

// fieldError names the field whose value was rejected. It is built only on
// the error path, so that the success path does not allocate.
type fieldError struct {
	name string
	err  error
}

func (e fieldError) Error() string { return e.name + ": " + e.err.Error() }
func (e fieldError) Unwrap() error { return e.err }

// mpErr converts an error from a msgp reader into errShort or a
// wireTypeError naming what was wanted.
func mpErr(err error, want string, at []byte) error {
	if errors.Is(err, msgp.ErrShortBytes) || len(at) == 0 {
		return errShort
	}
	return wireTypeError{want: want, got: at[0]}
}

func isArrayPrefix(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }
func isMapPrefix(c byte) bool   { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }
func isStrPrefix(c byte) bool   { return c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb }
func isIntPrefix(c byte) bool   { return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) }

const mnil = 0xc0

func (r *reader) peek() (byte, bool) {
	if r.err != nil || len(r.p) == 0 {
		return 0, false
	}
	return r.p[0], true
}

// nilNext consumes a nil if one is next.
func (r *reader) nilNext() bool {
	if c, ok := r.peek(); ok && c == mnil {
		r.p = r.p[1:]
		return true
	}
	return false
}

// arrayHeader reads an array header whose count the remaining input can hold.
func (r *reader) arrayHeader(reason, want string) uint32 {
	if r.err != nil {
		return 0
	}
	at := r.p
	n, rest, err := msgp.ReadArrayHeaderBytes(r.p)
	if err != nil {
		r.fail(reason, at, mpErr(err, want, at))
		return 0
	}
	if uint64(n) > uint64(len(rest)) {
		r.fail(reason, at, fmt.Errorf("array header claims %d elements, %d bytes remain: %w", n, len(rest), errShort))
		return 0
	}
	r.p = rest
	return n
}

// mapHeader reads a map header whose count the remaining input can hold.
func (r *reader) mapHeader(reason, want string) uint32 {
	if r.err != nil {
		return 0
	}
	at := r.p
	n, rest, err := msgp.ReadMapHeaderBytes(r.p)
	if err != nil {
		r.fail(reason, at, mpErr(err, want, at))
		return 0
	}
	if 2*uint64(n) > uint64(len(rest)) {
		r.fail(reason, at, fmt.Errorf("map header claims %d entries, %d bytes remain: %w", n, len(rest), errShort))
		return 0
	}
	r.p = rest
	return n
}

// skip skips one element of any type.
func (r *reader) skip(reason string) {
	if r.err != nil {
		return
	}
	rest, err := skip(r.p)
	if err != nil {
		r.fail(reason, r.p, err)
		return
	}
	r.p = rest
}

// key reads a map key. A key that is not a str is skipped (together with
// nothing else: the caller skips the value) and ok is false.
func (r *reader) key(reason string) (key []byte, ok bool) {
	c, present := r.peek()
	if !present {
		if r.err == nil {
			r.fail(reason, r.p, errShort)
		}
		return nil, false
	}
	if !isStrPrefix(c) {
		r.skip(reason)
		return nil, false
	}
	at := r.p
	key, rest, err := msgp.ReadStringZC(r.p)
	if err != nil {
		r.fail(reason, at, mpErr(err, "map key", at))
		return nil, false
	}
	r.p = rest
	return key, true
}

// envelope decodes an EventBatch: the array [ts, events, rank] (two
// elements before vLLM PR #18925), or defensively a map.
func (r *reader) envelope(b *Batch) {
	c, ok := r.peek()
	switch {
	case !ok:
		r.fail(ReasonEnvelope, r.p, errShort)
	case isArrayPrefix(c):
		at := r.p
		n := r.arrayHeader(ReasonEnvelope, "EventBatch")
		if r.err != nil {
			return
		}
		if n < 2 {
			r.fail(ReasonEnvelope, at, fmt.Errorf("EventBatch array has %d elements, want at least 2", n))
			return
		}
		b.TS = r.ts()
		r.events(b)
		if n >= 3 {
			r.rank(b)
		}
		for i := uint32(3); i < n && r.err == nil; i++ {
			r.skip(ReasonEnvelope)
		}
	case isMapPrefix(c):
		at := r.p
		n := r.mapHeader(ReasonEnvelope, "EventBatch")
		sawEvents := false
		for i := uint32(0); i < n && r.err == nil; i++ {
			key, ok := r.key(ReasonEnvelope)
			if !ok {
				r.skip(ReasonEnvelope)
				continue
			}
			switch string(key) {
			case "ts":
				b.TS = r.ts()
			case "events":
				r.events(b)
				sawEvents = true
			case "data_parallel_rank", "dp_rank", "attn_dp_rank":
				r.rank(b)
			default:
				r.skip(ReasonEnvelope)
			}
		}
		if r.err == nil && !sawEvents {
			r.fail(ReasonEnvelope, at, errMapNoEvents)
		}
	default:
		r.fail(ReasonEnvelope, r.p, wireTypeError{want: "EventBatch (array or map)", got: c})
	}
}

// ts reads the batch timestamp: a float64, float32 or integer.
func (r *reader) ts() float64 {
	c, ok := r.peek()
	if !ok {
		if r.err == nil {
			r.fail(ReasonEnvelope, r.p, errShort)
		}
		return 0
	}
	at := r.p
	switch {
	case c == 0xca || c == 0xcb:
		f, rest, err := msgp.ReadFloat64Bytes(r.p)
		if err != nil {
			r.fail(ReasonEnvelope, at, mpErr(err, "ts (float or int)", at))
			return 0
		}
		r.p = rest
		return f
	case isIntPrefix(c):
		bits, neg, rest, err := readInt(r.p, "ts (float or int)")
		if err != nil {
			r.fail(ReasonEnvelope, at, err)
			return 0
		}
		r.p = rest
		if neg {
			return float64(int64(bits))
		}
		return float64(bits)
	}
	r.fail(ReasonEnvelope, at, wireTypeError{want: "ts (float or int)", got: c})
	return 0
}

// rank reads data_parallel_rank: an int32-range integer or nil.
func (r *reader) rank(b *Batch) {
	at := r.p
	v, ok := r.int64v(ReasonEnvelope, "data_parallel_rank")
	if r.err != nil {
		return
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.fail(ReasonEnvelope, at, fmt.Errorf("data_parallel_rank %d out of int32 range", v))
		return
	}
	b.DPRank, b.HasDPRank = int32(v), ok
}

// events decodes the events array into b.Events. An event that fails to
// decode is skipped (see skipEvent).
func (r *reader) events(b *Batch) {
	n := r.arrayHeader(ReasonEnvelope, "events (array)")
	b.Events = b.Events[:0]
	b.Unknown, b.UnknownTag = 0, ""
	b.Skipped = Skips{}
	defer func() { r.quiet = false }() // later failures are the envelope's
	for i := uint32(0); i < n && r.err == nil; i++ {
		start := r.p
		ev, prev := b.next()
		r.event(ev, &prev)
		if r.err != nil {
			kind := ev.Kind
			b.Events = b.Events[:len(b.Events)-1]
			r.skipEvent(b, start, kind)
			continue
		}
		if ev.Kind == KindUnknown {
			// Counted, not kept: a stream of tiny unknown events must not
			// grow Events (each slot is hundreds of bytes) beyond what the
			// payload size justifies for real events.
			b.Unknown++
			if b.UnknownTag == "" {
				b.UnknownTag = ev.Tag
			}
			b.Events = b.Events[:len(b.Events)-1]
		}
	}
}

// skipEvent handles an event whose decoding failed (r.err set), starting
// at start, whose tag said kind (0 if the tag was not read). When the
// failure is in a value (a per-event reason, see SkipReasons) and the
// event is well-formed msgpack, the event is counted in b.Skipped and
// decoding goes on after it. Otherwise its end is unknown, or the failure
// was not the event's: r.err stays set and the batch fails.
func (r *reader) skipEvent(b *Batch, start []byte, kind Kind) {
	reason := r.qreason
	if r.err != errQuiet {
		var de *DecodeError
		if !errors.As(r.err, &de) {
			return
		}
		reason = de.Reason
	}
	ri := slices.Index(SkipReasons[:], reason)
	if ri < 0 {
		return // truncated: the batch fails
	}
	rest, err := skip(start)
	if err != nil {
		// Not well-formed msgpack (an invalid byte): where the event
		// ends, and so where the next one starts, is unknown: that fails
		// the batch (the error found first stays if it was this one).
		var de *DecodeError
		if r.err != errQuiet && errors.As(r.err, &de) && de.Offset == r.n-len(rest) {
			return
		}
		r.err, r.quiet = nil, false
		r.fail(ReasonEvent, rest, err)
		return
	}
	k := SkipUntagged
	switch kind {
	case KindBlockStored:
		k = SkipStored
	case KindBlockRemoved:
		k = SkipRemoved
	case KindAllBlocksCleared:
		k = SkipCleared
	}
	b.Skipped.N[k][ri]++
	b.Skipped.Last = len(b.Events)
	if r.err != errQuiet && b.Skipped.First == nil {
		b.Skipped.First = r.err.(*DecodeError)
	}
	r.err, r.p, r.quiet = nil, rest, true
}

// event decodes one event, array or map.
func (r *reader) event(ev *Event, prev *prevStrings) {
	c, ok := r.peek()
	switch {
	case !ok:
		if r.err == nil {
			r.fail(ReasonEvent, r.p, errShort)
		}
	case isArrayPrefix(c):
		r.arrayEvent(ev, prev)
	case isMapPrefix(c):
		r.mapEvent(ev, prev)
	default:
		r.failEvent(ReasonEvent, r.p, func() error { return wireTypeError{want: "event (array or map)", got: c} })
	}
}

var (
	errEmptyEvent  = errors.New("empty event array")
	errMapNoType   = errors.New(`map event has no "type" key`)
	errMapNoEvents = errors.New(`map EventBatch has no "events" key`)
)

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case TagBlockStored:
		return KindBlockStored
	case TagBlockRemoved:
		return KindBlockRemoved
	case TagAllBlocksCleared:
		return KindAllBlocksCleared
	}
	return KindUnknown
}

// tag reads an event tag (a str) and sets Kind and Tag.
func (r *reader) tag(ev *Event, prev *prevStrings) {
	if r.err != nil {
		return
	}
	at := r.p
	if len(at) > 0 && !isStrPrefix(at[0]) {
		r.failEvent(ReasonEvent, at, func() error { return wireTypeError{want: "event tag (str)", got: at[0]} })
		return
	}
	t, rest, err := msgp.ReadStringZC(r.p)
	if err != nil {
		r.fail(ReasonEvent, at, mpErr(err, "event tag (str)", at))
		return
	}
	r.p = rest
	ev.Kind = kindOf(t)
	ev.Tag = intern(t, prev.tag)
}

// arrayEvent decodes a tagged positional array: vLLM's layout before PR
// #42892, or the Dynamo mocker's compact one, which omits absent fields
// instead of writing nil (told apart by the type at position 5).
func (r *reader) arrayEvent(ev *Event, prev *prevStrings) {
	at := r.p
	n := r.arrayHeader(ReasonEvent, "event")
	if r.err != nil {
		return
	}
	if n == 0 {
		r.fail(ReasonEvent, at, errEmptyEvent)
		return
	}
	r.tag(ev, prev)
	i := uint32(1) // elements consumed
	switch ev.Kind {
	case KindBlockStored:
		if n < 5 {
			r.failEvent(ReasonEvent, at, func() error { return fmt.Errorf("BlockStored array has %d elements, want at least 5", n) })
			return
		}
		ev.BlockHashes = r.hashes(ev.BlockHashes)
		r.parent(ev)
		ev.TokenIDs = r.tokens(ev.TokenIDs)
		ev.BlockSize, _ = r.intv("block_size")
		i = 5
		if c, ok := r.peek(); ok && n > 5 && isStrPrefix(c) {
			// Dynamo mocker, compact layout: absent fields are omitted, so
			// a string after block_size is medium and the int after it is
			// group_idx. vLLM never has a string at position 5 (lora_id).
			ev.Medium = r.str("medium", prev.medium)
			i = 6
			if n > 6 {
				ev.GroupIdx, ev.HasGroupIdx = r.intv("group_idx")
				i = 7
			}
		} else {
			for ; i < n && i < 12 && r.err == nil; i++ {
				switch i {
				case 5:
					ev.LoraID, ev.HasLoraID = r.int64v(ReasonField, "lora_id")
				case 6:
					ev.Medium = r.str("medium", prev.medium)
				case 7:
					if c, ok := r.peek(); ok && isMapPrefix(c) {
						// SGLang's BlockStoredWithMetadata: the 7-element
						// BlockStored then a metadata struct, where vLLM
						// has lora_name.
						r.metadata(ev, prev)
					} else {
						ev.LoraName = r.str("lora_name", prev.loraName)
					}
				case 8:
					ev.ExtraKeysRaw = r.raw(ev.ExtraKeysRaw)
				case 9:
					ev.GroupIdx, ev.HasGroupIdx = r.intv("group_idx")
				case 10:
					ev.KVCacheSpecKind = r.str("kv_cache_spec_kind", prev.kind)
				case 11:
					ev.SlidingWindow, ev.HasSlidingWindow = r.intv("kv_cache_spec_sliding_window")
				}
			}
		}
		r.saltFallback(ev, prev)
	case KindBlockRemoved:
		if n < 2 {
			r.failEvent(ReasonEvent, at, func() error { return fmt.Errorf("BlockRemoved array has %d elements, want at least 2", n) })
			return
		}
		ev.BlockHashes = r.hashes(ev.BlockHashes)
		i = 2
		if c, ok := r.peek(); ok && n > 2 && isIntPrefix(c) {
			// Dynamo mocker with medium omitted: [tag, hashes, group_idx].
			ev.GroupIdx, ev.HasGroupIdx = r.intv("group_idx")
			i = 3
		} else if n > 2 {
			ev.Medium = r.str("medium", prev.medium)
			i = 3
			if n > 3 {
				ev.GroupIdx, ev.HasGroupIdx = r.intv("group_idx")
				i = 4
			}
		}
	}
	for ; i < n && r.err == nil; i++ {
		r.skip(ReasonEvent)
	}
}

// mapEvent decodes a tagged map (vLLM since PR #42892, v0.26+): "type"
// anywhere, fields by name, unknown keys skipped.
func (r *reader) mapEvent(ev *Event, prev *prevStrings) {
	at := r.p
	n := r.mapHeader(ReasonEvent, "event")
	if r.err != nil {
		return
	}
	body := r.p
	found := false
	for i := uint32(0); i < n && r.err == nil; i++ {
		key, ok := r.key(ReasonEvent)
		if ok && string(key) == "type" {
			r.tag(ev, prev)
			found = true
			break
		}
		r.skip(ReasonEvent)
	}
	if r.err != nil {
		return
	}
	if !found {
		r.fail(ReasonEvent, at, errMapNoType)
		return
	}
	if ev.Kind == KindUnknown || ev.Kind == KindAllBlocksCleared {
		r.p = body
		for i := uint32(0); i < 2*n && r.err == nil; i++ {
			r.skip(ReasonEvent)
		}
		return
	}
	r.p = body
	for i := uint32(0); i < n && r.err == nil; i++ {
		key, ok := r.key(ReasonEvent)
		if !ok || string(key) == "type" {
			r.skip(ReasonEvent)
			continue
		}
		r.field(ev, key, prev)
	}
	if ev.Kind == KindBlockStored {
		r.saltFallback(ev, prev)
	}
}

// field decodes the value of one map-event field of a BlockStored or
// BlockRemoved. Fields the kind does not have are skipped.
func (r *reader) field(ev *Event, key []byte, prev *prevStrings) {
	switch string(key) {
	case "block_hashes":
		ev.BlockHashes = r.hashes(ev.BlockHashes)
		return
	case "medium":
		ev.Medium = r.str("medium", prev.medium)
		return
	case "group_idx":
		ev.GroupIdx, ev.HasGroupIdx = r.intv("group_idx")
		return
	case "kv_cache_spec_kind":
		ev.KVCacheSpecKind = r.str("kv_cache_spec_kind", prev.kind)
		return
	case "kv_cache_spec_sliding_window":
		ev.SlidingWindow, ev.HasSlidingWindow = r.intv("kv_cache_spec_sliding_window")
		return
	case "locality":
		ev.Locality = r.str("locality", prev.locality)
		return
	case "ownership":
		ev.Ownership = r.str("ownership", prev.ownership)
		return
	case "session_id":
		ev.SessionID = r.str("session_id", prev.sessionID)
		return
	case "event_version":
		ev.EventVersion, _ = r.intv("event_version")
		return
	}
	if ev.Kind != KindBlockStored {
		r.skip(ReasonEvent)
		return
	}
	switch string(key) {
	case "parent_block_hash":
		r.parent(ev)
	case "token_ids":
		ev.TokenIDs = r.tokens(ev.TokenIDs)
	case "block_size":
		ev.BlockSize, _ = r.intv("block_size")
	case "lora_id":
		ev.LoraID, ev.HasLoraID = r.int64v(ReasonField, "lora_id")
	case "lora_name":
		ev.LoraName = r.str("lora_name", prev.loraName)
	case "extra_keys":
		ev.ExtraKeysRaw = r.raw(ev.ExtraKeysRaw)
	case "cache_salt":
		ev.CacheSalt = r.str("cache_salt", prev.cacheSalt)
	default:
		r.skip(ReasonEvent)
	}
}

// metadata decodes SGLang's BlockStoredMetadata, which its
// BlockStoredWithMetadata appends after medium (array position 7) when a
// request carries a cache salt (sgl-project/sglang PR #30827; session_id
// since PR #37482). The struct is not array_like, so msgspec writes it as a
// map: "cache_salt" and "session_id" (str or nil) are read, other keys
// skipped.
func (r *reader) metadata(ev *Event, prev *prevStrings) {
	n := r.mapHeader(ReasonField, "metadata (map)")
	for i := uint32(0); i < n && r.err == nil; i++ {
		key, ok := r.key(ReasonField)
		if !ok {
			r.skip(ReasonField)
			continue
		}
		switch string(key) {
		case "cache_salt":
			ev.CacheSalt = r.str("cache_salt", prev.cacheSalt)
		case "session_id":
			ev.SessionID = r.str("session_id", prev.sessionID)
		default:
			r.skip(ReasonField)
		}
	}
}

// saltFallback fills CacheSalt from extra_keys when no cache_salt was sent.
func (r *reader) saltFallback(ev *Event, prev *prevStrings) {
	if r.err != nil || ev.CacheSalt != "" || len(ev.ExtraKeysRaw) == 0 {
		return
	}
	if s, ok := extraKeysSalt(ev.ExtraKeysRaw); ok {
		ev.CacheSalt = intern(s, prev.cacheSalt)
	}
}

// CacheSaltPrefix marks the cache salt inside vLLM extra_keys, as Dynamo
// writes it ("dynamo-cache-salt:<namespace>").
const CacheSaltPrefix = "dynamo-cache-salt:"

// extraKeysSalt returns the cache salt (prefix stripped) carried by the first
// block's entry of an extra_keys value: the first str element with
// CacheSaltPrefix in that entry's tuple (or the entry itself if it is such a
// str). It aliases raw.
func extraKeysSalt(raw []byte) ([]byte, bool) {
	if len(raw) == 0 || !isArrayPrefix(raw[0]) {
		return nil, false
	}
	n, p, err := msgp.ReadArrayHeaderBytes(raw)
	if err != nil || n == 0 || len(p) == 0 {
		return nil, false
	}
	if isStrPrefix(p[0]) {
		s, _, err := msgp.ReadStringZC(p)
		if err == nil && bytes.HasPrefix(s, []byte(CacheSaltPrefix)) {
			return s[len(CacheSaltPrefix):], true
		}
		return nil, false
	}
	if !isArrayPrefix(p[0]) { // typically nil: no extra keys for this block
		return nil, false
	}
	m, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, false
	}
	for i := uint32(0); i < m && len(p) > 0; i++ {
		if isStrPrefix(p[0]) {
			s, rest, err := msgp.ReadStringZC(p)
			if err != nil {
				return nil, false
			}
			if bytes.HasPrefix(s, []byte(CacheSaltPrefix)) {
				return s[len(CacheSaltPrefix):], true
			}
			p = rest
			continue
		}
		if p, err = skip(p); err != nil {
			return nil, false
		}
	}
	return nil, false
}

// hashes reads a list of block hashes into dst[:0]. nil reads as empty.
func (r *reader) hashes(dst []uint64) []uint64 {
	dst = dst[:0]
	if r.err != nil || r.nilNext() {
		return dst
	}
	n := r.arrayHeader(ReasonField, "block_hashes (array)")
	if r.err != nil || n == 0 {
		return dst
	}
	dst = slices.Grow(dst, int(n)) // n ≤ remaining bytes (arrayHeader)
	p := r.p
	for i := uint32(0); i < n; i++ {
		h, rest, err := readHash(p)
		if err != nil {
			r.fail(ReasonHash, p, err)
			return dst
		}
		dst = append(dst, h)
		p = rest
	}
	r.p = p
	return dst
}

// parent reads parent_block_hash: a hash or nil (no parent).
func (r *reader) parent(ev *Event) {
	if r.err != nil {
		return
	}
	if r.nilNext() {
		ev.ParentHash, ev.HasParent = 0, false
		return
	}
	h, rest, err := readHash(r.p)
	if err != nil {
		r.fail(ReasonHash, r.p, err)
		return
	}
	r.p = rest
	ev.ParentHash, ev.HasParent = h, true
}

// tokens reads token_ids into dst[:0]; each must be an integer in
// [0, 2^32-1]. nil reads as empty.
func (r *reader) tokens(dst []uint32) []uint32 {
	dst = dst[:0]
	if r.err != nil || r.nilNext() {
		return dst
	}
	n := r.arrayHeader(ReasonField, "token_ids (array)")
	if r.err != nil || n == 0 {
		return dst
	}
	dst = slices.Grow(dst, int(n)) // n ≤ remaining bytes (arrayHeader)
	p := r.p
	for i := uint32(0); i < n; i++ {
		if len(p) > 0 && p[0] <= 0x7f { // positive fixint: the common case
			dst = append(dst, uint32(p[0]))
			p = p[1:]
			continue
		}
		if len(p) >= 3 && p[0] == 0xcd { // u16: typical vocabulary ids
			dst = append(dst, uint32(binary.BigEndian.Uint16(p[1:])))
			p = p[3:]
			continue
		}
		if len(p) >= 5 && p[0] == 0xce { // u32: large vocabularies
			dst = append(dst, binary.BigEndian.Uint32(p[1:]))
			p = p[5:]
			continue
		}
		if len(p) > 0 && !isIntPrefix(p[0]) {
			at := p
			r.failEvent(ReasonToken, at, func() error { return wireTypeError{want: "token id (int)", got: at[0]} })
			return dst
		}
		bits, neg, rest, err := readInt(p, "token id (int)")
		switch {
		case err != nil:
			r.fail(ReasonToken, p, err)
			return dst
		case neg || bits > math.MaxUint32:
			r.failEvent(ReasonToken, p, func() error {
				if neg {
					return fmt.Errorf("token id %d is negative", int64(bits))
				}
				return fmt.Errorf("token id %d exceeds 2^32-1", bits)
			})
			return dst
		}
		dst = append(dst, uint32(bits))
		p = rest
	}
	r.p = p
	return dst
}

// int64v reads an integer that fits int64, or nil (ok false).
func (r *reader) int64v(reason, name string) (v int64, ok bool) {
	if r.err != nil || r.nilNext() {
		return 0, false
	}
	at := r.p
	if len(at) > 0 && !isIntPrefix(at[0]) {
		r.failEvent(reason, at, func() error { return fieldError{name, wireTypeError{want: "int or nil", got: at[0]}} })
		return 0, false
	}
	bits, neg, rest, err := readInt(r.p, "int or nil")
	if err != nil {
		r.fail(reason, at, fieldError{name, err})
		return 0, false
	}
	if !neg && bits > math.MaxInt64 {
		r.fail(reason, at, fmt.Errorf("%s %d overflows int64", name, bits))
		return 0, false
	}
	r.p = rest
	return int64(bits), true
}

// intv reads an integer that fits int, or nil (ok false).
func (r *reader) intv(name string) (int, bool) {
	at := r.p
	v, ok := r.int64v(ReasonField, name)
	if r.err == nil && int64(int(v)) != v {
		r.fail(ReasonField, at, fmt.Errorf("%s %d overflows int", name, v))
		return 0, false
	}
	return int(v), ok
}

// str reads a str or nil (""), interning it (see intern).
func (r *reader) str(name, prev string) string {
	if r.err != nil || r.nilNext() {
		return ""
	}
	at := r.p
	if len(at) > 0 && !isStrPrefix(at[0]) {
		r.failEvent(ReasonField, at, func() error { return fieldError{name, wireTypeError{want: "str or nil", got: at[0]}} })
		return ""
	}
	s, rest, err := msgp.ReadStringZC(r.p)
	if err != nil {
		r.fail(ReasonField, at, fieldError{name, mpErr(err, "str or nil", at)})
		return ""
	}
	r.p = rest
	return intern(s, prev)
}

// raw copies the next element's encoding into dst[:0]; nil yields empty.
func (r *reader) raw(dst []byte) []byte {
	dst = dst[:0]
	if r.err != nil || r.nilNext() {
		return dst
	}
	rest, err := skip(r.p)
	if err != nil {
		r.fail(ReasonField, r.p, err)
		return dst
	}
	dst = append(dst, r.p[:len(r.p)-len(rest)]...)
	r.p = rest
	return dst
}

// skip returns p after its first msgpack element. It is iterative (a pending
// element counter instead of recursion), so hostile nesting costs no stack,
// and it fails as soon as the pending elements outnumber the remaining bytes.
// msgp.Skip is not used because it recurses up to 100,000 levels deep.
func skip(p []byte) ([]byte, error) {
	pending := uint64(1)
	for pending > 0 {
		if pending > uint64(len(p)) {
			return p, errShort
		}
		c := p[0]
		var hdr, body, kids uint64
		switch {
		case c <= 0x7f || c >= 0xe0: // fixint
			hdr = 1
		case c <= 0x8f: // fixmap
			hdr, kids = 1, 2*uint64(c&0x0f)
		case c <= 0x9f: // fixarray
			hdr, kids = 1, uint64(c&0x0f)
		case c <= 0xbf: // fixstr
			hdr, body = 1, uint64(c&0x1f)
		default:
			var lenBytes uint64 // width of a length field after the prefix
			switch c {
			case 0xc0, 0xc2, 0xc3: // nil, false, true
				hdr = 1
			case 0xc4, 0xd9: // bin8, str8
				hdr, lenBytes = 2, 1
			case 0xc5, 0xda: // bin16, str16
				hdr, lenBytes = 3, 2
			case 0xc6, 0xdb: // bin32, str32
				hdr, lenBytes = 5, 4
			case 0xc7: // ext8: len, type
				hdr, lenBytes = 3, 1
			case 0xc8: // ext16
				hdr, lenBytes = 4, 2
			case 0xc9: // ext32
				hdr, lenBytes = 6, 4
			case 0xca, 0xce, 0xd2: // float32, u32, i32
				hdr = 5
			case 0xcb, 0xcf, 0xd3: // float64, u64, i64
				hdr = 9
			case 0xcc, 0xd0: // u8, i8
				hdr = 2
			case 0xcd, 0xd1: // u16, i16
				hdr = 3
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
				hdr = 2 + 1<<(c-0xd4)
			case 0xdc, 0xde: // array16, map16
				hdr, lenBytes = 3, 2
			case 0xdd, 0xdf: // array32, map32
				hdr, lenBytes = 5, 4
			default: // 0xc1, never used
				return p, wireTypeError{want: "msgpack element", got: c}
			}
			if uint64(len(p)) < hdr {
				return p, errShort
			}
			var l uint64
			switch lenBytes {
			case 1:
				l = uint64(p[1])
			case 2:
				l = uint64(binary.BigEndian.Uint16(p[1:]))
			case 4:
				l = uint64(binary.BigEndian.Uint32(p[1:]))
			}
			switch c {
			case 0xdc, 0xdd:
				kids = l
			case 0xde, 0xdf:
				kids = 2 * l
			default:
				body = l
			}
		}
		if uint64(len(p)) < hdr+body {
			return p, errShort
		}
		p = p[hdr+body:]
		pending = pending - 1 + kids
	}
	return p, nil
}
