package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// exchange is one client request in flight.
type exchange struct {
	p     *Proxy
	w     http.ResponseWriter
	r     *http.Request
	ctx   context.Context // the request's, with its deadline
	req   *request
	id    string
	start time.Time
	hdr   http.Header

	mu       sync.Mutex // guards plan and seen (the first byte reports from its own goroutine)
	plan     api.PlanInfo
	seen     int      // plan transitions logged
	answered bool     // bytes went to the client
	served   []uint64 // the engines that answered, in order (prefill, then decode)

	retryAfter time.Duration // a 429's Retry-After from prefixd serve
	priority   *int          // the x-prefixd-priority header's, if any
}

// background is a context for giving bookings back: it outlives the
// client (which may have gone), bounded on its own.
func (x *exchange) background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(x.ctx), 5*time.Second)
}

// fail answers the client with an error, unless bytes went out already.
func (x *exchange) fail(status int, format string, args ...any) string {
	return x.failParam(status, "", fmt.Sprintf(format, args...))
}

// failParam answers the client with an error naming the field at fault,
// unless bytes went out already.
func (x *exchange) failParam(status int, param, msg string) string {
	if !x.answered {
		if status == http.StatusTooManyRequests && x.retryAfter > 0 {
			x.w.Header().Set("Retry-After", strconv.Itoa(int((x.retryAfter+time.Second-1)/time.Second)))
		}
		openAIError(x.w, status, param, msg)
	}
	return "error_" + statusClass(status)
}

func statusClass(status int) string { return fmt.Sprintf("%dxx", status/100) }

// upstreamError is an engine call that failed before its first byte:
// err is the transport's, or status the engine's answer. An answer the
// request itself caused (refused) keeps the engine's response, body
// unread, to be passed to the client as sent.
type upstreamError struct {
	engine uint64
	status int
	msg    string
	err    error
	resp   *http.Response // a refused request's answer: the client's
}

func (e *upstreamError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("engine %d: %v", e.engine, e.err)
	}
	return fmt.Sprintf("engine %d: HTTP %d: %s", e.engine, e.status, e.msg)
}

// retryable: the engine did not take the request (unreachable, or a
// server error), so another may. An answer the request caused (refused)
// is the same on any engine.
func (e *upstreamError) retryable() bool {
	return e.err != nil || e.status >= 500 && !refused(e.status)
}

// refused reports whether an engine's answer of status is about the
// request, not the engine: a 4xx (vLLM's 400 for an invalid parameter or
// a prompt over the context, 404 for a model it does not serve, 429), or
// 501 (a feature the model lacks). The client gets it as the engine sent
// it, and it is not tried on another engine.
func refused(status int) bool {
	return status/100 == 4 || status == http.StatusNotImplemented
}

