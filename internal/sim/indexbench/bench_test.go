package indexbench

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// The short form of `prefixd-bench index`: the trace's first 3,000
// requests on DefaultRecordConfig's 64 engines, recorded once.
var short struct {
	once sync.Once
	rec  *Recording
	err  error
}

func shortRecording(b *testing.B) *Recording {
	b.Helper()
	short.once.Do(func() {
		reqs, err := trace.Mooncake()
		if err != nil {
			short.err = err
			return
		}
		short.rec, short.err = Record(reqs[:3000], DefaultRecordConfig())
	})
	if short.err != nil {
		b.Fatal(short.err)
	}
	return short.rec
}

// BenchmarkMooncake replays the short recording unpaced with GOMAXPROCS
// appliers, ranks sticky (Dynamo's thread pool), and as many lookup
// goroutines, and reports ops/s (event blocks applied + lookup blocks
// matched) and ops/s per core; the same with a goroutine per rank (as the
// daemon's streams apply their batches: rank-ops/s, which unpaced runs a
// rank's batches back to back, its tables in the caches, and so overstates
// what live traffic gets: the sweep's paced figures are the measure);
// then the score latency at idle, under ingest (GOMAXPROCS − 1 appliers,
// at least one) and under the same ingest into another partition, and the
// ingest rate while the prober runs.
func BenchmarkMooncake(b *testing.B) {
	rec := shortRecording(b)
	cpus := runtime.GOMAXPROCS(0)
	var ops, rankOps int64
	var secs, rankSecs float64
	var st indexer.TreeStats
	for b.Loop() {
		res, err := Replay(context.Background(), rec, ReplayConfig{Appliers: cpus, Lookupers: cpus})
		if err != nil {
			b.Fatal(err)
		}
		ops += res.Ops
		secs += res.Elapsed.Seconds()
		st = res.Index.Stats()[0].TreeStats
		res, err = Replay(context.Background(), rec, ReplayConfig{Appliers: len(rec.Ranks), Lookupers: cpus})
		if err != nil {
			b.Fatal(err)
		}
		rankOps += res.Ops
		rankSecs += res.Elapsed.Seconds()
	}
	b.StopTimer()
	l, err := Latency(context.Background(), rec, LatencyConfig{Appliers: max(1, cpus-1), IdleProbes: 10000})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(ops)/secs, "ops/s")
	b.ReportMetric(float64(ops)/secs/float64(cpus), "ops/s/core")
	b.ReportMetric(float64(rankOps)/rankSecs, "rank-ops/s")
	b.ReportMetric(float64(l.IdleP99.Nanoseconds()), "idle-p99-ns")
	b.ReportMetric(float64(l.LoadP50.Nanoseconds()), "load-p50-ns")
	b.ReportMetric(float64(l.LoadP99.Nanoseconds()), "load-p99-ns")
	// The control: the same ingest into another partition, which the
	// scores share only the machine with.
	b.ReportMetric(float64(l.OtherP99.Nanoseconds()), "other-p99-ns")
	b.ReportMetric(l.Pauses, "machine-pauses/s")
	// What the ingest keeps while a query runs back to back.
	b.ReportMetric(l.IngestRate, "load-ingest-blocks/s")
	// The index's estimate of its heap (Stats().Bytes, about 95 % of the
	// measured heap) per entry after the replay: the churned lookups.
	b.ReportMetric(float64(st.Bytes)/float64(st.Entries), "est-B/entry")
}
