package engineload

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scraper's: failures by reason, scrape durations, and
// each listed rank's figure, read at collection so that a departed
// rank's series go with it.
type metrics struct {
	s        *Scraper
	failures *prometheus.CounterVec
	duration prometheus.Histogram

	running, waiting, usage, age, ranks *prometheus.Desc
}

// reasons are the failure reasons, pre-declared so that each series
// exists at 0.
var reasons = []string{"unreachable", "timeout", "transport", "status", "too_large", "parse", "too_many_series",
	"bad_value", "bad_label", "missing", "unlabeled", "unknown_rank", "refused", "bad_endpoint", "other"}

func newMetrics(s *Scraper) *metrics {
	rl := []string{"model", "group", "worker", "dp_rank"}
	m := &metrics{s: s,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_engine_load_scrape_failures_total",
			Help: "Engine /metrics scrapes, or ranks of one, refused: the engine's figure was not used (reason: unreachable, timeout, too_large, parse, bad_value, …)."}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "prefixd_engine_load_scrape_duration_seconds",
			Help: "Time to GET an engine's /metrics, the body read included.", Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		running: prometheus.NewDesc("prefixd_engine_load_running", "Requests running on the rank, as its engine last reported them.", rl, nil),
		waiting: prometheus.NewDesc("prefixd_engine_load_waiting", "Requests waiting on the rank, as its engine last reported them.", rl, nil),
		usage:   prometheus.NewDesc("prefixd_engine_load_kv_usage", "The rank's KV-cache usage in [0, 1], as its engine last reported it.", rl, nil),
		age:     prometheus.NewDesc("prefixd_engine_load_age_seconds", "Age of the rank's engine figure (absent: none yet).", rl, nil),
		ranks: prometheus.NewDesc("prefixd_engine_load_ranks",
			"Ranks whose engine figure counts in selection (state=engine), and ranks counted by bookings alone (state=bookings_only: no figure yet, stale, or unreachable).", []string{"state"}, nil),
	}
	for _, r := range reasons {
		m.failures.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.failures, m.duration, m}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.running, m.waiting, m.usage, m.age, m.ranks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	now := m.s.cfg.Now()
	counting, alone := 0, 0
	for _, r := range m.s.Ranks() {
		if !r.Counts {
			alone++
		} else {
			counting++
		}
		if r.Load.At.IsZero() {
			continue
		}
		lv := []string{r.Engine.Model, r.Engine.Group, workerLabel(r.Engine.WorkerID), rankLabel(r.Rank)}
		ch <- prometheus.MustNewConstMetric(m.running, prometheus.GaugeValue, float64(r.Load.Running), lv...)
		ch <- prometheus.MustNewConstMetric(m.waiting, prometheus.GaugeValue, float64(r.Load.Waiting), lv...)
		ch <- prometheus.MustNewConstMetric(m.usage, prometheus.GaugeValue, r.Load.KVUsage, lv...)
		ch <- prometheus.MustNewConstMetric(m.age, prometheus.GaugeValue, sinceSeconds(now, r.Load.At), lv...)
	}
	ch <- prometheus.MustNewConstMetric(m.ranks, prometheus.GaugeValue, float64(counting), "engine")
	ch <- prometheus.MustNewConstMetric(m.ranks, prometheus.GaugeValue, float64(alone), "bookings_only")
}
