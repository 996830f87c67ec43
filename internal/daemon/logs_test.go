package daemon

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
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
