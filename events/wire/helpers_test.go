package wire

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/prefixd/prefixd/events/wire/wiretest"
)

// vector is one entry of testdata/vectors.json: msgspec 0.21.1 output for
// vLLM's structs (sections 9.x), or bytes derived by hand from another
// producer's struct declarations (sections sglang, trtllm; Source says
// how).
type vector struct {
	Name       string   `json:"name"`
	Section    string   `json:"section"`
	Source     string   `json:"source"`
	Len        int      `json:"len"`
	Hex        string   `json:"hex"`
	Encode     *vecEnc  `json:"encode"`
	EncodeNote string   `json:"encode_note"`
	Batch      vecBatch `json:"batch"`
}

type vecEnc struct {
	Era  string `json:"era"`
	Hash string `json:"hash"`
}

type vecBatch struct {
	TS     float64    `json:"ts"`
	Rank   *int32     `json:"rank"`
	Events []vecEvent `json:"events"`
}

type vecEvent struct {
	Kind            string   `json:"kind"`
	Tag             string   `json:"tag"`
	Hashes          []string `json:"hashes"`
	Parent          *string  `json:"parent"`
	Tokens          []uint32 `json:"tokens"`
	BlockSize       int      `json:"block_size"`
	LoraID          *int64   `json:"lora_id"`
	Medium          string   `json:"medium"`
	LoraName        string   `json:"lora_name"`
	CacheSalt       string   `json:"cache_salt"`
	ExtraKeys       string   `json:"extra_keys"`
	GroupIdx        *int     `json:"group_idx"`
	KVCacheSpecKind string   `json:"kv_cache_spec_kind"`
	SlidingWindow   *int     `json:"sliding_window"`
	Locality        string   `json:"locality"`
	Ownership       string   `json:"ownership"`
	SessionID       string   `json:"session_id"`
	EventVersion    int      `json:"event_version"`
}

func loadVectors(tb testing.TB) []vector {
	tb.Helper()
	data, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		tb.Fatal(err)
	}
	var doc struct {
		Source  string   `json:"source"`
		Fields  string   `json:"fields"`
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		tb.Fatal(err)
	}
	if len(doc.Vectors) != 18 {
		tb.Fatalf("testdata/vectors.json has %d vectors, want 18: the 10 msgspec payload vectors, 5 SGLang, 3 TensorRT-LLM", len(doc.Vectors))
	}
	for _, v := range doc.Vectors {
		if !strings.HasPrefix(v.Section, "9.") && v.Source == "" {
			tb.Fatalf("vector %q (section %s) does not say where its bytes come from", v.Name, v.Section)
		}
	}
	return doc.Vectors
}

func (v vector) payload(tb testing.TB) []byte {
	tb.Helper()
	p, err := hex.DecodeString(v.Hex)
	if err != nil {
		tb.Fatalf("%s: %v", v.Name, err)
	}
	if len(p) != v.Len {
		tb.Fatalf("%s: %d bytes, vectors.json says %d", v.Name, len(p), v.Len)
	}
	return p
}

func (v vector) encoder(tb testing.TB) Encoder {
	tb.Helper()
	var e Encoder
	switch v.Encode.Era {
	case "map":
		e.Era = EraMap
	case "array":
		e.Era = EraArray
	default:
		tb.Fatalf("%s: era %q", v.Name, v.Encode.Era)
	}
	switch v.Encode.Hash {
	case "int":
		e.Hash = HashInt
	case "bytes":
		e.Hash = HashBytes
	case "signed":
		e.Hash = HashSigned
	default:
		tb.Fatalf("%s: hash %q", v.Name, v.Encode.Hash)
	}
	return e
}

