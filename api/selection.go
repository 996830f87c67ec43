package api

import (
	"fmt"
	"math"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Prompt is the prompt of a selection request: token ids, or local block
// hashes.
type Prompt struct {
	TokenIDs  TokenIDs `json:"token_ids"`
	LoraName  string   `json:"lora_name,omitempty"`
	CacheSalt string   `json:"cache_salt,omitempty"`
	// BlockHashes give the prompt as local block hashes instead of
	// token_ids (already salted: lora_name and cache_salt must then be
	// absent), as signed int64 or unsigned JSON integers; ISLTokens is its
	// length in tokens (default: blocks × block size).
	BlockHashes HashList `json:"block_hashes,omitempty"`
	ISLTokens   int      `json:"isl_tokens,omitempty"`
}

// TokenIDs are a prompt's token ids: on the wire a JSON array of integers
// in [0, 2^32−1]. The server reads a body's token_ids with jsonlex
// before encoding/json sees the body; UnmarshalJSON reads them with
// jsonlex too (no []any or float64 per element) where
// a TokenIDs is decoded by encoding/json alone, and stops at
// DefaultMaxTokens (413).
type TokenIDs []uint32

// UnmarshalJSON implements json.Unmarshaler; null leaves t as it is, by
// the interface's convention. Errors name the element ("token_ids[3]: -1
// is out of range …").
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	l := jsonlex.New(b)
	if isNull, err := l.Null(); isNull || err != nil {
		return err
	}
	v, err := l.Tokens("token_ids", nil, DefaultMaxTokens)
	*t = v
	return l.End("token_ids", err)
}

// HashList decodes JSON integers as uint64 hashes: signed int64 values are
// reinterpreted (Dynamo's convention), unsigned values up to 2^64−1 are
// taken as they are. The server reads a body's block_hashes with jsonlex,
// as /query_by_hash does, before encoding/json sees the body;
// UnmarshalJSON reads them with jsonlex too where a
// HashList is decoded by encoding/json alone, and stops at
// DefaultMaxBlockHashes (413).
type HashList []uint64

// UnmarshalJSON implements json.Unmarshaler; null leaves h as it is, by
// the interface's convention. Errors name the element ("block_hashes[1]:
// … is out of range [-2^63, 2^64-1]").
func (h *HashList) UnmarshalJSON(b []byte) error {
	l := jsonlex.New(b)
	if isNull, err := l.Null(); isNull || err != nil {
		return err
	}
	v, err := l.Hashes("block_hashes", nil, DefaultMaxBlockHashes)
	*h = v
	return l.End("block_hashes", err)
}

// WorkerRef names one (worker id, dp rank).
type WorkerRef struct {
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
}

// RoutingConstraints are a request's required and preferred taints.
type RoutingConstraints struct {
	RequiredTaints  RequiredTaints `json:"required_taints,omitempty"`
	PreferredTaints TaintWeights   `json:"preferred_taints,omitempty"`
}

// SelectRequest is the body of POST /select and /select_and_reserve.
type SelectRequest struct {
	Prompt
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group,omitempty"` // "" → DefaultRoutingGroup
	// Role is the pool: "aggregated" (default), "prefill" or "decode".
	Role string `json:"role,omitempty"`
	// SelectionID is the booking id of /select_and_reserve (required there);
	// /select only echoes it.
	SelectionID        string              `json:"selection_id,omitempty"`
	PinnedWorker       *WorkerRef          `json:"pinned_worker,omitempty"`
	AllowedWorkerIDs   WorkerIDs           `json:"allowed_worker_ids,omitempty"`
	RoutingConstraints *RoutingConstraints `json:"routing_constraints,omitempty"`
	// Temperature overrides the configured selection temperature when set.
	Temperature *float64 `json:"router_temperature,omitempty"`
	// Wait, on /select_and_reserve, lets the request wait in the pool's
	// router queue while every worker is busy (serve --queue-threshold);
	// without it, or without a queue, the request never waits.
	Wait *Wait `json:"wait,omitempty"`
	// SessionID names the conversation the request belongs to. With
	// session affinity on (coordinator.ServiceConfig.SessionTTL),
	// /select_and_reserve sends a session's requests back to the worker
	// its last one was booked on while that worker is eligible and under
	// the busy thresholds (and the queue's, for a request with a wait),
	// and moves the session when it is not: a conversation's turns find
	// their prefix cached. /select ignores it. Ids longer than 256 bytes
	// are remembered by their SHA-256.
	SessionID string `json:"session_id,omitempty"`
}

// Wait is how long, and at what priority, a /select_and_reserve may wait
// in the router queue. The answer comes when the request is placed (200),
// or with 429 and Retry-After when it is shed (queue full) or its wait
// runs out; a client that disconnects leaves the queue.
type Wait struct {
	// TimeoutMS bounds the wait in milliseconds (0: the queue's own
	// --queue-max-wait alone; that bound applies too).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Priority orders the queue, higher first; a negative priority is
	// sheddable first. The x-prefixd-priority header sets it when the
	// body does not.
	Priority *int `json:"priority,omitempty"`
}

// PriorityHeader carries a request's queue priority (an integer, higher
// first) to /select_and_reserve, prefixd proxy and the endpoint picker.
const PriorityHeader = "x-prefixd-priority"

// SessionHeader names a request's session (SelectRequest.SessionID) to
// prefixd proxy; without it the proxy reads the OpenAI body's "user",
// then vLLM's "session_id".
const SessionHeader = "x-session-id"

// OverlapInfo is the chosen rank's cached prefix, in tokens, tiers cumulative.
type OverlapInfo struct {
	LongestMatched int `json:"longest_matched"`
	GPU            int `json:"gpu"`
	CPU            int `json:"cpu"`
	Disk           int `json:"disk"`
}

