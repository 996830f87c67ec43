package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/dumptest"
)

type testDaemon struct {
	url  string
	stop func() error
}

func startDaemon(t *testing.T, etcd []string, token string, peers ...string) *testDaemon {
	t.Helper()
	return startDaemonWith(t, etcd, func(c *Config) { c.APIToken, c.Peers = token, peers })
}

// startDaemonWith starts a daemon on etcd with the tests' defaults, which
// edit may change.
func startDaemonWith(t *testing.T, etcd []string, edit func(*Config)) *testDaemon {
	t.Helper()
	cfg := Config{Etcd: etcdstore.Config{Endpoints: etcd, DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
		ReadyTimeout: 30 * time.Second,
		Subscriber:   stream.SubscriberConfig{IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond}}
	if edit != nil {
		edit(&cfg)
	}
	addr, stop := testsupport.Ready(t, "daemon", func(ctx context.Context, ready func(string)) error {
		cfg.OnReady = ready
		return Run(ctx, cfg)
	})
	return &testDaemon{url: "http://" + addr, stop: stop}
}

func call(t *testing.T, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestDaemonRegisterQueryUnregister: the whole serve path on a real etcd:
// POST /register writes the catalog, the watch starts the stream, the
// engine's blocks answer POST /query, /workers shows the rank, and POST
// /unregister takes it all away. With --api-token, writes need it.
func TestDaemonRegisterQueryUnregister(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "s3cret")
	e := publishtest.Start(t, 0)
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	e.StoreTokens(tokens)
	reg := map[string]any{"instance_id": 42, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
		"model_name": "meta-llama/Llama-3-8B", "block_size": 16}
	if code, body := call(t, "POST", d.url+"/register", "", reg); code != http.StatusUnauthorized {
		t.Fatalf("register without token: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/register", "s3cret", reg); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	query := map[string]any{"token_ids": tokens, "model_name": "meta-llama/Llama-3-8B"}
	testsupport.Eventually(t, 20*time.Second, "the engine's blocks to be queryable", func() bool {
		code, body := call(t, "POST", d.url+"/query", "", query)
		return code == 200 && bytes.Contains(body, []byte(`"scores":{"42":{"0":64}}`))
	})
	testsupport.Eventually(t, 20*time.Second, "ready", func() bool {
		code, _ := call(t, "GET", d.url+"/ready", "", nil)
		return code == 200
	})
	code, body := call(t, "GET", d.url+"/workers?model_name=meta-llama/Llama-3-8B", "", nil)
	if code != 200 || !bytes.Contains(body, []byte(`"instance_id":42`)) || !bytes.Contains(body, []byte(`"status":"active"`)) {
		t.Fatalf("workers: %d %s", code, body)
	}
	code, body = call(t, "GET", d.url+"/metrics", "", nil)
	if code != 200 || !bytes.Contains(body, []byte(`prefixd_stream_batches_total{rank="0",status="applied",worker="42"} 1`)) ||
		!bytes.Contains(body, []byte(`prefixd_index_entries{model="meta-llama/Llama-3-8B",routing_group="default"} 4`)) {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	bad := map[string]any{"instance_id": 43, "endpoint": e.Pub.Endpoint(), "model_name": "meta-llama/Llama-3-8B", "block_size": 32}
	if code, body := call(t, "POST", d.url+"/register", "s3cret", bad); code != http.StatusConflict {
		t.Fatalf("block size conflict: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/unregister", "s3cret", map[string]any{"instance_id": 42, "model_name": "meta-llama/Llama-3-8B"}); code != 200 {
		t.Fatalf("unregister: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "the worker's blocks, and its now empty partition, to leave the index", func() bool {
		code, body := call(t, "POST", d.url+"/query", "", query)
		return code == http.StatusNotFound && bytes.Contains(body, []byte(`no indexer for model=meta-llama/Llama-3-8B routing_group=default`))
	})
	if code, _ := call(t, "POST", d.url+"/unregister", "s3cret", map[string]any{"instance_id": 42, "model_name": "meta-llama/Llama-3-8B"}); code != http.StatusNotFound {
		t.Fatalf("second unregister: %d", code)
	}
}

// TestDaemonLeaseExpiry: a sidecar-registered worker (leased record) whose
// sidecar stops renewing disappears with its blocks within TTL + 2 s.
func TestDaemonLeaseExpiry(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	e := publishtest.Start(t, 0)
	e.Store(4)
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w := catalog.Worker{WorkerID: 5, ModelName: "m", BlockSize: 16, EventsEndpoint: e.Pub.Endpoint(), ReplayEndpoint: e.Pub.ReplayEndpoint(), DataParallelSize: 1}.WithDefaults()
	sess, err := catalog.Register(context.Background(), store, w, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopRenewing := context.WithCancel(context.Background())
	go func() { _ = sess.Run(sctx) }()
	blocks := func() string {
		_, body := call(t, "GET", d.url+"/workers", "", nil)
		return string(body)
	}
	testsupport.Eventually(t, 20*time.Second, "the worker's 4 blocks", func() bool {
		return bytes.Contains([]byte(blocks()), []byte(`"blocks":4`))
	})
	stopRenewing() // a crashed sidecar: no revoke, the lease lapses
	start := time.Now()
	testsupport.Eventually(t, 10*time.Second, "the worker to leave", func() bool { return !bytes.Contains([]byte(blocks()), []byte(`"instance_id"`)) })
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("worker left %v after its sidecar stopped; want within TTL + 2 s", el)
	}
}

// TestDaemonPeerBootstrap: a replica started with --peers restores its
// index from a peer's /dump and resumes each rank after its watermark once
// the engine confirms that batch, so it is exact even though the engine's
// replay buffer no longer reaches back to seq 0 — where a replica without
// a peer can only be degraded.
func TestDaemonPeerBootstrap(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	a := startDaemon(t, etcd.Endpoints(), "")
	e := publishtest.Start(t, 5)
	reg := map[string]any{"instance_id": 1, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(), "model_name": "m", "block_size": 16}
	if code, body := call(t, "POST", a.url+"/register", "", reg); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "a ready", func() bool { code, _ := call(t, "GET", a.url+"/ready", "", nil); return code == 200 })
	rankLine := func(d *testDaemon) string {
		_, body := call(t, "GET", d.url+"/workers", "", nil)
		return string(body)
	}
	// One batch at a time, each applied before the next, so that a live
	// batch the slow-joining SUB misses is always within the 5-batch
	// replay buffer when a's stream notices it.
	tokens := make([]uint32, 0, 20*16)
	for i := 0; i < 20; i++ {
		blk := make([]uint32, 16)
		for j := range blk {
			blk[j] = uint32(i*100 + j)
		}
		tokens = append(tokens, blk...)
		e.StoreTokens(blk)
		testsupport.Eventually(t, 20*time.Second, fmt.Sprintf("a to apply batch %d", i), func() bool {
			return bytes.Contains([]byte(rankLine(a)), []byte(fmt.Sprintf(`"last_seq":%d,`, i)))
		})
	}
	if bytes.Contains([]byte(rankLine(a)), []byte(`"degraded":true`)) {
		t.Fatalf("a degraded: %s", rankLine(a))
	}
	// b finds a through DNS, as replicas behind a headless Service do.
	b := startDaemon(t, etcd.Endpoints(), "", "dns+"+strings.Replace(a.url, "127.0.0.1", "localhost", 1))
	c := startDaemon(t, etcd.Endpoints(), "")
	for _, d := range []*testDaemon{b, c} {
		testsupport.Eventually(t, 20*time.Second, "ready", func() bool { code, _ := call(t, "GET", d.url+"/ready", "", nil); return code == 200 })
	}
	if l := rankLine(b); !bytes.Contains([]byte(l), []byte(`"degraded":false`)) || !bytes.Contains([]byte(l), []byte(`"last_seq":19`)) {
		t.Fatalf("bootstrapped replica: %s", l)
	}
	testsupport.Eventually(t, 20*time.Second, "c to give up on the rolled-over history", func() bool {
		return bytes.Contains([]byte(rankLine(c)), []byte(`"degraded":true`))
	})
	// The first block's chain: each batch stored one root block, so ask
	// for block 0 and block 19 separately and compare all three replicas.
	for _, q := range [][]uint32{tokens[:16], tokens[19*16:]} {
		_, wantBody := call(t, "POST", a.url+"/query", "", map[string]any{"token_ids": q, "model_name": "m"})
		_, gotBody := call(t, "POST", b.url+"/query", "", map[string]any{"token_ids": q, "model_name": "m"})
		if !bytes.Equal(wantBody, gotBody) || !bytes.Contains(gotBody, []byte(`"1":{"0":16}`)) {
			t.Fatalf("bootstrapped replica answers %s, peer %s", gotBody, wantBody)
		}
	}
	_, dumpA := call(t, "GET", a.url+"/dump", "", nil)
	_, dumpB := call(t, "GET", b.url+"/dump", "", nil)
	if ca, cb := dumptest.Lines(t, dumpA), dumptest.Lines(t, dumpB); !slices.Equal(ca, cb) || len(ca) != 21 {
		t.Fatalf("indexes differ:\n%v\n%v", ca, cb)
	}
}

// TestReadyLatches: once ready, a replica stays ready when a worker whose
// stream cannot sync joins (a readiness probe failing on every replica
// would take prefixd out of service because of one engine).
func TestReadyLatches(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	testsupport.Eventually(t, 20*time.Second, "ready", func() bool { code, _ := call(t, "GET", d.url+"/ready", "", nil); return code == 200 })
	reg := map[string]any{"instance_id": 9, "endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:2", "model_name": "m", "block_size": 16}
	if code, body := call(t, "POST", d.url+"/register", "", reg); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "the unreachable worker's stream", func() bool {
		_, body := call(t, "GET", d.url+"/workers", "", nil)
		return bytes.Contains(body, []byte(`"instance_id":9`)) && !bytes.Contains(body, []byte(`"status":"active"`))
	})
	if code, body := call(t, "GET", d.url+"/ready", "", nil); code != 200 {
		t.Fatalf("/ready after an unreachable worker joined: %d %s", code, body)
	}
}

// TestRunListenInUse: a taken --listen address fails Run at once with a
// hint, and leaves no goroutine behind (the watch and the plan expiry
// used to start before the listener and were never stopped). Not
// parallel: it looks for daemon goroutines in the whole process.
func TestRunListenInUse(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	err = Run(context.Background(), Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints()}, Listen: taken.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "pass --listen with a free port") {
		t.Fatalf("Run on a taken address: %v", err)
	}
	testsupport.Eventually(t, 10*time.Second, "no daemon goroutine left", func() bool {
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
		for _, f := range []string{"catalog.(*Watcher).Run", "coordinator.(*Service).Run", "stream.(*Manager).Run"} {
			if strings.Contains(buf.String(), f) {
				return false
			}
		}
		return true
	})
}

// TestDataDirInUse: a second daemon on a data dir in use fails at once,
// naming the holder (it used to wait forever on etcd's file lock, deaf to
// signals); one on another data dir but the same embedded etcd port says
// which flag to change.
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	etcdURL := "http://" + port.Addr().String()
	port.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	first := make(chan error, 1)
	go func() {
		first <- Run(ctx, Config{DataDir: dir, EmbeddedURL: etcdURL, Listen: "127.0.0.1:0", OnReady: func(a string) { ready <- a }})
	}()
	select {
	case <-ready:
	case err := <-first:
		t.Fatalf("first daemon: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("first daemon did not start")
	}
	defer func() {
		cancel()
		if err := <-first; err != nil {
			t.Errorf("first daemon: %v", err)
		}
	}()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	err = Run(sctx, Config{DataDir: dir, EmbeddedURL: etcdURL, Listen: "127.0.0.1:0"})
	want := fmt.Sprintf("data dir %s is in use by another prefixd (pid %d)", dir, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) || sctx.Err() != nil {
		t.Fatalf("second daemon on the same data dir: %v; want at once %q", err, want)
	}
	err = Run(sctx, Config{DataDir: t.TempDir(), EmbeddedURL: etcdURL, Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "pass --embedded-etcd-url with a free port") {
		t.Fatalf("second daemon on the same etcd port: %v", err)
	}
}

// TestPeerBootstrapKeepsDegraded: a replica restored from a peer whose
// copy of a rank is degraded (its history was lost) reports the rank
// degraded too, with the peer's reason — the dump carries the flag — and
// both lift it on the same event, the engine's AllBlocksCleared.
func TestPeerBootstrapKeepsDegraded(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	a := startDaemon(t, etcd.Endpoints(), "")
	e := publishtest.Start(t, 3)
	for range 8 {
		e.Store(1) // more than the 3-batch replay buffer holds
	}
	if code, body := register(t, a, map[string]any{"instance_id": 1, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	degraded := func(d *testDaemon) (api.Listener, bool) {
		l, ok := listener(t, d, "m", 1, 0)
		return l, ok && l.Degraded && l.LastSeq != nil && *l.LastSeq == e.Last
	}
	testsupport.Eventually(t, 20*time.Second, "a's rank degraded: its history was lost", func() bool { _, ok := degraded(a); return ok })
	la, _ := degraded(a)
	if !strings.HasPrefix(la.DegradedReason, "lost history: ") {
		t.Fatalf("a's reason: %q", la.DegradedReason)
	}
	b := startDaemon(t, etcd.Endpoints(), "", a.url)
	testsupport.Eventually(t, 20*time.Second, "b ready", func() bool { code, _ := call(t, "GET", b.url+"/ready", "", nil); return code == 200 })
	testsupport.Eventually(t, 20*time.Second, "b's restored rank following the engine", func() bool {
		l, ok := listener(t, b, "m", 1, 0)
		return ok && l.LastSeq != nil && *l.LastSeq == e.Last && l.Status == api.StatusActive
	})
	if lb, ok := degraded(b); !ok || lb.DegradedReason != la.DegradedReason {
		t.Fatalf("b restored the rank as %+v; want degraded, with a's reason %q", lb, la.DegradedReason)
	}
	// The engine clears its cache: both replicas lift the flag.
	e.Publish(wire.Event{Kind: wire.KindAllBlocksCleared})
	e.Store(2)
	for _, d := range []*testDaemon{a, b} {
		testsupport.Eventually(t, 20*time.Second, "the rank exact after the engine cleared", func() bool {
			l, ok := listener(t, d, "m", 1, 0)
			return ok && l.LastSeq != nil && *l.LastSeq == e.Last && !l.Degraded && l.DegradedReason == "" && l.Blocks == 2
		})
	}
}

// TestDaemonRequestMetrics: a query the daemon answers with a 404 is
// counted in its request latency histogram, by route, method and status.
func TestDaemonRequestMetrics(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemonWith(t, etcd.Endpoints(), nil)
	code, body := call(t, "POST", d.url+"/query", "", map[string]any{"token_ids": []int{1, 2}, "model_name": "m"})
	if code != http.StatusNotFound || !bytes.Contains(body, []byte("no indexer for model=m")) {
		t.Fatalf("/query: %d %s", code, body)
	}
	if code, body := call(t, "GET", d.url+"/metrics", "", nil); code != 200 ||
		!bytes.Contains(body, []byte(`prefixd_http_request_duration_seconds_count{code="404",handler="/query",method="post"} 1`)) {
		t.Fatalf("metrics: %d; its prefixd_http series:\n%s", code, bytes.Join(regexp.MustCompile(`(?m)^prefixd_http.*$`).FindAll(body, -1), []byte("\n")))
	}
}