// call posts body to e's path and returns the answer if it is a 2xx; an
// answer other than 2xx, or no answer, is an *upstreamError (a refused
// answer's body left open, the client's to receive).
func (x *exchange) call(e engine, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(x.ctx, http.MethodPost, e.endpoint+path, bytes.NewReader(body))
	if err != nil {
		return nil, &upstreamError{engine: e.id, err: err}
	}
	for k, vs := range x.hdr {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", x.id)
	load := x.p.fleet.load(e.endpoint)
	load.Add(1)
	resp, err := x.p.cfg.Engines.Do(req)
	if err != nil {
		load.Add(-1)
		return nil, &upstreamError{engine: e.id, err: err}
	}
	if resp.StatusCode/100 != 2 && !refused(resp.StatusCode) {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		load.Add(-1)
		return nil, &upstreamError{engine: e.id, status: resp.StatusCode, msg: clipBytes(raw)}
	}
	resp.Body = &countedBody{ReadCloser: resp.Body, load: load}
	x.served = append(x.served, e.id)
	if resp.StatusCode/100 != 2 {
		return nil, &upstreamError{engine: e.id, status: resp.StatusCode, resp: resp}
	}
	return resp, nil
}

// engineFailed answers the client for an engine call that failed: an
// answer the request caused goes to the client as the engine sent it
// (status, type and body), anything else is a 502 saying what failed.
func (x *exchange) engineFailed(err error, format string, args ...any) string {
	if ue := (*upstreamError)(nil); errors.As(err, &ue) && ue.resp != nil {
		return x.passOn(ue)
	}
	return x.fail(http.StatusBadGateway, "%s%v", fmt.Sprintf(format, args...), err)
}

// passOn relays an engine's refusal of the request, as it came.
func (x *exchange) passOn(ue *upstreamError) string {
	if err := x.relay(ue.resp, nil); err != nil {
		return x.outcome(err)
	}
	return "engine_" + statusClass(ue.status)
}

// countedBody gives back the engine's in-flight count when closed.
type countedBody struct {
	io.ReadCloser
	load *atomic.Int64
	once sync.Once
}

func (b *countedBody) Close() error {
	b.once.Do(func() { b.load.Add(-1) })
	return b.ReadCloser.Close()
}

// relay copies an engine's answer to the client as it arrives, flushing
// every read (SSE events reach the client as the engine sends them), and
// calls first once, at the first byte. It returns the first error: the
// engine's (the answer broke off) or the client's (it went away).
func (x *exchange) relay(resp *http.Response, first func()) error {
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			x.w.Header().Set(h, v)
		}
	}
	x.w.Header().Set("X-Request-Id", x.id)
	// Which engines ran the request: the one answering, and before it the
	// prefill worker of a disaggregated plan.
	for i, id := range x.served {
		name := "X-Prefixd-Worker"
		if i < len(x.served)-1 {
			name = "X-Prefixd-Prefill-Worker"
		}
		x.w.Header().Set(name, strconv.FormatUint(id, 10))
	}
	rc := http.NewResponseController(x.w)
	buf := make([]byte, 32<<10)
	started := false
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if !started {
				started = true
				x.answered = true
				x.w.WriteHeader(resp.StatusCode)
				x.p.m.ttft.WithLabelValues(x.req.Route.Label()).Observe(time.Since(x.start).Seconds())
				if first != nil {
					first()
				}
			}
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				return fmt.Errorf("client: %w", werr)
			}
			if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
				return fmt.Errorf("client: %w", ferr)
			}
		}
		if err == io.EOF {
			if !started {
				x.answered = true
				x.w.WriteHeader(resp.StatusCode)
			}
			return nil
		}
		if err != nil {
			if x.r.Context().Err() != nil {
				return fmt.Errorf("client: %w", x.r.Context().Err())
			}
			return fmt.Errorf("engine: %w", err)
		}
	}
}

// outcome labels how a relay ended.
func (x *exchange) outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case x.r.Context().Err() != nil:
		return "client_gone"
	case errors.Is(x.ctx.Err(), context.DeadlineExceeded):
		x.p.log.Warn("proxy: request deadline passed mid-answer", "request", x.id, "timeout", x.p.cfg.RequestTimeout)
		return "timeout"
	}
	x.p.log.Warn("proxy: answer broke off", "request", x.id, "err", err)
	return "engine_broke_off"
}

