package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// fakeSelector keeps reservations and plans in maps, enough to exercise
// the routes' status codes and their mapping of the coordinator's types.
type fakeSelector struct {
	mu      sync.Mutex
	res     map[string]bool
	plans   map[string]coordinator.Plan
	selErr  error
	lastSel coordinator.SelectRequest
	// SelectAndReserveWait's calls, last wait, and the error it returns.
	waits    int
	lastWait *coordinator.Wait
	waitErr  error
}

var _ Selector = (*fakeSelector)(nil)

func newFakeSelector() *fakeSelector {
	return &fakeSelector{res: map[string]bool{}, plans: map[string]coordinator.Plan{}}
}

func (f *fakeSelector) Select(r coordinator.SelectRequest) (coordinator.Choice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastSel = r
	if f.selErr != nil {
		return coordinator.Choice{}, f.selErr
	}
	return coordinator.Choice{Selection: coordinator.Selection{Rank: indexer.Rank{WorkerID: 7}, Endpoint: "http://w7", EffectivePrefillTokens: float64(len(r.Tokens))},
		BlockSize: 16}, nil
}

func (f *fakeSelector) SelectAndReserve(r coordinator.SelectRequest) (coordinator.Choice, error) {
	f.mu.Lock()
	dup := f.res[r.ID]
	f.mu.Unlock()
	if dup {
		return coordinator.Choice{}, fmt.Errorf("%w: selection_id: reservation %s already exists", ErrConflict, r.ID)
	}
	c, err := f.Select(r)
	if err == nil {
		f.mu.Lock()
		f.res[r.ID] = true
		f.mu.Unlock()
	}
	return c, err
}

func (f *fakeSelector) SelectAndReserveWait(_ context.Context, r coordinator.SelectRequest) (coordinator.Choice, error) {
	f.mu.Lock()
	f.lastWait, f.waits = r.Wait, f.waits+1
	err := f.waitErr
	f.mu.Unlock()
	if err != nil {
		return coordinator.Choice{}, err
	}
	return f.SelectAndReserve(r)
}

func (f *fakeSelector) Reserve(r coordinator.SelectRequest) (coordinator.Choice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.res[r.ID] {
		return coordinator.Choice{}, fmt.Errorf("%w: duplicate", ErrConflict)
	}
	if r.Pin.WorkerID != 7 {
		return coordinator.Choice{}, fmt.Errorf("%w: worker %d not in pool", ErrNotFound, r.Pin.WorkerID)
	}
	f.res[r.ID] = true
	return coordinator.Choice{Selection: coordinator.Selection{Rank: *r.Pin}}, nil
}

func (f *fakeSelector) ReservePrefillComplete(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.res[id] {
		return fmt.Errorf("%w: reservation %s not found", ErrNotFound, id)
	}
	return nil
}

func (f *fakeSelector) Free(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.res[id] {
		return fmt.Errorf("%w: reservation %s not found", ErrNotFound, id)
	}
	delete(f.res, id)
	return nil
}

func (f *fakeSelector) Plan(r coordinator.Request) (coordinator.Plan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.plans[r.ID]; ok {
		return coordinator.Plan{}, fmt.Errorf("%w: plan %s exists", ErrConflict, r.ID)
	}
	if r.Model == "overloaded" {
		return coordinator.Plan{ID: r.ID, State: coordinator.Idle}, fmt.Errorf("%w: all workers busy", ErrOverloaded)
	}
	p := coordinator.Plan{ID: r.ID, Order: coordinator.DecodeFirst, State: coordinator.Linked,
		Decode:      &coordinator.Booking{Rank: indexer.Rank{WorkerID: 1}},
		Prefill:     &coordinator.Booking{Rank: indexer.Rank{WorkerID: 3}},
		Decision:    &coordinator.Decision{},
		Signals:     &coordinator.DecodeSignals{PromptTokens: len(r.Tokens)},
		Transitions: []coordinator.Transition{{From: coordinator.Idle, To: coordinator.DecodePreviewed, Reason: "r"}}}
	f.plans[r.ID] = p
	return p, nil
}

func (f *fakeSelector) op(id string, state coordinator.State, del bool) (coordinator.Plan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.plans[id]
	if !ok {
		return coordinator.Plan{}, fmt.Errorf("%w: plan %s not found", ErrNotFound, id)
	}
	p.State = state
	f.plans[id] = p
	if del {
		delete(f.plans, id)
	}
	return p, nil
}

