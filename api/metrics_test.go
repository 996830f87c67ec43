package api

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/indexer"
)

// TestRequestMetrics: with a Registerer, every route's latency is observed
// by handler, method and status code.
func TestRequestMetrics(t *testing.T) {
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(indexer.PartitionKey{Model: "m", Group: DefaultRoutingGroup}, 4); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServer(t, Config{Index: ix, Registerer: reg})
	if r := s.post("/query", `{"model_name":"m","token_ids":[1,2,3,4]}`); r.status != 200 {
		t.Fatalf("query: %d %s", r.status, r.body)
	}
	s.post("/query", `{"model_name":"m","token_ids":"x"}`)
	s.get("/health")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "prefixd_http_request_duration_seconds" {
			continue
		}
		for _, m := range mf.Metric {
			key := ""
			for _, l := range m.Label {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			counts[key] = m.Histogram.GetSampleCount()
		}
	}
	for key, want := range map[string]uint64{
		"code=200 handler=/query method=post ": 1,
		"code=400 handler=/query method=post ": 1,
		"code=200 handler=/health method=get ": 1,
	} {
		if counts[key] != want {
			t.Errorf("%s: %d observations, want %d (all: %v)", key, counts[key], want, counts)
		}
	}
}
