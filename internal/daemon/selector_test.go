package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/api"
)

// selectorAPI is a selector behind the real HTTP API on a loopback server;
// logs collects what the API logs.
type selectorAPI struct {
	t    *testing.T
	sel  *selector
	url  string
	logs *bytes.Buffer
}

func newSelectorAPI(t *testing.T, workers ...catalog.Worker) *selectorAPI {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	s := newSelector(ix, coordinator.DefaultPoolConfig(), coordinator.CoordinatorConfig{}, slog.New(slog.DiscardHandler), nil)
	for _, w := range workers {
		s.setWorker(w)
	}
	var logs bytes.Buffer
	srv := httptest.NewServer(api.NewHandler(api.Config{Index: ix, Selector: s, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	t.Cleanup(srv.Close)
	return &selectorAPI{t: t, sel: s, url: srv.URL, logs: &logs}
}

// do sends a JSON request (body may be a string or a value to marshal).
func (a *selectorAPI) do(method, path string, body any) (int, string) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.url+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// worker is a catalog record of model m; endpoint "" registers it
// without an engine endpoint.
func worker(id uint64, group string, role catalog.Role, endpoint string) catalog.Worker {
	return catalog.Worker{WorkerID: id, ModelName: "m", RoutingGroup: group, Role: role, BlockSize: 16, DataParallelSize: 1, Endpoint: endpoint}.WithDefaults()
}

func engine(id uint64) string { return fmt.Sprintf("http://w%d:8000", id) }

// TestSelectorUnknownPartition: a model or routing group no worker ever
// served is a 404 on every selection route, naming the partition and what
// is known, and it is not logged (it was a 503 logged at ERROR). A
// multi-megabyte model name is not echoed.
func TestSelectorUnknownPartition(t *testing.T) {
	a := newSelectorAPI(t, worker(1, "default", catalog.RoleAggregated, engine(1)), worker(2, "default", catalog.RoleDecode, engine(2)),
		worker(3, "default", catalog.RolePrefill, engine(3)), worker(4, "g2", catalog.RoleAggregated, engine(4)))
	huge := strings.Repeat("x", 3<<20)
	for _, c := range []struct {
		method, path, body, want string
	}{
		{"POST", "/select", `{"model_name":"nope","token_ids":[1,2]}`,
			`{"error":"not found: model_name=nope routing_group=default: no such model (known models: m)"}`},
		{"POST", "/select", `{"model_name":"m","routing_group":"g3","token_ids":[1,2]}`,
			`{"error":"not found: model_name=m routing_group=g3: no such routing group (routing groups of the model: default, g2)"}`},
		{"POST", "/select_and_reserve", `{"model_name":"nope","selection_id":"s","token_ids":[1,2]}`,
			`{"error":"not found: model_name=nope routing_group=default: no such model (known models: m)"}`},
		{"POST", "/reservations", `{"model_name":"nope","selection_id":"s","worker_id":1,"token_ids":[1,2]}`,
			`{"error":"not found: model_name=nope routing_group=default: no such model (known models: m)"}`},
		{"POST", "/disagg/plans", `{"model_name":"nope","request_id":"r","token_ids":[1,2]}`,
			`{"error":"not found: model_name=nope routing_group=default: no such model (known models: m)"}`},
		{"POST", "/disagg/plans", `{"model_name":"m","request_id":"r","prefill_routing_group":"g9","token_ids":[1,2]}`,
			`{"error":"not found: model_name=m routing_group=g9: no such routing group (routing groups of the model: default, g2)"}`},
		{"POST", "/select", `{"model_name":"` + huge + `","token_ids":[1,2]}`,
			`{"error":"not found: model_name=` + huge[:64] + `… (3145728 bytes) routing_group=default: no such model (known models: m)"}`},
		{"POST", "/disagg/plans", `{"model_name":"` + huge + `","request_id":"r","token_ids":[1,2]}`,
			`{"error":"not found: model_name=` + huge[:64] + `… (3145728 bytes) routing_group=default: no such model (known models: m)"}`},
		{"POST", "/reservations", `{"model_name":"m","routing_group":"` + huge + `","selection_id":"s","worker_id":1,"token_ids":[1,2]}`,
			`{"error":"not found: model_name=m routing_group=` + huge[:64] + `… (3145728 bytes): no such routing group (routing groups of the model: default, g2)"}`},
	} {
		if code, body := a.do(c.method, c.path, c.body); code != http.StatusNotFound || strings.TrimSpace(body) != c.want {
			t.Errorf("%s %s %.80s: %d %.300s\nwant 404 %.300s", c.method, c.path, c.body, code, body, c.want)
		}
	}
	if a.logs.Len() > 0 {
		t.Errorf("unknown partitions were logged:\n%s", a.logs)
	}
	// The known list is bounded.
	many := []catalog.Worker{}
	for i := range 20 {
		w := worker(uint64(100+i), "default", catalog.RoleAggregated, engine(uint64(100+i)))
		w.ModelName = fmt.Sprintf("model-%02d", i)
		many = append(many, w)
	}
	b := newSelectorAPI(t, many...)
	if code, body := b.do("POST", "/select", `{"model_name":"nope","token_ids":[1]}`); code != 404 ||
		!strings.Contains(body, `(known models: model-00, model-01, model-02, model-03, model-04, model-05, model-06, model-07, … 12 more)`) {
		t.Errorf("many models: %d %s", code, body)
	}
	// Without any worker.
	if code, body := newSelectorAPI(t).do("POST", "/select", `{"model_name":"nope","token_ids":[1]}`); code != 404 ||
		!strings.Contains(body, `no such model (no model has workers)`) {
		t.Errorf("no workers at all: %d %s", code, body)
	}
}

// TestSelectorNoEngineEndpoint: a worker registered without an engine
// endpoint is indexed but never selected, reserved or planned (its
// selection would carry no endpoint); when no worker of a pool remains,
// the answer says why; once it registers an endpoint it is selectable,
// and it leaves the pool again if the endpoint goes.
func TestSelectorNoEngineEndpoint(t *testing.T) {
	a := newSelectorAPI(t, worker(1, "default", catalog.RoleAggregated, engine(1)), worker(2, "default", catalog.RoleAggregated, ""))
	for i := range 50 {
		code, body := a.do("POST", "/select", fmt.Sprintf(`{"model_name":"m","token_ids":[%d]}`, i))
		var sel api.Selection
		if code != 200 || json.Unmarshal([]byte(body), &sel) != nil || sel.WorkerID != 1 || sel.Endpoint != engine(1) {
			t.Fatalf("select %d: %d %s", i, code, body)
		}
		code, body = a.do("POST", "/select_and_reserve", fmt.Sprintf(`{"model_name":"m","selection_id":"s%d","token_ids":[%d]}`, i, i))
		if code != 200 || json.Unmarshal([]byte(body), &sel) != nil || sel.WorkerID != 1 || sel.Endpoint != engine(1) {
			t.Fatalf("select_and_reserve %d: %d %s", i, code, body)
		}
	}
	want := `{"error":"not found: worker 2 of pool m/default/aggregated is registered without an engine_endpoint: indexed, but not schedulable"}`
	if code, body := a.do("POST", "/reservations", `{"model_name":"m","selection_id":"r","worker_id":2,"token_ids":[1]}`); code != 404 || strings.TrimSpace(body) != want {
		t.Errorf("reserve on worker 2: %d %s", code, body)
	}
	if code, body := a.do("POST", "/select", `{"model_name":"m","token_ids":[1],"pinned_worker":{"worker_id":2}}`); code != 404 || strings.TrimSpace(body) != want {
		t.Errorf("select pinned to worker 2: %d %s", code, body)
	}

	// Only endpoint-less workers left.
	a.sel.removeWorker(catalog.Key{Model: "m", Group: "default", WorkerID: 1})
	if code, body := a.do("POST", "/select", `{"model_name":"m","token_ids":[1]}`); code != 503 || strings.TrimSpace(body) !=
		`{"error":"temporarily unavailable: pool m/default/aggregated has no schedulable workers: 1 worker registered without an engine_endpoint (indexed, but requests cannot be sent to them)"}` {
		t.Errorf("select with no schedulable worker: %d %s", code, body)
	}
	// Worker 2 gains an endpoint, then loses it.
	a.sel.setWorker(worker(2, "default", catalog.RoleAggregated, engine(2)))
	if code, body := a.do("POST", "/select", `{"model_name":"m","token_ids":[1]}`); code != 200 || !strings.Contains(body, `"endpoint":"`+engine(2)+`"`) {
		t.Errorf("select after worker 2 registered its endpoint: %d %s", code, body)
	}
	a.sel.setWorker(worker(2, "default", catalog.RoleAggregated, ""))
	if code, body := a.do("POST", "/select", `{"model_name":"m","token_ids":[1]}`); code != 503 || !strings.Contains(body, "no schedulable workers: 1 worker registered without an engine_endpoint") {
		t.Errorf("select after worker 2 lost its endpoint: %d %s", code, body)
	}

	// Plans: decode workers without endpoints.
	p := newSelectorAPI(t, worker(11, "default", catalog.RoleDecode, ""), worker(12, "default", catalog.RoleDecode, ""), worker(21, "default", catalog.RolePrefill, engine(21)))
	if code, body := p.do("POST", "/disagg/plans", `{"model_name":"m","request_id":"r","token_ids":[1,2,3]}`); code != 503 ||
		!strings.Contains(body, `no workers (pool m/default/decode: 2 workers registered without an engine_endpoint, not schedulable)`) {
		t.Errorf("plan without schedulable decode workers: %d %s", code, body)
	}
	p.sel.setWorker(worker(12, "default", catalog.RoleDecode, engine(12)))
	code, body := p.do("POST", "/disagg/plans", `{"model_name":"m","request_id":"r","token_ids":[1,2,3]}`)
	var plan api.PlanInfo
	if code != 201 || json.Unmarshal([]byte(body), &plan) != nil || plan.Decode == nil || plan.Decode.WorkerID != 12 || plan.Decode.Endpoint != engine(12) ||
		plan.Prefill == nil || plan.Prefill.Endpoint != engine(21) {
		t.Errorf("plan: %d %s", code, body)
	}
}

// TestFinishedPlansReusedID: a plan id that finishes, is reused and
// finishes again is remembered once, as the newest: the history evicts its
// oldest entry, never the reused id's new one (the old FIFO kept the stale
// position and dropped the new entry 4,095 plans later).
func TestFinishedPlansReusedID(t *testing.T) {
	s := newSelector(indexer.New(indexer.Options{}), coordinator.DefaultPoolConfig(), coordinator.CoordinatorConfig{}, slog.New(slog.DiscardHandler), nil)
	s.setWorker(worker(1, "default", catalog.RoleDecode, engine(1)))
	s.setWorker(worker(2, "default", catalog.RolePrefill, engine(2)))
	ctx := context.Background()
	// Past every plan's TTL, read at each call: under load creating 4,096
	// plans takes longer than a second, and a fixed time would not
	// expire the last ones (the test failed that way).
	later := func() time.Time { return time.Now().Add(coordinator.DefaultPlanTTL + time.Second) }
	plan := func(id string) {
		t.Helper()
		if p, err := s.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: []uint32{1, 2, 3}}, ID: id, ModelName: "m", RoutingGroup: "default"}); err != nil {
			t.Fatalf("plan %s: %+v %v", id, p, err)
		}
	}
	get := func(id string) bool {
		_, err := s.GetPlan(ctx, id)
		return err == nil
	}
	plan("x")
	s.expire(later())
	plan("x") // reused
	s.expire(later())
	if !get("x") {
		t.Fatal("the reused plan is not remembered")
	}
	for i := range maxFinished - 1 {
		plan(fmt.Sprint("p", i))
	}
	s.expire(later())
	if n := s.finished.len(); n != maxFinished {
		t.Fatalf("%d finished plans remembered, want %d", n, maxFinished)
	}
	if !get("x") || !get("p0") || !get(fmt.Sprint("p", maxFinished-2)) {
		t.Fatalf("with exactly %d finished plans, one was dropped: x %v, p0 %v", maxFinished, get("x"), get("p0"))
	}
	// One more: x, now the oldest, goes, and only x.
	plan("last")
	s.expire(later())
	if get("x") || !get("p0") || !get("last") || s.finished.len() != maxFinished {
		t.Fatalf("after one more: x %v (want false), p0 %v, last %v, %d remembered", get("x"), get("p0"), get("last"), s.finished.len())
	}
}

