package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
)

// records is an apiserver.Workers keeping registrations in memory.
type records struct {
	mu  sync.Mutex
	reg []catalog.Registration
}

func (r *records) Register(_ context.Context, reg catalog.Registration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reg = append(r.reg, reg)
	return nil
}

func (r *records) Unregister(_ context.Context, model, group string, id uint64, _ *uint32) error {
	return &catalog.NotRegisteredError{Msg: "instance_id: 9 is not registered for model " + model}
}

func (r *records) List(string, string) []apiserver.WorkerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []apiserver.WorkerState
	for _, reg := range r.reg {
		out = append(out, apiserver.WorkerState{Record: catalog.Worker{WorkerID: reg.WorkerID, ModelName: reg.Model, RoutingGroup: reg.Group,
			BlockSize: reg.BlockSize, EventsEndpoint: reg.EventsEndpoint, DataParallelSize: 1}})
	}
	return out
}

// prompt is the 64-token prompt worker 1 holds in fixture's index.
var prompt = func() []uint32 {
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	return tokens
}()

// fixture serves the real API handler with engines 1 (aggregated, holding
// prompt), 2 (prefill) and 3 (decode) of model "m" (max_num_batched_tokens
// 64, the router queue on at threshold 0.5), an in-memory worker
// list, the API token "w" and readToken, and a /metrics page "up 1".
func fixture(t *testing.T, readToken string) *httptest.Server {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	key := indexer.PartitionKey{Model: "m", Group: "default"}
	if err := ix.AddPartition(key, 16); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.Apply(key, indexer.Rank{WorkerID: 1}, 1, []indexer.Op{{Kind: indexer.OpStore,
		Store: indexer.Stored{Hashes: []uint64{11, 12, 13, 14}, Tokens: prompt, BlockSize: 16, Seed: indexer.BaseSeed}}}); err != nil {
		t.Fatal(err)
	}
	// The router queue is on: engine 1 is busy past 32 booked prefill
	// tokens, and a request with a wait then waits.
	queue := coordinator.DefaultQueueConfig()
	svc := coordinator.NewService(coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Source: coordinator.IndexOverlaps{Index: ix},
		Queue: &queue, QueueBusy: coordinator.Thresholds{PrefillTokensFrac: 0.5}})
	for id, role := range map[uint64]catalog.Role{1: catalog.RoleAggregated, 2: catalog.RolePrefill, 3: catalog.RoleDecode} {
		if err := svc.SetRecord(catalog.Worker{WorkerID: id, ModelName: "m", BlockSize: 16, Endpoint: "http://e",
			EventsEndpoint: "tcp://e:1", Attributes: catalog.Attributes{Role: role, MaxNumBatchedTokens: 64}}.WithDefaults()); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: ix, Selector: svc, Workers: &records{}, APIToken: "w", ReadToken: readToken,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("up 1\n")) })}))
	t.Cleanup(srv.Close)
	return srv
}