// aggregated runs the request on one engine: chosen by prefixd
// (select and reserve), at random, or by load; once more on the
// next-best engine when the first fails before its first byte.
func (x *exchange) aggregated() string {
	p := x.p
	if v := x.r.Header.Get(api.PriorityHeader); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1000 || n > 1000 {
			return x.failParam(http.StatusBadRequest, api.PriorityHeader, fmt.Sprintf("header %s %q: want an integer from -1000 to 1000", api.PriorityHeader, clip.String(v)))
		}
		x.priority = &n
	}
	es := p.fleet.pick(x.req.Model, p.cfg.RoutingGroup, catalog.RoleAggregated)
	if len(es) == 0 { // served, but not in this group or role
		return x.fail(http.StatusServiceUnavailable, "no aggregated engine of model %s in routing group %s", x.req.Model, p.cfg.RoutingGroup)
	}
	var tokens []uint32
	haveTokens := false
	if p.cfg.Policy == KVAware {
		var tooLong error
		if tokens, haveTokens, tooLong = x.tokens(es); tooLong != nil {
			return x.fail(http.StatusRequestEntityTooLarge, "%v", tooLong)
		}
	}
	var tried []uint64
	for attempt := 0; ; attempt++ {
		target, sid, status, msg := x.chooseAggregated(es, tokens, haveTokens, tried, attempt)
		if status != 0 {
			if x.r.Context().Err() != nil {
				return "client_gone"
			}
			return x.fail(status, "%s", msg)
		}
		resp, err := x.call(target, x.req.Route.Path(), x.req.Body)
		var ue *upstreamError
		if errors.As(err, &ue) {
			x.free(sid)
			if ue.resp != nil { // the request's fault: the same on any engine
				return x.passOn(ue)
			}
			tried = append(tried, target.id)
			if attempt == 0 && ue.retryable() && x.ctx.Err() == nil && len(x.others(es, tried)) > 0 {
				p.m.retries.Inc()
				p.log.Warn("proxy: engine failed before its first byte; retrying on the next-best engine", "request", x.id, "engine", target.id, "err", ue)
				continue
			}
			if ue.status != 0 {
				return x.fail(http.StatusBadGateway, "engine %d answered %d: %s", target.id, ue.status, ue.msg)
			}
			return x.fail(http.StatusBadGateway, "%v", ue)
		}
		// Given back once the answer is out: the handler's return ends
		// the client's response, which must not wait for prefixd.
		defer func() { go x.free(sid) }()
		return x.outcome(x.relay(resp, func() { x.prefillComplete(sid) }))
	}
}

// maxModelsNamed bounds the models an unknown model's error names.
const maxModelsNamed = 16

// unknownModel answers a request for a model no engine serves: a 404
// naming the models served, as vLLM answers a model it does not serve
// (NotFoundError, param "model"); a 503 before the fleet was first
// listed, when the proxy cannot know.
func (x *exchange) unknownModel() string {
	if !x.p.fleet.listed() {
		return x.fail(http.StatusServiceUnavailable, "the proxy has not listed the engines from prefixd yet; retry")
	}
	models := x.p.fleet.models()
	served := "none"
	if len(models) > 0 {
		served = strings.Join(models[:min(len(models), maxModelsNamed)], ", ")
		if len(models) > maxModelsNamed {
			served += fmt.Sprintf(" and %d more", len(models)-maxModelsNamed)
		}
	}
	return x.failParam(http.StatusNotFound, "model", fmt.Sprintf("The model `%s` does not exist: the engines serve %s (GET /v1/models)", clip.String(x.req.Model), served))
}

// others returns the engines of es not in tried.
func (x *exchange) others(es []engine, tried []uint64) []engine {
	return slices.DeleteFunc(slices.Clone(es), func(e engine) bool { return slices.Contains(tried, e.id) })
}