func (f *fakeSelector) PrefillComplete(id string) (coordinator.Plan, error) {
	return f.op(id, coordinator.PrefillReleased, false)
}
func (f *fakeSelector) PrefillFailed(id string) (coordinator.Plan, error) {
	return f.op(id, coordinator.Compensated, true)
}
func (f *fakeSelector) PlanDecode(id string) (coordinator.Plan, error) {
	return f.op(id, coordinator.Linked, false)
}
func (f *fakeSelector) Release(id string) (coordinator.Plan, error) {
	return f.op(id, coordinator.Released, true)
}
func (f *fakeSelector) Get(id string) (coordinator.Plan, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.plans[id]
	return p, ok
}

func newSelServer(t *testing.T, token string) (*server, *fakeSelector) {
	f := newFakeSelector()
	return newServer(t, Config{Index: indexer.New(indexer.Options{}), Selector: f, APIToken: token}), f
}

const auth = "Authorization: Bearer tok"

func TestSelectRoutes(t *testing.T) {
	s, f := newSelServer(t, "tok")
	// /select is a read: open without the token.
	s.post("/select", `{"model_name":"m","token_ids":[1,2,3]}`).expect(t, 200,
		`{"model_name":"m","routing_group":"default","worker_id":7,"dp_rank":0,"endpoint":"http://w7","block_size":16,"overlap":{"longest_matched":0,"gpu":0,"cpu":0,"disk":0},"effective_prefill_tokens":3,"potential_decode_blocks":0}`)
	if f.lastSel.Pool != (coordinator.PoolKey{Model: "m", Group: "default", Role: coordinator.RoleAggregated}) {
		t.Errorf("default pool %v", f.lastSel.Pool)
	}
	for _, c := range []struct{ body, want string }{
		{``, `{"error":"body: empty; expected a JSON object"}`},
		{`{"token_ids":[1]}`, `{"error":"model_name: required"}`},
		{`{"model_name":"m"}`, `{"error":"token_ids: required (a non-empty array of token ids, or block_hashes)"}`},
		{`{"model_name":"m","token_ids":[-1]}`, `{"error":"token_ids[0]: -1 is out of range [0, 4294967295]"}`},
		{`{"model_name":"m","token_ids":"x"}`, `{"error":"token_ids: must be an array of token ids, got a string"}`},
		{`{"model_name":7,"token_ids":[1]}`, `{"error":"model_name: must be a string, got a number"}`},
		{`{"model_name":"m","token_ids":[1],"role":"encoder"}`, `{"error":"role: \"encoder\" is not one of aggregated, prefill, decode"}`},
		{`{"model_name":"m","token_ids":[1],"pinned_worker":{"worker_id":"x"}}`, `{"error":"pinned_worker.worker_id: must be a non-negative integer, got a string"}`},
		{`{"model_name":"m","token_ids":[1]`, `{"error":"body: invalid JSON at offset 33: expected ',' or '}' after the value of \"token_ids\""}`},
		{`[1]`, `{"error":"body: must be an object, got an array"}`},
		{`{"model_name":"m","token_ids":[1]} {}`, `{"error":"body: invalid JSON at offset 35: data after the JSON object"}`},
	} {
		s.post("/select", c.body).expect(t, 400, c.want)
	}
	r := s.get("/select")
	r.expect(t, 405, `{"error":"method: GET not allowed on /select (allowed: POST)"}`)
	if r.header.Get("Allow") != "POST" {
		t.Errorf("Allow %q", r.header.Get("Allow"))
	}
	f.selErr = fmt.Errorf("%w: all eligible workers overloaded", ErrOverloaded)
	s.post("/select", `{"model_name":"m","token_ids":[1]}`).expect(t, 429, `{"error":"overloaded: all eligible workers overloaded"}`)
	f.selErr = fmt.Errorf("%w: pool m/default/aggregated has no workers", ErrUnavailable)
	s.post("/select", `{"model_name":"m","token_ids":[1]}`).expect(t, 503, `{"error":"temporarily unavailable: pool m/default/aggregated has no workers"}`)
	f.selErr = nil

	// /select_and_reserve is a write.
	body := `{"model_name":"m","token_ids":[1,2],"selection_id":"r1"}`
	s.post("/select_and_reserve", body).expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1,2]}`, auth).expect(t, 400, `{"error":"selection_id: required"}`)
	s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1,2],"selection_id":"a/b"}`, auth).expect(t, 400, `{"error":"selection_id: \"a/b\" must not contain '/'"}`)
	if r := s.post("/select_and_reserve", body, auth); r.status != 200 || !strings.Contains(r.body, `"selection_id":"r1"`) {
		t.Fatalf("select_and_reserve: %d %s", r.status, r.body)
	}
	s.post("/select_and_reserve", body, auth).expect(t, 409, `{"error":"conflict: selection_id: reservation r1 already exists"}`)
}

