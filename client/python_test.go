package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// python is the interpreter with Debian's packages (the first python3 on
// PATH may be another build).
const python = "/usr/bin/python3"

// TestPythonClient runs the Python client's tests (client/python) against
// the real API handler.
func TestPythonClient(t *testing.T) {
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s: %v (make test installs it)", python, err)
	}
	ix := indexer.New(indexer.Options{})
	key := indexer.PartitionKey{Model: "m", Group: "default"}
	if err := ix.AddPartition(key, 16); err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	if _, err := ix.Apply(key, indexer.Rank{WorkerID: 1}, 1, []indexer.Op{{Kind: indexer.OpStore,
		Store: indexer.Stored{Hashes: []uint64{11, 12, 13, 14}, Tokens: tokens, BlockSize: 16, Seed: indexer.BaseSeed}}}); err != nil {
		t.Fatal(err)
	}
	svc := coordinator.NewService(coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Source: coordinator.IndexOverlaps{Index: ix}})
	for id, role := range map[uint64]catalog.Role{1: catalog.RoleAggregated, 2: catalog.RolePrefill, 3: catalog.RoleDecode} {
		if err := svc.SetRecord(catalog.Worker{WorkerID: id, ModelName: "m", BlockSize: 16, Endpoint: "http://e",
			EventsEndpoint: "tcp://e:1", Attributes: catalog.Attributes{Role: role}}.WithDefaults()); err != nil {
			t.Fatal(err)
		}
	}
	ws := &registered{}
	srv := httptest.NewServer(api.NewHandler(api.Config{Index: ix, Selector: svc, Workers: ws, APIToken: "w",
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("up 1\n")) })}))
	defer srv.Close()
	dir, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(context.Background(), python, "-m", "unittest", "-v", "test_prefixd_client")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PREFIXD_URL="+srv.URL, "PREFIXD_TOKEN=w", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python tests: %v", err)
	}
}

// registered is an api.Workers that lists what was registered.
type registered struct {
	mu  sync.Mutex
	reg []catalog.Registration
}

func (r *registered) Register(_ context.Context, reg catalog.Registration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reg = append(r.reg, reg)
	return nil
}

func (r *registered) Unregister(context.Context, string, string, uint64, *uint32) error { return nil }

func (r *registered) List(string, string) []api.WorkerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []api.WorkerState
	for _, reg := range r.reg {
		out = append(out, api.WorkerState{Record: catalog.Worker{WorkerID: reg.WorkerID, ModelName: reg.Model, RoutingGroup: reg.Group,
			BlockSize: reg.BlockSize, EventsEndpoint: reg.EventsEndpoint, DataParallelSize: 1}})
	}
	return out
}
