package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
)

type fixedWorkers []apiserver.WorkerState

func (f fixedWorkers) Register(context.Context, catalog.Registration) error { return nil }
func (f fixedWorkers) Unregister(context.Context, string, string, uint64, *uint32) error {
	return nil
}
func (f fixedWorkers) List(model, group string) []apiserver.WorkerState {
	var out []apiserver.WorkerState
	for _, w := range f {
		if (model == "" || w.Record.ModelName == model) && (group == "" || w.Record.RoutingGroup == group) {
			out = append(out, w)
		}
	}
	return out
}

func runCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestWorkersAndQueryCommands(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	k := indexer.PartitionKey{Model: "m", Group: "default"}
	if err := ix.AddPartition(k, 4); err != nil {
		t.Fatal(err)
	}
	st := indexer.Stored{Hashes: []uint64{10, 11}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Seed: indexer.BaseSeed}
	if _, err := ix.Apply(k, indexer.Rank{WorkerID: 3}, 9, []indexer.Op{{Kind: indexer.OpStore, Store: st}}); err != nil {
		t.Fatal(err)
	}
	workers := fixedWorkers{{Record: catalog.Worker{WorkerID: 3, ModelName: "m", RoutingGroup: "default", BlockSize: 4,
		EventsEndpoint: "tcp://10.0.0.3:5557", DataParallelSize: 1},
		Streams: map[uint32]stream.Rank{0: {Running: true, State: stream.State{Connected: true, Synced: true}}}}}
	srv := httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: ix, Workers: workers}))
	defer srv.Close()

	got, err := runCommand(t, "workers", "--server", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(got, "\n")
	// WORKER MODEL GROUP ROLE RANK STATUS LAST-SEQ BLOCKS DEGRADED ENDPOINT
	if len(lines) < 2 || strings.Join(strings.Fields(lines[1]), " ") != "3 m default aggregated 0 active 9 2 false tcp://10.0.0.3:5557" {
		t.Fatalf("workers output:\n%s", got)
	}
	got, err = runCommand(t, "query", "--server", srv.URL, "--model", "m", "--tokens", "1,2,3,4,5,6,7,8,9")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(got, "\n")
	if len(lines) < 2 || strings.Join(strings.Fields(lines[1]), " ") != "3 0 8 8 8 8" {
		t.Fatalf("query output (want worker 3 rank 0 holding 8 tokens):\n%s", got)
	}
	if _, err := runCommand(t, "query", "--server", srv.URL, "--model", "nope", "--tokens", "1"); err == nil ||
		!strings.Contains(err.Error(), "no workers for model nope; known (model/routing group): m/default") || !strings.Contains(err.Error(), "no indexer for model") {
		t.Fatalf("query of an unknown model: %v", err)
	}
	if _, err := runCommand(t, "workers", "--server", srv.URL, "--model", "nope"); err == nil ||
		!strings.Contains(err.Error(), "no workers for model nope; known (model/routing group): m/default") {
		t.Fatalf("workers of an unknown model: %v", err)
	}
	// --server without a scheme is plain HTTP.
	got, err = runCommand(t, "workers", "--server", strings.TrimPrefix(srv.URL, "http://"), "--model", "m")
	if err != nil || !strings.Contains(got, "tcp://10.0.0.3:5557") {
		t.Fatalf("workers --server host:port: %v\n%s", err, got)
	}
	if _, err := runCommand(t, "workers", "--server", "ftp://x:1"); err == nil || !strings.Contains(err.Error(), "want host:port or http(s)://host:port") {
		t.Fatalf("workers --server ftp://: %v", err)
	}
	if _, err := runCommand(t, "query", "--model", "m", "--tokens", "x"); err == nil || !strings.Contains(err.Error(), "--tokens") {
		t.Fatalf("bad tokens: %v", err)
	}
}
