package epp_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// metricSum adds up the series of name on a metrics page whose labels
// include every one of labels (`key="value"` strings).
func metricSum(page, name string, labels ...string) float64 {
	var sum float64
lines:
	for _, line := range strings.Split(page, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				continue lines
			}
		}
		if f, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64); err == nil {
			sum += f
		}
	}
	return sum
}

// TestEPPQueueEndToEnd: prefixd serve with its router queue (threshold
// 0.5, one waiter at most) and the endpoint picker, two mock engines of
// max_num_batched_tokens 100, each held busy by a request of 100 token
// ids whose answer has not begun. A third request's stream waits,
// unanswered; a fourth, at the full queue, is answered 429 with
// retry-after; when one engine's request ends the waiter is sent to that
// engine, and serve's metrics count one wait placed and one shed.
func TestEPPQueueEndToEnd(t *testing.T) {
	s := startStack(t, func(c *daemon.Config) {
		c.Queue = daemon.QueueConfig{Threshold: 0.5, Queue: coordinator.QueueConfig{Order: coordinator.QueueFCFS, Aging: time.Second,
			MaxLen: 1, MaxWait: time.Minute}}
	}, engineSpec{id: 1, batched: 100}, engineSpec{id: 2, batched: 100})
	pool := []string{`model="m"`, `routing_group="default"`, `role="aggregated"`}
	waiting := func(n float64) {
		t.Helper()
		testsupport.Eventually(t, 10*time.Second, "the queue's length", func() bool { return metricSum(s.metrics(), "prefixd_queue_waiting", pool...) == n })
	}
	held := map[uint64]*exchange{}
	for id := uint64(1); id <= 2; id++ {
		x := s.envoy.open()
		a, err := x.request(req{body: idsBody(int(id)), subset: []string{s.addrs[id]}})
		if err != nil || a.header != s.addrs[id] {
			t.Fatalf("hold engine %d: %+v %v", id, a, err)
		}
		held[id] = x
	}

	c := s.envoy.start(req{body: idsBody(3)})
	waiting(1)
	c.unanswered(t, "every engine busy")

	full, err := s.envoy.do(req{body: idsBody(4)})
	if secs, perr := strconv.Atoi(full.retryAfter); err != nil || full.status != http.StatusTooManyRequests || perr != nil || secs < 1 ||
		!strings.Contains(full.errBody, "queue is full") {
		t.Fatalf("at the full queue: %+v %v; want a 429 with retry-after of whole seconds ≥ 1", full, err)
	}
	c.unanswered(t, "after the refusal")

	finish(t, held[2], s.addrs[2])
	if a := c.wait(t); a.status != 0 || a.header != s.addrs[2] || a.meta != a.header {
		t.Fatalf("the waiter: %+v, want the freed engine %s", a, s.addrs[2])
	}
	waiting(0)
	page := s.metrics()
	if placed, shed := metricSum(page, "prefixd_queue_wait_seconds_count", `outcome="placed"`), metricSum(page, "prefixd_queue_shed_total", `reason="queue_full"`); placed != 1 || shed != 1 {
		t.Errorf("prefixd_queue_wait_seconds_count{outcome=placed} %v, prefixd_queue_shed_total{reason=queue_full} %v; want 1 and 1", placed, shed)
	}
	finish(t, c.x, s.addrs[2])
	finish(t, held[1], s.addrs[1])
}
