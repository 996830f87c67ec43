package replica

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
)

var pool = coordinator.PoolKey{Model: "m", Group: "default", Role: coordinator.RoleAggregated}

func newService(origin string, hub *Hub) *coordinator.Service {
	cfg := coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Origin: origin}
	if hub != nil {
		cfg.OnBooking = hub.Booked
	}
	svc := coordinator.NewService(cfg)
	for id := uint64(1); id <= 2; id++ {
		e := coordinator.Engine{Worker: coordinator.Worker{Rank: indexer.Rank{WorkerID: id}, Model: "m", Group: "default",
			Role: coordinator.RoleAggregated, Endpoint: fmt.Sprintf("http://w%d:8000", id)}, DPRanks: []uint32{0}, BlockSize: 16}
		if err := svc.SetEngine(e); err != nil {
			panic(err)
		}
	}
	return svc
}

// noRevoke is a store whose replica never revokes its lease: a process
// killed with SIGKILL.
type noRevoke struct{ catalog.ReplicaStore }

func (noRevoke) Revoke(context.Context, catalog.LeaseID) error { return nil }

type replicaT struct {
	id   string
	svc  *coordinator.Service
	sync *Sync
	stop func() error
	seen chan uint64 // Applied's seq, any peer (the benchmark's)
	hub  *Hub
}

func startReplica(t testing.TB, store catalog.ReplicaStore, id string, ttl time.Duration) *replicaT {
	t.Helper()
	return startReplicaWith(t, store, id, ttl, 0, nil)
}

// startReplicaWith starts a replica whose hub holds buffer deltas per
// subscriber; applied, if set, runs after each message it applies.
func startReplicaWith(t testing.TB, store catalog.ReplicaStore, id string, ttl time.Duration, buffer int, applied func()) *replicaT {
	t.Helper()
	hub := NewHub(buffer)
	r := &replicaT{id: id, svc: newService(id, hub), seen: make(chan uint64, 1<<16), hub: hub}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.sync, err = New(Config{ID: id, Advertise: ln.Addr().String(), Listener: ln, Service: r.svc, Hub: hub, Store: store, LeaseTTL: ttl,
		Logger: slog.New(slog.DiscardHandler), Applied: func(_ string, seq uint64) {
			if applied != nil {
				applied()
			}
			r.seen <- seq
		}})
	if err != nil {
		t.Fatal(err)
	}
	_, r.stop = testsupport.Ready(t, "replica "+id, func(ctx context.Context, ready func(string)) error {
		ready(ln.Addr().String())
		return r.sync.Run(ctx)
	})
	return r
}

func store(t testing.TB, e *etcdstore.Embedded, prefix string) *storetest.EtcdStore {
	return storetest.NewEtcdStore(t, e.Endpoints(), prefix)
}

func load(svc *coordinator.Service, worker uint64) coordinator.Selection {
	r := indexer.Rank{WorkerID: worker}
	c, err := svc.Select(coordinator.SelectRequest{Pool: pool, Hashes: []uint64{42}, Pin: &r})
	if err != nil {
		panic(err)
	}
	return c.Selection
}

func reserve(t testing.TB, svc *coordinator.Service, id string, worker uint64, blocks int) {
	t.Helper()
	r := indexer.Rank{WorkerID: worker}
	h := make([]uint64, blocks)
	for i := range h {
		h[i] = uint64(len(id))<<32 + uint64(i) + 1000
	}
	if _, err := svc.Reserve(coordinator.SelectRequest{ID: id, Pool: pool, Hashes: h, Pin: &r}); err != nil {
		t.Fatal(err)
	}
}

// TestSyncBookingsFollowReplicas: three replicas on one etcd. Bookings
// made before a peer joins reach it in the snapshot, later ones as
// deltas; a replica that stops takes its bookings with it at once, one
// killed (its lease not revoked) within the lease TTL, and one that
// restarts under its id starts clean.
func TestSyncBookingsFollowReplicas(t *testing.T) {
	e := storetest.StartEtcd(t)
	prefix := "/sync-test/prefixd/v1"
	const ttl = time.Second
	a := startReplica(t, store(t, e, prefix), "a", ttl)
	reserve(t, a.svc, "early", 1, 4) // before b exists: b gets it in a's snapshot
	b := startReplica(t, store(t, e, prefix), "b", ttl)
	testsupport.Eventually(t, 10*time.Second, "b holds a's early booking", func() bool { return load(b.svc, 1).ActiveRequests == 1 })
	reserve(t, a.svc, "late", 1, 6)
	reserve(t, b.svc, "b1", 2, 3)
	testsupport.Eventually(t, 5*time.Second, "a's and b's bookings on both", func() bool {
		return load(b.svc, 1).ActiveRequests == 2 && load(a.svc, 2).ActiveRequests == 1
	})
	if got, want := load(b.svc, 1).PotentialDecodeBlocks, load(a.svc, 1).PotentialDecodeBlocks; got != want {
		t.Fatalf("worker 1 on b: %d blocks, a's own view %d", got, want)
	}
	must(t, a.svc.ReservePrefillComplete("late"))
	must(t, a.svc.Free("early"))
	testsupport.Eventually(t, 5*time.Second, "a's free on b", func() bool {
		return load(b.svc, 1) == load(a.svc, 1)
	})

	// A killed replica: its lease runs out, b drops its bookings.
	c := startReplica(t, noRevoke{store(t, e, prefix)}, "c", ttl)
	reserve(t, c.svc, "c1", 2, 5)
	testsupport.Eventually(t, 10*time.Second, "c's booking on b", func() bool { return load(b.svc, 2).ActiveRequests == 2 })
	killed := time.Now()
	must(t, c.stop())
	testsupport.Eventually(t, 10*time.Second, "c's bookings leave b", func() bool { return load(b.svc, 2).ActiveRequests == 1 })
	if took := time.Since(killed); took > 3*ttl+time.Second { // etcd rounds a lease up and checks expiry each 500 ms
		t.Fatalf("c's bookings left b %v after the kill, lease TTL %v", took, ttl)
	}

	// A stopped replica revokes its record: its bookings leave at once.
	must(t, a.stop())
	testsupport.Eventually(t, 5*time.Second, "a's bookings leave b", func() bool { return load(b.svc, 1).ActiveRequests == 0 })
	if ps := b.svc.Peers(); len(ps) != 0 {
		t.Fatalf("b still holds %+v", ps)
	}
	// a again, under its id, with nothing booked: b follows the new a.
	a2 := startReplica(t, store(t, e, prefix), "a", ttl)
	reserve(t, a2.svc, "again", 1, 2)
	testsupport.Eventually(t, 10*time.Second, "the restarted a's booking on b", func() bool { return load(b.svc, 1).ActiveRequests == 1 })
	testsupport.Eventually(t, 10*time.Second, "b's booking on the restarted a", func() bool { return load(a2.svc, 2).ActiveRequests == 1 })
}

