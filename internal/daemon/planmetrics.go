package daemon

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// planMetrics counts what the coordinator's selections and plans do: it
// is the service's coordinator.Observer, called under the service's lock.
type planMetrics struct {
	transitions   *prometheus.CounterVec
	compensations *prometheus.CounterVec
	live          prometheus.Gauge
	overlap       *prometheus.HistogramVec
	routed        *prometheus.CounterVec
	seen          map[string]int // transitions already counted per live plan
}

func newPlanMetrics(reg prometheus.Registerer) *planMetrics {
	m := &planMetrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_plan_transitions_total",
			Help: "Disaggregated plan state transitions, by the state entered."}, []string{"state"}),
		compensations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_plan_compensations_total",
			Help: "Plans compensated (bookings freed before release), by cause: prefill_failed, worker_removed, expired, other."}, []string{"reason"}),
		live: prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixd_plans_live", Help: "Plans holding bookings."}),
		overlap: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixd_selection_overlap_tokens",
			Help:    "Device-tier prefix tokens the chosen worker already caches, per selection or plan booking.",
			Buckets: prometheus.ExponentialBuckets(16, 4, 8)}, []string{"kind"}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_routed_total",
			Help: "Requests booked on a worker rank (select_and_reserve, plan decode and prefill bookings), by kind; worker and rank match the prefixd_stream_* labels."},
			[]string{"worker", "rank", "kind"}),
		seen: map[string]int{},
	}
	if reg != nil {
		reg.MustRegister(m.transitions, m.compensations, m.live, m.overlap, m.routed)
	}
	return m
}

var _ coordinator.Observer = (*planMetrics)(nil)

// PlanChanged implements coordinator.Observer.
func (m *planMetrics) PlanChanged(p coordinator.Plan, live bool, plans int) {
	m.observe(p, live, plans)
}

// Planned implements coordinator.Observer: the decode booking's cached
// tokens and both bookings' routes.
func (m *planMetrics) Planned(p coordinator.Plan) {
	if p.Decode != nil && p.Signals != nil {
		m.overlap.WithLabelValues("plan_decode").Observe(p.Signals.CachedTokens)
	}
	if p.Decode != nil {
		m.route(p.Decode.Rank, "plan_decode")
	}
	if p.Prefill != nil {
		m.route(p.Prefill.Rank, "plan_prefill")
	}
}

// Selected implements coordinator.Observer: every selection's
// device-tier overlap, and select_and_reserve's route.
func (m *planMetrics) Selected(op coordinator.SelectOp, c coordinator.Choice) {
	m.overlap.WithLabelValues("selection").Observe(float64(int(c.Overlap.Device) * c.BlockSize))
	if op == coordinator.OpSelectAndReserve {
		m.route(c.Rank, "reservation")
	}
}

// RankRemoved implements coordinator.Observer.
func (m *planMetrics) RankRemoved(r indexer.Rank) { m.forget(r) }

// route counts a booking on r.
func (m *planMetrics) route(r indexer.Rank, kind string) {
	m.routed.WithLabelValues(strconv.FormatUint(r.WorkerID, 10), strconv.FormatUint(uint64(r.DPRank), 10), kind).Inc()
}

// forget deletes the series of a departed worker rank.
func (m *planMetrics) forget(r indexer.Rank) {
	m.routed.DeletePartialMatch(prometheus.Labels{"worker": strconv.FormatUint(r.WorkerID, 10), "rank": strconv.FormatUint(uint64(r.DPRank), 10)})
}

// observe counts the transitions of p not counted yet; live is whether the
// coordinator still holds p, and plans the coordinator's live count.
func (m *planMetrics) observe(p coordinator.Plan, live bool, plans int) {
	for _, t := range p.Transitions[min(m.seen[p.ID], len(p.Transitions)):] {
		m.transitions.WithLabelValues(t.To.String()).Inc()
		if t.To == coordinator.Compensated {
			m.compensations.WithLabelValues(compensationCause(t.Reason)).Inc()
		}
	}
	if live {
		m.seen[p.ID] = len(p.Transitions)
	} else {
		delete(m.seen, p.ID)
	}
	m.live.Set(float64(plans))
}

func compensationCause(reason string) string {
	switch r := strings.ToLower(reason); {
	case strings.Contains(r, "removed"):
		return "worker_removed"
	case strings.Contains(r, "expired"):
		return "expired"
	case strings.Contains(r, "prefill"):
		return "prefill_failed"
	}
	return "other"
}
