package epp

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the picker's Prometheus metrics.
type metrics struct {
	picks            *prometheus.CounterVec
	decision         prometheus.Histogram
	fallbacksOffered prometheus.Counter
	fallbacksUsed    prometheus.Counter
	servedElsewhere  *prometheus.CounterVec
	errors           *prometheus.CounterVec
	bodiesRefused    *prometheus.CounterVec
	tokenize         *prometheus.CounterVec
	transitions      *prometheus.CounterVec
	cacheEvictions   prometheus.Counter
	cacheRefusals    prometheus.Counter
	shed             *prometheus.CounterVec
	waitsLeft        prometheus.Counter
	open             atomic.Int64 // bookings the streams hold
}

func newMetrics() *metrics {
	return &metrics{
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_picks_total",
			Help: "Requests the endpoint picker sent to an engine, by the engine's ip:port (the primary endpoint)."}, []string{"endpoint"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "prefixd_epp_decision_seconds",
			Help:    "Time from a request's last body byte at the picker to its answer: reading, tokenizing, selecting and booking, and the wait in the router queue when there is one.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}),
		fallbacksOffered: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_epp_fallbacks_offered_total",
			Help: "Fallback endpoints listed after the primary in the picker's answers."}),
		fallbacksUsed: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_epp_fallbacks_used_total",
			Help: "Requests the gateway served on one of the listed fallbacks: the booking moved there."}),
		servedElsewhere: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_served_elsewhere_total",
			Help: "Responses served by another endpoint than the picked one, by what the picker did: moved (the booking followed), kept (a plan, or an endpoint of no engine of the pool)."}, []string{"booking"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_errors_total",
			Help: "Requests the picker answered with an immediate response, by HTTP status."}, []string{"status"}),
		bodiesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_bodies_refused_total",
			Help: "Request bodies the picker refused, by reason: too_large (413), budget (503, the body budget full), timeout (408)."}, []string{"reason"}),
		tokenize: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_tokenize_total",
			Help: "Where a request's token ids came from: client (sent as ids), cache, engine, or unavailable (picked by load)."}, []string{"source"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_plan_transitions_total",
			Help: "Plan state transitions the picker's disaggregated plans went through."}, []string{"from", "to"}),
		cacheEvictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_epp_tokenize_cache_evictions_total",
			Help: "Tokenize answers pushed out of the picker's cache by its entry or byte bound."}),
		cacheRefusals: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_epp_tokenize_cache_refusals_total",
			Help: "Tokenize answers the picker did not cache: larger than a sixteenth of the cache's byte bound."}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_epp_shed_total",
			Help: "Requests the router queue would not hold, answered 429 with Retry-After, by reason: queue_full (refused on arrival or pushed out by a higher priority), wait_expired."}, []string{"reason"}),
		waitsLeft: prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_epp_waits_abandoned_total",
			Help: "Requests whose stream ended while they waited in the router queue (the client left, the gateway reset the stream): they left the queue, nothing booked."}),
	}
}

// register registers the metrics and the gauges read from s.
func (m *metrics) register(r prometheus.Registerer, s *Server) error {
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_epp_bookings",
			Help: "Reservations and plans the picker holds for requests in flight."}, func() float64 { return float64(m.open.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_epp_body_bytes",
			Help: "Bytes the request bodies at the picker hold, of its body budget."}, func() float64 { return float64(s.bodies.Used()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_epp_unroutable_engines",
			Help: "Engine records whose endpoint cannot be given as ip:port: never picked."}, func() float64 { return float64(s.cfg.Endpoints.Unroutable()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_epp_tokenize_cache_bytes",
			Help: "Bytes the picker's tokenize cache holds."}, func() float64 { b, _ := s.cache.Size(); return float64(b) }),
	}
	for _, c := range append([]prometheus.Collector{m.picks, m.decision, m.fallbacksOffered, m.fallbacksUsed, m.servedElsewhere, m.errors, m.bodiesRefused,
		m.tokenize, m.transitions, m.cacheEvictions, m.cacheRefusals, m.shed, m.waitsLeft}, gauges...) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
