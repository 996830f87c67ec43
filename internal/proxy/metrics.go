package proxy

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus metrics.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	ttft        *prometheus.HistogramVec
	tokenize    *prometheus.CounterVec
	fallbacks   *prometheus.CounterVec
	retries     prometheus.Counter
	transitions *prometheus.CounterVec
	bypasses    *prometheus.CounterVec
	bookings    prometheus.GaugeFunc
	open        atomic.Int64

	bodyBytes     prometheus.GaugeFunc
	bodiesRefused *prometheus.CounterVec

	cacheEvictions, cacheRefusals prometheus.Counter
	cacheBytes, cacheEntries      prometheus.GaugeFunc
}

// newMetrics returns the metrics; bodies reads the bytes the bodies in
// flight hold. The tokenize cache's gauges are set by watchCache.
func newMetrics(bodies func() int64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_requests_total",
			Help: "OpenAI requests by route and outcome (ok, client_gone, engine_broke_off, invalid, error_4xx and error_5xx for errors the proxy answered, engine_4xx and engine_5xx for an engine's refusal passed to the client as sent)."}, []string{"route", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixd_proxy_request_duration_seconds",
			Help: "Time from a request's arrival to its last byte.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}, []string{"route"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixd_proxy_time_to_first_byte_seconds",
			Help:    "Time from a request's arrival to the first byte of its answer (the first token of a stream), queueing included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"route"}),
		tokenize: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_tokenize_total",
			Help: "Where a request's token ids came from: client (sent as ids), cache, engine, or unavailable (routed by load)."}, []string{"source"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_fallbacks_total",
			Help: "Requests not routed as configured, by reason: no_tokens, prefixd_unavailable, unauthorized (routed by load; unauthorized: prefixd refuses the proxy's token); pinned_prefill, decode_not_indexed, no_decode_host (plans falling back to prefill-first)."}, []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_proxy_retries_total",
			Help: "Requests retried on the next-best engine after the first failed before its first byte."}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_plan_transitions_total",
			Help: "Plan state transitions the proxy's plans went through."}, []string{"from", "to"}),
		bypasses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_bypasses_total",
			Help: "Disaggregated requests run whole on their decode worker: bypass (the plan's policy), bypass_after_prefill_failure."}, []string{"reason"}),
	}
	m.bodyBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_proxy_body_bytes",
		Help: "Bytes the bodies of the requests in flight hold, of the body budget."}, func() float64 { return float64(bodies()) })
	m.bodiesRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_proxy_bodies_refused_total",
		Help: "Request bodies not read, by reason: too_large (413), budget (503, the body budget full), timeout (408, the read timeout), stalled (408, a body lent the budget's reserve stopped arriving), read (400)."},
		[]string{"reason"})
	m.cacheEvictions = prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_proxy_tokenize_cache_evictions_total",
		Help: "Tokenize answers pushed out of the cache (least recently used first) by its entry or byte bound."})
	m.cacheRefusals = prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_proxy_tokenize_cache_refusals_total",
		Help: "Tokenize answers not cached: larger than a sixteenth of the cache's byte bound."})
	m.bookings = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_proxy_bookings",
		Help: "Reservations and plans the proxy holds for requests in flight."}, func() float64 { return float64(m.open.Load()) })
	return m
}

// watchCache adds the gauges of c's size.
func (m *metrics) watchCache(c *tokenCache) {
	m.cacheBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_proxy_tokenize_cache_bytes",
		Help: "Bytes the tokenize cache holds (the ids and a fixed cost per entry), of --tokenize-cache-bytes."},
		func() float64 { b, _ := c.Size(); return float64(b) })
	m.cacheEntries = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_proxy_tokenize_cache_entries",
		Help: "Tokenize answers the cache holds, of --tokenize-cache."},
		func() float64 { _, n := c.Size(); return float64(n) })
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.ttft, m.tokenize, m.fallbacks, m.retries, m.transitions, m.bypasses, m.bookings, m.bodyBytes, m.bodiesRefused,
		m.cacheEvictions, m.cacheRefusals, m.cacheBytes, m.cacheEntries} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
