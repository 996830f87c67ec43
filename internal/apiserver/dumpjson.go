package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixd/prefixd/indexer"
)

// The JSON form of an indexer.Snapshot, each partition's value in GET
// /dump: one partition of Dynamo's /dump response ({"block_size",
// "events": [RouterEvent…]}) with synthetic event ids, plus prefixd's
// fields: per-rank watermarks, node placement, the edges no rank holds,
// KV-cache groups and per-tier copy counts. The wire types at the end of
// this file document the shape. WriteSnapshot streams it out (the /dump
// handler) and MarshalSnapshot returns it in memory; DecodeSnapshot
// streams it in within limits (peer bootstrap) and UnmarshalSnapshot reads
// it through encoding/json, the reference DecodeSnapshot matches.

// MarshalSnapshot returns the JSON form of s. It is WriteSnapshot into
// memory.
func MarshalSnapshot(s *indexer.Snapshot) ([]byte, error) {
	var b bytes.Buffer
	if err := WriteSnapshot(&b, s); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// jsonChunk is how much WriteSnapshot buffers before writing to its writer.
const jsonChunk = 32 << 10

// tierKeyOrder lists the tiers in the order of their names, the order in
// which encoding/json writes map keys.
var tierKeyOrder = func() []indexer.Tier {
	out := make([]indexer.Tier, indexer.NumTiers)
	for t := range out {
		out[t] = indexer.Tier(t)
	}
	slices.SortFunc(out, func(a, b indexer.Tier) int { return strings.Compare(a.String(), b.String()) })
	return out
}()

// WriteSnapshot writes the JSON form of s (exactly the bytes
// MarshalSnapshot returns; no trailing newline) to w, in writes of about
// 32 KiB, holding no more than that beyond the snapshot itself. It returns
// the first write error. It only reads s: goroutines may write one
// snapshot at once.
func WriteSnapshot(w io.Writer, s *indexer.Snapshot) error {
	b := make([]byte, 0, jsonChunk+1024)
	flush := func() error {
		if len(b) < jsonChunk {
			return nil
		}
		_, err := w.Write(b)
		b = b[:0]
		return err
	}
	b = append(b, `{"block_size":`...)
	b = strconv.AppendInt(b, int64(s.BlockSize), 10)
	b = append(b, `,"events":[`...)
	for i := range s.Events {
		ev := &s.Events[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"worker_id":`...)
		b = strconv.AppendUint(b, ev.Rank.WorkerID, 10)
		b = append(b, `,"storage_tier":`...)
		b = strconv.AppendQuote(b, ev.Tier.String()) // tier names need no escaping
		b = append(b, `,"event":{"event_id":`...)
		b = strconv.AppendUint(b, uint64(i), 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(ev.Rank.DPRank), 10)
		b = append(b, `,"data":{"stored":{"parent_hash":`...)
		if ev.HasParent {
			b = strconv.AppendUint(b, ev.ParentHash, 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"start_position":null,"blocks":[`...)
		var single [indexer.NumTiers]uint32
		if ev.Tier < indexer.NumTiers {
			single[ev.Tier] = 1
		}
		for j := range ev.Blocks {
			bl := &ev.Blocks[j]
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"block_hash":`...)
			b = strconv.AppendUint(b, bl.Hash, 10)
			b = append(b, `,"tokens_hash":`...)
			b = strconv.AppendUint(b, bl.TokensHash, 10)
			b = append(b, `,"mm_extra_info":null`...)
			b = appendCounts(b, bl.Counts, single)
			b = append(b, '}')
			if err := flush(); err != nil {
				return err
			}
		}
		b = append(b, `]}}},"node":`...)
		b = strconv.AppendUint(b, uint64(ev.Node), 10)
		b = append(b, `,"parent_node":`...)
		b = strconv.AppendUint(b, uint64(ev.ParentNode), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendUint(b, uint64(ev.Offset), 10)
		b = append(b, '}')
		if err := flush(); err != nil {
			return err
		}
	}
	b = append(b, `],"watermarks":[`...)
	for i, wm := range s.Ranks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"worker_id":`...)
		b = strconv.AppendUint(b, wm.Rank.WorkerID, 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendUint(b, uint64(wm.Rank.DPRank), 10)
		b = append(b, `,"last_event_id":`...)
		if wm.HasSeq {
			b = strconv.AppendUint(b, wm.Seq, 10)
		} else {
			b = append(b, "null"...)
		}
		if wm.Digest != 0 {
			b = append(b, `,"digest":`...)
			b = strconv.AppendUint(b, wm.Digest, 10)
		}
		if wm.Truncated {
			b = append(b, `,"truncated":true`...)
		}
		if wm.Degraded {
			b = append(b, `,"degraded":true`...)
		}
		if wm.DegradedReason != "" {
			reason, _ := json.Marshal(wm.DegradedReason) // a string always marshals
			b = append(append(b, `,"degraded_reason":`...), reason...)
		}
		if wm.Shard != 0 {
			b = append(b, `,"shard":`...)
			b = strconv.AppendUint(b, uint64(wm.Shard), 10)
		}
		b = append(b, '}')
		if err := flush(); err != nil {
			return err
		}
	}
	b = append(b, ']')
	if len(s.Structural) > 0 {
		b = append(b, `,"structural_nodes":[`...)
		for i, d := range s.Structural {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"node":`...)
			b = strconv.AppendUint(b, uint64(d.Node), 10)
			b = append(b, `,"parent_node":`...)
			b = strconv.AppendUint(b, uint64(d.ParentNode), 10)
			b = append(b, `,"tokens_hashes":`...)
			if d.Hashes == nil {
				b = append(b, "null"...)
			} else {
				b = append(b, '[')
				for j, h := range d.Hashes {
					if j > 0 {
						b = append(b, ',')
					}
					b = strconv.AppendUint(b, h, 10)
					if err := flush(); err != nil {
						return err
					}
				}
				b = append(b, ']')
			}
			if d.Shard != 0 {
				b = append(b, `,"shard":`...)
				b = strconv.AppendUint(b, uint64(d.Shard), 10)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(s.Groups) > 0 {
		b = append(b, `,"groups":[`...)
		for i := range s.Groups {
			g := &s.Groups[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"worker_id":`...)
			b = strconv.AppendUint(b, g.Rank.WorkerID, 10)
			b = append(b, `,"dp_rank":`...)
			b = strconv.AppendUint(b, uint64(g.Rank.DPRank), 10)
			b = append(b, `,"group_idx":`...)
			b = strconv.AppendInt(b, int64(g.Idx), 10)
			b = append(b, `,"attention":`...)
			b = appendJSONString(b, g.Attention.String())
			if g.Kind != "" {
				b = append(b, `,"kind":`...)
				b = appendJSONString(b, g.Kind)
			}
			if g.Window != 0 {
				b = append(b, `,"sliding_window":`...)
				b = strconv.AppendInt(b, int64(g.Window), 10)
			}
			if g.Main {
				b = append(b, `,"main":true`...)
			}
			if g.Tracked {
				b = append(b, `,"tracked":true`...)
			}
			if len(g.Blocks) > 0 {
				b = append(b, `,"blocks":[`...)
				one := [indexer.NumTiers]uint32{indexer.TierDevice: 1}
				for j := range g.Blocks {
					bl := &g.Blocks[j]
					if j > 0 {
						b = append(b, ',')
					}
					b = append(b, `{"block_hash":`...)
					b = strconv.AppendUint(b, bl.Hash, 10)
					b = appendCounts(b, bl.Counts, one)
					b = append(b, '}')
					if err := flush(); err != nil {
						return err
					}
				}
				b = append(b, ']')
			}
			b = append(b, '}')
			if err := flush(); err != nil {
				return err
			}
		}
		b = append(b, ']')
	}
	b = append(b, '}')
	_, err := w.Write(b)
	return err
}

// appendCounts appends `,"counts":{…}` (the tiers with copies, in
// tierKeyOrder) unless counts is def, what a block without "counts"
// means, or empty.
func appendCounts(b []byte, counts, def [indexer.NumTiers]uint32) []byte {
	if counts == def || counts == ([indexer.NumTiers]uint32{}) {
		return b
	}
	b = append(b, `,"counts":{`...)
	first := true
	for _, tier := range tierKeyOrder {
		if c := counts[tier]; c > 0 {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = strconv.AppendQuote(b, tier.String())
			b = append(b, ':')
			b = strconv.AppendUint(b, uint64(c), 10)
		}
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it (HTML characters included).
func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// ErrSnapshotTooLarge: a snapshot being decoded has more events or blocks
// than DecodeLimits allow.
var ErrSnapshotTooLarge = errors.New("snapshot exceeds the decode limit")

// DecodeLimits bound what DecodeSnapshot allocates. A zero field is no
// limit.
type DecodeLimits struct {
	MaxEvents int // events, and separately KV-cache groups
	// MaxBlocks bounds the blocks of all events together (the entries the
	// snapshot would restore), and separately the hashes of all structural
	// nodes together, and the blocks of all KV-cache groups together.
	MaxBlocks int
}

// DecodeSnapshot reads one snapshot object, in the form WriteSnapshot
// writes, as the next value of dec, and returns what UnmarshalSnapshot
// would make of it: object keys match as encoding/json matches struct fields
// (exactly, else ignoring case; the last of duplicate keys wins), unknown
// keys are skipped, JSON null leaves a field unset. One difference: an
// object with a non-empty "error" string (how the /dump handler reports a
// partition it could not dump) is an error naming it.
//
// It reads the events and their blocks one at a time and checks lim
// before storing each, so a hostile or oversized snapshot fails with
// ErrSnapshotTooLarge (wrapped with the field concerned) before it is
// held in memory. Other errors name the field too: "events[3].event.data:
// not a stored event". Only the caller's decoder is read; on error the
// decoder is left mid-value.
func DecodeSnapshot(dec *json.Decoder, lim DecodeLimits) (*indexer.Snapshot, error) {
	d := &snapDecoder{dec: dec, lim: lim}
	s := &indexer.Snapshot{}
	var peerErr string
	var events []indexer.DumpEvent
	var ranks []indexer.RankWatermark
	var structural []indexer.DumpNode
	var groups []indexer.DumpGroup
	err := d.object("", func(key string) error {
		switch {
		case matchField(key, "block_size"):
			return d.value("block_size", &s.BlockSize)
		case matchField(key, "events"):
			events = nil
			d.blocks = 0
			return d.array("events", func(i int) error {
				if lim.MaxEvents > 0 && len(events) >= lim.MaxEvents {
					return fmt.Errorf("events: more than %d events: %w", lim.MaxEvents, ErrSnapshotTooLarge)
				}
				ev, err := d.event(i)
				if err == nil {
					events = append(events, ev)
				}
				return err
			})
		case matchField(key, "watermarks"):
			ranks = nil
			return d.array("watermarks", func(i int) error {
				var jw jsonWatermark
				if err := d.value(fmt.Sprintf("watermarks[%d]", i), &jw); err != nil {
					return err
				}
				ranks = append(ranks, jw.watermark())
				return nil
			})
		case matchField(key, "structural_nodes"):
			structural = nil
			d.hashes = 0
			return d.array("structural_nodes", func(i int) error {
				n, err := d.structural(i)
				if err == nil {
					structural = append(structural, n)
				}
				return err
			})
		case matchField(key, "groups"):
			groups = nil
			d.gblocks = 0
			return d.array("groups", func(i int) error {
				if lim.MaxEvents > 0 && len(groups) >= lim.MaxEvents {
					return fmt.Errorf("groups: more than %d groups: %w", lim.MaxEvents, ErrSnapshotTooLarge)
				}
				g, err := d.group(i)
				if err == nil {
					groups = append(groups, g)
				}
				return err
			})
		case matchField(key, "error"):
			return d.value("error", &peerErr)
		}
		return d.skip()
	})
	if err != nil {
		return nil, err
	}
	if peerErr != "" {
		return nil, fmt.Errorf("the snapshot is an error: %s", peerErr)
	}
	s.Events, s.Ranks, s.Structural, s.Groups = events, ranks, structural, groups
	return s, nil
}

// matchField reports whether key names the field name, as encoding/json
// matches keys to fields.
func matchField(key, name string) bool { return key == name || strings.EqualFold(key, name) }

type snapDecoder struct {
	dec     *json.Decoder
	lim     DecodeLimits
	blocks  int // event blocks read so far
	hashes  int // structural hashes read so far
	gblocks int // group blocks read so far
	nulls   []int
}

// fieldPath joins a field path for error messages.
func fieldPath(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func (d *snapDecoder) fail(at string, err error) error {
	if at == "" {
		return fmt.Errorf("snapshot: %w", err)
	}
	return fmt.Errorf("%s: %w", at, err)
}

// object reads an object, calling f for each key with the decoder before
// the key's value; f must consume the value. A null is no object and no
// error.
func (d *snapDecoder) object(at string, f func(key string) error) error {
	_, err := d.objectOrNull(at, f)
	return err
}

func (d *snapDecoder) objectOrNull(at string, f func(key string) error) (null bool, err error) {
	tok, err := d.dec.Token()
	if err != nil {
		return false, d.fail(at, err)
	}
	if tok == nil {
		return true, nil
	}
	if tok != json.Delim('{') {
		return false, d.fail(at, fmt.Errorf("want an object, have %v", tok))
	}
	for d.dec.More() {
		tok, err := d.dec.Token()
		if err != nil {
			return false, d.fail(at, err)
		}
		if err := f(tok.(string)); err != nil { // a key is always a string
			return false, err
		}
	}
	if _, err := d.dec.Token(); err != nil {
		return false, d.fail(at, err)
	}
	return false, nil
}

// array reads an array (or null), calling f for each element.
func (d *snapDecoder) array(at string, f func(i int) error) error {
	tok, err := d.dec.Token()
	if err != nil {
		return d.fail(at, err)
	}
	if tok == nil {
		return nil
	}
	if tok != json.Delim('[') {
		return d.fail(at, fmt.Errorf("want an array, have %v", tok))
	}
	for i := 0; d.dec.More(); i++ {
		if err := f(i); err != nil {
			return err
		}
	}
	if _, err := d.dec.Token(); err != nil {
		return d.fail(at, err)
	}
	return nil
}

// value decodes the next value into v with encoding/json.
func (d *snapDecoder) value(at string, v any) error {
	if err := d.dec.Decode(v); err != nil {
		return d.fail(at, err)
	}
	return nil
}

// skip consumes the next value, token by token.
func (d *snapDecoder) skip() error {
	depth := 0
	for {
		tok, err := d.dec.Token()
		if err != nil {
			return d.fail("", err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// event reads events[i].
func (d *snapDecoder) event(i int) (indexer.DumpEvent, error) {
	var ev indexer.DumpEvent
	var tierName string
	var stored, haveBlocks bool
	at := fmt.Sprintf("events[%d]", i)
	d.nulls = d.nulls[:0] // blocks with no counts: one copy in the event's tier
	blocks := func(prefix string) error {
		ev.Blocks, d.nulls, haveBlocks = nil, d.nulls[:0], true
		return d.array(fieldPath(prefix, "blocks"), func(j int) error {
			if d.lim.MaxBlocks > 0 && d.blocks >= d.lim.MaxBlocks {
				return fmt.Errorf("%s.blocks: more than %d blocks: %w", prefix, d.lim.MaxBlocks, ErrSnapshotTooLarge)
			}
			var jb jsonBlock
			if err := d.value(fmt.Sprintf("%s.blocks[%d]", prefix, j), &jb); err != nil {
				return err
			}
			b := indexer.DumpBlock{Hash: jb.BlockHash, TokensHash: jb.TokensHash}
			if jb.Counts == nil {
				d.nulls = append(d.nulls, len(ev.Blocks))
			}
			for name, c := range jb.Counts {
				t, ok := indexer.ParseTier(name)
				if !ok {
					return fmt.Errorf("%s.blocks[%d].counts: unknown tier %q", prefix, j, name)
				}
				b.Counts[t] = c
			}
			ev.Blocks = append(ev.Blocks, b)
			d.blocks++
			return nil
		})
	}
	storedObj := func(at string) (bool, error) {
		return d.objectOrNull(at, func(key string) error {
			switch {
			case matchField(key, "parent_hash"):
				var p *uint64
				if err := d.value(fieldPath(at, "parent_hash"), &p); err != nil {
					return err
				}
				ev.ParentHash, ev.HasParent = 0, false
				if p != nil {
					ev.ParentHash, ev.HasParent = *p, true
				}
				return nil
			case matchField(key, "start_position"):
				var p *uint32
				return d.value(fieldPath(at, "start_position"), &p)
			case matchField(key, "blocks"):
				return blocks(at)
			}
			return d.skip()
		})
	}
	err := d.object(at, func(key string) error {
		switch {
		case matchField(key, "worker_id"):
			return d.value(fieldPath(at, "worker_id"), &ev.Rank.WorkerID)
		case matchField(key, "storage_tier"):
			return d.value(fieldPath(at, "storage_tier"), &tierName)
		case matchField(key, "node"):
			return d.value(fieldPath(at, "node"), &ev.Node)
		case matchField(key, "parent_node"):
			return d.value(fieldPath(at, "parent_node"), &ev.ParentNode)
		case matchField(key, "offset"):
			return d.value(fieldPath(at, "offset"), &ev.Offset)
		case matchField(key, "event"):
			at := fieldPath(at, "event")
			return d.object(at, func(key string) error {
				switch {
				case matchField(key, "event_id"):
					var id uint64
					return d.value(fieldPath(at, "event_id"), &id)
				case matchField(key, "dp_rank"):
					return d.value(fieldPath(at, "dp_rank"), &ev.Rank.DPRank)
				case matchField(key, "data"):
					at := fieldPath(at, "data")
					return d.object(at, func(key string) error {
						if !matchField(key, "stored") {
							return d.skip()
						}
						null, err := storedObj(fieldPath(at, "stored"))
						if null {
							// As a nil *jsonStored: a later "stored"
							// starts afresh.
							ev.HasParent, ev.ParentHash, ev.Blocks, haveBlocks = false, 0, nil, false
						}
						stored = !null
						return err
					})
				}
				return d.skip()
			})
		}
		return d.skip()
	})
	if err != nil {
		return ev, err
	}
	if !stored {
		return ev, fmt.Errorf("%s.event.data: not a stored event", at)
	}
	tier, ok := indexer.ParseTier(tierName)
	if !ok {
		return ev, fmt.Errorf("%s.storage_tier: unknown tier %q", at, tierName)
	}
	ev.Tier = tier
	if haveBlocks {
		for _, j := range d.nulls {
			ev.Blocks[j].Counts[tier] = 1
		}
	}
	return ev, nil
}

// group reads groups[i], its blocks one at a time.
func (d *snapDecoder) group(i int) (indexer.DumpGroup, error) {
	var jg jsonGroup
	var blocks []indexer.DumpGroupBlock
	at := fmt.Sprintf("groups[%d]", i)
	err := d.object(at, func(key string) error {
		switch {
		case matchField(key, "worker_id"):
			return d.value(fieldPath(at, "worker_id"), &jg.WorkerID)
		case matchField(key, "dp_rank"):
			return d.value(fieldPath(at, "dp_rank"), &jg.DPRank)
		case matchField(key, "group_idx"):
			return d.value(fieldPath(at, "group_idx"), &jg.Idx)
		case matchField(key, "attention"):
			return d.value(fieldPath(at, "attention"), &jg.Attention)
		case matchField(key, "kind"):
			return d.value(fieldPath(at, "kind"), &jg.Kind)
		case matchField(key, "sliding_window"):
			return d.value(fieldPath(at, "sliding_window"), &jg.Window)
		case matchField(key, "main"):
			return d.value(fieldPath(at, "main"), &jg.Main)
		case matchField(key, "tracked"):
			return d.value(fieldPath(at, "tracked"), &jg.Tracked)
		case matchField(key, "blocks"):
			blocks = nil
			at := fieldPath(at, "blocks")
			return d.array(at, func(j int) error {
				if d.lim.MaxBlocks > 0 && d.gblocks >= d.lim.MaxBlocks {
					return fmt.Errorf("%s: more than %d group blocks: %w", at, d.lim.MaxBlocks, ErrSnapshotTooLarge)
				}
				var jb jsonGroupBlock
				bat := fmt.Sprintf("%s[%d]", at, j)
				if err := d.value(bat, &jb); err != nil {
					return err
				}
				b, err := jb.block(bat)
				if err != nil {
					return err
				}
				blocks = append(blocks, b)
				d.gblocks++
				return nil
			})
		}
		return d.skip()
	})
	if err != nil {
		return indexer.DumpGroup{}, err
	}
	g, err := jg.group(at)
	g.Blocks = blocks
	return g, err
}

// structural reads structural_nodes[i], its hashes one at a time.
func (d *snapDecoder) structural(i int) (indexer.DumpNode, error) {
	var n indexer.DumpNode
	at := fmt.Sprintf("structural_nodes[%d]", i)
	err := d.object(at, func(key string) error {
		switch {
		case matchField(key, "node"):
			return d.value(fieldPath(at, "node"), &n.Node)
		case matchField(key, "parent_node"):
			return d.value(fieldPath(at, "parent_node"), &n.ParentNode)
		case matchField(key, "shard"):
			return d.value(fieldPath(at, "shard"), &n.Shard)
		case matchField(key, "tokens_hashes"):
			n.Hashes = nil
			at := fieldPath(at, "tokens_hashes")
			tok, err := d.dec.Token()
			if err != nil {
				return d.fail(at, err)
			}
			if tok == nil {
				return nil
			}
			if tok != json.Delim('[') {
				return d.fail(at, fmt.Errorf("want an array, have %v", tok))
			}
			n.Hashes = []uint64{}
			for j := 0; d.dec.More(); j++ {
				if d.lim.MaxBlocks > 0 && d.hashes >= d.lim.MaxBlocks {
					return fmt.Errorf("%s: more than %d structural hashes: %w", at, d.lim.MaxBlocks, ErrSnapshotTooLarge)
				}
				var h uint64
				if err := d.value(fmt.Sprintf("%s[%d]", at, j), &h); err != nil {
					return err
				}
				n.Hashes = append(n.Hashes, h)
				d.hashes++
			}
			_, err = d.dec.Token()
			return d.failIf(at, err)
		}
		return d.skip()
	})
	return n, err
}

func (d *snapDecoder) failIf(at string, err error) error {
	if err != nil {
		return d.fail(at, err)
	}
	return nil
}

// ---- Wire types: Dynamo's /dump partition shape, with prefixd's extra fields ----
//
// The types below are what UnmarshalSnapshot decodes with encoding/json and
// document the shape; WriteSnapshot writes it and DecodeSnapshot streams it
// in.

type jsonSnapshot struct {
	BlockSize  int             `json:"block_size"`
	Events     []jsonEvent     `json:"events"`
	Watermarks []jsonWatermark `json:"watermarks"`
	Structural []jsonNode      `json:"structural_nodes,omitempty"`
	Groups     []jsonGroup     `json:"groups,omitempty"`
}

// jsonGroup is an indexer.DumpGroup. A block without counts is one device copy.
type jsonGroup struct {
	WorkerID  uint64           `json:"worker_id"`
	DPRank    uint32           `json:"dp_rank"`
	Idx       int              `json:"group_idx"`
	Attention string           `json:"attention"`
	Kind      string           `json:"kind,omitempty"`
	Window    int              `json:"sliding_window,omitempty"`
	Main      bool             `json:"main,omitempty"`
	Tracked   bool             `json:"tracked,omitempty"`
	Blocks    []jsonGroupBlock `json:"blocks,omitempty"`
}

type jsonGroupBlock struct {
	BlockHash uint64            `json:"block_hash"`
	Counts    map[string]uint32 `json:"counts,omitempty"`
}

// block converts one group block; at names it in errors.
func (jb *jsonGroupBlock) block(at string) (indexer.DumpGroupBlock, error) {
	b := indexer.DumpGroupBlock{Hash: jb.BlockHash}
	if jb.Counts == nil {
		b.Counts[indexer.TierDevice] = 1
	}
	for name, c := range jb.Counts {
		t, ok := indexer.ParseTier(name)
		if !ok {
			return b, fmt.Errorf("%s.counts: unknown tier %q", at, name)
		}
		b.Counts[t] = c
	}
	return b, nil
}

// group converts a group but its blocks; at names it in errors.
func (jg *jsonGroup) group(at string) (indexer.DumpGroup, error) {
	a, ok := indexer.ParseAttention(jg.Attention)
	if !ok {
		return indexer.DumpGroup{}, fmt.Errorf("%s.attention: unknown attention %q", at, jg.Attention)
	}
	return indexer.DumpGroup{Rank: indexer.Rank{WorkerID: jg.WorkerID, DPRank: jg.DPRank}, Idx: jg.Idx, Attention: a, Kind: jg.Kind, Window: jg.Window,
		Main: jg.Main, Tracked: jg.Tracked}, nil
}

type jsonWatermark struct {
	WorkerID uint64  `json:"worker_id"`
	DPRank   uint32  `json:"dp_rank"`
	Seq      *uint64 `json:"last_event_id"`
	Digest   uint64  `json:"digest,omitempty"`
	// Truncated and Degraded are absent when false, so dumps of exact
	// ranks are what they were before the flags existed.
	Truncated      bool   `json:"truncated,omitempty"`
	Degraded       bool   `json:"degraded,omitempty"`
	DegradedReason string `json:"degraded_reason,omitempty"`
	Shard          uint32 `json:"shard,omitempty"`
}

func (w *jsonWatermark) watermark() indexer.RankWatermark {
	rw := indexer.RankWatermark{Rank: indexer.Rank{WorkerID: w.WorkerID, DPRank: w.DPRank}, Digest: w.Digest, Truncated: w.Truncated,
		Degraded: w.Degraded, DegradedReason: w.DegradedReason, Shard: w.Shard}
	if w.Seq != nil {
		rw.Seq, rw.HasSeq = *w.Seq, true
	}
	return rw
}

type jsonNode struct {
	Node       uint32   `json:"node"`
	ParentNode uint32   `json:"parent_node"`
	Hashes     []uint64 `json:"tokens_hashes"`
	Shard      uint32   `json:"shard,omitempty"`
}

type jsonEvent struct {
	WorkerID    uint64      `json:"worker_id"`
	StorageTier string      `json:"storage_tier"`
	Event       jsonKvEvent `json:"event"`
	Node        uint32      `json:"node"`
	ParentNode  uint32      `json:"parent_node"`
	Offset      uint32      `json:"offset"`
}

type jsonKvEvent struct {
	EventID uint64     `json:"event_id"`
	DPRank  uint32     `json:"dp_rank"`
	Data    jsonKvData `json:"data"`
}

type jsonKvData struct {
	Stored *jsonStored `json:"stored"`
}

type jsonStored struct {
	ParentHash    *uint64     `json:"parent_hash"`
	StartPosition *uint32     `json:"start_position"`
	Blocks        []jsonBlock `json:"blocks"`
}

type jsonBlock struct {
	BlockHash   uint64            `json:"block_hash"`
	TokensHash  uint64            `json:"tokens_hash"`
	MMExtraInfo *struct{}         `json:"mm_extra_info"`
	Counts      map[string]uint32 `json:"counts,omitempty"`
}

// UnmarshalSnapshot reads what MarshalSnapshot writes, with encoding/json
// and the wire types above: the reference reader, which DecodeSnapshot
// matches within its limits. JSON null is the zero Snapshot.
func UnmarshalSnapshot(data []byte) (*indexer.Snapshot, error) {
	var js jsonSnapshot
	if err := json.Unmarshal(data, &js); err != nil {
		return nil, err
	}
	s := &indexer.Snapshot{BlockSize: js.BlockSize}
	for _, w := range js.Watermarks {
		s.Ranks = append(s.Ranks, w.watermark())
	}
	for _, n := range js.Structural {
		s.Structural = append(s.Structural, indexer.DumpNode(n))
	}
	for i := range js.Groups {
		at := fmt.Sprintf("groups[%d]", i)
		g, err := js.Groups[i].group(at)
		if err != nil {
			return nil, err
		}
		for j := range js.Groups[i].Blocks {
			b, err := js.Groups[i].Blocks[j].block(fmt.Sprintf("%s.blocks[%d]", at, j))
			if err != nil {
				return nil, err
			}
			g.Blocks = append(g.Blocks, b)
		}
		s.Groups = append(s.Groups, g)
	}
	for i, je := range js.Events {
		st := je.Event.Data.Stored
		if st == nil {
			return nil, fmt.Errorf("event %d: not a stored event", i)
		}
		tier, ok := indexer.ParseTier(je.StorageTier)
		if !ok {
			return nil, fmt.Errorf("event %d: unknown storage_tier %q", i, je.StorageTier)
		}
		ev := indexer.DumpEvent{Rank: indexer.Rank{WorkerID: je.WorkerID, DPRank: je.Event.DPRank}, Tier: tier, Node: je.Node, ParentNode: je.ParentNode, Offset: je.Offset}
		if st.ParentHash != nil {
			ev.ParentHash, ev.HasParent = *st.ParentHash, true
		}
		for _, jb := range st.Blocks {
			b := indexer.DumpBlock{Hash: jb.BlockHash, TokensHash: jb.TokensHash}
			if jb.Counts == nil {
				b.Counts[tier] = 1
			}
			for name, c := range jb.Counts {
				t, ok := indexer.ParseTier(name)
				if !ok {
					return nil, fmt.Errorf("event %d: unknown tier %q in counts", i, name)
				}
				b.Counts[t] = c
			}
			ev.Blocks = append(ev.Blocks, b)
		}
		s.Events = append(s.Events, ev)
	}
	return s, nil
}
