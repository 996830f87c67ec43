package stream

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the stream metrics of every Subscriber sharing them, labelled
// by worker and rank. Create one per process with NewMetrics and the
// process's registry.
type Metrics struct {
	up       *prometheus.GaugeVec
	lastSeq  *prometheus.GaugeVec
	lastSeen *prometheus.GaugeVec
	degraded *prometheus.GaugeVec // set by Subscribers; collected unless status is set
	// status, when set (reportFrom), is what prefixd_stream_degraded
	// reports.
	status    atomic.Pointer[func() []Rank]
	batches   *prometheus.CounterVec
	events    *prometheus.CounterVec
	gaps      *prometheus.CounterVec
	restarts  *prometheus.CounterVec
	replays   *prometheus.CounterVec
	probes    *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	skipped   *prometheus.CounterVec
	redundant *prometheus.CounterVec
	// sizeMismatch counts BlockStored events left out because their blocks
	// contradict the worker's registered block size.
	sizeMismatch *prometheus.CounterVec
	replayTime   prometheus.Histogram
}

// NewMetrics registers the stream metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	wr := []string{"worker", "rank"}
	m := &Metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_stream_up",
			Help: "1 while the live socket to the worker rank is connected."}, wr),
		lastSeq: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_stream_last_applied_seq",
			Help: "Sequence number of the last batch applied for the worker rank."}, wr),
		lastSeen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_stream_last_seen_seq",
			Help: "Sequence number of the last batch received on the worker rank's live socket; minus prefixd_stream_last_applied_seq, the batches waiting for a gap's replay."}, wr),
		degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_stream_degraded",
			Help: "1 while the worker rank's history is known to be incomplete (it holds a subset of the engine's cache)."}, wr),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_batches_total",
			Help: "Batches by outcome: applied, duplicate, or dropped (see prefixd_stream_dropped_total)."}, append(wr, "status")),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_events_total",
			Help: "Events in applied batches, by type (stored, removed, cleared, unknown, filtered)."}, append(wr, "type")),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_gaps_total",
			Help: "Live sequence gaps detected."}, wr),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_restarts_total",
			Help: "New engine incarnations detected (seq went back, or a reconnect found another history)."}, wr),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_replays_total",
			Help: "Replays of missed batches (at join, after a gap, a restart or a reconnect; a probe that found batches) by outcome: ok (every gap closed), partial (an attempt ended incomplete and was retried), failed (history lost). A probe that found nothing is not one: see prefixd_stream_probes_total."}, append(wr, "result")),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_probes_total",
			Help: "Idle probes: a quiet stream asking its engine for any batch newer than its last (every --probe-interval), to find a lost last batch that no later one would reveal as a gap."}, wr),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_dropped_total",
			Help: "Messages and batches dropped, by reason."}, append(wr, "reason")),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_events_skipped_total",
			Help: "Events that could not be decoded and were left out of their batch, by kind (stored, removed, cleared, untagged) and reason (event, hash, token, field). A skipped stored event leaves the rank a strict subset (degraded); any other makes the batch lossy (dropped, reason lossy: the rank is reset and degraded)."},
			append(wr, "kind", "reason")),
		redundant: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_index_redundant_store_blocks_total",
			Help: "Blocks of redundant BlockStored events: device copies of blocks the rank already held on the device, on the chain it held. Applied as copies; a steady rate under prefix-cache hits means the engine re-reports cached blocks (vLLM's kv_cache_report_mode=\"full\"), so its copy counts, and the index, may exceed the engine's."}, wr),
		sizeMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_stream_block_size_mismatch_total",
			Help: "BlockStored events whose blocks contradict the worker's registered block size (their block_size field, or their token_ids per block_hashes): not indexed, and the rank is marked degraded."}, wr),
		replayTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "prefixd_stream_replay_duration_seconds",
			Help: "Duration of replay sessions, from the first request to the end.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
	}
	reg.MustRegister(m.up, m.lastSeq, m.lastSeen, degradedCollector{m}, m.batches, m.events, m.gaps, m.restarts, m.replays, m.probes, m.dropped, m.skipped, m.redundant, m.sizeMismatch, m.replayTime)
	return m
}

// reportFrom makes prefixd_stream_degraded report status's ranks when
// scraped (a Manager's Status: the index's word on each rank), instead of
// what each Subscriber set last.
func (m *Metrics) reportFrom(status func() []Rank) {
	m.status.Store(&status)
}

// degradedCollector collects prefixd_stream_degraded: from the Manager
// that reports the ranks (reportFrom), else from what the Subscribers set.
type degradedCollector struct{ m *Metrics }

var degradedDesc = prometheus.NewDesc("prefixd_stream_degraded",
	"1 while the worker rank's history is known to be incomplete (it holds a subset of the engine's cache).", []string{"worker", "rank"}, nil)

func (c degradedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- degradedDesc }

func (c degradedCollector) Collect(ch chan<- prometheus.Metric) {
	status := c.m.status.Load()
	if status == nil {
		c.m.degraded.Collect(ch)
		return
	}
	for _, r := range (*status)() {
		if !r.Running && !r.Indexed {
			continue
		}
		v := 0.0
		if r.Degraded {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, v,
			strconv.FormatUint(r.Worker, 10), strconv.FormatUint(uint64(r.Rank), 10))
	}
}

// forget deletes every series of one worker rank.
func (m *Metrics) forget(worker, rank string) {
	l := prometheus.Labels{"worker": worker, "rank": rank}
	m.up.DeletePartialMatch(l)
	m.lastSeq.DeletePartialMatch(l)
	m.lastSeen.DeletePartialMatch(l)
	m.degraded.DeletePartialMatch(l)
	m.batches.DeletePartialMatch(l)
	m.events.DeletePartialMatch(l)
	m.gaps.DeletePartialMatch(l)
	m.restarts.DeletePartialMatch(l)
	m.replays.DeletePartialMatch(l)
	m.probes.DeletePartialMatch(l)
	m.dropped.DeletePartialMatch(l)
	m.skipped.DeletePartialMatch(l)
	m.redundant.DeletePartialMatch(l)
	m.sizeMismatch.DeletePartialMatch(l)
}
