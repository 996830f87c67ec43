package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/coordinator"
)

// QueueConfig configures the router queue (docs/operations.md, "Routing
// under overload").
type QueueConfig struct {
	// Threshold: a request that may wait (an API call with "wait", every request of
	// prefixd proxy and the endpoint picker) waits while every engine of its pool holds more
	// booked prefill than Threshold × its max_num_batched_tokens. 0: no queue.
	Threshold float64
	// Queue orders and bounds it (coordinator.DefaultQueueConfig when zero).
	Queue coordinator.QueueConfig
}

// queueConfig is the coordinator's queue configuration of c: nil when
// the queue is off, the defaults when c.Queue is zero. Its bounds are
// checked (coordinator.NewQueue) so that a bad one fails the start, not
// the first request that waits.
func (c QueueConfig) queueConfig() (*coordinator.QueueConfig, error) {
	if math.IsNaN(c.Threshold) || math.IsInf(c.Threshold, 0) || c.Threshold < 0 {
		return nil, fmt.Errorf("threshold %v: want a finite fraction ≥ 0 (0: no queue)", c.Threshold)
	}
	if c.Threshold == 0 {
		return nil, nil
	}
	qc := c.Queue
	if qc.Order == 0 && qc.Aging == 0 && qc.MaxLen == 0 && qc.MaxWait == 0 && len(qc.Bands) == 0 {
		qc = coordinator.DefaultQueueConfig()
	}
	if _, err := coordinator.NewQueue(qc); err != nil {
		return nil, err
	}
	return &qc, nil
}

// maxPriorityLabel bounds the priority label of prefixd_queue_shed_total:
// priorities beyond ±maxPriorityLabel count under ±maxPriorityLabel, so a
// client choosing priorities (-1000 to 1000 on the API) makes at most 21
// series per reason.
const maxPriorityLabel = 10

// shedLogInterval is how often the shedding of a pool is logged, with the
// count since the last line: a queue shedding thousands a second writes
// one line per pool per interval.
const shedLogInterval = 10 * time.Second

// queueMetrics is the Service's coordinator.QueueObserver: the queues'
// depth, waits and shedding. The observer runs under the Service's lock,
// so it only counts; runLog writes the shedding lines.
type queueMetrics struct {
	waiting *prometheus.GaugeVec
	wait    *prometheus.HistogramVec
	shed    *prometheus.CounterVec

	mu        sync.Mutex
	shedSince map[coordinator.PoolKey]shedCount // since the last log line
}

// shedCount is a pool's requests turned away since the last log line.
type shedCount struct{ full, expired int }

func newQueueMetrics(reg prometheus.Registerer) *queueMetrics {
	m := &queueMetrics{
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_queue_waiting",
			Help: "Requests waiting in the pool's router queue (serve --queue-threshold)."}, []string{"model", "routing_group", "role"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixd_queue_wait_seconds",
			Help:    "How long requests waited in a router queue, by how they left it: placed, shed (queue full), expired (wait past its deadline), cancelled (the client left), failed.",
			Buckets: prometheus.ExponentialBucketsRange(0.005, 60, 12)}, []string{"outcome"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_queue_shed_total",
			Help: "Requests the router queue answered 429: reason queue_full (refused or pushed out by a higher priority) or wait_expired; priorities beyond ±10 count as ±10."},
			[]string{"priority", "reason"}),
		shedSince: map[coordinator.PoolKey]shedCount{},
	}
	if reg != nil {
		reg.MustRegister(m.waiting, m.wait, m.shed)
	}
	return m
}

var _ coordinator.QueueObserver = (*queueMetrics)(nil)

// Waited implements coordinator.QueueObserver.
func (m *queueMetrics) Waited(k coordinator.PoolKey, priority int, d time.Duration, o coordinator.WaitOutcome) {
	m.wait.WithLabelValues(o.String()).Observe(d.Seconds())
	var reason string
	switch o {
	case coordinator.WaitShed:
		reason = "queue_full"
	case coordinator.WaitExpired:
		reason = "wait_expired"
	default:
		return
	}
	m.shed.WithLabelValues(strconv.Itoa(max(-maxPriorityLabel, min(maxPriorityLabel, priority))), reason).Inc()
	m.mu.Lock()
	c := m.shedSince[k]
	if o == coordinator.WaitShed {
		c.full++
	} else {
		c.expired++
	}
	m.shedSince[k] = c
	m.mu.Unlock()
}

// QueueLen implements coordinator.QueueObserver.
func (m *queueMetrics) QueueLen(k coordinator.PoolKey, n int) {
	m.waiting.WithLabelValues(k.Model, k.Group, k.Role.String()).Set(float64(n))
}

// runLog logs, every interval until ctx ends, one line per pool that
// turned requests away since the last.
func (m *queueMetrics) runLog(ctx context.Context, log *slog.Logger, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.logShed(log, interval)
			return nil
		case <-t.C:
			m.logShed(log, interval)
		}
	}
}

func (m *queueMetrics) logShed(log *slog.Logger, interval time.Duration) {
	m.mu.Lock()
	since := m.shedSince
	if len(since) > 0 {
		m.shedSince = map[coordinator.PoolKey]shedCount{}
	}
	m.mu.Unlock()
	for _, k := range slices.SortedFunc(maps.Keys(since), func(a, b coordinator.PoolKey) int {
		return strings.Compare(a.String(), b.String())
	}) {
		c := since[k]
		log.Warn("router queue turned requests away (429)", "model", k.Model, "routing_group", k.Group, "role", k.Role.String(),
			"queue_full", c.full, "wait_expired", c.expired, "over", interval)
	}
}
