package replica

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector returns the replica sync's metrics, read at scrape time:
// per peer, deltas sent, dropped for a slow peer, applied, refused, the
// gaps in its sequence, its bookings held here and the streams synced;
// and the peers followed and connected.
func (s *Sync) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Sync }

var (
	descSent      = prometheus.NewDesc("prefixd_replica_deltas_sent_total", "Booking deltas sent to a peer's stream.", []string{"peer"}, nil)
	descSendDrop  = prometheus.NewDesc("prefixd_replica_deltas_send_dropped_total", "Booking deltas not sent because the peer fell behind (its stream is ended; it resyncs from a snapshot).", []string{"peer"}, nil)
	descApplied   = prometheus.NewDesc("prefixd_replica_deltas_applied_total", "Booking deltas of a peer applied here (snapshot admits included), since it was last dropped.", []string{"peer"}, nil)
	descRefused   = prometheus.NewDesc("prefixd_replica_deltas_refused_total", "Booking deltas of a peer refused here: duplicate or old seq, unknown pool, rank or id, the reservation cap.", []string{"peer"}, nil)
	descGaps      = prometheus.NewDesc("prefixd_replica_seq_gaps_total", "Breaks in a peer's delta sequence (deltas lost); repaired by the next snapshot, expiry and engine load.", []string{"peer"}, nil)
	descBookings  = prometheus.NewDesc("prefixd_replica_peer_bookings", "A peer's live bookings held here, counted in selection.", []string{"peer"}, nil)
	descStreams   = prometheus.NewDesc("prefixd_replica_streams_synced_total", "Streams from a peer that started with a snapshot (the first, and every reconnect).", []string{"peer"}, nil)
	descPeers     = prometheus.NewDesc("prefixd_replica_peers", "Replicas found in the catalog and followed.", nil, nil)
	descConnected = prometheus.NewDesc("prefixd_replica_peers_connected", "Followed replicas whose stream is synced.", nil, nil)
	descSubs      = prometheus.NewDesc("prefixd_replica_subscribers", "Streams this replica sends its deltas to.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSent, descSendDrop, descApplied, descRefused, descGaps, descBookings, descStreams, descPeers, descConnected, descSubs} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	sent, dropped := s.cfg.Hub.counters()
	for p, v := range sent {
		ch <- prometheus.MustNewConstMetric(descSent, prometheus.CounterValue, float64(v), p)
	}
	for p, v := range dropped {
		ch <- prometheus.MustNewConstMetric(descSendDrop, prometheus.CounterValue, float64(v), p)
	}
	for _, p := range s.cfg.Service.Peers() {
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.CounterValue, float64(p.Applied), p.Origin)
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(p.Dropped), p.Origin)
		ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(p.Gaps), p.Origin)
		ch <- prometheus.MustNewConstMetric(descBookings, prometheus.GaugeValue, float64(p.Bookings), p.Origin)
	}
	s.mu.Lock()
	peers, connected := len(s.followers), 0
	for _, up := range s.connected {
		if up {
			connected++
		}
	}
	for p, n := range s.streams {
		ch <- prometheus.MustNewConstMetric(descStreams, prometheus.CounterValue, float64(n), p)
	}
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descPeers, prometheus.GaugeValue, float64(peers))
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, float64(connected))
	ch <- prometheus.MustNewConstMetric(descSubs, prometheus.GaugeValue, float64(s.cfg.Hub.Subscribers()))
}
