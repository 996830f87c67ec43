package epp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// The router queue through the picker: every engine's max_num_batched_tokens
// is 100 and an engine is busy past half of it, so one booked prompt of
// 100 token ids (prefill not yet complete) keeps an engine busy.
const (
	queueBatched = 100
	queueEngine1 = "127.0.0.1:1"
	queueEngine2 = "127.0.0.2:1"
)

var queuePool = coordinator.PoolKey{Model: model, Group: catalog.DefaultRoutingGroup, Role: coordinator.RoleAggregated}

// startQueued is a picker over a Service with a router queue of qcfg.
func startQueued(t *testing.T, cfg epp.Config, qcfg coordinator.QueueConfig, engines map[uint64]string) *picker {
	t.Helper()
	scfg := coordinator.ServiceConfig{Pool: coordinator.DefaultPoolConfig(), Queue: &qcfg, QueueBusy: coordinator.Thresholds{PrefillTokensFrac: 0.5}}
	cfg.Fallbacks = -1
	return startPickerWith(t, cfg, scfg, engines, queueBatched)
}

// idsBody is a completions request of 100 token ids, distinct per seed.
func idsBody(seed int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","prompt":[`)
	for i := range 100 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(seed*1000 + i))
	}
	b.WriteString(`]}`)
	return b.String()
}

// pending is a request whose answer is awaited on another goroutine.
type pending struct {
	x    *exchange
	done chan result
}

type result struct {
	a   answer
	err error
}

// start sends r on a new stream; its answer arrives on done.
func (e *envoy) start(r req) *pending {
	p := &pending{x: e.open(), done: make(chan result, 1)}
	go func() {
		a, err := p.x.request(r)
		p.done <- result{a, err}
	}()
	return p
}

// wait returns p's answer, failing t if none comes in time.
func (p *pending) wait(t *testing.T) answer {
	t.Helper()
	select {
	case r := <-p.done:
		if r.err != nil {
			t.Fatalf("answer: %v", r.err)
		}
		return r.a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	return answer{}
}

// unanswered fails t if p was answered.
func (p *pending) unanswered(t *testing.T, what string) {
	t.Helper()
	select {
	case r := <-p.done:
		t.Fatalf("%s: answered while it waits: %+v %v", what, r.a, r.err)
	default:
	}
}

// hold books a request of seed on the engine at addr (the subset hint
// pins it) and keeps it booked: its prefill incomplete.
func hold(t *testing.T, p *picker, seed int, addr string) *exchange {
	t.Helper()
	x := p.envoy.open()
	a, err := x.request(req{body: idsBody(seed), subset: []string{addr}})
	if err != nil || a.header != addr {
		t.Fatalf("hold on %s: %+v %v", addr, a, err)
	}
	return x
}

// finish serves x's request where it went and ends its stream.
func finish(t *testing.T, x *exchange, addr string) {
	t.Helper()
	if err := x.respond(addr, 200, "data: a\n\n", "data: [DONE]\n\n"); err != nil {
		t.Fatal(err)
	}
	if err := x.close(); err != nil {
		t.Fatal(err)
	}
}

func waitingIs(t *testing.T, p *picker, n int) {
	t.Helper()
	testsupport.Eventually(t, 10*time.Second, fmt.Sprintf("%d waiting", n), func() bool { return p.svc.Waiting(queuePool) == n })
}

// TestPickerQueueHoldsUntilFreed: with every engine busy, a request's
// stream gets no answer while it waits (in both body modes); when one
// engine's booking is freed the request is placed there, and the
// destination names it.
func TestPickerQueueHoldsUntilFreed(t *testing.T) {
	t.Parallel()
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
		t.Run(mode.String(), func(t *testing.T) {
			p := startQueued(t, epp.Config{}, coordinator.DefaultQueueConfig(), map[uint64]string{1: "http://" + queueEngine1, 2: "http://" + queueEngine2})
			a := hold(t, p, 1, queueEngine1)
			b := hold(t, p, 2, queueEngine2)

			c := p.envoy.start(req{body: idsBody(3), mode: mode})
			waitingIs(t, p, 1)
			c.unanswered(t, "every engine busy")
			if got := p.svc.Reservations(); got != 2 {
				t.Fatalf("%d reservations while one request waits, want 2", got)
			}

			finish(t, b, queueEngine2)
			ans := c.wait(t)
			if ans.status != 0 || ans.header != queueEngine2 || ans.header != ans.meta || (mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && ans.body != idsBody(3)) {
				t.Fatalf("placed: %+v, want the freed engine %s", ans, queueEngine2)
			}
			waitingIs(t, p, 0)
			finish(t, c.x, queueEngine2)
			finish(t, a, queueEngine1)
		})
	}
}

