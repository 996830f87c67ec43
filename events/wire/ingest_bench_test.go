package wire_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
	"github.com/prefixd/prefixd/internal/sim/indexdemo"
)

var (
	ingestOnce   sync.Once
	ingestStream []indexdemo.Payload
	ingestErr    error
)

// BenchmarkIngest measures the whole path from msgpack payload to index:
// Decode, AppendOps and Index.Apply (locking and watermark included), for
// the default index workload (64 ranks, ≥1M entries, then churn) encoded as
// vLLM map-era batches of up to 4 events. blocks/s counts stored and
// removed blocks.
func BenchmarkIngest(b *testing.B) {
	ingestOnce.Do(func() {
		w, err := workload.Generate(workload.DefaultConfig())
		if err == nil {
			ingestStream, _, err = indexdemo.Encode(w, wire.EraMap)
		}
		ingestErr = err
	})
	if ingestErr != nil {
		b.Fatal(ingestErr)
	}
	key := indexer.PartitionKey{Model: "m", Group: "default"}
	var blocks, bytes int
	for _, p := range ingestStream {
		blocks += p.Blocks
		bytes += len(p.Bytes)
	}
	b.ReportAllocs()
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		ix := indexer.New(indexer.Options{})
		if err := ix.AddPartition(key, 16); err != nil {
			b.Fatal(err)
		}
		var d wire.Decoder
		var batch wire.Batch
		var ops []indexer.Op
		var filtered [wire.NumFilters]uint64
		b.StartTimer()
		start := time.Now()
		for _, p := range ingestStream {
			if err := d.Decode(p.Bytes, &batch); err != nil {
				b.Fatal(err)
			}
			ops = wire.AppendOps(ops[:0], &batch, &filtered)
			if _, err := ix.Apply(key, p.Rank, p.Seq, ops); err != nil {
				b.Fatal(err)
			}
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(blocks)*float64(b.N)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(len(ingestStream))*float64(b.N)/elapsed.Seconds(), "batches/s")
	b.ReportMetric(float64(bytes)*float64(b.N)/elapsed.Seconds()/1e6, "MB/s")
}
