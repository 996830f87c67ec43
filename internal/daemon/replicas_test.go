package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// killed is a replica store that never revokes: the replica's record
// outlives it until its lease runs out, as after SIGKILL.
type killed struct{ catalog.ReplicaStore }

func (killed) Revoke(context.Context, catalog.LeaseID) error { return nil }

// TestReplicasShareBookings: two serve replicas on one etcd, with booking
// sync on loopback gRPC and two mock engines. Bookings made through one
// (POST /select_and_reserve, as the proxy books) change the other's
// selection: it sees their blocks and requests on the booked engine and
// sends an unpinned request to the other one. The booking replica
// killed (no revoke, no unregister), its bookings leave the other
// within the lease TTL.
func TestReplicasShareBookings(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	const ttl = 2 * time.Second
	replicaOf := func(id string, kill bool) func(*Config) {
		return func(c *Config) {
			c.Replica = ReplicaConfig{Listen: "127.0.0.1:0", ID: id, LeaseTTL: ttl, Resync: time.Second}
			if kill {
				c.Replica.store = func(s catalog.ReplicaStore) catalog.ReplicaStore { return killed{s} }
			}
		}
	}
	a := startDaemonWith(t, etcd.Endpoints(), replicaOf("a", true))
	b := startDaemonWith(t, etcd.Endpoints(), replicaOf("b", false))
	for id := uint64(1); id <= 2; id++ {
		e := publishtest.Start(t, 0)
		reg := map[string]any{"instance_id": id, "endpoint": e.Pub.Endpoint(), "replay_endpoint": e.Pub.ReplayEndpoint(),
			"model_name": "m", "block_size": 16, "engine_endpoint": fmt.Sprintf("http://127.0.0.1:%d", 9000+id)}
		if code, body := call(t, "POST", a.url+"/register", "", reg); code != http.StatusCreated {
			t.Fatalf("register %d: %d %s", id, code, body)
		}
	}
	prompt := func(base int) []uint32 {
		tokens := make([]uint32, 64)
		for i := range tokens {
			tokens[i] = uint32(base + i)
		}
		return tokens
	}
	sel := func(d *testDaemon, pin uint64) api.Selection {
		t.Helper()
		req := map[string]any{"model_name": "m", "token_ids": prompt(7_000_000)}
		if pin != 0 {
			req["pinned_worker"] = map[string]any{"worker_id": pin}
		}
		code, body := call(t, "POST", d.url+"/select", "", req)
		if code != 200 {
			t.Fatalf("select: %d %s", code, body)
		}
		var r api.Selection
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, d := range []*testDaemon{a, b} {
		testsupport.Eventually(t, 20*time.Second, "both engines selectable", func() bool {
			code, _ := call(t, "POST", d.url+"/select", "", map[string]any{"model_name": "m", "token_ids": prompt(1), "pinned_worker": map[string]any{"worker_id": 2}})
			return code == 200
		})
	}
	if got := sel(b, 1).PotentialDecodeBlocks; got != 4 {
		t.Fatalf("worker 1 on b before any booking: %d blocks, want the prompt's 4", got)
	}
	// Eight requests through a, on engine 1: 32 blocks.
	for i := range 8 {
		req := map[string]any{"model_name": "m", "selection_id": fmt.Sprint("req-", i), "token_ids": prompt(i * 1000),
			"pinned_worker": map[string]any{"worker_id": 1}}
		if code, body := call(t, "POST", a.url+"/select_and_reserve", "", req); code != 200 {
			t.Fatalf("select_and_reserve %d: %d %s", i, code, body)
		}
	}
	testsupport.Eventually(t, 10*time.Second, "a's bookings in b's selection", func() bool { return sel(b, 1).PotentialDecodeBlocks == 36 })
	for range 5 {
		if r := sel(b, 0); r.WorkerID != 2 {
			t.Fatalf("b chose worker %d, the one a booked: %+v", r.WorkerID, r)
		}
	}
	_, metrics := call(t, "GET", b.url+"/metrics", "", nil)
	for _, want := range []string{`prefixd_replica_peer_bookings{peer="a"} 8`, `prefixd_replica_peers_connected 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("b's metrics lack %s", want)
		}
	}
	// A freed booking leaves b too.
	if code, body := call(t, "DELETE", a.url+"/reservations/req-0", "", nil); code/100 != 2 {
		t.Fatalf("free req-0: %d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "a's free in b's selection", func() bool { return sel(b, 1).PotentialDecodeBlocks == 32 })

	killedAt := time.Now()
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 3*ttl, "the killed replica's bookings to leave b", func() bool { return sel(b, 1).PotentialDecodeBlocks == 4 })
	t.Logf("a's bookings left b %v after a was killed (lease TTL %v)", time.Since(killedAt).Round(time.Millisecond), ttl)
	if el := time.Since(killedAt); el > ttl+2*time.Second {
		t.Fatalf("a's bookings left b %v after the kill; want within the lease TTL %v (+2 s of etcd's expiry granularity)", el, ttl)
	}
}
