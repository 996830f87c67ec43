package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// TestDaemonLogsStateChanges proves the log lines docs/operations.md
// quotes: a worker joining, its stream connecting and replaying, an engine
// restart, lost history, a worker leaving and its rank removed, and the
// daemon's own start and shutdown — each with its attributes.
func TestDaemonLogsStateChanges(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	logs, log := testlog.New(t)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.Logger = log })
	const wait = 20 * time.Second
	logs.Wait(t, wait, "index shards: each partition's ranks spread over this many trees, written in parallel", fmt.Sprintf("shards=%d", indexer.DefaultShards()))
	if rec := logs.Wait(t, wait, "prefixd serving"); !strings.HasPrefix(rec.Attrs["http"], "127.0.0.1:") {
		t.Errorf("prefixd serving: http=%q, want the listen address", rec.Attrs["http"])
	}
	logs.Wait(t, wait, "catalog synced", "workers=0")

	e := publishtest.Start(t, 0)
	e.Store(2)
	if code, body := register(t, d, map[string]any{"instance_id": 7, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	logs.Wait(t, wait, "worker joined", "worker=7", "model=m", "group=default", "role=aggregated", "ranks=[0]", "registration=persistent")
	logs.Wait(t, wait, "stream connected", "worker=7", "rank=0", "endpoint="+e.Pub.Endpoint())
	logs.Wait(t, wait, "replay started", "worker=7", "rank=0", "reason=join", "from=0")
	logs.Wait(t, wait, "replay complete", "worker=7", "rank=0", "reason=join", "applied_seq=0")

	e.Pub.Restart()
	e.Store(1)
	logs.Wait(t, wait, "engine restarted: a new incarnation; rank reset, replaying it", "worker=7", "rank=0")

	// An engine whose replay buffer no longer holds its first batches.
	old := publishtest.Start(t, 2)
	for range 6 {
		old.Store(1)
	}
	if code, body := register(t, d, map[string]any{"instance_id": 8, "endpoint": old.Pub.Endpoint(), "replay_endpoint": old.Pub.ReplayEndpoint(),
		"model_name": "m", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	logs.Wait(t, wait, "lost history: rank reset and marked degraded", "worker=8", "rank=0", "reason=the engine no longer has the batches")

	if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 8, "model_name": "m"}); code != 200 {
		t.Fatalf("unregister: %d %s", code, body)
	}
	logs.Wait(t, wait, "worker left", "worker=8", "model=m", "group=default")
	logs.Wait(t, wait, "stream stopped; rank removed from index", "worker=8", "rank=0")

	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, wait, "shutting down: draining HTTP, then stopping the catalog watch and the streams")
	logs.Wait(t, wait, "prefixd stopped")
}

// TestBadRecordLogClipped: a worker record in etcd with a 600,000-byte
// model name (a key and an error as long) is logged once, in a short line
// that names the lengths, and counted.
func TestBadRecordLogClipped(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	logs, log := testlog.New(nil) // the lines are checked here, not printed
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.Logger = log })
	logs.Wait(t, 20*time.Second, "catalog synced")
	raw := storetest.NewEtcdStore(t, etcd.Endpoints(), "")
	model := strings.Repeat("m", 600_000)
	key := catalog.Key{Model: model, Group: "default", WorkerID: 9}
	w := storetest.Worker(model, "default", 9)
	body, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.PutRaw(context.Background(), key.Path(""), body); err != nil {
		t.Fatal(err)
	}
	rec := logs.Wait(t, 20*time.Second, "catalog: ignoring bad worker record")
	if n := len(rec.String()); n > 2<<10 {
		t.Errorf("the bad record's line is %d bytes; want at most 2 KiB", n)
	}
	if !strings.Contains(rec.Attrs["key"], fmt.Sprintf("(%d bytes)", len(key.Path("")))) {
		t.Errorf("key=%.200q…: want the key's length named", rec.Attrs["key"])
	}
	if !strings.Contains(rec.Attrs["err"], "model_name: longer than 512 bytes (600000)") {
		t.Errorf("err=%.300q…: want the reason", rec.Attrs["err"])
	}
	testsupport.Eventually(t, 10*time.Second, "the bad record counted", func() bool {
		_, body := call(t, "GET", d.url+"/metrics", "", nil)
		return strings.Contains(string(body), "prefixd_catalog_bad_records_total 1\n")
	})
	for _, r := range logs.Records() {
		if n := len(r.String()); n > 2<<10 {
			t.Errorf("a %d-byte line: %.200s…", n, r.String())
		}
	}
}

// TestStoppedLineLast: "prefixd stopped" is logged once everything has
// stopped, the embedded etcd and the data dir's lock included, so its
// took is the whole shutdown.
func TestStoppedLineLast(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	etcdURL := "http://" + port.Addr().String()
	port.Close()
	logs, log := testlog.New(t)
	free := make(chan error, 1)
	log = slog.New(onMessage{Handler: log.Handler(), msg: "prefixd stopped", f: func() {
		// Whatever still runs holds the data dir.
		l, err := lockDataDir(dir)
		if err == nil {
			l.Close()
		}
		free <- err
	}})
	d := startDaemonWith(t, nil, func(c *Config) { c.DataDir, c.EmbeddedURL, c.Logger = dir, etcdURL, log })
	logs.Wait(t, 20*time.Second, "catalog synced")
	start := time.Now()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	if err := <-free; err != nil {
		t.Fatalf("when prefixd stopped was logged, the daemon still held its data dir: %v", err)
	}
	rec := logs.Wait(t, time.Second, "prefixd stopped")
	took, err := time.ParseDuration(rec.Attrs["took"])
	if err != nil || took > wall+time.Millisecond { // took is rounded to the millisecond
		t.Fatalf("took=%q; the stop took %v", rec.Attrs["took"], wall)
	}
	t.Logf("took=%v, stop %v", took, wall)
}

// onMessage is a slog.Handler that calls f before it handles a record
// with message msg.
type onMessage struct {
	slog.Handler
	msg string
	f   func()
}

func (h onMessage) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.f()
	}
	return h.Handler.Handle(ctx, r)
}

func (h onMessage) WithAttrs(as []slog.Attr) slog.Handler {
	return onMessage{Handler: h.Handler.WithAttrs(as), msg: h.msg, f: h.f}
}

func (h onMessage) WithGroup(name string) slog.Handler {
	return onMessage{Handler: h.Handler.WithGroup(name), msg: h.msg, f: h.f}
}