// chooseAggregated picks the engine of an attempt and books it (sid is
// the booking, "" for none); a status other than 0 is the error to
// answer.
func (x *exchange) chooseAggregated(es []engine, tokens []uint32, haveTokens bool, tried []uint64, attempt int) (e engine, sid string, status int, msg string) {
	p := x.p
	left := x.others(es, tried)
	if p.cfg.Policy == Random {
		if e, ok := p.fleet.random(left, p.rand, &p.randMu); ok {
			return e, "", 0, ""
		}
		return e, "", http.StatusServiceUnavailable, fmt.Sprintf("no engine serves model %s", x.req.Model)
	}
	if haveTokens {
		sid = x.id
		if attempt > 0 {
			sid = fmt.Sprintf("%s-%d", x.id, attempt)
		}
		sr := api.SelectRequest{Prompt: api.Prompt{TokenIDs: tokens}, ModelName: x.req.Model, RoutingGroup: p.cfg.RoutingGroup, SelectionID: sid,
			Wait: &api.Wait{TimeoutMS: p.cfg.QueueWait.Milliseconds(), Priority: x.priority}, SessionID: sessionOf(x.r.Header, x.req)}
		if len(tried) > 0 {
			for _, o := range left {
				sr.AllowedWorkerIDs = append(sr.AllowedWorkerIDs, o.id)
			}
		}
		sel, err := p.cfg.Prefixd.SelectAndReserve(x.ctx, sr)
		p.access.observe(err)
		if err == nil {
			p.m.open.Add(1)
			if sel.Endpoint != "" {
				return engine{id: sel.WorkerID, endpoint: sel.Endpoint}, sid, 0, ""
			}
			x.free(sid) // a worker without an engine endpoint: not schedulable
		}
		switch {
		case err == nil:
		case errors.Is(err, client.ErrOverloaded):
			if ce := (*client.Error)(nil); errors.As(err, &ce) {
				x.retryAfter = ce.RetryAfter
			}
			return e, "", http.StatusTooManyRequests, "every engine of model " + x.req.Model + " is busy: " + errMsg(err)
		case errors.Is(err, client.ErrNotFound):
			return e, "", http.StatusNotFound, errMsg(err)
		case errors.Is(err, client.ErrInvalid):
			return e, "", invalidStatus(err), "prefixd cannot route the request: " + errMsg(err)
		case x.ctx.Err() != nil:
			// The client left, or the request's deadline passed, while
			// prefixd held it in its queue: not prefixd's failure, and no
			// engine is to run it.
			return e, "", http.StatusGatewayTimeout, "the request's deadline passed while it waited for an engine"
		case errors.Is(err, client.ErrUnauthorized):
			// Logged once, when prefixd started refusing (access.set).
			p.m.fallbacks.WithLabelValues("unauthorized").Inc()
		default:
			p.m.fallbacks.WithLabelValues("prefixd_unavailable").Inc()
			if n, ok := p.noPrefixd.allow(time.Now()); ok {
				p.log.Warn("proxy: prefixd did not choose; routing by load", "request", x.id, "err", err, "suppressed", n)
			}
		}
	} else {
		p.m.fallbacks.WithLabelValues("no_tokens").Inc()
	}
	if e, ok := p.fleet.leastLoaded(left); ok {
		return e, "", 0, ""
	}
	return e, "", http.StatusServiceUnavailable, fmt.Sprintf("no engine serves model %s", x.req.Model)
}

// invalidStatus is the status of a request prefixd refused as invalid
// (client.ErrInvalid): its own, 400 or 413. The proxy checks what it
// sends, so this is a limit of prefixd's it does not know of.
func invalidStatus(err error) int {
	if ce := (*client.Error)(nil); errors.As(err, &ce) && ce.Status == http.StatusRequestEntityTooLarge {
		return ce.Status
	}
	return http.StatusBadRequest
}

func errMsg(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Msg != "" {
		return ce.Msg
	}
	return err.Error()
}

// prefillComplete reports a booking's first token, off the answer's path.
func (x *exchange) prefillComplete(sid string) {
	if sid == "" {
		return
	}
	go func() {
		ctx, cancel := x.background()
		defer cancel()
		if err := x.p.cfg.Prefixd.ReservationPrefillComplete(ctx, sid); err != nil && !errors.Is(err, client.ErrNotFound) {
			x.p.log.Warn("proxy: prefill complete not recorded", "request", x.id, "selection", sid, "err", err)
		}
	}()
}

// free gives a booking back.
func (x *exchange) free(sid string) {
	if sid == "" {
		return
	}
	ctx, cancel := x.background()
	defer cancel()
	err := x.p.cfg.Prefixd.FreeReservation(ctx, sid)
	x.p.m.open.Add(-1)
	if err != nil && !errors.Is(err, client.ErrNotFound) {
		x.p.log.Warn("proxy: reservation not freed (it expires with its TTL)", "request", x.id, "selection", sid, "err", err)
	}
}