// TestSelectAndReserveWait: a /select_and_reserve with wait goes to
// SelectAndReserveWait with its priority (the body's, else the header's)
// and deadline; a shed is a 429 with Retry-After in whole seconds; a bad
// wait is a 400 naming the field; without wait, and on /select, nothing
// waits.
func TestSelectAndReserveWait(t *testing.T) {
	s, f := newSelServer(t, "")
	before := time.Now()
	ok := func(r response) {
		t.Helper()
		if r.status != 200 || !strings.Contains(r.body, `"worker_id":7`) {
			t.Fatalf("got %d %s, want the selection", r.status, r.body)
		}
	}
	ok(s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"w1","wait":{"timeout_ms":5000}}`, api.PriorityHeader+": -7"))
	if w := f.lastWait; f.waits != 1 || w == nil || w.Priority != -7 || w.Deadline.Before(before.Add(5*time.Second)) || w.Deadline.After(time.Now().Add(5*time.Second)) {
		t.Fatalf("wait %+v after %d calls, want priority -7 (the header) and a deadline 5 s on", w, f.waits)
	}
	ok(s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"w2","wait":{"priority":3}}`, api.PriorityHeader+": 9"))
	if w := f.lastWait; w == nil || w.Priority != 3 || !w.Deadline.IsZero() {
		t.Fatalf("wait %+v, want the body's priority 3 and no deadline of its own", w)
	}
	// Without wait, and on /select, the header is not read and nothing waits.
	ok(s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"w3"}`, api.PriorityHeader+": x"))
	ok(s.post("/select", `{"model_name":"m","token_ids":[1],"wait":{"timeout_ms":1}}`, api.PriorityHeader+": x"))
	if f.waits != 2 {
		t.Fatalf("%d waits, want 2", f.waits)
	}
	for _, c := range []struct{ body, header, want string }{
		{`{"timeout_ms":-1}`, "", `{"error":"wait.timeout_ms: -1 is out of range [0, 3600000]"}`},
		{`{"timeout_ms":3600001}`, "", `{"error":"wait.timeout_ms: 3600001 is out of range [0, 3600000]"}`},
		{`{"priority":1001}`, "", `{"error":"wait.priority: 1001 is out of range [-1000, 1000] (from the body, or the x-prefixd-priority header)"}`},
		{`{}`, "-1001", `{"error":"wait.priority: -1001 is out of range [-1000, 1000] (from the body, or the x-prefixd-priority header)"}`},
		{`{}`, "1.5", `{"error":"x-prefixd-priority: \"1.5\" is not an integer"}`},
		{`{"timeout_ms":"soon"}`, "", `{"error":"wait.timeout_ms: must be an integer, got a string"}`},
	} {
		var h []string
		if c.header != "" {
			h = append(h, api.PriorityHeader+": "+c.header)
		}
		s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"bad","wait":`+c.body+`}`, h...).expect(t, 400, c.want)
	}
	for _, c := range []struct {
		err        error
		retryAfter string
		want       string
	}{
		{&coordinator.ShedError{Pool: coordinator.PoolKey{Model: "m", Group: "default"}, Priority: -2, RetryAfter: 1500 * time.Millisecond, Err: coordinator.ErrQueueFull}, "2",
			`{"error":"overloaded: router queue of pool m/default/aggregated: priority -2 turned away: the queue is full and this request has the lowest priority; retry after 2s","reason":"queue_full"}`},
		{&coordinator.ShedError{Pool: coordinator.PoolKey{Model: "m", Group: "default"}, Priority: 4, Err: fmt.Errorf("queue push: %w", coordinator.ErrWaitExpired)}, "1",
			`{"error":"overloaded: router queue of pool m/default/aggregated: priority 4 turned away: its wait ran out (wait.timeout_ms or --queue-max-wait) before a worker freed; retry after 1s","reason":"wait_expired"}`},
	} {
		f.waitErr = c.err
		r := s.post("/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"shed","wait":{}}`)
		r.expect(t, 429, c.want)
		if got := r.header.Get("Retry-After"); got != c.retryAfter {
			t.Errorf("Retry-After %q, want %q", got, c.retryAfter)
		}
	}
}

