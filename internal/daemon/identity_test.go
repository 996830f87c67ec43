package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// workersOf returns GET /workers for model.
func workersOf(t *testing.T, d *testDaemon, model string) []api.WorkerInfo {
	t.Helper()
	code, body := call(t, "GET", d.url+"/workers?model_name="+model, "", nil)
	if code != 200 {
		t.Fatalf("workers: %d %s", code, body)
	}
	var ws []api.WorkerInfo
	if err := json.Unmarshal(body, &ws); err != nil {
		t.Fatal(err)
	}
	return ws
}

// listener returns worker id's rank r from /workers, if listed.
func listener(t *testing.T, d *testDaemon, model string, id uint64, r uint32) (api.Listener, bool) {
	t.Helper()
	for _, w := range workersOf(t, d, model) {
		if w.InstanceID == id {
			l, ok := w.Listeners[r]
			return l, ok
		}
	}
	return api.Listener{}, false
}

func register(t *testing.T, d *testDaemon, body map[string]any) (int, string) {
	t.Helper()
	code, b := call(t, "POST", d.url+"/register", "", body)
	return code, string(b)
}

func etcdStore(t *testing.T, etcd *etcdstore.Embedded) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestWorkerIDIsOneEngine: a worker id names one engine. Registering the
// id for another model (the api.md example pasted while a mock worker 2
// runs) is a 409 naming the holder, and leaves worker 2's stream and
// blocks alone; unregistering the id from the other model is a 404.
func TestWorkerIDIsOneEngine(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	e := publishtest.Start(t, 0)
	e.Store(4)
	if code, body := register(t, d, map[string]any{"instance_id": 2, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
		"model_name": "mock-model", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "worker 2's 4 blocks", func() bool {
		l, ok := listener(t, d, "mock-model", 2, 0)
		return ok && l.Blocks == 4 && l.Status == api.StatusActive
	})
	code, body := register(t, d, map[string]any{"instance_id": 2, "endpoint": "tcp://10.0.0.2:5557", "model_name": "llama-3-8b",
		"routing_group": "customer-a", "block_size": 16, "dp_rank": 0, "replay_endpoint": "tcp://10.0.0.2:5560"})
	if code != http.StatusConflict || !strings.Contains(body, "instance_id: 2 is registered for model=mock-model routing_group=default") {
		t.Fatalf("register id 2 for another model: %d %s; want 409 naming the holder", code, body)
	}
	if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 2, "model_name": "llama-3-8b"}); code != http.StatusNotFound {
		t.Fatalf("unregister id 2 from the other model: %d %s", code, body)
	}
	e.Store(1)
	testsupport.Eventually(t, 20*time.Second, "worker 2 still indexed and following its engine", func() bool {
		l, ok := listener(t, d, "mock-model", 2, 0)
		return ok && l.Blocks == 5 && l.Status == api.StatusActive && !l.Degraded
	})
	if ws := workersOf(t, d, "llama-3-8b"); len(ws) != 0 {
		t.Fatalf("workers of the refused model: %+v", ws)
	}
}

// TestRegisterRanksConcurrently: concurrent /register calls for different
// ranks of one instance all land (the record is merged with
// compare-and-swap), in rounds so that an unlucky interleaving shows.
func TestRegisterRanksConcurrently(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	store := etcdStore(t, etcd)
	const rounds, ranks = 10, 4
	for round := range rounds {
		id := uint64(100 + round)
		var wg sync.WaitGroup
		codes := make(chan string, ranks)
		for r := range ranks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := register(t, d, map[string]any{"instance_id": id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 20000+10*round+r),
					"model_name": "m", "block_size": 16, "dp_rank": r})
				codes <- fmt.Sprintf("%d %s", code, body)
			}()
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			if !strings.HasPrefix(c, "201") {
				t.Fatalf("round %d: register: %s", round, c)
			}
		}
		w, err := store.Get(context.Background(), catalog.Key{Model: "m", Group: "default", WorkerID: id})
		if err != nil {
			t.Fatal(err)
		}
		if got := w.Ranks(); !slices.Equal(got, []uint32{0, 1, 2, 3}) {
			t.Fatalf("round %d: the record kept ranks %v of 4 registered at once", round, got)
		}
	}
}

