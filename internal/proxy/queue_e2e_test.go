package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// gate stands in front of a mock engine's HTTP API and holds its
// generation requests until the test opens it: a held request has had no
// first byte, so its booking's prefill stays incomplete and keeps the
// engine busy for the router queue. The other routes (/tokenize, /v1/models)
// pass at once.
type gate struct {
	mu       sync.Mutex
	open     chan struct{} // closed when the gate opens
	isOpen   bool
	arrivals int      // generation requests that reached the gate
	bodies   []string // their bodies
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

// start serves the gate in front of the engine at target and returns its
// URL.
func (g *gate) start(t testing.TB, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	// Its own connections, closed at the end: a connection dialled but
	// never used would hold the engine's graceful stop for 5 s.
	tr := &http.Transport{}
	rp.Transport, rp.FlushInterval = tr, -1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/completions") {
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				return
			}
			g.mu.Lock()
			g.arrivals++
			g.bodies = append(g.bodies, string(body))
			open := g.open
			g.mu.Unlock()
			select {
			case <-open:
			case <-r.Context().Done():
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() {
		g.release() // no request stays held past the test
		srv.Close()
		tr.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String()
}

// release opens the gate: held and later requests go through.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isOpen {
		close(g.open)
		g.isOpen = true
	}
}

func (g *gate) seen() (int, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.arrivals, append([]string(nil), g.bodies...)
}

// queueStack is a stack whose prefixd serve runs the router queue
// (threshold 0.5, fcfs, at most maxLen waiting, a minute's wait) in front
// of two gated engines of max_num_batched_tokens 64: a request of more
// than 32 uncached prompt tokens held at its engine's gate keeps that
// engine busy.
type queueStack struct {
	*stack
	reg   *prometheus.Registry
	gates []*gate
}

func startQueueStack(t *testing.T, maxLen int) *queueStack {
	t.Helper()
	return startQueueStackTimed(t, maxLen, mocker.Timing{})
}

// startQueueStackTimed is startQueueStack with the engines' steps priced
// by timing.
func startQueueStackTimed(t *testing.T, maxLen int, timing mocker.Timing) *queueStack {
	t.Helper()
	q := &queueStack{reg: prometheus.NewRegistry(), gates: []*gate{newGate(), newGate()}}
	q.stack = startStackDaemon(t, func(c *daemon.Config) {
		c.Registry = q.reg
		c.Queue = daemon.QueueConfig{Threshold: 0.5, Queue: coordinator.QueueConfig{Order: coordinator.QueueFCFS, Aging: time.Second,
			MaxLen: maxLen, MaxWait: time.Minute}}
	}, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated, batched: 64, gate: q.gates[0], timing: timing},
		spec{id: 2, role: catalog.RoleAggregated, batched: 64, gate: q.gates[1], timing: timing})
	return q
}

// waiting is prefixd_queue_waiting of the stack's pool.
func (q *queueStack) waiting() int {
	return int(testsupport.MetricSum(q.t, q.reg, "prefixd_queue_waiting", "model", model, "routing_group", "default", "role", "aggregated"))
}