// TestRoutes calls every route through the client against the real API
// handler, with tokens.
func TestRoutes(t *testing.T) {
	srv := fixture(t, "r")
	tokens := prompt
	var hashes []int64 // /query_by_hash takes Dynamo's signed form
	for _, h := range indexer.HashBlocks(nil, tokens, 16, indexer.BaseSeed) {
		hashes = append(hashes, int64(h))
	}
	ctx := context.Background()
	c, reader := client.New(srv.URL+"/", "w"), client.New(srv.URL, "r")

	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(ctx, api.RegisterRequest{InstanceID: 9, Endpoint: "tcp://h:5557", ModelName: "m", BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	if err := reader.Register(ctx, api.RegisterRequest{InstanceID: 9, Endpoint: "tcp://h:5557", ModelName: "m", BlockSize: 16}); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("register with the read token: %v", err)
	}
	if err := c.Unregister(ctx, api.UnregisterRequest{InstanceID: 9, ModelName: "m"}); !errors.Is(err, client.ErrNotFound) ||
		!strings.Contains(err.Error(), "instance_id: 9 is not registered for model m") {
		t.Fatalf("unregister: %v", err)
	}
	if got, err := reader.Workers(ctx, "m", ""); err != nil || len(got) != 1 || got[0].InstanceID != 9 {
		t.Fatalf("workers %+v, %v", got, err)
	}
	if s, err := reader.Query(ctx, api.QueryRequest{TokenIDs: tokens, ModelName: "m"}); err != nil || s.Instances[1].LongestMatched != 64 {
		t.Fatalf("query %+v, %v", s, err)
	}
	if s, err := reader.QueryByHash(ctx, api.QueryByHashRequest{BlockHashes: hashes, ModelName: "m"}); err != nil || s.Instances[1].LongestMatched != 64 {
		t.Fatalf("query by hash %+v, %v", s, err)
	}
	if _, err := reader.Query(ctx, api.QueryRequest{TokenIDs: tokens, ModelName: "nope"}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("query of an unknown model: %v", err)
	}
	sel, err := reader.Select(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: tokens}, ModelName: "m"})
	if err != nil || sel.WorkerID != 1 || sel.Overlap.GPU != 64 {
		t.Fatalf("select %+v, %v", sel, err)
	}
	if _, err := c.SelectAndReserve(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: tokens}, ModelName: "m", SelectionID: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SelectAndReserve(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: tokens}, ModelName: "m", SelectionID: "a"}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("the same id twice: %v", err)
	}
	if err := c.ReservationPrefillComplete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeReservation(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	one := uint64(1)
	if r, err := c.Reserve(ctx, api.ReserveRequest{Prompt: api.Prompt{TokenIDs: tokens}, SelectionID: "b/c", ModelName: "m", WorkerID: &one}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("an id with a slash: %+v %v", r, err)
	}
	if r, err := c.Reserve(ctx, api.ReserveRequest{Prompt: api.Prompt{TokenIDs: tokens}, SelectionID: "b", ModelName: "m", WorkerID: &one}); err != nil || r.WorkerID != 1 {
		t.Fatalf("reserve %+v %v", r, err)
	}
	if err := c.FreeReservation(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	p, err := c.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 4096)}, ID: "p", ModelName: "m"})
	if err != nil || p.Decode == nil || p.Decode.WorkerID != 3 {
		t.Fatalf("plan %+v %v", p, err)
	}
	if got, err := reader.Plan(ctx, "p"); err != nil || got.State != p.State {
		t.Fatalf("get plan %+v %v", got, err)
	}
	if p, err = c.PlanPrefillFailed(ctx, "p"); err != nil {
		t.Fatalf("prefill failed: %+v %v", p, err)
	}
	if _, err := c.PlanPrefillComplete(ctx, "p"); err == nil {
		t.Fatal("prefill complete after it failed")
	}
	if _, err := c.ReleasePlan(ctx, "p"); err != nil && !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrConflict) {
		t.Fatalf("release: %v", err)
	}
	var dump bytes.Buffer
	if n, err := c.Dump(ctx, &dump); err != nil || n == 0 || !strings.Contains(dump.String(), `"m:default"`) {
		t.Fatalf("dump %d %v: %.200s", n, err, dump.String())
	}
	if _, err := reader.Dump(ctx, &dump); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("dump with the read token: %v", err)
	}
	if m, err := reader.Metrics(ctx); err != nil || string(m) != "up 1\n" {
		t.Fatalf("metrics %q %v", m, err)
	}
	if _, err := client.New("http://127.0.0.1:1", "").Workers(ctx, "", ""); err == nil {
		t.Fatal("no error from a closed port")
	}
}

// TestDeferredDecode: a prefill-first plan with defer_decode books prefill
// only; decode is booked after the hand-off, on a decode worker that
// joined in between.
func TestDeferredDecode(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	svc := coordinator.NewService(coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Source: coordinator.IndexOverlaps{Index: ix}})
	rec := func(id uint64, role catalog.Role) catalog.Worker {
		return catalog.Worker{WorkerID: id, ModelName: "m", BlockSize: 16, Endpoint: "http://e", EventsEndpoint: "tcp://e:1",
			Attributes: catalog.Attributes{Role: role}}.WithDefaults()
	}
	for _, w := range []catalog.Worker{rec(2, catalog.RolePrefill), rec(3, catalog.RoleDecode)} {
		if err := svc.SetRecord(w); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: ix, Selector: svc}))
	defer srv.Close()
	c, ctx := client.New(srv.URL, ""), context.Background()
	svc.RemoveRecord(rec(3, catalog.RoleDecode).Key()) // no decode worker at plan time
	p, err := c.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 64)}, ID: "d", ModelName: "m",
		Order: "prefill-first", DeferDecode: true})
	if err != nil || p.State != "PrefillCommitted" || p.Decode != nil || p.Prefill == nil || p.Prefill.WorkerID != 2 {
		t.Fatalf("deferred plan %+v %v", p, err)
	}
	if p, err = c.PlanPrefillComplete(ctx, "d"); err != nil || p.State != "PrefillReleased" {
		t.Fatalf("prefill complete %+v %v", p, err)
	}
	if err := svc.SetRecord(rec(3, catalog.RoleDecode)); err != nil {
		t.Fatal(err)
	}
	if p, err = c.PlanDecode(ctx, "d"); err != nil || p.Decode == nil || p.Decode.WorkerID != 3 || p.State != "PrefillReleased" {
		t.Fatalf("decode %+v %v", p, err)
	}
	if _, err := c.PlanDecode(ctx, "d"); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("a second decode booking: %v", err)
	}
	if p, err = c.ReleasePlan(ctx, "d"); err != nil || p.State != "Released" {
		t.Fatalf("release %+v %v", p, err)
	}
	var trace []string
	for _, tr := range p.Transitions {
		trace = append(trace, tr.To)
	}
	if got := strings.Join(trace, " → "); got != "PrefillCommitted → PrefillReleased → Released" {
		t.Fatalf("transitions %s", got)
	}
	// defer_decode needs the prefill-first order.
	if _, err := c.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 64)}, ID: "e", ModelName: "m", DeferDecode: true}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("defer_decode without the order: %v", err)
	}
}
