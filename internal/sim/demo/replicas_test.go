package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/sim/gateway"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// The front ends users deploy in front of several serve replicas, each
// front end routing through its own replica: N prefixd proxies each with
// its own --server, or a gateway spreading its ext_proc streams over N
// endpoint pickers. Requests alternate between the front ends, so every
// replica books only its share; booking sync (--replica-sync-listen) is
// what lets each replica select with the others' bookings.

// TestReplicasShareBookingsThroughProxies: two serve replicas on one
// etcd, two mock engines, a prefixd proxy per replica, requests
// alternating between the proxies (sharedBookings says what is checked).
// Without booking sync (--replica-sync-listen off) each replica sees only
// the requests routed through it: the control that the checks would
// catch sync being broken.
func TestReplicasShareBookingsThroughProxies(t *testing.T) {
	t.Parallel()
	for _, synced := range []bool{true, false} {
		t.Run(syncName(synced), func(t *testing.T) {
			t.Parallel()
			sharedBookings(t, frontProxy, synced)
		})
	}
}

// TestReplicasShareBookingsThroughGateways is the same through the test
// gateway (Envoy's side of ext_proc) in front of each replica's endpoint
// picker (--epp-listen): the picker books in the replica's coordinator
// without the HTTP API, and its bookings reach the other replica all the
// same.
func TestReplicasShareBookingsThroughGateways(t *testing.T) {
	t.Parallel()
	for _, synced := range []bool{true, false} {
		t.Run(syncName(synced), func(t *testing.T) {
			t.Parallel()
			sharedBookings(t, frontGateway, synced)
		})
	}
}

func syncName(synced bool) string {
	if synced {
		return "sync"
	}
	return "sync off"
}

// frontEnd is what routes a replica's share of the requests.
type frontEnd int

const (
	frontProxy   frontEnd = iota // prefixd proxy --server <replica>
	frontGateway                 // the test gateway → the replica's endpoint picker
)

// sharedRequests is how many requests the test holds in flight, half
// through each front end.
const sharedRequests = 4

// sharedBookings sends sharedRequests requests, alternating between the
// two front ends, to engines whose clock is held: every request stays in
// flight, booked, until the test lets the engines run. After each
// request it checks, with booking sync, that the other replica's
// selection counts the request's blocks on the engine that serves it (a
// /select pinned to each engine with a prompt of no whole block shows the
// engine's booked blocks: both replicas show the same on every engine)
// and that the engines stay balanced (each front end sends an unrelated
// prompt to the engine the other replica has not loaded); without sync,
// that the other replica's selection does not change. Then the engines
// run, every request completes, and both replicas hold no booking, local
// or a peer's: nothing leaks through sync.
func sharedBookings(t *testing.T, front frontEnd, synced bool) {
	s := startShared(t, front, synced)
	a, b := s.replicas[0], s.replicas[1]
	done := make([]<-chan error, sharedRequests)
	for i := range sharedRequests {
		via, other := s.replicas[i%2], s.replicas[1-i%2]
		viaBefore, otherBefore, before := via.booked(t), other.booked(t), s.inflight()
		done[i] = s.send(via.front, i)
		var on uint64
		testsupport.Eventually(t, 10*time.Second, fmt.Sprintf("request %d at an engine", i), func() bool {
			for id, n := range s.inflight() {
				if n > before[id] {
					on = id
					return true
				}
			}
			return false
		})
		// The front end books before it forwards: the booking is in its
		// replica's selection once the engine has the request.
		viaNow := via.booked(t)
		d := viaNow[on] - viaBefore[on]
		if d <= 0 {
			t.Fatalf("request %d through replica %s runs on engine %d, which %s's selection shows %d → %d blocks booked on", i, via.name, on, via.name, viaBefore[on], viaNow[on])
		}
		if !synced {
			if got := other.booked(t); !maps.Equal(got, otherBefore) {
				t.Fatalf("request %d through replica %s (engine %d, %d blocks): without sync replica %s's selection changed %v → %v", i, via.name, on, d, other.name, otherBefore, got)
			}
			continue
		}
		testsupport.Eventually(t, 10*time.Second, fmt.Sprintf("request %d's %d blocks on engine %d, booked through replica %s, in replica %s's selection", i, d, on, via.name, other.name), func() bool {
			return maps.Equal(other.booked(t), viaNow)
		})
		if n := s.inflight(); n[1]-n[2] > 1 || n[2]-n[1] > 1 {
			t.Fatalf("after request %d the engines run %v requests: replica %s did not avoid the engine the other loaded", i, n, via.name)
		}
	}
	t.Logf("held in flight: requests per engine %v; blocks booked per engine in a's selection %v, in b's %v", s.inflight(), a.booked(t), b.booked(t))
	// Held, the bookings stand still: /workers lists what selection counts.
	for _, r := range []*sharedReplica{a, b} {
		if got, want := r.listed(t), r.booked(t); !maps.Equal(got, want) {
			t.Fatalf("replica %s: /workers lists %v blocks booked per engine, its selection counts %v", r.name, got, want)
		}
	}
	if synced {
		for _, r := range s.replicas {
			peer := s.replicas[0]
			if r == peer {
				peer = s.replicas[1]
			}
			if got := r.metric(t, "prefixd_replica_peer_bookings", "peer", peer.name); got != sharedRequests/2 {
				t.Errorf("replica %s holds %v of %s's bookings, want %d", r.name, got, peer.name, sharedRequests/2)
			}
		}
	}

	s.release()
	for i, ch := range done {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("request %d not answered within 20 s of the engines running", i)
		}
	}
	zero := map[uint64]int{1: 0, 2: 0}
	for _, r := range s.replicas {
		testsupport.Eventually(t, 10*time.Second, "no booking left in replica "+r.name, func() bool {
			return maps.Equal(r.booked(t), zero) && maps.Equal(r.listed(t), zero) && r.metric(t, "prefixd_reservations_live") == 0 &&
				r.metric(t, "prefixd_plans_live") == 0 && r.metric(t, "prefixd_replica_peer_bookings") == 0
		})
		if synced {
			if gaps, refused := r.metric(t, "prefixd_replica_seq_gaps_total"), r.metric(t, "prefixd_replica_deltas_refused_total"); gaps+refused != 0 {
				t.Errorf("replica %s: %v gaps in its peer's deltas, %v refused", r.name, gaps, refused)
			}
		}
	}
	for _, g := range s.gateways {
		if st := g.Stats(); st.Requests != sharedRequests/2 || st.Fallbacks+st.ProtocolErrors+st.EPPFailures != 0 || len(st.Immediate) != 0 {
			t.Errorf("gateway %+v", st)
		}
	}
}

