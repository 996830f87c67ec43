package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/indexer"
)

func TestIndexCollector(t *testing.T) {
	t.Parallel()
	ix := indexer.New(indexer.Options{})
	k := indexer.PartitionKey{Model: "meta/llama", Group: "a"}
	if err := ix.AddPartition(k, 2); err != nil {
		t.Fatal(err)
	}
	ops := []indexer.Op{
		{Kind: indexer.OpStore, Store: indexer.Stored{Hashes: []uint64{1, 2}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, Seed: indexer.BaseSeed}},
		{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{99}}},
	}
	if _, err := ix.Apply(k, indexer.Rank{WorkerID: 1}, 0, ops); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewIndexCollector(ix, 1000))
	want := `
# HELP prefixd_index_blocks Distinct indexed blocks (prefix paths).
# TYPE prefixd_index_blocks gauge
prefixd_index_blocks{model="meta/llama",routing_group="a"} 2
# HELP prefixd_index_entries Indexed (block, rank) entries.
# TYPE prefixd_index_entries gauge
prefixd_index_entries{model="meta/llama",routing_group="a"} 2
# HELP prefixd_index_max_entries Configured cap on indexed entries over all partitions (0 = none).
# TYPE prefixd_index_max_entries gauge
prefixd_index_max_entries 1000
# HELP prefixd_index_nodes Edges of the compressed radix tree.
# TYPE prefixd_index_nodes gauge
prefixd_index_nodes{model="meta/llama",routing_group="a"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "prefixd_index_blocks", "prefixd_index_entries",
		"prefixd_index_max_entries", "prefixd_index_nodes"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(NewIndexCollector(ix, 0), "prefixd_index_skipped_blocks_total"); n != int(indexer.NumReasons) {
		t.Fatalf("%d skip series, want one per reason", n)
	}
}