// disaggregated runs the request as a plan: decode booked first (or
// prefill first as a fallback), prefill on the plan's prefill worker,
// its KV handed to the plan's decode worker, whose answer is the
// client's.
func (x *exchange) disaggregated() string {
	p := x.p
	decode := p.fleet.pick(x.req.Model, p.cfg.RoutingGroup, catalog.RoleDecode)
	prefill := p.fleet.pick(x.req.Model, p.cfg.PrefillRoutingGroup, catalog.RolePrefill)
	tokens, ok, tooLong := x.tokens(append(slices.Clone(decode), prefill...))
	if tooLong != nil {
		return x.fail(http.StatusRequestEntityTooLarge, "%v", tooLong)
	}
	if !ok {
		// No tokens, no plan: the whole request on the least-loaded decode
		// engine, which can prefill too.
		p.m.fallbacks.WithLabelValues("no_tokens").Inc()
		e, ok := p.fleet.leastLoaded(decode)
		if !ok {
			return x.fail(http.StatusServiceUnavailable, "no decode engine serves model %s", x.req.Model)
		}
		resp, err := x.call(e, x.req.Route.Path(), x.req.Body)
		if err != nil {
			return x.engineFailed(err, "")
		}
		return x.outcome(x.relay(resp, nil))
	}
	pr := api.PlanRequest{Prompt: api.Prompt{TokenIDs: tokens}, ID: x.id, ModelName: x.req.Model, RoutingGroup: p.cfg.RoutingGroup,
		PrefillRoutingGroup: p.cfg.PrefillRoutingGroup, Policy: p.cfg.PlanPolicy, PrefillFailure: p.cfg.PrefillFailure}
	order, reason := p.cfg.Order, ""
	pin, ok, err := pinnedPrefill(x.r.Header)
	if err != nil {
		return x.fail(http.StatusBadRequest, "%v", err)
	}
	switch {
	case ok:
		pr.PinnedPrefillWorker = &pin
		order, reason = coordinator.PrefillFirst, "pinned_prefill"
	case order != coordinator.DecodeFirst:
	case len(decode) == 0:
		// No schedulable decode engine now: prefill first, and book
		// decode after the handoff, when one may have come.
		order, reason = coordinator.PrefillFirst, "no_decode_host"
	case !slices.ContainsFunc(decode, func(e engine) bool { return e.indexed }):
		order, reason = coordinator.PrefillFirst, "decode_not_indexed"
	}
	plan, err := x.createPlan(pr, order)
	if err != nil && order == coordinator.DecodeFirst && noDecodeHost(err) {
		reason = "no_decode_host"
		x.logFallback(reason, err)
		plan, err = x.createPlan(pr, coordinator.PrefillFirst)
	} else if reason != "" {
		x.logFallback(reason, nil)
	}
	if err != nil {
		return x.planFailed(err)
	}
	p.m.open.Add(1)
	defer func() { go x.release() }() // after the answer is out, as free
	switch plan.State {
	case "Bypass":
		return x.runWhole(*plan.Decode, "bypass")
	}
	if plan.Prefill == nil {
		return x.fail(http.StatusBadGateway, "plan %s in state %s has no prefill booking", plan.ID, plan.State)
	}
	params, perr := x.runPrefill(*plan.Prefill)
	if perr != nil {
		failed, err := p.cfg.Prefixd.PlanPrefillFailed(x.ctx, x.id)
		x.observe(failed, err)
		if ue := (*upstreamError)(nil); errors.As(perr, &ue) && ue.resp != nil {
			// The request's fault (an invalid parameter): the decode
			// engine would refuse it too. The client gets the answer.
			p.log.Debug("proxy: prefill engine refused the request", "request", x.id, "engine", ue.engine, "status", ue.status)
			return x.passOn(ue)
		}
		if err == nil && failed.State == "BypassAfterPrefillFailure" && failed.Decode != nil {
			p.log.Warn("proxy: prefill failed; prefilling on the decode worker (bypass_on_decode)", "request", x.id, "plan_state", failed.State, "err", perr)
			return x.runWhole(*failed.Decode, "bypass_after_prefill_failure")
		}
		p.log.Warn("proxy: prefill failed; decode freed", "request", x.id, "plan_state", failed.State, "err", perr)
		return x.fail(http.StatusBadGateway, "prefill on engine %d failed (%v); the plan's decode booking was freed (prefill_failure free_decode)", plan.Prefill.WorkerID, perr)
	}
	done, err := p.cfg.Prefixd.PlanPrefillComplete(x.ctx, x.id)
	x.observe(done, err)
	if err != nil {
		return x.fail(http.StatusBadGateway, "plan %s: prefill complete: %s", x.id, errMsg(err))
	}
	dec := done.Decode
	if dec == nil { // prefill first, decode deferred to the hand-off
		booked, err := p.cfg.Prefixd.PlanDecode(x.ctx, x.id)
		x.observe(booked, err)
		if err != nil || booked.Decode == nil {
			return x.fail(http.StatusServiceUnavailable, "plan %s: no decode engine after prefill: %s", x.id, errMsg(err))
		}
		dec = booked.Decode
	}
	body, err := decodeBody(x.req, params)
	if err != nil {
		return x.fail(http.StatusInternalServerError, "decode body: %v", err)
	}
	resp, err := x.call(engine{id: dec.WorkerID, endpoint: dec.Endpoint}, x.req.Route.Path(), body)
	if err != nil {
		return x.engineFailed(err, "decode: ")
	}
	return x.outcome(x.relay(resp, nil))
}

