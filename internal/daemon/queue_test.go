package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// queueFixture is a daemon with the router queue on (threshold 0.5) and
// two mock engines of max_num_batched_tokens 64: a worker is busy once
// more than 32 prefill tokens are booked on it.
type queueFixture struct {
	t    *testing.T
	logs *testlog.Recorder
	url  string
	reg  *prometheus.Registry
	next int // distinct prompts and ids
}

const queueTestMNBT = 64

func startQueueFixture(t *testing.T, maxLen int, edits ...func(*Config)) *queueFixture {
	t.Helper()
	etcd := storetest.StartEtcd(t)
	reg := prometheus.NewRegistry()
	logs, log := testlog.New(t)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) {
		c.Registry, c.Logger = reg, log
		c.Queue = QueueConfig{Threshold: 0.5, Queue: coordinator.QueueConfig{Order: coordinator.QueueFCFS, Aging: time.Second,
			MaxLen: maxLen, MaxWait: time.Minute}}
		for _, e := range edits {
			e(c)
		}
	})
	store := storetest.NewEtcdStore(t, etcd.Endpoints(), catalog.DefaultPrefix)
	ctx, cancel := context.WithCancel(context.Background())
	fleet := mocker.NewFleet(ctx, store, nil)
	t.Cleanup(func() {
		cancel()
		if err := fleet.Stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("fleet: %v", err)
		}
	})
	for id := uint64(1); id <= 2; id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		w := catalog.Worker{WorkerID: id, ModelName: "m", Endpoint: "http://" + ln.Addr().String(),
			Attributes: catalog.Attributes{MaxNumBatchedTokens: queueTestMNBT}}
		if _, err := fleet.Start(ctx, mocker.Config{TotalBlocks: 64, BlockSize: 16, Worker: w, LeaseTTL: 5 * time.Second}, ln); err != nil {
			t.Fatal(err)
		}
	}
	logs.Wait(t, 20*time.Second, "router queue on: requests that may wait wait while every engine of their pool is busy",
		"threshold=0.5", "order=fcfs", "aging=1s", "max_len="+strconv.Itoa(maxLen), "max_wait=1m0s", "bands=0")
	f := &queueFixture{t: t, logs: logs, url: d.url, reg: reg}
	testsupport.Eventually(t, 20*time.Second, "both engines schedulable", func() bool {
		for w := 1; w <= 2; w++ {
			code, _ := call(t, "POST", d.url+"/select", "", map[string]any{"model_name": "m", "token_ids": f.prompt(16), "allowed_worker_ids": []int{w}})
			if code != 200 {
				return false
			}
		}
		return true
	})
	return f
}

// prompt returns n tokens no other prompt of the test shares.
func (f *queueFixture) prompt(n int) []uint32 {
	f.next++
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(f.next*10_000 + i)
	}
	return toks
}

func (f *queueFixture) id(what string) string {
	f.next++
	return fmt.Sprintf("%s-%d", what, f.next)
}

// fill books 48 prefill tokens on each engine (over 0.5 × 64): every
// engine is busy. It returns the bookings by worker.
func (f *queueFixture) fill() map[uint64]string {
	f.t.Helper()
	ids := map[uint64]string{}
	for w := uint64(1); w <= 2; w++ {
		ids[w] = f.id("fill")
		code, body := call(f.t, "POST", f.url+"/reservations", "", map[string]any{"selection_id": ids[w], "model_name": "m",
			"worker_id": w, "token_ids": f.prompt(48)})
		if code != http.StatusCreated {
			f.t.Fatalf("reserve on worker %d: %d %s", w, code, body)
		}
	}
	return ids
}

func (f *queueFixture) free(id string) {
	f.t.Helper()
	if code, body := call(f.t, "DELETE", f.url+"/reservations/"+id, "", nil); code != 200 {
		f.t.Fatalf("free %s: %d %s", id, code, body)
	}
}

// answer is a /select_and_reserve's answer.
type answer struct {
	code       int
	body       []byte
	retryAfter string
	sel        api.Selection
	err        error
}

