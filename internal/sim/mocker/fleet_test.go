package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
)

// TestFleet: engines start registered, one serves HTTP on its listener, a
// crashed one is forgotten, Stop revokes the rest; an engine that cannot
// run fails Start, closes Failed and is in Stop's error.
func TestFleet(t *testing.T) {
	t.Parallel()
	store := storetest.NewMemoryStore("")
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	fl := NewFleet(ctx, store, nil)
	worker := func(id uint64) catalog.Worker {
		return catalog.Worker{WorkerID: id, ModelName: "m", RoutingGroup: "g", Endpoint: "http://127.0.0.1:1"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := fl.Start(ctx, Config{TotalBlocks: 64, BlockSize: 4, Worker: worker(1)}, ln)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fl.Start(ctx, Config{TotalBlocks: 64, BlockSize: 4, Worker: worker(2)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fl.Engines(); len(got) != 2 || got[0] != a || got[1] != b || a.Worker().WorkerID != 1 {
		t.Fatalf("engines %v", got)
	}
	body, _ := json.Marshal(Request{TokenIDs: []uint32{1, 2, 3, 4, 5}, MaxTokens: 1})
	resp, err := http.Post("http://"+ln.Addr().String()+"/generate", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /generate: %d", resp.StatusCode)
	}
	fl.Crash(b)
	if got := fl.Engines(); len(got) != 1 || got[0] != a {
		t.Fatalf("engines after a crash: %v", got)
	}
	select {
	case <-fl.Failed():
		t.Fatal("Failed closed, yet nothing failed")
	default:
	}
	// An engine whose publisher cannot bind.
	if _, err := fl.Start(ctx, Config{TotalBlocks: 64, BlockSize: 4, Worker: worker(3),
		Publisher: PublisherConfig{Endpoint: "tcp://256.0.0.1:1"}}, nil); err == nil {
		t.Fatal("an engine that cannot bind started")
	}
	<-fl.Failed()
	if err := fl.Stop(); err == nil {
		t.Fatal("Stop reported no failure")
	}
	if keys, err := store.Keys(ctx, "m", 1); err != nil || len(keys) != 0 {
		t.Fatalf("worker 1 still registered after Stop: %v %v", keys, err)
	}
}

// slowAckStore applies a Put and then holds its answer until the caller's
// context ends, as an etcd whose reply is still in flight at shutdown.
type slowAckStore struct {
	*storetest.MemoryStore
	applied chan struct{}
}

func (s slowAckStore) Put(ctx context.Context, w catalog.Worker, lease catalog.LeaseID) (int64, error) {
	if _, err := s.MemoryStore.Put(ctx, w, lease); err != nil {
		return 0, err
	}
	close(s.applied)
	<-ctx.Done()
	return 0, ctx.Err()
}

// TestFleetStoppedWhileRegistering: a fleet shut down while an engine's
// registration is in flight is a clean stop, not a failure, and the
// half-made registration leaves with its revoked lease.
func TestFleetStoppedWhileRegistering(t *testing.T) {
	t.Parallel()
	store := slowAckStore{storetest.NewMemoryStore(""), make(chan struct{})}
	t.Cleanup(func() { store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	fl := NewFleet(ctx, store, nil)
	go func() {
		<-store.applied
		cancel()
	}()
	_, err := fl.Start(context.Background(), Config{TotalBlocks: 64, BlockSize: 4,
		Worker: catalog.Worker{WorkerID: 1, ModelName: "m", RoutingGroup: "g", Endpoint: "http://127.0.0.1:1"}}, nil)
	if !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Start = %v, want ErrNotRunning", err)
	}
	if err := fl.Stop(); err != nil {
		t.Fatalf("Stop = %v, want a clean stop", err)
	}
	select {
	case <-fl.Failed():
		t.Fatal("Failed closed by a shutdown")
	default:
	}
	if keys, err := store.Keys(context.Background(), "m", 1); err != nil || len(keys) != 0 {
		t.Fatalf("worker 1 still registered: %v %v", keys, err)
	}
}