func TestReservationRoutes(t *testing.T) {
	s, _ := newSelServer(t, "tok")
	body := `{"selection_id":"r1","model_name":"m","worker_id":7,"dp_rank":1,"token_ids":[1,2,3]}`
	s.post("/reservations", body).expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	s.post("/reservations", `{"selection_id":"r1","model_name":"m","token_ids":[1]}`, auth).expect(t, 400,
		`{"error":"worker_id: required (only the explicit form of /reservations is supported)"}`)
	s.post("/reservations", `{"model_name":"m","worker_id":7,"token_ids":[1]}`, auth).expect(t, 400, `{"error":"selection_id: required"}`)
	s.post("/reservations", `{"selection_id":"r1","model_name":"m","worker_id":8,"token_ids":[1]}`, auth).expect(t, 404, `{"error":"not found: worker 8 not in pool"}`)
	s.post("/reservations", body, auth).expect(t, 201, `{"selection_id":"r1","model_name":"m","routing_group":"default","worker_id":7,"dp_rank":1,"endpoint":""}`)
	s.post("/reservations", body, auth).expect(t, 409, `{"error":"conflict: duplicate"}`)

	s.post("/reservations/r1/prefill_complete", "").expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	s.post("/reservations/r1/prefill_complete", "", auth).expect(t, 200, `{"status":"ok"}`)
	s.post("/reservations/nope/prefill_complete", "", auth).expect(t, 404, `{"error":"not found: reservation nope not found"}`)
	s.do("GET", "/reservations/r1/prefill_complete", "").expect(t, 405, `{"error":"method: GET not allowed on /reservations/r1/prefill_complete (allowed: POST)"}`)
	s.do("DELETE", "/reservations/r1", "").expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	s.do("DELETE", "/reservations/r1", "", auth).expect(t, 200, `{"status":"ok"}`)
	s.do("DELETE", "/reservations/r1", "", auth).expect(t, 404, `{"error":"not found: reservation r1 not found"}`)
	s.do("POST", "/reservations/r1", "", auth).expect(t, 405, `{"error":"method: POST not allowed on /reservations/r1 (allowed: DELETE)"}`)
	s.get("/reservations/r1/x/y").expect(t, 404, `{"error":"path: no endpoint /reservations/r1/x/y"}`)
}