// TestPickerQueueSheds: a full queue (MaxLen 1) sheds the lower
// priority with a 429 and Retry-After, whether it waited or just came;
// a wait past the queue's MaxWait is a 429 too; both are counted by
// reason.
func TestPickerQueueSheds(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	qcfg := coordinator.DefaultQueueConfig()
	qcfg.MaxLen = 1
	p := startQueued(t, epp.Config{Registerer: reg}, qcfg, map[uint64]string{1: "http://" + queueEngine1})
	a := hold(t, p, 1, queueEngine1)

	low := p.envoy.start(req{body: idsBody(2), headers: []string{epp.PriorityHeader, "-1"}})
	waitingIs(t, p, 1)
	low.unanswered(t, "low")
	high := p.envoy.start(req{body: idsBody(3), headers: []string{epp.PriorityHeader, "5"}})
	shed := low.wait(t)
	if shed.status != http.StatusTooManyRequests || !strings.Contains(shed.errBody, "queue is full (priority -1)") {
		t.Errorf("the lower priority, pushed out: %+v", shed)
	}
	if s, err := strconv.Atoi(shed.retryAfter); err != nil || s < 1 {
		t.Errorf("retry-after %q: want whole seconds, at least 1", shed.retryAfter)
	}
	waitingIs(t, p, 1)
	high.unanswered(t, "high")

	refused, err := p.envoy.do(req{body: idsBody(4)}) // priority 0 < 5: refused on arrival
	if err != nil || refused.status != http.StatusTooManyRequests || refused.retryAfter == "" || !strings.Contains(refused.errBody, `model \"m\" in routing group \"default\"`) {
		t.Errorf("the lower priority, arriving at a full queue: %+v %v", refused, err)
	}

	finish(t, a, queueEngine1)
	if ans := high.wait(t); ans.header != queueEngine1 {
		t.Fatalf("high: %+v", ans)
	}
	waitingIs(t, p, 0)

	// An expired wait: the queue's MaxWait.
	qcfg.MaxLen, qcfg.MaxWait = 0, 50*time.Millisecond
	reg2 := prometheus.NewRegistry()
	p2 := startQueued(t, epp.Config{Registerer: reg2}, qcfg, map[uint64]string{1: "http://" + queueEngine1})
	a2 := hold(t, p2, 1, queueEngine1)
	if ans, err := p2.envoy.do(req{body: idsBody(2)}); err != nil || ans.status != http.StatusTooManyRequests || ans.retryAfter == "" ||
		!strings.Contains(ans.errBody, "waited past its deadline (priority 0)") {
		t.Errorf("expired: %+v %v", ans, err)
	}
	finish(t, a2, queueEngine1)
	finish(t, high.x, queueEngine1)

	want := func(full, expired int) string {
		return fmt.Sprintf(`
# HELP prefixd_epp_shed_total Requests the router queue would not hold, answered 429 with Retry-After, by reason: queue_full (refused on arrival or pushed out by a higher priority), wait_expired.
# TYPE prefixd_epp_shed_total counter
%s%s`, map[bool]string{true: fmt.Sprintf("prefixd_epp_shed_total{reason=\"queue_full\"} %d\n", full)}[full > 0],
			map[bool]string{true: fmt.Sprintf("prefixd_epp_shed_total{reason=\"wait_expired\"} %d\n", expired)}[expired > 0])
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(2, 0)), "prefixd_epp_shed_total"); err != nil {
		t.Error(err)
	}
	if err := testutil.GatherAndCompare(reg2, strings.NewReader(want(0, 1)), "prefixd_epp_shed_total"); err != nil {
		t.Error(err)
	}
	if n := testsupport.MetricSum(t, reg, "prefixd_epp_errors_total", "status", "429"); n != 2 {
		t.Errorf("prefixd_epp_errors_total{status=429} %v, want 2", n)
	}
}