// TestSyncSlowPeer: a peer that stops reading never slows bookings
// down: the sender's buffer for it overflows, its deltas are dropped
// and counted, its stream ends, and once it reads again it resyncs from
// a snapshot to the sender's exact load.
func TestSyncSlowPeer(t *testing.T) {
	e := storetest.StartEtcd(t)
	prefix := "/slow/prefixd/v1"
	a := startReplicaWith(t, store(t, e, prefix), "a", 2*time.Second, 4, nil)
	gate := make(chan struct{})
	var stalled atomic.Bool
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	defer release()
	b := startReplicaWith(t, store(t, e, prefix), "b", 2*time.Second, 0, func() {
		if stalled.Load() {
			<-gate
		}
	})
	reserve(t, a.svc, "first", 1, 1)
	testsupport.Eventually(t, 10*time.Second, "b synced with a", func() bool { return load(b.svc, 1).ActiveRequests == 1 })
	// b applies nothing now: the stream's flow-control windows fill,
	// then a's four-delta buffer for b.
	stalled.Store(true)
	for i := range 3000 {
		reserve(t, a.svc, fmt.Sprint("burst-", i), 1+uint64(i%2), 100)
	}
	_, dropped := a.hub.counters()
	if dropped["b"] == 0 {
		t.Fatalf("nothing dropped for a stalled peer after 3000 bookings")
	}
	release()
	testsupport.Eventually(t, 20*time.Second, "b resynced to a's load", func() bool {
		return load(b.svc, 1) == load(a.svc, 1) && load(b.svc, 2) == load(a.svc, 2)
	})
	if ps := b.svc.Peers(); len(ps) != 1 || ps[0].Bookings != 3001 {
		t.Fatalf("b holds %+v, want a's 3001 bookings", ps)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestHubDropsForASlowSubscriber: a subscriber whose buffer is full is
// marked to resubscribe and its deltas count as dropped; selection's
// hook never waits; others go on.
func TestHubDropsForASlowSubscriber(t *testing.T) {
	h := NewHub(2)
	slow, fast := h.add("slow"), h.add("fast")
	for i := range 3 {
		h.Booked(coordinator.BookingDelta{Seq: uint64(i + 1)})
		if i < 2 {
			if ds, _ := h.take(fast); len(ds) != 1 {
				t.Fatalf("fast took %d", len(ds))
			}
		}
	}
	ds, overflow := h.take(slow)
	if len(ds) != 2 || !overflow {
		t.Fatalf("slow: %d deltas, overflow %v", len(ds), overflow)
	}
	if ds, overflow := h.take(fast); len(ds) != 1 || overflow {
		t.Fatalf("fast: %d deltas, overflow %v", len(ds), overflow)
	}
	h.Booked(coordinator.BookingDelta{Seq: 4})
	_, dropped := h.counters()
	if dropped["slow"] != 2 || dropped["fast"] != 0 {
		t.Fatalf("dropped %v", dropped)
	}
}

// BenchmarkDeltaLatency measures a booking's trip from one replica's
// Reserve to its application on a peer, over loopback gRPC: p50 and p99
// in µs.
func BenchmarkDeltaLatency(b *testing.B) {
	e := storetest.StartEtcd(b)
	prefix := "/bench/prefixd/v1"
	a := startReplica(b, store(b, e, prefix), "a", 2*time.Second)
	peer := startReplica(b, store(b, e, prefix), "b", 2*time.Second)
	reserve(b, a.svc, "warm", 1, 1)
	testsupport.Eventually(b, 10*time.Second, "b synced with a", func() bool { return load(peer.svc, 1).ActiveRequests == 1 })
	for len(peer.seen) > 0 {
		<-peer.seen
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint("r", i)
		start := time.Now()
		reserve(b, a.svc, id, 1, 8)
		<-peer.seen
		lat = append(lat, time.Since(start))
		b.StopTimer()
		must(b, a.svc.Free(id))
		<-peer.seen
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
