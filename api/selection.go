package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Selector is what the selection routes need from the coordinator
// (Dynamo's standalone selection service: /select, /select_and_reserve,
// /reservations; and prefixd's disaggregated plans, docs/coordinator.md).
// *coordinator.Service implements it; implementations must be safe for
// concurrent use. The routes map their bodies onto the coordinator's
// types and its errors onto statuses (coordinatorError): the
// coordinator's sentinels and typed errors, or an error wrapping one of
// this package's sentinels (ErrInvalid, ErrNotFound, ErrConflict,
// ErrOverloaded, ErrUnavailable); anything else is a 500. The text of an
// error is sent to the client.
type Selector interface {
	// Select chooses a worker and books nothing.
	Select(r coordinator.SelectRequest) (coordinator.Choice, error)
	// SelectAndReserve chooses a worker and books r.ID on it.
	SelectAndReserve(r coordinator.SelectRequest) (coordinator.Choice, error)
	// Reserve books r.ID on r.Pin.
	Reserve(r coordinator.SelectRequest) (coordinator.Choice, error)
	// ReservePrefillComplete clears the reservation's prefill load.
	ReservePrefillComplete(id string) error
	// Free releases a reservation; an unknown or freed id is an error.
	Free(id string) error
	// Plan books a disaggregated plan. A failure may still return the
	// plan (its transitions say what happened).
	Plan(r coordinator.Request) (coordinator.Plan, error)
	PrefillComplete(id string) (coordinator.Plan, error)
	PrefillFailed(id string) (coordinator.Plan, error)
	// PlanDecode books the decode half of a plan created with
	// defer_decode (prefill first, decode after the hand-off).
	PlanDecode(id string) (coordinator.Plan, error)
	// Release releases a live plan; an unknown or finished plan is an error.
	Release(id string) (coordinator.Plan, error)
	// Get returns a live plan, or one recently finished by the Selector
	// itself (worker removal, expiry).
	Get(id string) (coordinator.Plan, bool)
}

// ErrOverloaded: every eligible worker (or the pinned one) is over a busy
// threshold (429).
var ErrOverloaded = errors.New("overloaded")

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
}

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

// registerSelection adds the selection routes. Path-only patterns (with
// {id} wildcards) keep the JSON 405 of methods for every route; accessOf
// says which token each needs.
func (h *handler) registerSelection(route func(string, methods)) {
	route("/select", methods{http.MethodPost: h.selectWorker})
	route("/select_and_reserve", methods{http.MethodPost: h.selectAndReserve})
	route("/reservations", methods{http.MethodPost: h.reserve})
	route("/reservations/{id}/prefill_complete", methods{http.MethodPost: h.reservePrefillComplete})
	route("/reservations/{id}", methods{http.MethodDelete: h.freeReservation})
	route("/disagg/plans", methods{http.MethodPost: h.createPlan})
	route("/disagg/plans/{id}/prefill_complete", methods{http.MethodPost: h.planPrefillComplete})
	route("/disagg/plans/{id}/prefill_failed", methods{http.MethodPost: h.planPrefillFailed})
	route("/disagg/plans/{id}/decode", methods{http.MethodPost: h.planDecode})
	route("/disagg/plans/{id}", methods{http.MethodGet: h.getPlan, http.MethodDelete: h.releasePlan})
}

// selector returns the Selector, or writes a 503 when there is none.
func (h *handler) selector(w http.ResponseWriter) Selector {
	if h.cfg.Selector == nil {
		writeError(w, &httpError{http.StatusServiceUnavailable, "selection: no selector in this process"})
	}
	return h.cfg.Selector
}

// selectionError maps a Selector error to its status.
func selectionError(err error) error {
	err = coordinatorError(err)
	if errors.Is(err, ErrOverloaded) {
		return &httpError{http.StatusTooManyRequests, err.Error()}
	}
	return workersError(err)
}

// decodeBody reads r's body and decodes it into a T (decodeJSON), whose
// Prompt prompt returns for promptBounds. Errors name the field at fault.
func decodeBody[T any](h *handler, w http.ResponseWriter, r *http.Request, prompt func(*T) *Prompt) (T, error) {
	var req T
	s := h.getScratch()
	defer h.putScratch(s)
	body, herr := h.readBody(w, r, s)
	if herr != nil {
		return req, herr
	}
	own := promptFields(prompt(&req), h.cfg.MaxTokens, h.cfg.MaxBlockHashes)
	if _, err := decodeJSON(body, &req, map[string]uint64{"isl_tokens": uint64(h.cfg.MaxTokens)}, own...); err != nil {
		return req, err
	}
	if herr := h.promptBounds(prompt(&req)); herr != nil {
		return req, herr
	}
	return req, nil
}