// TestPickerQueueStreamEnds: a stream that ends while its request waits
// takes it out of the queue with nothing booked; one that ends as its
// engine frees (racing the placement) leaves nothing booked either way.
func TestPickerQueueStreamEnds(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p := startQueued(t, epp.Config{Registerer: reg}, coordinator.DefaultQueueConfig(), map[uint64]string{1: "http://" + queueEngine1})
	a := hold(t, p, 1, queueEngine1)
	c := p.envoy.start(req{body: idsBody(2)})
	waitingIs(t, p, 1)
	c.x.cancel()
	waitingIs(t, p, 0)
	if r := <-c.done; r.err == nil {
		t.Errorf("a cancelled stream answered: %+v", r.a)
	}
	testsupport.Eventually(t, 10*time.Second, "the abandoned wait counted", func() bool {
		return testsupport.MetricSum(t, reg, "prefixd_epp_waits_abandoned_total") == 1
	})
	if r, b := p.svc.Reservations(), p.srv.Bookings(); r != 1 || b != 1 {
		t.Fatalf("after the waiting stream ended: %d reservations, %d bookings; want the held one", r, b)
	}
	finish(t, a, queueEngine1)

	for i := range 10 {
		a := hold(t, p, 10+2*i, queueEngine1)
		c := p.envoy.start(req{body: idsBody(11 + 2*i)})
		waitingIs(t, p, 1)
		go c.x.cancel()
		finish(t, a, queueEngine1)
		<-c.done
		testsupport.Eventually(t, 10*time.Second, "nothing booked or waiting", func() bool {
			return p.svc.Waiting(queuePool) == 0 && p.svc.Reservations() == 0 && p.srv.Bookings() == 0
		})
	}
}

// TestPickerQueuePriorities: the objective header's priority
// (Config.Priorities) orders the waiters, x-prefixd-priority wins over
// it, and a bad x-prefixd-priority is a 400 naming the header.
func TestPickerQueuePriorities(t *testing.T) {
	t.Parallel()
	p := startQueued(t, epp.Config{Priorities: map[string]int{"premium": 10, "batch": -5}}, coordinator.DefaultQueueConfig(),
		map[uint64]string{1: "http://" + queueEngine1})
	for _, v := range []string{"x", "1001", "-1001", "", "1.5"} {
		a, err := p.envoy.do(req{body: idsBody(1), headers: []string{epp.PriorityHeader, v}})
		if err != nil || a.status != http.StatusBadRequest || !strings.Contains(a.errBody, epp.PriorityHeader) {
			t.Errorf("priority %q: %+v %v", v, a, err)
		}
	}

	held := hold(t, p, 1, queueEngine1)
	batch := p.envoy.start(req{body: idsBody(2), headers: []string{epp.ObjectiveHeader, "batch"}})
	waitingIs(t, p, 1)
	overridden := p.envoy.start(req{body: idsBody(3), headers: []string{epp.ObjectiveHeader, "premium", epp.PriorityHeader, "-10"}})
	waitingIs(t, p, 2)
	premium := p.envoy.start(req{body: idsBody(4), headers: []string{epp.ObjectiveHeader, "premium"}})
	waitingIs(t, p, 3)

	// Each placement books the engine busy again: one waiter goes per
	// freed booking, the highest priority first.
	for i, next := range []*pending{premium, batch, overridden} {
		finish(t, held, queueEngine1)
		if a := next.wait(t); a.header != queueEngine1 {
			t.Fatalf("placed: %+v", a)
		}
		waitingIs(t, p, 2-i)
		held = next.x
	}
	finish(t, held, queueEngine1)

	for _, c := range []map[string]int{{"": 1}, {"a": 1001}, {"b": -1001}} {
		cfg := epp.Config{Priorities: c, Service: coordinator.NewService(coordinator.ServiceConfig{}), Endpoints: epp.NewEndpoints(nil, 0)}
		if _, err := epp.New(cfg); err == nil || !strings.Contains(err.Error(), "Config.Priorities") {
			t.Errorf("New(Priorities %v): %v, want an error naming the field", c, err)
		}
	}
}

// TestDaemonPassesObjectivePriorities: prefixd serve's
// --epp-objective-priority reaches the picker (daemon.EPPConfig.Priorities):
// a priority the picker refuses stops the daemon, naming the field.
func TestDaemonPassesObjectivePriorities(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := daemon.Run(ctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
		ReadyTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler),
		EPP: daemon.EPPConfig{Listen: "127.0.0.1:0", Priorities: map[string]int{"premium": epp.MaxPriority + 1}}})
	if err == nil || !strings.Contains(err.Error(), `Config.Priorities["premium"]`) {
		t.Fatalf("daemon.Run: %v, want the picker's error naming the priority", err)
	}
}