// Selection is the response of /select and /select_and_reserve.
type Selection struct {
	SelectionID            string      `json:"selection_id,omitempty"`
	ModelName              string      `json:"model_name"`
	RoutingGroup           string      `json:"routing_group"`
	WorkerID               uint64      `json:"worker_id"`
	DPRank                 uint32      `json:"dp_rank"`
	Endpoint               string      `json:"endpoint"`
	BlockSize              int         `json:"block_size"`
	Overlap                OverlapInfo `json:"overlap"`
	EffectivePrefillTokens float64     `json:"effective_prefill_tokens"`
	ISLTokens              int         `json:"isl_tokens,omitempty"`
	TrackPrefillTokens     *bool       `json:"track_prefill_tokens,omitempty"`
	PotentialDecodeBlocks  int         `json:"potential_decode_blocks"`
}

// ReserveRequest is the explicit form of POST /reservations: book
// SelectionID on (WorkerID, DPRank) of (model, group, role).
type ReserveRequest struct {
	Prompt
	SelectionID  string  `json:"selection_id"`
	ModelName    string  `json:"model_name"`
	RoutingGroup string  `json:"routing_group,omitempty"`
	Role         string  `json:"role,omitempty"`
	WorkerID     *uint64 `json:"worker_id"`
	DPRank       uint32  `json:"dp_rank"`
}

// Reservation is the 201 response of POST /reservations.
type Reservation struct {
	SelectionID  string `json:"selection_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	WorkerID     uint64 `json:"worker_id"`
	DPRank       uint32 `json:"dp_rank"`
	Endpoint     string `json:"endpoint"`
}

// PlanRequest is the body of POST /disagg/plans. Decode is booked in
// RoutingGroup, prefill in PrefillRoutingGroup (default: RoutingGroup).
type PlanRequest struct {
	Prompt
	ID                  string `json:"request_id"`
	ModelName           string `json:"model_name"`
	RoutingGroup        string `json:"routing_group,omitempty"`
	PrefillRoutingGroup string `json:"prefill_routing_group,omitempty"`
	// Policy and PrefillFailure override the daemon's conditional
	// disaggregation and prefill-failure policy for this request.
	Policy         *PlanPolicy `json:"policy,omitempty"`
	PrefillFailure string      `json:"prefill_failure,omitempty"` // "free_decode" or "bypass_on_decode"
	// Order overrides the daemon's --disagg-order for this request
	// ("decode-first" or "prefill-first"). DeferDecode, with
	// prefill-first, books only prefill; POST /disagg/plans/{id}/decode
	// books decode after the prefill hand-off.
	Order               string              `json:"order,omitempty"`
	DeferDecode         bool                `json:"defer_decode,omitempty"`
	PinnedPrefillWorker *WorkerRef          `json:"pinned_prefill_worker,omitempty"`
	AllowedWorkerIDs    WorkerIDs           `json:"allowed_worker_ids,omitempty"`
	RoutingConstraints  *RoutingConstraints `json:"routing_constraints,omitempty"`
}

// PlanPolicy is a per-request conditional-disaggregation policy. Zero
// thresholds take the defaults (2048 tokens, 0.7) or disable the gate and
// the probe.
type PlanPolicy struct {
	Kind                 string  `json:"kind"` // "off", "isl_bounding", "prefill_load" or "isl_or_load"
	EffISLThreshold      float64 `json:"eff_isl_threshold,omitempty"`
	EffISLRatioThreshold float64 `json:"eff_isl_ratio_threshold,omitempty"`
	DecodeBusyThreshold  float64 `json:"decode_busy_threshold,omitempty"`
	PrefillBusyThreshold float64 `json:"prefill_busy_threshold,omitempty"`
}

// PlanBooking is one booking of a plan. Tokens is the prompt length.
type PlanBooking struct {
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
	Endpoint string `json:"endpoint,omitempty"`
	Tokens   int    `json:"tokens"`
}

// PlanDecision is the conditional-disaggregation outcome.
type PlanDecision struct {
	// Kind is "bypass" (prefill on the decode worker) or "remote_prefill".
	Kind             string `json:"kind"`
	PolicySaysBypass bool   `json:"policy_says_bypass"`
	PrefillBusy      string `json:"prefill_busy"`
	DecodeBusy       string `json:"decode_busy"`
}

// PlanTransition is one recorded state change.
type PlanTransition struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Reason string `json:"reason"`
}

// PlanInfo is a plan as the API shows it.
type PlanInfo struct {
	ID            string           `json:"request_id"`
	Order         string           `json:"order"`
	State         string           `json:"state"`
	Decode        *PlanBooking     `json:"decode"`
	Prefill       *PlanBooking     `json:"prefill"`
	PrefillWorker *WorkerRef       `json:"prefill_worker,omitempty"`
	Decision      *PlanDecision    `json:"decision"`
	Transitions   []PlanTransition `json:"transitions"`
}

// String renders a WorkerRef as "worker_id/dp_rank".
func (r WorkerRef) String() string { return fmt.Sprintf("%d/%d", r.WorkerID, r.DPRank) }

// Limits of the selection and plan bodies, checked while a body is read,
// before anything is allocated for the value (docs/api.md lists them all):
// the bounded lists read themselves with jsonlex, in their UnmarshalJSON;
// promptBounds checks the configured limits after decoding.
const (
	// DefaultMaxTokens bounds token_ids per request: TokenIDs stops there,
	// and the server's Config.MaxTokens defaults to it.
	DefaultMaxTokens = 1_000_000
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
		name := field + "." + clip.N(taint, clip.Echo)
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
