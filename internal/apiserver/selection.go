package apiserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
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
	// SelectAndReserveWait is SelectAndReserve for a request with a Wait:
	// it may wait in its pool's router queue until placed, shed or
	// expired (a *coordinator.ShedError, answered 429 with Retry-After),
	// or until ctx ends (the client left: nothing stays booked).
	SelectAndReserveWait(ctx context.Context, r coordinator.SelectRequest) (coordinator.Choice, error)
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
func decodeBody[T any](h *handler, w http.ResponseWriter, r *http.Request, prompt func(*T) *api.Prompt) (T, error) {
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
func checkPrompt(p *api.Prompt) *httpError {
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
		*group = api.DefaultRoutingGroup
	}
	return nil
}

func (h *handler) decodeSelect(w http.ResponseWriter, r *http.Request, reserve bool) (api.SelectRequest, coordinator.Role, bool) {
	req, err := decodeBody(h, w, r, func(r *api.SelectRequest) *api.Prompt { return &r.Prompt })
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
	if herr == nil && reserve && req.Wait != nil {
		herr = checkWait(req.Wait, r.Header)
	}
	if herr != nil {
		writeError(w, herr)
		return req, 0, false
	}
	return req, role, true
}

// Bounds of a /select_and_reserve's wait.
const (
	maxWaitTimeoutMS = 3_600_000 // an hour
	maxWaitPriority  = 1000
)

// checkWait validates a /select_and_reserve's wait, taking its priority
// from api.PriorityHeader when the body gives none. The header counts
// only with a wait: without one, nothing waits.
func checkWait(wt *api.Wait, h http.Header) *httpError {
	if wt.TimeoutMS < 0 || wt.TimeoutMS > maxWaitTimeoutMS {
		return badRequest("wait.timeout_ms", "%d is out of range [0, %d]", wt.TimeoutMS, maxWaitTimeoutMS)
	}
	if wt.Priority == nil {
		if v := h.Get(api.PriorityHeader); v != "" {
			p, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return &httpError{http.StatusBadRequest, fmt.Sprintf("%s: %q is not an integer", api.PriorityHeader, clip.N(v, maxEcho))}
			}
			wt.Priority = &p
		}
	}
	if wt.Priority != nil && (*wt.Priority < -maxWaitPriority || *wt.Priority > maxWaitPriority) {
		return badRequest("wait.priority", "%d is out of range [%d, %d] (from the body, or the %s header)", *wt.Priority, -maxWaitPriority, maxWaitPriority, api.PriorityHeader)
	}
	return nil
}

// coordinatorWait is a validated wait's coordinator.Wait: its deadline is
// timeout_ms from now.
func coordinatorWait(wt *api.Wait, now time.Time) *coordinator.Wait {
	cw := &coordinator.Wait{}
	if wt.Priority != nil {
		cw.Priority = *wt.Priority
	}
	if wt.TimeoutMS > 0 {
		cw.Deadline = now.Add(time.Duration(wt.TimeoutMS) * time.Millisecond)
	}
	return cw
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
	cr := selectRequest(&req, role)
	var c coordinator.Choice
	var err error
	if reserve && req.Wait != nil {
		cr.Wait = coordinatorWait(req.Wait, time.Now())
		c, err = sel.SelectAndReserveWait(r.Context(), cr)
	} else {
		c, err = op(cr)
	}
	if err != nil {
		if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
			return // the client left while waiting: no one to answer
		}
		var se *coordinator.ShedError
		if errors.As(err, &se) {
			writeShed(w, se)
			return
		}
		h.fail(w, r, selectionError(err))
		return
	}
	writeJSON(w, http.StatusOK, selection(&req, c, reserve))
}

func (h *handler) reserve(w http.ResponseWriter, r *http.Request) {
	req, err := decodeBody(h, w, r, func(r *api.ReserveRequest) *api.Prompt { return &r.Prompt })
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
	writeJSON(w, http.StatusCreated, api.Reservation{SelectionID: req.SelectionID, ModelName: req.ModelName, RoutingGroup: req.RoutingGroup,
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
	req, err := decodeBody(h, w, r, func(r *api.PlanRequest) *api.Prompt { return &r.Prompt })
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
		Error string        `json:"error"`
		Plan  *api.PlanInfo `json:"plan"`
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

// writeShed answers a request the router queue turned away: 429 with
// Retry-After (whole seconds, at least 1), and a body naming the pool,
// the priority and the reason (queue_full or wait_expired).
func writeShed(w http.ResponseWriter, se *coordinator.ShedError) {
	reason, why := "queue_full", "the queue is full and this request has the lowest priority"
	if errors.Is(se, coordinator.ErrWaitExpired) {
		reason, why = "wait_expired", "its wait ran out (wait.timeout_ms or --queue-max-wait) before a worker freed"
	}
	secs := max(1, int64(math.Ceil(se.RetryAfter.Seconds())))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeJSON(w, http.StatusTooManyRequests, struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}{clip.N(fmt.Sprintf("%v: router queue of pool %s: priority %d turned away: %s; retry after %ds", ErrOverloaded, poolName(se.Pool), se.Priority, why, secs), maxErrorBytes), reason})
}