// createPlan books the plan in order (prefill first defers decode).
func (x *exchange) createPlan(pr api.PlanRequest, order coordinator.Order) (api.PlanInfo, error) {
	pr.Order = order.String()
	pr.DeferDecode = order == coordinator.PrefillFirst
	plan, err := x.p.cfg.Prefixd.CreatePlan(x.ctx, pr)
	x.p.access.observe(err)
	x.observe(plan, err)
	return plan, err
}

// noDecodeHost: a decode-first plan failed at its decode preview or
// booking, nothing booked — no decode worker can take it now.
func noDecodeHost(err error) bool {
	var ce *client.Error
	if !errors.As(err, &ce) || (ce.Status != http.StatusServiceUnavailable && ce.Status != http.StatusTooManyRequests && ce.Status != http.StatusNotFound) {
		return false
	}
	if ce.Plan == nil {
		return true
	}
	return !slices.ContainsFunc(ce.Plan.Transitions, func(t api.PlanTransition) bool { return t.To == "DecodeCommitted" })
}

func (x *exchange) logFallback(reason string, err error) {
	x.p.m.fallbacks.WithLabelValues(reason).Inc()
	attrs := []any{"request", x.id, "reason", reason}
	if err != nil {
		attrs = append(attrs, "err", errMsg(err))
	}
	x.p.log.Info("proxy: plan falls back to prefill-first", attrs...)
}

// planFailed answers a plan that could not be booked.
func (x *exchange) planFailed(err error) string {
	switch {
	case errors.Is(err, client.ErrOverloaded):
		return x.fail(http.StatusTooManyRequests, "plan: %s", errMsg(err))
	case errors.Is(err, client.ErrNotFound):
		return x.fail(http.StatusNotFound, "plan: %s", errMsg(err))
	case errors.Is(err, client.ErrInvalid):
		return x.fail(invalidStatus(err), "prefixd cannot route the request: %s", errMsg(err))
	case errors.Is(err, client.ErrUnauthorized):
		return x.fail(http.StatusServiceUnavailable, "plan: prefixd refuses the proxy's token: give the proxy prefixd serve's --api-token")
	}
	return x.fail(http.StatusServiceUnavailable, "plan: %s", errMsg(err))
}

