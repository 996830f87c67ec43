package daemon

import (
	"context"
	"encoding/json"
	"fmt"
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