// TestRegisterSparseRanks: ranks may be registered in any order and leave
// holes; removing one rank keeps the others.
func TestRegisterSparseRanks(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	store := etcdStore(t, etcd)
	for _, r := range []int{2, 0, 5} {
		if code, body := register(t, d, map[string]any{"instance_id": 3, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 21000+r),
			"model_name": "m", "block_size": 16, "dp_rank": r}); code != http.StatusCreated {
			t.Fatalf("register rank %d: %d %s", r, code, body)
		}
	}
	k := catalog.Key{Model: "m", Group: "default", WorkerID: 3}
	if w, err := store.Get(context.Background(), k); err != nil || !slices.Equal(w.Ranks(), []uint32{0, 2, 5}) {
		t.Fatalf("record %+v, %v; want ranks 0, 2, 5", w, err)
	}
	testsupport.Eventually(t, 20*time.Second, "ranks 0, 2 and 5 listed", func() bool {
		ws := workersOf(t, d, "m")
		return len(ws) == 1 && len(ws[0].Listeners) == 3 && ws[0].Endpoints[5] == "tcp://127.0.0.1:21005"
	})
	if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 3, "model_name": "m", "routing_group": "default", "dp_rank": 2}); code != 200 {
		t.Fatalf("unregister rank 2: %d %s", code, body)
	}
	if w, err := store.Get(context.Background(), k); err != nil || !slices.Equal(w.Ranks(), []uint32{0, 5}) {
		t.Fatalf("record %+v, %v; want ranks 0, 5", w, err)
	}
}

// TestSidecarRecordIsTheSidecars: a record a sidecar keeps under a lease
// cannot be overwritten (which would detach the lease) or deleted (which
// would leave the sidecar renewing a lease that holds nothing) through
// the API: both are a 409 naming the lease, and the record keeps it.
func TestSidecarRecordIsTheSidecars(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	store := etcdStore(t, etcd)
	w := catalog.Worker{WorkerID: 5, ModelName: "m", BlockSize: 16, EventsEndpoint: "tcp://127.0.0.1:22000", DataParallelSize: 1}.WithDefaults()
	sess, err := catalog.Register(context.Background(), store, w, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	lease := fmt.Sprintf("lease %x", sess.Lease())
	code, body := register(t, d, map[string]any{"instance_id": 5, "endpoint": "tcp://127.0.0.1:22001", "model_name": "m", "block_size": 16, "dp_rank": 1})
	if code != http.StatusConflict || !strings.Contains(body, lease) {
		t.Fatalf("register over a sidecar's record: %d %s; want 409 naming %s", code, body, lease)
	}
	for _, req := range []map[string]any{
		{"instance_id": 5, "model_name": "m"},
		{"instance_id": 5, "model_name": "m", "routing_group": "default"},
		{"instance_id": 5, "model_name": "m", "routing_group": "default", "dp_rank": 0},
	} {
		if code, body := call(t, "POST", d.url+"/unregister", "", req); code != http.StatusConflict || !strings.Contains(string(body), lease) {
			t.Fatalf("unregister %v of a sidecar's record: %d %s; want 409 naming %s", req, code, body, lease)
		}
	}
	snap, err := store.List(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Records) != 1 || snap.Records[0].Lease != sess.Lease() || !snap.Records[0].Worker.Equal(w) {
		t.Fatalf("records %+v; want the sidecar's, unchanged, under its lease", snap.Records)
	}
}

// TestSiblingRanksKeepTheirStreams: registering or removing one rank of a
// worker leaves its other ranks' streams and blocks alone — an engine
// whose replay buffer no longer reaches its first batch could not give
// them back.
func TestSiblingRanksKeepTheirStreams(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	e0 := publishtest.Start(t, 4)
	if code, body := register(t, d, map[string]any{"instance_id": 1, "endpoint": e0.Pub.Endpoint(), "replay_endpoint": e0.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register rank 0: %d %s", code, body)
	}
	for i := range 12 { // one at a time, so the 4-batch buffer always covers what the stream missed
		e0.Store(1)
		testsupport.Eventually(t, 20*time.Second, fmt.Sprintf("batch %d applied", i), func() bool {
			l, ok := listener(t, d, "m", 1, 0)
			return ok && l.LastSeq != nil && *l.LastSeq == uint64(i)
		})
	}
	exact := func(what string) {
		t.Helper()
		l, ok := listener(t, d, "m", 1, 0)
		if !ok || l.Blocks != 12 || l.Degraded || l.Status != api.StatusActive {
			t.Fatalf("%s: rank 0 is %+v; want its 12 blocks, active, not degraded", what, l)
		}
	}
	exact("before")
	e1 := publishtest.Start(t, 0)
	e1.Store(3)
	if code, body := register(t, d, map[string]any{"instance_id": 1, "endpoint": e1.Pub.Endpoint(), "replay_endpoint": e1.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16, "dp_rank": 1}); code != http.StatusCreated {
		t.Fatalf("register rank 1: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "rank 1 indexed", func() bool {
		l, ok := listener(t, d, "m", 1, 1)
		return ok && l.Blocks == 3
	})
	exact("after rank 1 joined")
	if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 1, "model_name": "m", "routing_group": "default", "dp_rank": 1}); code != 200 {
		t.Fatalf("unregister rank 1: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "rank 1 gone", func() bool {
		_, ok := listener(t, d, "m", 1, 1)
		return !ok
	})
	exact("after rank 1 left")
}