func TestPlanRoutes(t *testing.T) {
	s, _ := newSelServer(t, "tok")
	body := `{"request_id":"p1","model_name":"m","token_ids":[1,2,3,4]}`
	s.post("/disagg/plans", body).expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	for _, c := range []struct{ body, want string }{
		{`{"model_name":"m","token_ids":[1]}`, `{"error":"request_id: required"}`},
		{`{"request_id":"p","token_ids":[1]}`, `{"error":"model_name: required"}`},
		{`{"request_id":"p","model_name":"m"}`, `{"error":"token_ids: required (a non-empty array of token ids, or block_hashes)"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"allowed_worker_ids":[-3]}`, `{"error":"allowed_worker_ids[0]: -3 is out of range [0, 18446744073709551615]"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"routing_constraints":{"required_taints":"x"}}`, `{"error":"routing_constraints.required_taints: must be an array, got a string"}`},
		{`{"request_id":1}`, `{"error":"request_id: must be a string, got a number"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"block_hashes":[1]}`, `{"error":"block_hashes: give token_ids or block_hashes, not both"}`},
		{`{"request_id":"p","model_name":"m","block_hashes":[1],"lora_name":"x"}`, `{"error":"block_hashes: hashes are already salted: omit lora_name and cache_salt"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"isl_tokens":5}`, `{"error":"isl_tokens: only with block_hashes"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"prefill_failure":"retry"}`, `{"error":"prefill_failure: \"retry\": want free_decode or bypass_on_decode"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"policy":{"kind":"always"}}`, `{"error":"policy.kind: \"always\": want off, isl_bounding, prefill_load or isl_or_load"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"policy":{"kind":"isl_bounding","eff_isl_ratio_threshold":1.5}}`, `{"error":"policy.eff_isl_ratio_threshold: 1.5 must be at most 1"}`},
		{`{"request_id":"p","model_name":"m","token_ids":[1],"policy":{"kind":"isl_bounding","decode_busy_threshold":-1}}`, `{"error":"policy.decode_busy_threshold: -1 must not be negative"}`},
	} {
		s.post("/disagg/plans", c.body, auth).expect(t, 400, c.want)
	}
	want := `{"request_id":"p1","order":"decode-first","state":"Linked","decode":{"worker_id":1,"dp_rank":0,"tokens":4},"prefill":{"worker_id":3,"dp_rank":0,"tokens":4},"decision":{"kind":"remote_prefill","policy_says_bypass":false,"prefill_busy":"unknown","decode_busy":"unknown"},"transitions":[{"from":"Idle","to":"DecodePreviewed","reason":"r"}]}`
	s.post("/disagg/plans", body, auth).expect(t, 201, want)
	s.post("/disagg/plans", body, auth).expect(t, 409, `{"error":"conflict: plan p1 exists"}`)
	s.post("/disagg/plans", `{"request_id":"p2","model_name":"overloaded","token_ids":[1]}`, auth).expect(t, 429,
		`{"error":"overloaded: all workers busy","plan":{"request_id":"p2","order":"decode-first","state":"Idle","decode":null,"prefill":null,"decision":null,"transitions":[]}}`)
	s.get("/disagg/plans/p1").expect(t, 200, want)
	s.post("/disagg/plans/p1/prefill_complete", "").expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	if r := s.post("/disagg/plans/p1/prefill_complete", "", auth); r.status != 200 || !strings.Contains(r.body, `"state":"PrefillReleased"`) {
		t.Fatalf("prefill_complete: %d %s", r.status, r.body)
	}
	s.do("GET", "/disagg/plans/p1/prefill_failed", "").expect(t, 405, `{"error":"method: GET not allowed on /disagg/plans/p1/prefill_failed (allowed: POST)"}`)
	s.do("PUT", "/disagg/plans/p1", "").expect(t, 405, `{"error":"method: PUT not allowed on /disagg/plans/p1 (allowed: DELETE, GET, HEAD)"}`)
	s.do("DELETE", "/disagg/plans/p1", "").expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	if r := s.do("DELETE", "/disagg/plans/p1", "", auth); r.status != 200 || !strings.Contains(r.body, `"state":"Released"`) {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	s.do("DELETE", "/disagg/plans/p1", "", auth).expect(t, 404, `{"error":"not found: plan p1 not found"}`)
	s.get("/disagg/plans/p1").expect(t, 404, `{"error":"not found: plan p1 not found"}`)
	s.post("/disagg/plans/p1/prefill_failed", "", auth).expect(t, 404, `{"error":"not found: plan p1 not found"}`)
	s.post("/disagg/plans", `{"request_id":"p3","model_name":"m","token_ids":[1]}`, auth).expect(t, 201,
		strings.NewReplacer(`"p1"`, `"p3"`, `"tokens":4`, `"tokens":1`).Replace(want))
	if r := s.post("/disagg/plans/p3/prefill_failed", "", auth); r.status != 200 || !strings.Contains(r.body, `"state":"Compensated"`) {
		t.Fatalf("prefill_failed: %d %s", r.status, r.body)
	}
}

func TestSelectionWithoutSelector(t *testing.T) {
	s := newServer(t, Config{Index: indexer.New(indexer.Options{})})
	s.post("/select", `{"model_name":"m","token_ids":[1]}`).expect(t, 503, `{"error":"selection: no selector in this process"}`)
	s.do(http.MethodDelete, "/disagg/plans/x", "").expect(t, 503, `{"error":"selection: no selector in this process"}`)
	// The existing routes keep their 405s.
	s.get("/register").expect(t, 405, `{"error":"method: GET not allowed on /register (allowed: POST)"}`)
}
