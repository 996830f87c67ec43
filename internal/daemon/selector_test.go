package daemon

import (
	"bytes"
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

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
)

// testSelector is the coordinator service as the daemon wires it: over
// the index, with its metrics, fed worker records as the catalog view
// feeds them.
type testSelector struct {
	svc     *coordinator.Service
	metrics *planMetrics
}

func newTestSelector(ix *indexer.Index) *testSelector {
	m := newPlanMetrics(nil)
	return &testSelector{svc: coordinator.NewService(coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Source: coordinator.IndexOverlaps{Index: ix}, Observer: m}), metrics: m}
}

func (s *testSelector) setWorker(w catalog.Worker) { s.svc.SetRecord(w) }
func (s *testSelector) removeWorker(k catalog.Key) { s.svc.RemoveRecord(k) }
func (s *testSelector) expire(now time.Time)       { s.svc.Expire(now) }

// selectorAPI is the service behind the real HTTP API on a loopback
// server; logs collects what the API logs.
type selectorAPI struct {
	t    *testing.T
	sel  *testSelector
	url  string
	logs *bytes.Buffer
}

func newSelectorAPI(t *testing.T, workers ...catalog.Worker) *selectorAPI {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	s := newTestSelector(ix)
	for _, w := range workers {
		s.setWorker(w)
	}
	var logs bytes.Buffer
	srv := httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: ix, Selector: s.svc, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
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
	return catalog.Worker{WorkerID: id, ModelName: "m", RoutingGroup: group, BlockSize: 16, DataParallelSize: 1, Endpoint: endpoint, Attributes: catalog.Attributes{Role: role}}.WithDefaults()
}

func engine(id uint64) string { return fmt.Sprintf("http://w%d:8000", id) }

// TestSelectorUnknownPartition: a model or routing group no worker ever
// served is a 404 on every selection route, naming the partition and what
// is known, and it is not logged (it was a 503 logged at ERROR). A
// multi-megabyte model name is not echoed.
func TestSelectorUnknownPartition(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestExpiredPlanSaysExpired: a plan the daemon expired is answered by
// GET /disagg/plans/{id} as Expired, with the expiry as its last
// transition (it said Released, as if the client had released it), and
// counted in prefixd_plan_transitions_total{state="Expired"}.
func TestExpiredPlanSaysExpired(t *testing.T) {
	t.Parallel()
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
