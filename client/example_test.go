package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
)

// exampleServer is a prefixd API in process with engines 1 (aggregated),
// 2 (prefill) and 3 (decode) of model meta-llama/Llama-3.1-8B-Instruct,
// none of which has cached anything yet.
func exampleServer() *httptest.Server {
	ix := indexer.New(indexer.Options{})
	svc := coordinator.NewService(coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Source: coordinator.IndexOverlaps{Index: ix}})
	for id, role := range map[uint64]catalog.Role{1: catalog.RoleAggregated, 2: catalog.RolePrefill, 3: catalog.RoleDecode} {
		w := catalog.Worker{WorkerID: id, ModelName: "meta-llama/Llama-3.1-8B-Instruct", BlockSize: 16, Endpoint: fmt.Sprintf("http://engine-%d:8000", id),
			EventsEndpoint: fmt.Sprintf("tcp://engine-%d:5557", id), Attributes: catalog.Attributes{Role: role}}.WithDefaults()
		if err := svc.SetRecord(w); err != nil {
			panic(err)
		}
	}
	return httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: ix, Selector: svc}))
}

// A request served by one aggregated engine: choose and book a worker,
// send the request there, report its first token, release at the end.
func Example() {
	srv := exampleServer() // a prefixd API in process
	defer srv.Close()
	prefixdURL := srv.URL // e.g. http://prefixd:8090
	ctx := context.Background()
	ids := make([]uint32, 100) // the prompt's token ids, from the engine's POST /tokenize
	reqID := "req-1"

	c := client.New(prefixdURL, os.Getenv("PREFIXD_TOKEN"))
	sel, err := c.SelectAndReserve(ctx, api.SelectRequest{
		Prompt: api.Prompt{TokenIDs: ids}, ModelName: "meta-llama/Llama-3.1-8B-Instruct", SelectionID: reqID})
	switch {
	case errors.Is(err, client.ErrOverloaded): // 429: every eligible worker is busy
		fmt.Println("answer 429, or queue the request")
		return
	case errors.Is(err, client.ErrNotFound): // no such model, or no worker
		fmt.Println("answer 404")
		return
	case err != nil: // prefixd unreachable: route by load
		fmt.Println("route by load:", err)
		return
	}
	fmt.Printf("send %s to worker %d at %s (%d tokens cached)\n", reqID, sel.WorkerID, sel.Endpoint, sel.Overlap.GPU)
	// … forward the request to sel.Endpoint; at its first streamed token:
	if err := c.ReservationPrefillComplete(ctx, reqID); err != nil {
		fmt.Println(err) // nothing to do: the load is corrected at release
	}
	// … when the response ends or the client goes away:
	if err := c.FreeReservation(ctx, reqID); err != nil {
		fmt.Println(err)
	}
	// A second release is an error the router can ignore.
	err = c.FreeReservation(ctx, reqID)
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output:
	// send req-1 to worker 1 at http://engine-1:8000 (0 tokens cached)
	// true
}

// A disaggregated request, decode first: the plan books decode, then
// prefill within the decode worker's KV-transfer domain.
func ExampleClient_CreatePlan() {
	srv := exampleServer()
	defer srv.Close()
	c := client.New(srv.URL, "")
	ctx := context.Background()

	plan, err := c.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 4096)}, ID: "req-2", ModelName: "meta-llama/Llama-3.1-8B-Instruct"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %s, decode on %d, prefill on %d\n", plan.Order, plan.State, plan.Decode.WorkerID, plan.Prefill.WorkerID)
	// … send the prefill request to plan.Prefill.Endpoint; when it answers:
	if plan, err = c.PlanPrefillComplete(ctx, "req-2"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(plan.State)
	// … send the decode request to plan.Decode.Endpoint; at its end:
	if plan, err = c.ReleasePlan(ctx, "req-2"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(plan.State)
	// Output:
	// decode-first: Linked, decode on 3, prefill on 2
	// PrefillReleased
	// Released
}
