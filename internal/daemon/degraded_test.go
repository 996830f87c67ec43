package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/status"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// gate is a TCP forwarder on loopback in front of an engine's socket: the
// engine's endpoint as the replicas see it. Shut, it closes the
// connections it carries and closes every new one at once (a dial that
// gets no ZMTP greeting), counting them; open again, it forwards.
type gate struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	open    bool
	conns   map[net.Conn]struct{}
	refused int
	changed chan struct{} // closed and replaced when refused grows
}

func newGate(t *testing.T, endpoint string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: strings.TrimPrefix(endpoint, "tcp://"), open: true, conns: map[net.Conn]struct{}{}, changed: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.serve(c, &wg)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		g.shut()
		wg.Wait()
	})
	return g
}

func (g *gate) endpoint() string { return "tcp://" + g.ln.Addr().String() }

func (g *gate) serve(c net.Conn, wg *sync.WaitGroup) {
	g.mu.Lock()
	if !g.open {
		g.refused++
		close(g.changed)
		g.changed = make(chan struct{})
		g.mu.Unlock()
		c.Close()
		return
	}
	g.mu.Unlock()
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	if !g.open { // shut while dialling
		g.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.mu.Unlock()
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		g.mu.Lock()
		delete(g.conns, dst)
		delete(g.conns, src)
		g.mu.Unlock()
	}
	go pipe(c, up)
	go pipe(up, c)
}

// shut closes every connection the gate carries and refuses new ones.
func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = false
	for c := range g.conns {
		c.Close()
	}
}

func (g *gate) reopen() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// waitRefused waits until the gate has refused more than n connections,
// and returns how many it has.
func (g *gate) waitRefused(t *testing.T, n int) int {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		g.mu.Lock()
		got, ch := g.refused, g.changed
		g.mu.Unlock()
		if got > n {
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the gate refused %d connections; waited for more than %d", got, n)
		}
	}
}

// flagViews is what each view of a daemon says of one rank's degraded
// flag: /workers, /dump, /metrics and `prefixd status` (built from
// /workers and /metrics as the command builds it).
type flagViews struct {
	workers, dump, metrics, status        bool
	workersWhy, dumpWhy, statusWhy, state string
	listed, dumped, scraped, statusListed bool
}

func (v flagViews) String() string {
	return fmt.Sprintf("/workers %v (listed %v) %q; /dump %v (dumped %v) %q; /metrics %v (scraped %v); status %v (listed %v) state %s %q",
		v.workers, v.listed, v.workersWhy, v.dump, v.dumped, v.dumpWhy, v.metrics, v.scraped, v.status, v.statusListed, v.state, v.statusWhy)
}

// agree reports whether every view lists the rank and says degraded,
// with one reason starting with why.
func (v flagViews) agree(degraded bool, why string) bool {
	listed := v.listed && v.dumped && v.scraped && v.statusListed
	flags := v.workers == degraded && v.dump == degraded && v.metrics == degraded && v.status == degraded
	reasons := v.workersWhy == v.dumpWhy && v.statusWhy == v.dumpWhy && strings.HasPrefix(v.dumpWhy, why) && (degraded || v.dumpWhy == "")
	return listed && flags && reasons
}

