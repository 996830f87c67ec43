// Package trace reads request traces in Mooncake's format — one JSON
// object per line with timestamp (ms), input_length, output_length and
// hash_ids (the prompt's blocks of BlockTokens tokens as remapped ids) —
// and turns a request into token ids an engine can hash: each hash id
// expands to BlockTokens deterministic tokens derived from the id alone
// (equal ids, equal tokens), cut at input_length. The Mooncake FAST'25
// conversation trace ships with the package (Mooncake; its README and
// license are in mooncake/).
package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/zeebo/xxh3"
)

// BlockTokens is how many tokens one hash id stands for.
const BlockTokens = 512

// Bounds on what Read accepts, checked before anything is allocated for
// a line's values.
const (
	MaxLineBytes   = 1 << 20 // a line of the trace
	MaxInputTokens = 1 << 21 // input_length (4,096 blocks)
	MaxRequests    = 1 << 24 // lines of a trace
	maxTimestampMS = 1 << 50 // about 35,000 years
)

// Request is one request of a trace.
type Request struct {
	// Arrival is the request's arrival from the start of the trace.
	Arrival      time.Duration
	InputLength  int
	OutputLength int
	// HashIDs are the prompt's blocks; ceil(InputLength / BlockTokens)
	// of them.
	HashIDs []uint64
}

//go:embed mooncake/conversation_trace.jsonl.gz
var mooncake []byte

// Mooncake returns the shipped Mooncake conversation trace.
func Mooncake() ([]Request, error) { return Read(bytes.NewReader(mooncake)) }

// Read reads a trace, gzipped or not. Errors name the line and the field
// ("line 7: hash_ids: 3 ids for input_length 2000, want 4"), and never
// repeat a line's content.
func Read(r io.Reader) ([]Request, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace: gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	var out []Request
	for n := 1; sc.Scan(); n++ {
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		if len(out) == MaxRequests {
			return nil, fmt.Errorf("trace: more than %d requests", MaxRequests)
		}
		req, err := parse(raw)
		if err != nil {
			return nil, fmt.Errorf("trace: line %d: %w", n, err)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("trace: line %d: longer than %d bytes", len(out)+1, MaxLineBytes)
		}
		return nil, fmt.Errorf("trace: %w", err)
	}
	return out, nil
}

func parse(raw []byte) (Request, error) {
	// The lengths first: they bound hash_ids before it is decoded.
	var head struct {
		Timestamp    *float64        `json:"timestamp"`
		InputLength  *int64          `json:"input_length"`
		OutputLength *int64          `json:"output_length"`
		HashIDs      json.RawMessage `json:"hash_ids"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Request{}, fmt.Errorf("%s: must be %s", te.Field, te.Type)
		}
		return Request{}, errors.New("not a JSON object")
	}
	switch {
	case head.Timestamp == nil:
		return Request{}, errors.New("timestamp: required")
	case *head.Timestamp < 0 || *head.Timestamp > maxTimestampMS || math.IsNaN(*head.Timestamp):
		return Request{}, fmt.Errorf("timestamp: %v is out of range [0, 2^50] ms", *head.Timestamp)
	case head.InputLength == nil:
		return Request{}, errors.New("input_length: required")
	case *head.InputLength < 1 || *head.InputLength > MaxInputTokens:
		return Request{}, fmt.Errorf("input_length: %d is out of range [1, %d]", *head.InputLength, MaxInputTokens)
	case head.OutputLength == nil:
		return Request{}, errors.New("output_length: required")
	case *head.OutputLength < 0 || *head.OutputLength > MaxInputTokens:
		return Request{}, fmt.Errorf("output_length: %d is out of range [0, %d]", *head.OutputLength, MaxInputTokens)
	}
	want := int((*head.InputLength + BlockTokens - 1) / BlockTokens)
	// An id is at least one digit and a comma: a longer array cannot be
	// the right one, so it is refused before it is decoded.
	if len(head.HashIDs) > 2+22*want {
		return Request{}, fmt.Errorf("hash_ids: more than the %d ids input_length %d needs", want, *head.InputLength)
	}
	var ids []uint64
	if err := json.Unmarshal(head.HashIDs, &ids); err != nil || ids == nil {
		return Request{}, errors.New("hash_ids: must be an array of non-negative integers")
	}
	if len(ids) != want {
		return Request{}, fmt.Errorf("hash_ids: %d ids for input_length %d, want %d", len(ids), *head.InputLength, want)
	}
	return Request{Arrival: time.Duration(*head.Timestamp * float64(time.Millisecond)), InputLength: int(*head.InputLength),
		OutputLength: int(*head.OutputLength), HashIDs: ids}, nil
}

// Tokens appends r's prompt to dst as token ids: BlockTokens per hash
// id, each derived from the id and its position in the block alone, in
// [0, vocab), cut at InputLength.
func (r Request) Tokens(dst []uint32, vocab uint32) []uint32 {
	var buf [16]byte
	for i, id := range r.HashIDs {
		n := min(BlockTokens, r.InputLength-i*BlockTokens)
		binary.LittleEndian.PutUint64(buf[:8], id)
		for j := range n {
			binary.LittleEndian.PutUint64(buf[8:], uint64(j))
			dst = append(dst, uint32(xxh3.Hash(buf[:])%uint64(vocab)))
		}
	}
	return dst
}
