package api

import (
	"fmt"
	"math"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Limits of the selection and plan bodies, checked while a body is read,
// before anything is allocated for the value (docs/api.md lists them all):
// the bounded lists read themselves with jsonlex, in their UnmarshalJSON;
// promptBounds checks the configured limits after decoding.
const (
	// DefaultMaxBlockHashes is Config.MaxBlockHashes' default: block hashes
	// per request, DefaultMaxTokens / 16 rounded up to a power of two (a
	// block holds 16 tokens or more).
	DefaultMaxBlockHashes = 1 << 16
	// MaxAllowedWorkerIDs bounds allowed_worker_ids.
	MaxAllowedWorkerIDs = 4096
	// MaxTaints bounds required_taints and preferred_taints (each) of a
	// request, and the taints and topology_domains of a /register.
	MaxTaints = 256
	// MaxTaintBytes bounds one taint of a request, as the catalog bounds
	// names: a longer taint matches no worker.
	MaxTaintBytes = 512
	// MaxTaintWeight bounds |weight| of a preferred taint: a worker's
	// cost is scaled by exp(−tanh Σ weights), which is flat long before.
	MaxTaintWeight = 1000
)

// WorkerIDs are allowed_worker_ids: at most MaxAllowedWorkerIDs ids in
// [0, 2^64−1], counted before they are allocated (413 beyond). null is nil.
type WorkerIDs []uint64

// UnmarshalJSON implements json.Unmarshaler.
func (ids *WorkerIDs) UnmarshalJSON(b []byte) error {
	const field = "allowed_worker_ids"
	l := jsonlex.New(b)
	*ids = nil
	if isNull, err := l.Null(); isNull || err != nil {
		return err
	}
	err := l.Array(field, 1, func(i int) error {
		if i == MaxAllowedWorkerIDs {
			return &jsonlex.Error{Field: field, Problem: fmt.Sprintf("more than %d worker ids", MaxAllowedWorkerIDs), Over: true}
		}
		v, err := l.Uint(jsonlex.At(field, i), math.MaxUint64)
		*ids = append(*ids, v)
		return err
	})
	return l.End(field, err)
}

// RequiredTaints are routing_constraints.required_taints: at most
// MaxTaints taints of at most MaxTaintBytes, counted before they are
// allocated (413 beyond). null is nil.
type RequiredTaints []string

// UnmarshalJSON implements json.Unmarshaler.
func (t *RequiredTaints) UnmarshalJSON(b []byte) error {
	const field = "routing_constraints.required_taints"
	l := jsonlex.New(b)
	v, err := l.Strings(field, MaxTaints, MaxTaintBytes)
	*t = v
	return l.End(field, err)
}

// TaintWeights are routing_constraints.preferred_taints: at most MaxTaints
// taints of at most MaxTaintBytes, each weighing at most ±MaxTaintWeight,
// counted before they are allocated (413 beyond). null is nil.
type TaintWeights map[string]float64

// UnmarshalJSON implements json.Unmarshaler.
func (m *TaintWeights) UnmarshalJSON(b []byte) error {
	const field = "routing_constraints.preferred_taints"
	l := jsonlex.New(b)
	*m = nil
	if isNull, err := l.Null(); isNull || err != nil {
		return err
	}
	out := TaintWeights{}
	n := 0
	err := l.Object(field, 1, func(taint string) error {
		if n++; n > MaxTaints {
			return &jsonlex.Error{Field: field, Problem: fmt.Sprintf("more than %d taints", MaxTaints), Over: true}
		}
		name := field + "." + clip.N(taint, maxEcho)
		if len(taint) > MaxTaintBytes {
			return &jsonlex.Error{Field: name, Problem: fmt.Sprintf("the taint is longer than %d bytes", MaxTaintBytes)}
		}
		w, err := l.Float(name)
		if err == nil && math.Abs(w) > MaxTaintWeight {
			return &jsonlex.Error{Field: name, Problem: fmt.Sprintf("%v is out of range [-%d, %d]", w, MaxTaintWeight, MaxTaintWeight)}
		}
		out[taint] = w
		return err
	})
	*m = out
	return l.End(field, err)
}

// promptBounds checks what the arrays' UnmarshalJSON cannot know: the
// configured limits (TokenIDs and HashList stop at the defaults, the most
// they ever allocate), and isl_tokens, at most MaxTokens, the longest
// prompt token_ids may carry.
func (h *handler) promptBounds(p *Prompt) *httpError {
	switch {
	case len(p.TokenIDs) > h.cfg.MaxTokens:
		return tooLarge("token_ids", "more than %d tokens", h.cfg.MaxTokens)
	case len(p.BlockHashes) > h.cfg.MaxBlockHashes:
		return tooLarge("block_hashes", "more than %d hashes", h.cfg.MaxBlockHashes)
	case p.ISLTokens < 0 || p.ISLTokens > h.cfg.MaxTokens:
		return badRequest("isl_tokens", "%d is out of range [0, %d]", p.ISLTokens, h.cfg.MaxTokens)
	}
	return nil
}