// TestEmptyPartitionsGo: a partition goes with its last worker — with its
// block size, its /dump entry and its metric series — so models created
// and deleted leave nothing behind, and a new fleet may bring another
// block size.
func TestEmptyPartitionsGo(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	e := publishtest.Start(t, 0)
	e.Store(3)
	const models = 60
	for i := range models {
		model := fmt.Sprintf("churn-%d", i)
		if code, body := register(t, d, map[string]any{"instance_id": 1000 + i, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
			"model_name": model, "block_size": 16}); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", model, code, body)
		}
		testsupport.Eventually(t, 20*time.Second, model+" indexed", func() bool {
			l, ok := listener(t, d, model, uint64(1000+i), 0)
			return ok && l.Blocks == 3
		})
		if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 1000 + i, "model_name": model}); code != 200 {
			t.Fatalf("unregister %s: %d %s", model, code, body)
		}
	}
	testsupport.Eventually(t, 20*time.Second, "every partition gone from /dump", func() bool {
		code, body := call(t, "GET", d.url+"/dump", "", nil)
		return code == 200 && strings.TrimSpace(string(body)) == "{}"
	})
	// A stream's series go when its subscriber has stopped, which the
	// manager does not wait for (the rank leaves the index first).
	testsupport.Eventually(t, 20*time.Second, "no series of a deleted model or worker", func() bool {
		_, metrics := call(t, "GET", d.url+"/metrics", "", nil)
		for _, line := range strings.Split(string(metrics), "\n") {
			if strings.Contains(line, `"churn-`) || strings.Contains(line, `worker="10`) {
				return false
			}
		}
		return true
	})
	// The block size left with the last worker.
	if code, body := register(t, d, map[string]any{"instance_id": 2000, "endpoint": "tcp://127.0.0.1:23000", "model_name": "churn-0", "block_size": 32}); code != http.StatusCreated {
		t.Fatalf("register churn-0 with another block size: %d %s", code, body)
	}
}

// TestRankCapacity: a rank never holds more blocks than its engine can
// (total_kv_blocks with a margin): an engine that publishes more — a
// rogue's endless valid replay, or a wrong registration — is trimmed,
// reported degraded (the index then holds a strict subset of it, and the
// degraded flag must not say otherwise) and logged, until its engine
// clears its cache. The index cap itself defaults to one derived from
// memory.
func TestRankCapacity(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	logs, log := testlog.New(nil)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.Logger = log })
	e := publishtest.Start(t, 0)
	if code, body := register(t, d, map[string]any{"instance_id": 9, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16, "total_kv_blocks": 32}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	const limit = 32 + 32/8 + 64 // withMargin(32)
	for range 20 {
		e.Store(10) // 200 blocks in all
	}
	testsupport.Eventually(t, 20*time.Second, "the rank trimmed and degraded", func() bool {
		l, ok := listener(t, d, "m", 9, 0)
		return ok && l.LastSeq != nil && *l.LastSeq == e.Last && l.Degraded && l.Blocks <= limit && l.Blocks > 0
	})
	logs.Wait(t, 10*time.Second, "rank truncated: the index dropped some of its blocks (the memory cap, or more than its registered capacity); marked degraded until its engine clears", "worker=9", "rank=0")
	_, metrics := call(t, "GET", d.url+"/metrics", "", nil)
	for _, want := range []string{`prefixd_stream_degraded{rank="0",worker="9"} 1`, `reason="rank_capacity",routing_group="default"}`} {
		if !strings.Contains(string(metrics), want) {
			t.Fatalf("no %s in /metrics", want)
		}
	}
	if strings.Contains(string(metrics), "prefixd_index_max_entries 0\n") {
		t.Fatal("no default index cap")
	}
	// The engine clears its cache: the rank is exact again.
	e.Publish(wire.Event{Kind: wire.KindAllBlocksCleared})
	e.Store(2)
	testsupport.Eventually(t, 20*time.Second, "the rank exact again", func() bool {
		l, ok := listener(t, d, "m", 9, 0)
		return ok && l.LastSeq != nil && *l.LastSeq == e.Last && !l.Degraded && l.Blocks == 2
	})
	logs.Wait(t, 10*time.Second, "rank exact again: degraded cleared", "worker=9", "rank=0")
}