// waits is how many waits ended with outcome (prefixd_queue_wait_seconds'
// count).
func (q *queueStack) waits(outcome string) uint64 {
	q.t.Helper()
	mfs, err := q.reg.Gather()
	if err != nil {
		q.t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "prefixd_queue_wait_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// arrived is how many generation requests reached the engines' gates.
func (q *queueStack) arrived() int {
	n := 0
	for _, g := range q.gates {
		a, _ := g.seen()
		n += a
	}
	return n
}

func (q *queueStack) release() {
	for _, g := range q.gates {
		g.release()
	}
}

func (q *queueStack) live() int {
	return int(testsupport.MetricSum(q.t, q.reg, "prefixd_reservations_live"))
}

// reply is a client's answer from the proxy.
type reply struct {
	seed       int
	code       int
	retryAfter string
	body       string
	err        error
}

// send posts a completion of longPrompt(seed) (some 200 tokens: one
// makes an engine busy) to the proxy.
func (q *queueStack) send(ctx context.Context, seed int, hdr ...string) reply {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": longPrompt(seed), "max_tokens": 2})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, q.url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{seed: seed, err: err}
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return reply{seed: seed, code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(out), err: err}
}

// replies collects the answers of clients running concurrently.
type replies struct {
	mu  sync.Mutex
	got []reply
	wg  sync.WaitGroup
}

func (rs *replies) start(q *queueStack, ctx context.Context, seed int, hdr ...string) {
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		r := q.send(ctx, seed, hdr...)
		rs.mu.Lock()
		rs.got = append(rs.got, r)
		rs.mu.Unlock()
	}()
}

func (rs *replies) snapshot() []reply {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return append([]reply(nil), rs.got...)
}

// wait waits for every client, failing t past a deadline.
func (rs *replies) wait(t *testing.T) []reply {
	t.Helper()
	done := make(chan struct{})
	go func() { rs.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("clients unanswered after 30 s: %d answered", len(rs.snapshot()))
	}
	return rs.snapshot()
}

// TestQueueThroughProxy: many clients at once through prefixd proxy, two
// engines held busy by their first requests and a router queue of 3.
// Every client is either at an engine, waiting, or answered 429 with a
// Retry-After — and the 429s are exactly the clients beyond the engines
// and the queue's bound (none while it had room). A client of a higher
// priority then pushes out a waiter (429). When the engines answer again
// the queue drains: every waiter is served 200 having waited, nothing
// waits and nothing stays booked.
func TestQueueThroughProxy(t *testing.T) {
	const clients, maxLen = 12, 3
	q := startQueueStack(t, maxLen)
	var rs replies
	for i := range clients {
		rs.start(q, context.Background(), 100+i)
	}
	// Saturated: nothing moves until the gates open.
	// While the engines are held, an answer can only be a refusal.
	var refused []reply
	testsupport.Eventually(t, 20*time.Second, "every client at an engine, waiting or refused", func() bool {
		refused = rs.snapshot()
		return q.arrived()+q.waiting()+len(refused) == clients && q.waiting() == maxLen
	})
	atEngines, n429 := q.arrived(), len(refused)
	if atEngines < 2 || n429 != clients-atEngines-maxLen {
		t.Fatalf("%d at the engines, %d waiting, %d answered: want ≥ 2 at the engines and the rest beyond the queue's %d answered", atEngines, q.waiting(), n429, maxLen)
	}
	for _, r := range refused {
		secs, err := strconv.Atoi(r.retryAfter)
		if r.err != nil || r.code != http.StatusTooManyRequests || err != nil || secs < 1 || !strings.Contains(r.body, "queue") {
			t.Errorf("client %d beyond the queue: %d Retry-After %q %s %v; want a 429 with whole seconds ≥ 1", r.seed, r.code, r.retryAfter, r.body, r.err)
		}
	}
	if shed := testsupport.MetricSum(t, q.reg, "prefixd_queue_shed_total", "reason", "queue_full"); int(shed) != n429 {
		t.Errorf("prefixd_queue_shed_total{reason=queue_full} %v, want the %d 429s", shed, n429)
	}
	// A client of a higher priority (the x-prefixd-priority header) at the
	// full queue pushes out a waiter of priority 0: one more 429, not its.
	rs.start(q, context.Background(), 999, api.PriorityHeader, "5")
	testsupport.Eventually(t, 20*time.Second, "a waiter pushed out", func() bool { return len(rs.snapshot()) == n429+1 })
	if last := rs.snapshot()[n429]; last.seed == 999 || last.code != http.StatusTooManyRequests || last.retryAfter == "" {
		t.Fatalf("pushed out: client %d, %d Retry-After %q %s; want a waiter of priority 0 answered 429", last.seed, last.code, last.retryAfter, last.body)
	}
	if w := q.waiting(); w != maxLen {
		t.Fatalf("%d waiting after the higher priority came, want %d", w, maxLen)
	}
	n429++
	if shed := testsupport.MetricSum(t, q.reg, "prefixd_queue_shed_total", "priority", "0", "reason", "queue_full"); int(shed) != n429 {
		t.Errorf("prefixd_queue_shed_total{priority=0,reason=queue_full} %v, want %d", shed, n429)
	}
	if n := q.waits("placed"); n != 0 {
		t.Errorf("%d waits placed while the engines were held", n)
	}

	q.release()
	all := rs.wait(t)
	ok := 0
	for _, r := range all {
		if r.code == http.StatusOK {
			decodeCompletion(t, r.body)
			ok++
		}
	}
	if ok != clients+1-n429 {
		t.Fatalf("%d answered 200, want %d (every client within the bounds)", ok, clients+1-n429)
	}
	testsupport.Eventually(t, 10*time.Second, "the queue drained", func() bool { return q.waiting() == 0 && q.live() == 0 })
	if n, shed := q.waits("placed"), testsupport.MetricSum(t, q.reg, "prefixd_queue_shed_total"); n != maxLen || int(shed) != n429 {
		t.Errorf("after the drain: %d waits placed, %v shed; want the %d that waited, the %d refused", n, shed, maxLen, n429)
	}
	if got := q.arrived(); got != clients+1-n429 {
		t.Errorf("%d requests reached the engines, want %d: none of the refused", got, clients+1-n429)
	}
}

// TestQueueUnderLoadThroughProxy: the engines run at their own pace (a
// prompt of some 200 tokens prefills in 4 steps of 64 tokens, about half a
// second), nothing held back: twelve clients at once are each served 200
// or answered 429 with Retry-After, never more 429s than the clients
// beyond the two engines and the queue of 3; some were served having
// waited; then nothing waits and nothing stays booked.
func TestQueueUnderLoadThroughProxy(t *testing.T) {
	const clients, maxLen = 12, 3
	q := startQueueStackTimed(t, maxLen, mocker.Timing{MaxNumBatchedTokens: 64, MaxNumSeqs: 16, StepOverhead: 50 * time.Millisecond,
		PrefillPerToken: time.Millisecond, DecodePerSeq: time.Millisecond})
	q.release()
	var rs replies
	for i := range clients {
		rs.start(q, context.Background(), 100+i)
	}
	ok, n429 := 0, 0
	for _, r := range rs.wait(t) {
		switch secs, err := strconv.Atoi(r.retryAfter); {
		case r.err == nil && r.code == http.StatusOK:
			decodeCompletion(t, r.body)
			ok++
		case r.err == nil && r.code == http.StatusTooManyRequests && err == nil && secs >= 1:
			n429++
		default:
			t.Errorf("client %d: %d Retry-After %q %s %v; want 200, or 429 with Retry-After", r.seed, r.code, r.retryAfter, r.body, r.err)
		}
	}
	t.Logf("%d served, %d refused, %d served after waiting", ok, n429, q.waits("placed"))
	if n429 > clients-2-maxLen {
		t.Errorf("%d 429s: more than the %d clients beyond the engines and the queue", n429, clients-2-maxLen)
	}
	if shed := testsupport.MetricSum(t, q.reg, "prefixd_queue_shed_total", "reason", "queue_full"); int(shed) != n429 {
		t.Errorf("prefixd_queue_shed_total{reason=queue_full} %v, want the %d 429s", shed, n429)
	}
	if n := q.waits("placed"); n == 0 || n > uint64(ok) {
		t.Errorf("%d waits placed, want some of the %d served", n, ok)
	}
	testsupport.Eventually(t, 10*time.Second, "the queue drained", func() bool { return q.waiting() == 0 && q.live() == 0 })
}

// TestQueueClientLeavesThroughProxy: a client that disconnects while its
// request waits in prefixd's queue (behind engines held busy) takes it out
// of the queue: nothing is booked for it and it never reaches an engine,
// while the others are served once the engines answer.
func TestQueueClientLeavesThroughProxy(t *testing.T) {
	q := startQueueStack(t, 8)
	var rs replies
	// One client at a time until one waits: the engines are busy then.
	cancels := map[int]context.CancelFunc{}
	waiter := 0
	for seed := 1; waiter == 0; seed++ {
		arrived := q.arrived()
		if seed > 5 {
			t.Fatalf("%d clients at the engines and none waits", arrived)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		cancels[seed] = cancel
		rs.start(q, ctx, seed)
		testsupport.Eventually(t, 20*time.Second, "the client at an engine or waiting", func() bool {
			return q.arrived() > arrived || q.waiting() == 1
		})
		if q.waiting() == 1 {
			waiter = seed
		}
	}
	held := q.live()
	if held != q.arrived() {
		t.Fatalf("%d reservations live, %d requests at the engines", held, q.arrived())
	}
	cancels[waiter]()
	testsupport.Eventually(t, 20*time.Second, "the departed client out of the queue", func() bool {
		return q.waiting() == 0 && q.waits("cancelled") == 1
	})
	if n := q.live(); n != held {
		t.Fatalf("%d reservations live after the waiting client left, want the %d at the engines", n, held)
	}
	// The proxy counts it as the client's leaving, not prefixd's failure.
	testsupport.Eventually(t, 10*time.Second, "the departed client counted", func() bool {
		_, page := q.get("/metrics")
		return strings.Contains(page, `prefixd_proxy_requests_total{outcome="client_gone",route="completions"} 1`)
	})
	if _, page := q.get("/metrics"); strings.Contains(page, "prefixd_proxy_fallbacks_total{") {
		t.Errorf("the departed client counted as a fallback")
	}
	if n := q.logs.Count("proxy: prefixd did not choose; routing by load"); n != 0 {
		t.Errorf("the departed client logged as prefixd failing to choose")
	}
	q.release()
	for _, r := range rs.wait(t) {
		switch {
		case r.seed == waiter && r.err == nil:
			t.Errorf("the departed client was answered: %d %s", r.code, r.body)
		case r.seed != waiter && r.code != http.StatusOK:
			t.Errorf("client %d: %d %s %v", r.seed, r.code, r.body, r.err)
		}
	}
	if n := q.waits("placed"); n != 0 {
		t.Errorf("%d waits placed, want none: the one waiter left", n)
	}
	for _, g := range q.gates {
		_, bodies := g.seen()
		for _, b := range bodies {
			if strings.Contains(b, fmt.Sprintf("conversation %d:", waiter)) {
				t.Errorf("the departed client's request reached an engine")
			}
		}
	}
}