// maxIDBytes bounds the ids a client chooses (selection_id, request_id).
const maxIDBytes = 256

// checkID validates an id a client chooses: non-empty, at most maxIDBytes,
// no '/'.
func checkID(field, id string) *httpError {
	switch {
	case id == "":
		return badRequest(field, "required")
	case len(id) > maxIDBytes:
		return badRequest(field, "%q is longer than %d bytes", clip.N(id, maxEcho), maxIDBytes)
	case strings.Contains(id, "/"):
		return badRequest(field, "%q must not contain '/'", id)
	}
	return nil
}

// checkPrompt checks what decoding leaves: one form of prompt, and salts
// only with token ids. (Decoding bounded the counts and isl_tokens.)
func checkPrompt(p *Prompt) *httpError {
	if len(p.BlockHashes) > 0 {
		switch {
		case len(p.TokenIDs) > 0:
			return badRequest("block_hashes", "give token_ids or block_hashes, not both")
		case p.LoraName != "" || p.CacheSalt != "":
			return badRequest("block_hashes", "hashes are already salted: omit lora_name and cache_salt")
		}
		return nil
	}
	switch {
	case p.ISLTokens != 0:
		return badRequest("isl_tokens", "only with block_hashes")
	case len(p.TokenIDs) == 0:
		return badRequest("token_ids", "required (a non-empty array of token ids, or block_hashes)")
	}
	return nil
}

func checkPartition(model string, group *string) *httpError {
	if model == "" {
		return badRequest("model_name", "required")
	}
	if *group == "" {
		*group = DefaultRoutingGroup
	}
	return nil
}

func (h *handler) decodeSelect(w http.ResponseWriter, r *http.Request, reserve bool) (SelectRequest, coordinator.Role, bool) {
	req, err := decodeBody(h, w, r, func(r *SelectRequest) *Prompt { return &r.Prompt })
	if err != nil {
		h.fail(w, r, err)
		return req, 0, false
	}
	var role coordinator.Role
	herr := checkPartition(req.ModelName, &req.RoutingGroup)
	if herr == nil {
		role, herr = parseRole(req.Role)
	}
	if herr == nil {
		herr = checkPrompt(&req.Prompt)
	}
	if herr == nil && (reserve || req.SelectionID != "") {
		herr = checkID("selection_id", req.SelectionID)
	}
	if herr == nil && req.Temperature != nil && *req.Temperature < 0 {
		herr = badRequest("router_temperature", "must not be negative")
	}
	if herr != nil {
		writeError(w, herr)
		return req, 0, false
	}
	return req, role, true
}

func (h *handler) selectWorker(w http.ResponseWriter, r *http.Request) {
	h.doSelect(w, r, false)
}

func (h *handler) selectAndReserve(w http.ResponseWriter, r *http.Request) {
	h.doSelect(w, r, true)
}

func (h *handler) doSelect(w http.ResponseWriter, r *http.Request, reserve bool) {
	req, role, ok := h.decodeSelect(w, r, reserve)
	if !ok {
		return
	}
	sel := h.selector(w)
	if sel == nil {
		return
	}
	op := sel.Select
	if reserve {
		op = sel.SelectAndReserve
	}
	c, err := op(selectRequest(&req, role))
	if err != nil {
		h.fail(w, r, selectionError(err))
		return
	}
	writeJSON(w, http.StatusOK, selection(&req, c, reserve))
}

func (h *handler) reserve(w http.ResponseWriter, r *http.Request) {
	req, err := decodeBody(h, w, r, func(r *ReserveRequest) *Prompt { return &r.Prompt })
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var role coordinator.Role
	herr := checkID("selection_id", req.SelectionID)
	if herr == nil {
		herr = checkPartition(req.ModelName, &req.RoutingGroup)
	}
	if herr == nil {
		role, herr = parseRole(req.Role)
	}
	if herr == nil && req.WorkerID == nil {
		herr = badRequest("worker_id", "required (only the explicit form of /reservations is supported)")
	}
	if herr == nil {
		herr = checkPrompt(&req.Prompt)
	}
	if herr != nil {
		writeError(w, herr)
		return
	}
	sel := h.selector(w)
	if sel == nil {
		return
	}
	c, err := sel.Reserve(reserveRequest(&req, role))
	if err != nil {
		h.fail(w, r, selectionError(err))
		return
	}
	writeJSON(w, http.StatusCreated, Reservation{SelectionID: req.SelectionID, ModelName: req.ModelName, RoutingGroup: req.RoutingGroup,
		WorkerID: c.Rank.WorkerID, DPRank: c.Rank.DPRank, Endpoint: c.Endpoint})
}