func parseU64(tb testing.TB, s string) uint64 {
	tb.Helper()
	u, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// want builds the Batch a vector must decode to.
func (v vector) want(tb testing.TB) *Batch {
	tb.Helper()
	b := &Batch{TS: v.Batch.TS}
	if v.Batch.Rank != nil {
		b.DPRank, b.HasDPRank = *v.Batch.Rank, true
	}
	for _, ve := range v.Batch.Events {
		ev := Event{
			Tag:             ve.Tag,
			TokenIDs:        ve.Tokens,
			BlockSize:       ve.BlockSize,
			Medium:          ve.Medium,
			LoraName:        ve.LoraName,
			CacheSalt:       ve.CacheSalt,
			KVCacheSpecKind: ve.KVCacheSpecKind,
			Locality:        ve.Locality,
			Ownership:       ve.Ownership,
			SessionID:       ve.SessionID,
			EventVersion:    ve.EventVersion,
		}
		switch ve.Kind {
		case "BlockStored":
			ev.Kind = KindBlockStored
		case "BlockRemoved":
			ev.Kind = KindBlockRemoved
		case "AllBlocksCleared":
			ev.Kind = KindAllBlocksCleared
		default:
			ev.Kind = KindUnknown
			b.Unknown++
		}
		if ev.Tag == "" {
			ev.Tag = ve.Kind
		}
		for _, h := range ve.Hashes {
			ev.BlockHashes = append(ev.BlockHashes, parseU64(tb, h))
		}
		if ve.Parent != nil {
			ev.ParentHash, ev.HasParent = parseU64(tb, *ve.Parent), true
		}
		if ve.LoraID != nil {
			ev.LoraID, ev.HasLoraID = *ve.LoraID, true
		}
		if ve.ExtraKeys != "" {
			raw, err := hex.DecodeString(ve.ExtraKeys)
			if err != nil {
				tb.Fatal(err)
			}
			ev.ExtraKeysRaw = raw
		}
		if ve.GroupIdx != nil {
			ev.GroupIdx, ev.HasGroupIdx = *ve.GroupIdx, true
		}
		if ve.SlidingWindow != nil {
			ev.SlidingWindow, ev.HasSlidingWindow = *ve.SlidingWindow, true
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// diffBatch compares every field of two batches (floats by bits, nil and
// empty slices equal) and describes the first difference, or returns "".
// diffBatch compares a decoded batch with what was encoded: the decoder
// drops unknown events from Events and counts them, so the expectation is
// normalised the same way.
func diffBatch(want, got *Batch) string {
	want = knownOnly(want)
	if math.Float64bits(want.TS) != math.Float64bits(got.TS) {
		return fmt.Sprintf("TS: want %v, got %v", want.TS, got.TS)
	}
	if want.DPRank != got.DPRank || want.HasDPRank != got.HasDPRank {
		return fmt.Sprintf("rank: want %d/%v, got %d/%v", want.DPRank, want.HasDPRank, got.DPRank, got.HasDPRank)
	}
	if want.Unknown != got.Unknown || want.UnknownTag != got.UnknownTag {
		return fmt.Sprintf("Unknown: want %d (%q), got %d (%q)", want.Unknown, want.UnknownTag, got.Unknown, got.UnknownTag)
	}
	if len(want.Events) != len(got.Events) {
		return fmt.Sprintf("len(Events): want %d, got %d", len(want.Events), len(got.Events))
	}
	for i := range want.Events {
		if d := diffEvent(&want.Events[i], &got.Events[i]); d != "" {
			return fmt.Sprintf("Events[%d].%s", i, d)
		}
	}
	return ""
}

// diffEvent compares every field of Event by reflection, so that fields added
// later are covered automatically.
func diffEvent(want, got *Event) string {
	wv, gv := reflect.ValueOf(want).Elem(), reflect.ValueOf(got).Elem()
	for i := 0; i < wv.NumField(); i++ {
		name := wv.Type().Field(i).Name
		a, b := wv.Field(i), gv.Field(i)
		if a.Kind() == reflect.Slice {
			if a.Len() != b.Len() {
				return fmt.Sprintf("%s: want %v, got %v", name, a.Interface(), b.Interface())
			}
			for j := 0; j < a.Len(); j++ {
				if a.Index(j).Interface() != b.Index(j).Interface() {
					return fmt.Sprintf("%s: want %v, got %v", name, a.Interface(), b.Interface())
				}
			}
			continue
		}
		if a.Interface() != b.Interface() {
			return fmt.Sprintf("%s: want %#v, got %#v", name, a.Interface(), b.Interface())
		}
	}
	return ""
}

// cloneBatch deep-copies b (Decode reuses a Batch's storage).
func cloneBatch(b *Batch) *Batch {
	c := *b
	c.Events = make([]Event, len(b.Events))
	for i, ev := range b.Events {
		ev.BlockHashes = append([]uint64(nil), ev.BlockHashes...)
		ev.TokenIDs = append([]uint32(nil), ev.TokenIDs...)
		ev.ExtraKeysRaw = append([]byte(nil), ev.ExtraKeysRaw...)
		c.Events[i] = ev
	}
	return &c
}

func decodeErr(tb testing.TB, err error) *DecodeError {
	tb.Helper()
	if err == nil {
		tb.Fatal("Decode succeeded, want an error")
	}
	if !errors.Is(err, ErrMalformed) {
		tb.Fatalf("error %v does not match ErrMalformed", err)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		tb.Fatalf("error %v is not a *DecodeError", err)
	}
	return de
}

// The hand-built payloads of these tests come from wiretest; the short
// names keep the tables readable.
type (
	raw = wiretest.Raw
	kvs = wiretest.Map
)

func mp(vs ...any) []byte { return wiretest.Pack(vs...) }

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// H is the block hash of the golden vectors: ≥ 2^63, so msgpack writes it
// as cf (uint64) and an int64 decoder would see a negative value.
const H uint64 = 0xFEDCBA9876543210

// stored91 is the event of the golden vectors "9.1 map-era minimal
// BlockStored" and "9.4 array-era BlockStored".
func stored91() Event {
	return Event{
		Kind: KindBlockStored, Tag: TagBlockStored,
		BlockHashes: []uint64{H}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "GPU",
	}
}

// map91 is the "9.1 map-era minimal BlockStored" event as a builder value.
func map91() kvs {
	return kvs{
		"type", "BlockStored", "block_hashes", []any{H}, "parent_block_hash", nil,
		"token_ids", []any{1, 2, 3, 4}, "block_size", 4, "lora_id", nil, "medium", "GPU", "lora_name", nil,
	}
}

// typicalBatch is the benchmark batch: 4 BlockStored × 16 blocks × 16
// tokens, filled as vLLM fills it (parent, extra_keys of nils, group_idx 0,
// full_attention), rank 0.
func typicalBatch() *Batch {
	b := &Batch{TS: 1.7e9 + 0.25, DPRank: 0, HasDPRank: true}
	h := uint64(0x9E3779B97F4A7C15)
	tok := uint32(1000)
	var parent uint64
	for e := 0; e < 4; e++ {
		ev := Event{Kind: KindBlockStored, Tag: TagBlockStored, BlockSize: 16, Medium: "GPU",
			HasGroupIdx: true, KVCacheSpecKind: "full_attention"}
		if e > 0 {
			ev.ParentHash, ev.HasParent = parent, true
		}
		extra := msgp.AppendArrayHeader(nil, 16)
		for blk := 0; blk < 16; blk++ {
			h = h*6364136223846793005 + 1442695040888963407
			ev.BlockHashes = append(ev.BlockHashes, h)
			for t := 0; t < 16; t++ {
				tok = (tok*1103515245 + 12345) % 150000
				ev.TokenIDs = append(ev.TokenIDs, tok)
			}
			extra = msgp.AppendNil(extra)
		}
		ev.ExtraKeysRaw = extra
		parent = h
		b.Events = append(b.Events, ev)
	}
	return b
}

func mustEncode(tb testing.TB, e Encoder, b *Batch) []byte {
	tb.Helper()
	p, err := e.AppendBatch(nil, b)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// knownOnly normalises an encoder input the way Decode reports it: a batch
// with KindUnknown events in Events (whose Unknown already counts them) is
// returned without them and with UnknownTag set to the first one's tag. A
// batch without such events (e.g. one Decode produced) is returned as is.
func knownOnly(b *Batch) *Batch {
	if !slices.ContainsFunc(b.Events, func(ev Event) bool { return ev.Kind == KindUnknown }) {
		return b
	}
	out := *b
	out.Events = nil
	for _, ev := range b.Events {
		if ev.Kind == KindUnknown {
			if out.UnknownTag == "" {
				out.UnknownTag = ev.Tag
			}
			continue
		}
		out.Events = append(out.Events, ev)
	}
	return &out
}
