package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/catalog"
)

// catalogCollector exports the catalog's health at scrape time: whether
// etcd answers (one count-only read, bounded by timeout) and the watch's
// counters. As with an exporter's up metric, an unreachable etcd is a 0,
// not a failed scrape.
type catalogCollector struct {
	ping    func(context.Context) (int64, error)
	stats   func() catalog.WatcherStats
	timeout time.Duration

	up, workers, resyncs, revision *prometheus.Desc
}

func newCatalogCollector(ping func(context.Context) (int64, error), stats func() catalog.WatcherStats) *catalogCollector {
	return &catalogCollector{
		ping: ping, stats: stats, timeout: time.Second,
		up:       prometheus.NewDesc("prefixd_catalog_up", "1 if etcd answered a read of the worker catalog during this scrape (1 s timeout).", nil, nil),
		workers:  prometheus.NewDesc("prefixd_catalog_workers", "Worker records the catalog watch holds.", nil, nil),
		resyncs:  prometheus.NewDesc("prefixd_catalog_resyncs_total", "Full catalog lists after the first (compaction, etcd restarts, lost connections).", nil, nil),
		revision: prometheus.NewDesc("prefixd_catalog_revision", "etcd revision of the last catalog change or list applied.", nil, nil),
	}
}

func (c *catalogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.workers
	ch <- c.resyncs
	ch <- c.revision
}

func (c *catalogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	_, err := c.ping(ctx)
	cancel()
	up := 1.0
	if err != nil {
		up = 0
	}
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(st.Workers))
	ch <- prometheus.MustNewConstMetric(c.resyncs, prometheus.CounterValue, float64(st.Resyncs))
	ch <- prometheus.MustNewConstMetric(c.revision, prometheus.GaugeValue, float64(st.Revision))
}
