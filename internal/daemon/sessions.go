package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/coordinator"
)

// registerSessionMetrics exports what session affinity does, read from
// the Service at each scrape.
func registerSessionMetrics(reg prometheus.Registerer, svc *coordinator.Service) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_sessions",
		Help: "Sessions remembered for affinity (serve --session-ttl)."}, func() float64 { return float64(svc.SessionStats().Sessions) }))
	for _, o := range []struct {
		outcome string
		v       func(coordinator.SessionStats) uint64
	}{
		{"sticky", func(s coordinator.SessionStats) uint64 { return s.Hits }},
		{"moved", func(s coordinator.SessionStats) uint64 { return s.Moves }},
		{"new", func(s coordinator.SessionStats) uint64 { return s.New }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "prefixd_session_bookings_total",
			Help:        "Bookings of requests naming a session: sticky (back on the session's worker), moved (its worker busy, gone or not allowed), new (a session not remembered).",
			ConstLabels: prometheus.Labels{"outcome": o.outcome}}, func() float64 { return float64(o.v(svc.SessionStats())) }))
	}
}