// observe logs and counts the transitions of plan not seen yet.
func (x *exchange) observe(plan api.PlanInfo, err error) {
	var ce *client.Error
	if err != nil {
		if !errors.As(err, &ce) || ce.Plan == nil {
			return
		}
		plan = *ce.Plan // a failed operation's plan: what it changed
	}
	if plan.ID == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.plan = plan
	if x.seen > len(plan.Transitions) {
		x.seen = 0
	}
	for _, t := range plan.Transitions[x.seen:] {
		x.p.m.transitions.WithLabelValues(t.From, t.To).Inc()
		x.p.log.Info("proxy: plan transition", "plan", plan.ID, "from", t.From, "to", t.To, "reason", t.Reason, "order", plan.Order)
	}
	x.seen = len(plan.Transitions)
}

// release gives the plan back at the end of the request.
func (x *exchange) release() {
	ctx, cancel := x.background()
	defer cancel()
	plan, err := x.p.cfg.Prefixd.ReleasePlan(ctx, x.id)
	x.p.m.open.Add(-1)
	switch {
	case err == nil:
		x.observe(plan, nil)
	case errors.Is(err, client.ErrNotFound): // already finished (compensated, expired)
	default:
		x.p.log.Warn("proxy: plan not released (it expires with its TTL)", "plan", x.id, "err", err)
	}
}

// runWhole sends the whole request to one booked engine (a bypass).
func (x *exchange) runWhole(b api.PlanBooking, why string) string {
	x.p.m.bypasses.WithLabelValues(why).Inc()
	resp, err := x.call(engine{id: b.WorkerID, endpoint: b.Endpoint}, x.req.Route.Path(), x.req.Body)
	if err != nil {
		return x.engineFailed(err, "")
	}
	// A decode booking tracks no prompt load (the coordinator's decode
	// override), so there is nothing to report at the first byte.
	return x.outcome(x.relay(resp, nil))
}

// maxPrefillAnswer bounds a prefill worker's answer.
const maxPrefillAnswer = 4 << 20

// runPrefill runs the prefill request on its worker and returns the
// kv_transfer_params of its answer.
func (x *exchange) runPrefill(b api.PlanBooking) (json.RawMessage, error) {
	body, err := prefillBody(x.req)
	if err != nil {
		return nil, err
	}
	resp, err := x.call(engine{id: b.WorkerID, endpoint: b.Endpoint}, x.req.Route.Path(), body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("engine %d: reading the prefill answer: %w", b.WorkerID, err)
	}
	if len(raw) > maxPrefillAnswer {
		return nil, fmt.Errorf("engine %d: prefill answer longer than %d bytes", b.WorkerID, maxPrefillAnswer)
	}
	return transferParams(raw)
}

// pinnedPrefill reads the X-Prefixd-Prefill-Worker header
// ("<worker_id>/<dp_rank>" or "<worker_id>").
func pinnedPrefill(h http.Header) (api.WorkerRef, bool, error) {
	v := h.Get("X-Prefixd-Prefill-Worker")
	if v == "" {
		return api.WorkerRef{}, false, nil
	}
	id, rank, hasRank := strings.Cut(v, "/")
	var ref api.WorkerRef
	var err error
	if ref.WorkerID, err = strconv.ParseUint(id, 10, 64); err == nil && hasRank {
		var r uint64
		r, err = strconv.ParseUint(rank, 10, 32)
		ref.DPRank = uint32(r)
	}
	if err != nil || ref.WorkerID == 0 {
		return api.WorkerRef{}, false, fmt.Errorf("X-Prefixd-Prefill-Worker: %q is not <worker_id>[/<dp_rank>]", clipBytes([]byte(v)))
	}
	return ref, true, nil
}