// TestExpiredPlanSaysExpired: a plan the daemon expired is answered by
// GET /disagg/plans/{id} as Expired, with the expiry as its last
// transition (it said Released, as if the client had released it), and
// counted in prefixd_plan_transitions_total{state="Expired"}.
func TestExpiredPlanSaysExpired(t *testing.T) {
	a := newSelectorAPI(t, worker(1, "default", catalog.RoleDecode, engine(1)), worker(2, "default", catalog.RolePrefill, engine(2)))
	if code, body := a.do("POST", "/disagg/plans", `{"model_name":"m","request_id":"r","token_ids":[1,2,3]}`); code != 201 {
		t.Fatalf("plan: %d %s", code, body)
	}
	a.sel.expire(time.Now().Add(coordinator.DefaultPlanTTL + time.Second))
	code, body := a.do("GET", "/disagg/plans/r", nil)
	var p api.PlanInfo
	if code != 200 || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("get: %d %s", code, body)
	}
	last := p.Transitions[len(p.Transitions)-1]
	if p.State != "Expired" || p.Decode != nil || p.Prefill != nil || last != (api.PlanTransition{From: "Linked", To: "Expired", Reason: "expired after 5m0s"}) {
		t.Errorf("expired plan: %s", body)
	}
	if code, body := a.do("DELETE", "/disagg/plans/r", nil); code != 404 {
		t.Errorf("release of an expired plan: %d %s", code, body)
	}
	if got := testutil.ToFloat64(a.sel.metrics.transitions.WithLabelValues("Expired")); got != 1 {
		t.Errorf("transitions{state=Expired} = %v", got)
	}
}