// sharedStack is one etcd, two mock engines on one virtual clock, two
// serve replicas and a front end per replica.
type sharedStack struct {
	ctx      context.Context
	clock    *mocker.VirtualClock
	release  func() // lets the engines run, from then on
	engines  []*mocker.Engine
	replicas []*sharedReplica
	gateways []*gateway.Gateway
}

// sharedReplica is one serve replica and the front end routing through
// it.
type sharedReplica struct {
	name  string
	cl    *client.Client
	reg   *prometheus.Registry
	epp   string // its endpoint picker's address (gateway front ends)
	front string // the front end's URL
}

// startShared starts the stack. The engines' clock is held from the
// start: a request stays at its engine, its prefill not started, until
// release.
func startShared(t *testing.T, front frontEnd, synced bool) *sharedStack {
	t.Helper()
	ctx, emb, store := e2eEtcd(t)
	s := &sharedStack{ctx: ctx, clock: mocker.NewVirtualClock(time.Now())}
	// The engines, the replicas and the front ends stop at cleanup, in
	// the order they would in a fleet: front ends, replicas, engines,
	// etcd.
	fl := mocker.NewFleet(context.Background(), store, nil)
	t.Cleanup(func() {
		if err := fl.Stop(); err != nil {
			t.Errorf("engines: %v", err)
		}
	})
	for id := uint64(1); id <= 2; id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		w := catalog.Worker{WorkerID: id, ModelName: model, Endpoint: "http://" + ln.Addr().String()}
		// A step costs 1 ms on the held clock: none ends until release.
		e, err := fl.Start(ctx, mocker.Config{TotalBlocks: 256, BlockSize: 16, Worker: w, Clock: s.clock,
			Timing: mocker.Timing{StepOverhead: time.Millisecond}, LeaseTTL: 5 * time.Second}, ln)
		if err != nil {
			t.Fatal(err)
		}
		s.engines = append(s.engines, e)
	}
	for _, name := range []string{"a", "b"} {
		s.replicas = append(s.replicas, startSharedReplica(t, emb.Endpoints(), name, synced, front == frontGateway))
	}
	testsupport.Eventually(t, 30*time.Second, "both replicas ready, following both engines (and each other, with sync)", func() bool {
		for _, r := range s.replicas {
			ws, err := r.cl.Workers(ctx, model, "")
			if err != nil || r.cl.Ready(ctx) != nil || len(ws) != len(s.engines) {
				return false
			}
			for _, w := range ws {
				for _, l := range w.Listeners {
					if l.Status != api.StatusActive {
						return false
					}
				}
			}
			if synced && r.metric(t, "prefixd_replica_peers_connected") != 1 {
				return false
			}
		}
		return true
	})
	log := slog.New(slog.DiscardHandler)
	for _, r := range s.replicas {
		switch front {
		case frontProxy:
			url, stop, err := startProxy(context.Background(), client.New(r.cl.BaseURL, ""), proxy.Config{}, log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			r.front = url
		case frontGateway:
			url, gw, stop, err := startGateway(context.Background(), r.epp, Config{Log: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			r.front, s.gateways = url, append(s.gateways, gw)
		}
	}
	var once sync.Once
	s.release = func() {
		once.Do(func() { testsupport.Go(t, "the engines' clock", s.run) })
	}
	// A test that fails with requests held lets them end before the
	// front ends and engines stop.
	t.Cleanup(s.release)
	return s
}

// run advances the engines' clock whenever an engine waits on it, until
// ctx ends.
func (s *sharedStack) run(ctx context.Context) error {
	for {
		changed := s.clock.Changed()
		for {
			if _, ok := s.clock.AdvanceToNext(); !ok {
				break
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// startSharedReplica starts serve replica name on etcd, with booking sync
// on loopback (or off) and an endpoint picker if epp.
func startSharedReplica(t *testing.T, etcd []string, name string, synced, epp bool) *sharedReplica {
	t.Helper()
	r := &sharedReplica{name: name, reg: prometheus.NewRegistry()}
	eppAddr := make(chan string, 1)
	cfg := daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd, DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
		Registry: r.reg, ReadyTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Subscriber: stream.SubscriberConfig{ProbeInterval: 100 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond}}
	if synced {
		cfg.Replica = daemon.ReplicaConfig{Listen: "127.0.0.1:0", ID: name} // "" is --replica-sync-listen off
	}
	if epp {
		cfg.EPP = daemon.EPPConfig{Listen: "127.0.0.1:0", OnReady: func(a string) { eppAddr <- a }}
	}
	addr, _ := testsupport.Ready(t, "replica "+name, func(ctx context.Context, ready func(string)) error {
		cfg.OnReady = ready
		return daemon.Run(ctx, cfg)
	})
	r.cl = client.New("http://"+addr, "")
	t.Cleanup(r.cl.HTTP.CloseIdleConnections) // before the replica stops
	if epp {
		r.epp = <-eppAddr // sent before OnReady
	}
	return r
}

// booked is the blocks booked on each engine in r's selection: a /select
// pinned to the engine with a prompt of no whole block previews the
// engine's load, its bookings' blocks (the replica's own, and with sync
// its peer's).
func (r *sharedReplica) booked(t *testing.T) map[uint64]int {
	t.Helper()
	out := map[uint64]int{}
	for id := uint64(1); id <= 2; id++ {
		sel, err := r.cl.Select(context.Background(), api.SelectRequest{Prompt: api.Prompt{TokenIDs: []uint32{1}}, ModelName: model,
			PinnedWorker: &api.WorkerRef{WorkerID: id}})
		if err != nil {
			t.Fatalf("replica %s: select on engine %d: %v", r.name, id, err)
		}
		out[id] = sel.PotentialDecodeBlocks
	}
	return out
}

// listed is the blocks booked on each engine as r's /workers lists them
// (each rank's load, booked).
func (r *sharedReplica) listed(t *testing.T) map[uint64]int {
	t.Helper()
	ws, err := r.cl.Workers(context.Background(), model, "")
	if err != nil {
		t.Fatalf("replica %s: /workers: %v", r.name, err)
	}
	out := map[uint64]int{}
	for _, w := range ws {
		if l, ok := w.Listeners[0]; ok && l.Load != nil {
			out[w.InstanceID] = l.Load.Booked.Blocks
		}
	}
	return out
}

// metric sums the series of a metric of r whose labels include labels.
func (r *sharedReplica) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return testsupport.MetricSum(t, r.reg, name, labels...)
}

// inflight is the requests each engine holds: queued, transferring or
// running.
func (s *sharedStack) inflight() map[uint64]int {
	out := map[uint64]int{}
	for _, e := range s.engines {
		l := e.Load()
		out[e.Worker().WorkerID] = l.Waiting + l.Transferring + l.Running
	}
	return out
}

// send posts request i, a streamed completion of a 64-word prompt no
// other request shares, to the front end at url in the background; the
// channel gets nil once the whole stream has arrived, ending in [DONE].
func (s *sharedStack) send(url string, i int) <-chan error {
	var prompt strings.Builder
	for w := range 64 {
		fmt.Fprintf(&prompt, "u%d_%d ", i, w)
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"stream":true}`, model, strings.TrimSpace(prompt.String()))
	out := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
		if err != nil {
			out <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- err
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			out <- err
		case resp.StatusCode != http.StatusOK || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")):
			out <- fmt.Errorf("%d %.300q", resp.StatusCode, b)
		default:
			out <- nil
		}
	}()
	return out
}