func viewsOf(t *testing.T, d *testDaemon, model string, id uint64, r uint32) flagViews {
	t.Helper()
	var v flagViews
	code, body := call(t, "GET", d.url+"/workers", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/workers: %d %s", code, body)
	}
	var ws []api.WorkerInfo
	if err := json.Unmarshal(body, &ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if l, ok := w.Listeners[r]; ok && w.InstanceID == id && w.ModelName == model {
			v.listed, v.workers, v.workersWhy = true, l.Degraded, l.DegradedReason
		}
	}
	code, body = call(t, "GET", d.url+"/metrics", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	m, err := status.ParseMetrics(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	val, ok := m.Get("prefixd_stream_degraded", "worker", fmt.Sprint(id), "rank", fmt.Sprint(r))
	v.scraped, v.metrics = ok, val == 1
	for _, sr := range status.Build(ws, m).Ranks {
		if sr.Worker == id && sr.Rank == r && sr.Model == model {
			v.statusListed, v.status, v.statusWhy, v.state = true, sr.Degraded, sr.DegradedReason, sr.State
		}
	}
	code, body = call(t, "GET", d.url+"/dump", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/dump: %d %s", code, body)
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(body, &parts); err != nil {
		t.Fatal(err)
	}
	for _, part := range parts {
		s, err := apiserver.UnmarshalSnapshot(part)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range s.Ranks {
			if w.Rank == (indexer.Rank{WorkerID: id, DPRank: r}) {
				v.dumped, v.dump, v.dumpWhy = true, w.Degraded, w.DegradedReason
			}
		}
	}
	return v
}

// mustAgree fails unless every view of d says degraded (with a reason
// starting with why) or not.
func mustAgree(t *testing.T, d *testDaemon, when string, degraded bool, why string) flagViews {
	t.Helper()
	v := viewsOf(t, d, "m", 1, 0)
	if !v.agree(degraded, why) {
		t.Fatalf("%s: the views disagree, want degraded %v (%q…): %s", when, degraded, why, v)
	}
	return v
}

// TestPeerRestoreDegradedEngineGone: replica A degrades a rank — its
// history was lost (a replay buffer too short), or the memory cap dropped
// some of its blocks — and then its engine becomes unreachable. Replica B
// starts with --peers A and restores A's dump. Every view of B (/workers,
// /dump, /metrics, `prefixd status`) says degraded, with A's reason: as
// soon as it lists the rank, and after each of its stream's connection
// attempts fails (A is stopped by then, so every attempt the gate refuses
// is B's). The flag stays up when the engine comes back with the same
// history (a verified resume does not restore what was lost), and is
// lifted in every view only when the truth is restored: by the engine's
// AllBlocksCleared, or by a fresh start of the engine (a new incarnation,
// replayed from its first batch).
func TestPeerRestoreDegradedEngineGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		maxEntries int    // A's memory cap (0: none)
		steps      int    // the engine's replay buffer
		why        string // the reason every view gives
		restart    bool   // the engine comes back as a new incarnation
	}{
		{name: "lost history, cleared", steps: 3, why: "lost history: "},
		{name: "lost history, engine restarted", steps: 3, why: "lost history: ", restart: true},
		{name: "memory cap, cleared", maxEntries: 4, why: indexer.TruncatedReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			etcd := storetest.StartEtcd(t)
			e := publishtest.Start(t, tc.steps)
			for range 8 {
				e.Store(1) // more than the replay buffer or the cap holds
			}
			pub, replay := newGate(t, e.Pub.Endpoint()), newGate(t, e.Pub.ReplayEndpoint())
			a := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.MaxEntries = tc.maxEntries })
			if code, body := register(t, a, map[string]any{"instance_id": 1, "endpoint": pub.endpoint(), "replay_endpoint": replay.endpoint(),
				"model_name": "m", "block_size": 16}); code != http.StatusCreated {
				t.Fatalf("register: %d %s", code, body)
			}
			testsupport.Eventually(t, 20*time.Second, "a's rank degraded and caught up", func() bool {
				l, ok := listener(t, a, "m", 1, 0)
				return ok && l.Degraded && l.LastSeq != nil && *l.LastSeq == e.Last && l.Status == api.StatusActive
			})
			va := mustAgree(t, a, "a, connected", true, tc.why)

			// The engine becomes unreachable: a says so, and stays degraded.
			pub.shut()
			replay.shut()
			testsupport.Eventually(t, 20*time.Second, "a's stream disconnected", func() bool {
				v := viewsOf(t, a, "m", 1, 0)
				return v.state == status.StateDown
			})
			mustAgree(t, a, "a, engine gone", true, tc.why)

			b := startDaemon(t, etcd.Endpoints(), "", a.url)
			// /workers lists the rank as soon as the catalog's watch
			// delivers it, and /metrics once its stream is followed: each
			// says degraded from its first word on.
			testsupport.Eventually(t, 20*time.Second, "every view of b lists the restored rank", func() bool {
				v := viewsOf(t, b, "m", 1, 0)
				if (v.listed && !v.workers) || (v.scraped && !v.metrics) || (v.statusListed && !v.status) {
					t.Fatalf("b lists the restored rank not degraded: %s", v)
				}
				return v.listed && v.dumped && v.scraped && v.statusListed
			})
			vb := mustAgree(t, b, "b, restored, engine gone", true, tc.why)
			if vb.dumpWhy != va.dumpWhy {
				t.Fatalf("b's reason %q, a's %q", vb.dumpWhy, va.dumpWhy)
			}
			if err := a.stop(); err != nil {
				t.Fatalf("stop a: %v", err)
			}
			n := 0
			for i := range 3 {
				n = pub.waitRefused(t, n)
				v := mustAgree(t, b, fmt.Sprintf("b, connection attempt %d refused", i+1), true, tc.why)
				if v.state != status.StateDown {
					t.Fatalf("b's rank is %s while its engine is unreachable: %s", v.state, v)
				}
			}

			if tc.restart {
				// A fresh start of the engine while it is unreachable: the
				// resume finds another history, and B replays the new one
				// whole — the truth, so the flag goes.
				e.Pub.Restart()
				e.Store(2)
				pub.reopen()
				replay.reopen()
				testsupport.Eventually(t, 20*time.Second, "b exact after the engine's fresh start", func() bool {
					l, ok := listener(t, b, "m", 1, 0)
					return ok && !l.Degraded && l.LastSeq != nil && *l.LastSeq == e.Last && l.Blocks == 2 && l.Status == api.StatusActive
				})
				mustAgree(t, b, "b, after the engine's fresh start", false, "")
				return
			}
			// The engine comes back with the same history: B verifies the
			// restored watermark and resumes — still degraded in every view.
			e.Store(1)
			pub.reopen()
			replay.reopen()
			testsupport.Eventually(t, 20*time.Second, "b resumed after the engine came back", func() bool {
				l, ok := listener(t, b, "m", 1, 0)
				return ok && l.LastSeq != nil && *l.LastSeq == e.Last && l.Status == api.StatusActive
			})
			mustAgree(t, b, "b, resumed", true, tc.why)

			// The engine clears its cache: the truth is restored.
			e.Publish(wire.Event{Kind: wire.KindAllBlocksCleared})
			e.Store(2)
			testsupport.Eventually(t, 20*time.Second, "b exact after the engine cleared", func() bool {
				l, ok := listener(t, b, "m", 1, 0)
				return ok && !l.Degraded && l.LastSeq != nil && *l.LastSeq == e.Last && l.Blocks == 2
			})
			mustAgree(t, b, "b, after AllBlocksCleared", false, "")
		})
	}
}

// TestDegradedBeforeFirstConnection: a daemon's views of a rank its
// stream has not connected to yet (the engine is not up) agree that it is
// not degraded — nothing is known to be missing — and the metric exists
// from the start.
func TestDegradedBeforeFirstConnection(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	ln.Close() // nothing listens there: every dial is refused
	if code, body := register(t, d, map[string]any{"instance_id": 1, "endpoint": ep, "model_name": "m", "block_size": 16}); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	testsupport.Eventually(t, 20*time.Second, "the rank listed and scraped", func() bool {
		v := viewsOf(t, d, "m", 1, 0)
		return v.listed && v.scraped
	})
	v := viewsOf(t, d, "m", 1, 0)
	if v.workers || v.metrics || v.status || v.dump || v.state != status.StateDown {
		t.Fatalf("a rank never connected: %s", v)
	}
}