// selectWait posts a /select_and_reserve of id, a prompt of 48 tokens
// (one makes an engine busy); wait is its "wait" (nil:
// none) and prio, when not empty, its x-prefixd-priority header.
func (f *queueFixture) selectWait(ctx context.Context, id string, wait map[string]any, prio string) answer {
	body := map[string]any{"selection_id": id, "model_name": "m", "token_ids": f.prompt(48)}
	if wait != nil {
		body["wait"] = wait
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/select_and_reserve", bytes.NewReader(b))
	if prio != "" {
		req.Header.Set(api.PriorityHeader, prio)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	a.body, a.err = io.ReadAll(resp.Body)
	if a.code == 200 {
		a.err = json.Unmarshal(a.body, &a.sel)
	}
	return a
}

// waitAsync runs selectWait on its own goroutine.
func (f *queueFixture) waitAsync(ctx context.Context, id string, wait map[string]any, prio string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- f.selectWait(ctx, id, wait, prio) }()
	return ch
}

func (f *queueFixture) waiting() float64 {
	return testsupport.MetricSum(f.t, f.reg, "prefixd_queue_waiting", "model", "m", "routing_group", "default", "role", "aggregated")
}

func (f *queueFixture) awaitWaiting(n int) {
	f.t.Helper()
	testsupport.Eventually(f.t, 20*time.Second, fmt.Sprintf("%d requests waiting", n), func() bool { return f.waiting() == float64(n) })
}

// waits is how many waits ended with outcome.
func (f *queueFixture) waits(outcome string) uint64 {
	f.t.Helper()
	mf, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, m := range mf {
		if m.GetName() != "prefixd_queue_wait_seconds" {
			continue
		}
		for _, s := range m.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

func (f *queueFixture) shed(priority, reason string) float64 {
	return testsupport.MetricSum(f.t, f.reg, "prefixd_queue_shed_total", "priority", priority, "reason", reason)
}

func (f *queueFixture) live() float64 {
	return testsupport.MetricSum(f.t, f.reg, "prefixd_reservations_live")
}

func get(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no answer in 30 s")
	}
	return answer{}
}

// check429 checks a shed or expired request's answer: 429, a Retry-After
// of whole seconds ≥ 1, and a body naming the pool, priority and reason.
func check429(t *testing.T, a answer, priority int, reason string) {
	t.Helper()
	var body struct{ Error, Reason string }
	secs, err := strconv.Atoi(a.retryAfter)
	if a.code != http.StatusTooManyRequests || err != nil || secs < 1 || json.Unmarshal(a.body, &body) != nil || body.Reason != reason ||
		!bytes.Contains(a.body, []byte("pool m/default/aggregated")) || !bytes.Contains(a.body, []byte(fmt.Sprintf("priority %d ", priority))) {
		t.Fatalf("want a 429 (%s, priority %d) with Retry-After: %d %q %s", reason, priority, a.code, a.retryAfter, a.body)
	}
}

// TestDaemonQueuePlacesOnFreedEngine: with every engine busy, a
// /select_and_reserve with wait blocks in the queue and is answered 200
// once a booking is freed, on the engine that freed.
func TestDaemonQueuePlacesOnFreedEngine(t *testing.T) {
	t.Parallel()
	f := startQueueFixture(t, 8)
	fill := f.fill()
	ch := f.waitAsync(context.Background(), "a", map[string]any{"timeout_ms": 30_000}, "")
	f.awaitWaiting(1)
	select {
	case a := <-ch:
		t.Fatalf("answered while every engine is busy: %d %s", a.code, a.body)
	default:
	}
	f.free(fill[2])
	a := get(t, ch)
	if a.code != 200 || a.sel.WorkerID != 2 || a.sel.SelectionID != "a" {
		t.Fatalf("placed: %d %s, want worker 2", a.code, a.body)
	}
	f.awaitWaiting(0)
	if n := f.waits("placed"); n != 1 {
		t.Fatalf("prefixd_queue_wait_seconds{outcome=placed} count %d, want 1", n)
	}
	f.free("a")
	f.free(fill[1])
	if n := f.live(); n != 0 {
		t.Fatalf("%v reservations live after every one was freed", n)
	}
}

// TestDaemonQueueSheds: past --queue-max-len the lowest priority is
// answered 429 with Retry-After, a newcomer of a lower priority at once,
// a waiter of a lower priority when a higher one comes; past its
// timeout_ms a waiter is answered 429 too. A bad wait is a 400.
func TestDaemonQueueSheds(t *testing.T) {
	t.Parallel()
	f := startQueueFixture(t, 2)
	fill := f.fill()
	ctx := context.Background()
	low := f.waitAsync(ctx, "low", map[string]any{"timeout_ms": 30_000}, "") // priority 0
	f.awaitWaiting(1)
	high := f.waitAsync(ctx, "high", map[string]any{"timeout_ms": 30_000, "priority": 5}, "")
	f.awaitWaiting(2)
	// Full: a newcomer below everything waiting is refused on arrival.
	check429(t, f.selectWait(ctx, "lower", map[string]any{"timeout_ms": 30_000}, "-3"), -3, "queue_full")
	// One above the lowest pushes it out (priority from the header).
	mid := f.waitAsync(ctx, "mid", map[string]any{"timeout_ms": 30_000}, "1")
	check429(t, get(t, low), 0, "queue_full")
	f.awaitWaiting(2)
	if a, b := f.shed("-3", "queue_full"), f.shed("0", "queue_full"); a != 1 || b != 1 {
		t.Fatalf("prefixd_queue_shed_total{reason=queue_full}: priority -3 %v, 0 %v; want 1 each", a, b)
	}
	if n := f.waits("shed"); n != 2 {
		t.Fatalf("prefixd_queue_wait_seconds{outcome=shed} count %d, want 2", n)
	}
	// Priorities beyond ±10 share the label ±10.
	check429(t, f.selectWait(ctx, "sheddable", map[string]any{"priority": -500}, ""), -500, "queue_full")
	if n := f.shed("-10", "queue_full"); n != 1 {
		t.Fatalf("prefixd_queue_shed_total{priority=-10} %v, want 1", n)
	}
	// Freed capacity goes to the highest priority first.
	f.free(fill[1])
	if a := get(t, high); a.code != 200 || a.sel.WorkerID != 1 {
		t.Fatalf("high: %d %s, want worker 1", a.code, a.body)
	}
	f.awaitWaiting(1)
	select {
	case a := <-mid:
		t.Fatalf("mid answered while every engine is busy: %d %s", a.code, a.body)
	default:
	}
	f.free(fill[2])
	if a := get(t, mid); a.code != 200 || a.sel.WorkerID != 2 {
		t.Fatalf("mid: %d %s, want worker 2", a.code, a.body)
	}
	f.awaitWaiting(0)
	f.free("high")
	f.free("mid")

	// Past timeout_ms: 429, wait_expired.
	fill = f.fill()
	check429(t, f.selectWait(ctx, "late", map[string]any{"timeout_ms": 50, "priority": 2}, ""), 2, "wait_expired")
	f.awaitWaiting(0)
	if n, w := f.shed("2", "wait_expired"), f.waits("expired"); n != 1 || w != 1 {
		t.Fatalf("expired: shed_total %v, wait_seconds count %d; want 1, 1", n, w)
	}
	for _, c := range []struct {
		wait map[string]any
		prio string
		want string
	}{
		{map[string]any{"timeout_ms": -1}, "", "wait.timeout_ms"},
		{map[string]any{"timeout_ms": 3_600_001}, "", "wait.timeout_ms"},
		{map[string]any{"priority": 1001}, "", "wait.priority"},
		{map[string]any{}, "-1001", "wait.priority"},
		{map[string]any{}, "high", api.PriorityHeader},
	} {
		if a := f.selectWait(ctx, f.id("bad"), c.wait, c.prio); a.code != 400 || !bytes.Contains(a.body, []byte(c.want)) {
			t.Errorf("wait %v header %q: %d %s, want a 400 naming %s", c.wait, c.prio, a.code, a.body, c.want)
		}
	}
	f.free(fill[1])
	f.free(fill[2])
	if n := f.live(); n != 0 {
		t.Fatalf("%v reservations live after every one was freed", n)
	}
}

// TestDaemonQueueClientLeaves: a client that disconnects while waiting
// leaves the queue and nothing is booked for it; without wait nothing
// waits (busy engines take the request at once, as without a queue).
func TestDaemonQueueClientLeaves(t *testing.T) {
	t.Parallel()
	f := startQueueFixture(t, 8)
	fill := f.fill()
	ctx, cancel := context.WithCancel(context.Background())
	ch := f.waitAsync(ctx, "gone", map[string]any{"timeout_ms": 30_000}, "")
	f.awaitWaiting(1)
	cancel()
	if a := <-ch; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("cancelled client: %d %s %v", a.code, a.body, a.err)
	}
	f.awaitWaiting(0)
	testsupport.Eventually(t, 20*time.Second, "the wait counted as cancelled", func() bool { return f.waits("cancelled") == 1 })
	if n := f.live(); n != 2 {
		t.Fatalf("%v reservations live, want the 2 fills alone", n)
	}
	f.free(fill[2])
	if code, body := call(t, "DELETE", f.url+"/reservations/gone", "", nil); code != http.StatusNotFound {
		t.Fatalf("the departed client's id: %d %s, want 404 (never booked)", code, body)
	}

	// Without wait: no queue, even with every engine busy.
	fill = map[uint64]string{1: fill[1]}
	code, body := call(t, "POST", f.url+"/reservations", "", map[string]any{"selection_id": "refill", "model_name": "m", "worker_id": 2, "token_ids": f.prompt(48)})
	if code != http.StatusCreated {
		t.Fatalf("refill: %d %s", code, body)
	}
	fill[2] = "refill"
	if a := f.selectWait(context.Background(), "now", nil, "5"); a.code != 200 || a.err != nil {
		t.Fatalf("without wait: %d %s %v", a.code, a.body, a.err)
	}
	if n := f.waiting(); n != 0 {
		t.Fatalf("%v waiting after a request without wait", n)
	}
	for _, id := range []string{"now", fill[1], fill[2]} {
		f.free(id)
	}
	if n := f.live(); n != 0 {
		t.Fatalf("%v reservations live after every one was freed", n)
	}
}
