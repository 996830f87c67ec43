package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/indexer"
)

// indexCollector exports the index's size and skip counters at scrape
// time, per partition.
type indexCollector struct {
	ix                                  *indexer.Index
	maxEntries                          int
	entries, blocks, nodes, bytes, maxE *prometheus.Desc
	skipped                             *prometheus.Desc
}

// NewIndexCollector returns a collector for ix; register it on the
// process's registry. maxEntries is the configured cap (0 = none).
func NewIndexCollector(ix *indexer.Index, maxEntries int) prometheus.Collector {
	pl := []string{"model", "routing_group"}
	return &indexCollector{
		ix: ix, maxEntries: maxEntries,
		entries: prometheus.NewDesc("prefixd_index_entries", "Indexed (block, rank) entries.", pl, nil),
		blocks:  prometheus.NewDesc("prefixd_index_blocks", "Distinct indexed blocks (prefix paths).", pl, nil),
		nodes:   prometheus.NewDesc("prefixd_index_nodes", "Edges of the compressed radix tree.", pl, nil),
		bytes:   prometheus.NewDesc("prefixd_index_bytes", "Estimated heap bytes held by the index.", pl, nil),
		maxE:    prometheus.NewDesc("prefixd_index_max_entries", "Configured cap on indexed entries over all partitions (0 = none).", nil, nil),
		skipped: prometheus.NewDesc("prefixd_index_skipped_blocks_total", "Blocks of engine events not applied, or evicted by the memory cap, by reason.",
			append(pl, "reason"), nil),
	}
}

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.entries, c.blocks, c.nodes, c.bytes, c.maxE, c.skipped} {
		ch <- d
	}
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.maxE, prometheus.GaugeValue, float64(c.maxEntries))
	for _, ps := range c.ix.Stats() {
		l := []string{ps.Key.Model, ps.Key.Group}
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(ps.Entries), l...)
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(ps.Blocks), l...)
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(ps.Nodes), l...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(ps.Bytes), l...)
		for r, n := range ps.Counts {
			ch <- prometheus.MustNewConstMetric(c.skipped, prometheus.CounterValue, float64(n), append(l, indexer.Reason(r).String())...)
		}
	}
}
