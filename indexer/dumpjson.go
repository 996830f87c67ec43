package indexer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Streaming forms of the snapshot JSON: WriteJSON writes what MarshalJSON
// returns without building it, and DecodeSnapshot reads what UnmarshalJSON
// reads from a json.Decoder, within limits.

// MarshalJSON writes the snapshot as one partition of Dynamo's /dump
// response ({"block_size", "events": [RouterEvent…]}) with synthetic event
// ids, plus prefixd's fields: per-rank watermarks, node placement and
// per-tier copy counts. It is WriteJSON into memory.
func (s *Snapshot) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	if err := s.WriteJSON(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// jsonChunk is how much WriteJSON buffers before writing to its writer.
const jsonChunk = 32 << 10

// tierKeyOrder lists the tiers in the order of their names, the order in
// which encoding/json writes map keys.
var tierKeyOrder = func() []Tier {
	out := make([]Tier, NumTiers)
	for t := range out {
		out[t] = Tier(t)
	}
	slices.SortFunc(out, func(a, b Tier) int { return strings.Compare(a.String(), b.String()) })
	return out
}()

// WriteJSON writes the snapshot's JSON (exactly the bytes MarshalJSON
// returns; no trailing newline) to w, in writes of about 32 KiB, holding
// no more than that beyond the snapshot itself. It returns the first write
// error.
func (s *Snapshot) WriteJSON(w io.Writer) error {
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
		var single [NumTiers]uint32
		if ev.Tier < NumTiers {
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
				one := [NumTiers]uint32{TierDevice: 1}
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

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it (HTML characters included).
// appendCounts appends `,"counts":{…}` (the tiers with copies, in
// tierKeyOrder) unless counts is def, what a block without "counts"
// means, or empty.
func appendCounts(b []byte, counts, def [NumTiers]uint32) []byte {
	if counts == def || counts == ([NumTiers]uint32{}) {
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

// DecodeSnapshot reads one snapshot object, in the form MarshalJSON
// writes, as the next value of dec, and returns what UnmarshalJSON would
// make of it: object keys match as encoding/json matches struct fields
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
func DecodeSnapshot(dec *json.Decoder, lim DecodeLimits) (*Snapshot, error) {
	d := &snapDecoder{dec: dec, lim: lim}
	s := &Snapshot{}
	var peerErr string
	var events []DumpEvent
	var ranks []RankWatermark
	var structural []DumpNode
	var groups []DumpGroup
	err := d.object("", func(key string) error {
		switch {
		case field(key, "block_size"):
			return d.value("block_size", &s.BlockSize)
		case field(key, "events"):
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
		case field(key, "watermarks"):
			ranks = nil
			return d.array("watermarks", func(i int) error {
				var jw jsonWatermark
				if err := d.value(fmt.Sprintf("watermarks[%d]", i), &jw); err != nil {
					return err
				}
				ranks = append(ranks, jw.watermark())
				return nil
			})
		case field(key, "structural_nodes"):
			structural = nil
			d.hashes = 0
			return d.array("structural_nodes", func(i int) error {
				n, err := d.structural(i)
				if err == nil {
					structural = append(structural, n)
				}
				return err
			})
		case field(key, "groups"):
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
		case field(key, "error"):
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

// field reports whether key names the field name, as encoding/json
// matches keys to fields.
func field(key, name string) bool { return key == name || strings.EqualFold(key, name) }

type snapDecoder struct {
	dec     *json.Decoder
	lim     DecodeLimits
	blocks  int // event blocks read so far
	hashes  int // structural hashes read so far
	gblocks int // group blocks read so far
	nulls   []int
}

// path joins a field path for error messages.
func path(prefix, name string) string {
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
func (d *snapDecoder) event(i int) (DumpEvent, error) {
	var ev DumpEvent
	var tierName string
	var stored, haveBlocks bool
	at := fmt.Sprintf("events[%d]", i)
	d.nulls = d.nulls[:0] // blocks with no counts: one copy in the event's tier
	blocks := func(prefix string) error {
		ev.Blocks, d.nulls, haveBlocks = nil, d.nulls[:0], true
		return d.array(path(prefix, "blocks"), func(j int) error {
			if d.lim.MaxBlocks > 0 && d.blocks >= d.lim.MaxBlocks {
				return fmt.Errorf("%s.blocks: more than %d blocks: %w", prefix, d.lim.MaxBlocks, ErrSnapshotTooLarge)
			}
			var jb jsonBlock
			if err := d.value(fmt.Sprintf("%s.blocks[%d]", prefix, j), &jb); err != nil {
				return err
			}
			b := DumpBlock{Hash: jb.BlockHash, TokensHash: jb.TokensHash}
			if jb.Counts == nil {
				d.nulls = append(d.nulls, len(ev.Blocks))
			}
			for name, c := range jb.Counts {
				t, ok := ParseTier(name)
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
			case field(key, "parent_hash"):
				var p *uint64
				if err := d.value(path(at, "parent_hash"), &p); err != nil {
					return err
				}
				ev.ParentHash, ev.HasParent = 0, false
				if p != nil {
					ev.ParentHash, ev.HasParent = *p, true
				}
				return nil
			case field(key, "start_position"):
				var p *uint32
				return d.value(path(at, "start_position"), &p)
			case field(key, "blocks"):
				return blocks(at)
			}
			return d.skip()
		})
	}
	err := d.object(at, func(key string) error {
		switch {
		case field(key, "worker_id"):
			return d.value(path(at, "worker_id"), &ev.Rank.WorkerID)
		case field(key, "storage_tier"):
			return d.value(path(at, "storage_tier"), &tierName)
		case field(key, "node"):
			return d.value(path(at, "node"), &ev.Node)
		case field(key, "parent_node"):
			return d.value(path(at, "parent_node"), &ev.ParentNode)
		case field(key, "offset"):
			return d.value(path(at, "offset"), &ev.Offset)
		case field(key, "event"):
			at := path(at, "event")
			return d.object(at, func(key string) error {
				switch {
				case field(key, "event_id"):
					var id uint64
					return d.value(path(at, "event_id"), &id)
				case field(key, "dp_rank"):
					return d.value(path(at, "dp_rank"), &ev.Rank.DPRank)
				case field(key, "data"):
					at := path(at, "data")
					return d.object(at, func(key string) error {
						if !field(key, "stored") {
							return d.skip()
						}
						null, err := storedObj(path(at, "stored"))
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
	tier, ok := ParseTier(tierName)
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
func (d *snapDecoder) group(i int) (DumpGroup, error) {
	var jg jsonGroup
	var blocks []DumpGroupBlock
	at := fmt.Sprintf("groups[%d]", i)
	err := d.object(at, func(key string) error {
		switch {
		case field(key, "worker_id"):
			return d.value(path(at, "worker_id"), &jg.WorkerID)
		case field(key, "dp_rank"):
			return d.value(path(at, "dp_rank"), &jg.DPRank)
		case field(key, "group_idx"):
			return d.value(path(at, "group_idx"), &jg.Idx)
		case field(key, "attention"):
			return d.value(path(at, "attention"), &jg.Attention)
		case field(key, "kind"):
			return d.value(path(at, "kind"), &jg.Kind)
		case field(key, "sliding_window"):
			return d.value(path(at, "sliding_window"), &jg.Window)
		case field(key, "main"):
			return d.value(path(at, "main"), &jg.Main)
		case field(key, "tracked"):
			return d.value(path(at, "tracked"), &jg.Tracked)
		case field(key, "blocks"):
			blocks = nil
			at := path(at, "blocks")
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
		return DumpGroup{}, err
	}
	g, err := jg.group(at)
	g.Blocks = blocks
	return g, err
}

// structural reads structural_nodes[i], its hashes one at a time.
func (d *snapDecoder) structural(i int) (DumpNode, error) {
	var n DumpNode
	at := fmt.Sprintf("structural_nodes[%d]", i)
	err := d.object(at, func(key string) error {
		switch {
		case field(key, "node"):
			return d.value(path(at, "node"), &n.Node)
		case field(key, "parent_node"):
			return d.value(path(at, "parent_node"), &n.ParentNode)
		case field(key, "shard"):
			return d.value(path(at, "shard"), &n.Shard)
		case field(key, "tokens_hashes"):
			n.Hashes = nil
			at := path(at, "tokens_hashes")
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
