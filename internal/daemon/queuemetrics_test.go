package daemon

import (
	"bytes"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestQueueMetricsShedLog: the observer counts shedding by clamped
// priority and reason, and logShed writes one line per pool with the
// counts since the last line, then nothing until more is shed.
func TestQueueMetricsShedLog(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newQueueMetrics(reg)
	a := coordinator.PoolKey{Model: "a", Group: "default"}
	b := coordinator.PoolKey{Model: "b", Group: "g"}
	for range 3 {
		m.Waited(a, -50, 0, coordinator.WaitShed)
	}
	m.Waited(a, 2, time.Second, coordinator.WaitExpired)
	m.Waited(b, 50, time.Second, coordinator.WaitShed)
	m.Waited(b, 0, time.Second, coordinator.WaitPlaced)
	m.Waited(b, 0, time.Second, coordinator.WaitCancelled)
	m.QueueLen(b, 4)
	for _, c := range []struct {
		prio, reason string
		want         float64
	}{{"-10", "queue_full", 3}, {"2", "wait_expired", 1}, {"10", "queue_full", 1}, {"0", "queue_full", 0}} {
		if got := testsupport.MetricSum(t, reg, "prefixd_queue_shed_total", "priority", c.prio, "reason", c.reason); got != c.want {
			t.Errorf("shed_total{priority=%s,reason=%s} = %v, want %v", c.prio, c.reason, got, c.want)
		}
	}
	if got := testsupport.MetricSum(t, reg, "prefixd_queue_waiting", "model", "b", "routing_group", "g", "role", "aggregated"); got != 4 {
		t.Errorf("waiting = %v, want 4", got)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	m.logShed(log, 10*time.Second)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "model=a routing_group=default role=aggregated queue_full=3 wait_expired=1 over=10s") ||
		!strings.Contains(lines[1], "model=b routing_group=g role=aggregated queue_full=1 wait_expired=0") {
		t.Fatalf("shed log:\n%s", buf.String())
	}
	buf.Reset()
	m.logShed(log, 10*time.Second)
	if buf.Len() != 0 {
		t.Fatalf("logged again with nothing shed since:\n%s", buf.String())
	}
}

// TestQueueConfig: threshold 0 is no queue, a zero Queue the defaults, and
// a bad threshold or bound fails the start.
func TestQueueConfig(t *testing.T) {
	if qc, err := (QueueConfig{}).queueConfig(); qc != nil || err != nil {
		t.Fatalf("threshold 0: %+v, %v; want no queue", qc, err)
	}
	if qc, err := (QueueConfig{Threshold: 0.5}).queueConfig(); err != nil || qc == nil || !reflect.DeepEqual(*qc, coordinator.DefaultQueueConfig()) {
		t.Fatalf("zero queue: %+v, %v; want the defaults", qc, err)
	}
	fcfs := coordinator.QueueConfig{Order: coordinator.QueueFCFS, MaxLen: 3}
	if qc, err := (QueueConfig{Threshold: 1, Queue: fcfs}).queueConfig(); err != nil || qc == nil || !reflect.DeepEqual(*qc, fcfs) {
		t.Fatalf("fcfs: %+v, %v; want it as given", qc, err)
	}
	for _, c := range []QueueConfig{{Threshold: -1}, {Threshold: math.NaN()}, {Threshold: math.Inf(1)},
		{Threshold: 0.5, Queue: coordinator.QueueConfig{MaxLen: -1}}} {
		if _, err := c.queueConfig(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
