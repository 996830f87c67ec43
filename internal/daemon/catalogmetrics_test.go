package daemon

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
)

// TestCatalogCollector: prefixd_catalog_up follows a real etcd going away;
// the watch counters pass through.
func TestCatalogCollector(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newCatalogCollector(store.Ping, func() catalog.WatcherStats {
		return catalog.WatcherStats{Workers: 3, Resyncs: 2, Revision: 41}
	}))
	want := func(up int) string {
		return strings.ReplaceAll(`# HELP prefixd_catalog_resyncs_total Full catalog lists after the first (compaction, etcd restarts, lost connections).
# TYPE prefixd_catalog_resyncs_total counter
prefixd_catalog_resyncs_total 2
# HELP prefixd_catalog_revision etcd revision of the last catalog change or list applied.
# TYPE prefixd_catalog_revision gauge
prefixd_catalog_revision 41
# HELP prefixd_catalog_up 1 if etcd answered a read of the worker catalog during this scrape (1 s timeout).
# TYPE prefixd_catalog_up gauge
prefixd_catalog_up UP
# HELP prefixd_catalog_workers Worker records the catalog watch holds.
# TYPE prefixd_catalog_workers gauge
prefixd_catalog_workers 3
`, "UP", string(rune('0'+up)))
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(1))); err != nil {
		t.Fatal(err)
	}
	etcd.Close()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0))); err != nil {
		t.Fatal(err)
	}
}