// pathID returns the {id} of the route, validated.
func pathID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if herr := checkID("id", id); herr != nil {
		writeError(w, herr)
		return "", false
	}
	return id, true
}

func (h *handler) reservePrefillComplete(w http.ResponseWriter, r *http.Request) {
	h.reservationOp(w, r, Selector.ReservePrefillComplete)
}

func (h *handler) freeReservation(w http.ResponseWriter, r *http.Request) {
	h.reservationOp(w, r, Selector.Free)
}

func (h *handler) reservationOp(w http.ResponseWriter, r *http.Request, op func(Selector, string) error) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	sel := h.selector(w)
	if sel == nil {
		return
	}
	if err := op(sel, id); err != nil {
		h.fail(w, r, selectionError(err))
		return
	}
	writeRaw(w, http.StatusOK, statusOK)
}

func (h *handler) createPlan(w http.ResponseWriter, r *http.Request) {
	req, err := decodeBody(h, w, r, func(r *PlanRequest) *Prompt { return &r.Prompt })
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var cr coordinator.Request
	herr := checkID("request_id", req.ID)
	if herr == nil {
		herr = checkPartition(req.ModelName, &req.RoutingGroup)
	}
	if herr == nil {
		herr = checkPrompt(&req.Prompt)
	}
	if herr == nil {
		cr, herr = planRequest(&req)
	}
	if herr != nil {
		writeError(w, herr)
		return
	}
	sel := h.selector(w)
	if sel == nil {
		return
	}
	plan, err := sel.Plan(cr)
	if err != nil {
		h.failPlan(w, r, plan, promptLen(&req.Prompt), err)
		return
	}
	writeJSON(w, http.StatusCreated, planInfo(plan, promptLen(&req.Prompt)))
}

// failPlan writes a plan error; when the selector returned the failed
// plan, the body carries it next to the error (tokens as planInfo's).
func (h *handler) failPlan(w http.ResponseWriter, r *http.Request, plan coordinator.Plan, tokens int, err error) {
	err = selectionError(err)
	var he *httpError
	if plan.ID == "" || !errors.As(err, &he) {
		h.fail(w, r, err)
		return
	}
	info := planInfo(plan, tokens)
	writeJSON(w, he.status, struct {
		Error string    `json:"error"`
		Plan  *PlanInfo `json:"plan"`
	}{clip.N(he.msg, maxErrorBytes), &info})
}

func (h *handler) planPrefillComplete(w http.ResponseWriter, r *http.Request) {
	h.planOp(w, r, Selector.PrefillComplete)
}

func (h *handler) planDecode(w http.ResponseWriter, r *http.Request) {
	h.planOp(w, r, Selector.PlanDecode)
}

func (h *handler) planPrefillFailed(w http.ResponseWriter, r *http.Request) {
	h.planOp(w, r, Selector.PrefillFailed)
}

func (h *handler) releasePlan(w http.ResponseWriter, r *http.Request) {
	h.planOp(w, r, Selector.Release)
}

// getPlan reads a plan; it changes nothing.
func (h *handler) getPlan(w http.ResponseWriter, r *http.Request) {
	h.planOp(w, r, func(sel Selector, id string) (coordinator.Plan, error) {
		if p, ok := sel.Get(id); ok {
			return p, nil
		}
		return coordinator.Plan{}, fmt.Errorf("%w: plan %s not found", ErrNotFound, id)
	})
}

func (h *handler) planOp(w http.ResponseWriter, r *http.Request, op func(Selector, string) (coordinator.Plan, error)) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	sel := h.selector(w)
	if sel == nil {
		return
	}
	plan, err := op(sel, id)
	if err != nil {
		h.failPlan(w, r, plan, -1, err)
		return
	}
	writeJSON(w, http.StatusOK, planInfo(plan, -1))
}

// String renders a WorkerRef as "worker_id/dp_rank".
func (r WorkerRef) String() string { return fmt.Sprintf("%d/%d", r.WorkerID, r.DPRank) }
