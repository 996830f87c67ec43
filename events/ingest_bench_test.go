package events_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

type encodedBatch struct {
	rank    indexer.Rank
	payload []byte
	blocks  int
}

var (
	ingestOnce    sync.Once
	ingestBatches []encodedBatch
	ingestErr     error
)

// ingestStream encodes the default index workload (64 ranks, ≥1M entries,
// then churn) as vLLM map-era batches: consecutive events of one rank are
// grouped into batches of up to 4, as an engine publishes one batch per
// scheduler step.
func ingestStream(b *testing.B) []encodedBatch {
	ingestOnce.Do(func() {
		w, err := workload.Generate(workload.DefaultConfig())
		if err != nil {
			ingestErr = err
			return
		}
		enc := events.Encoder{}
		var batch events.Batch
		var cur encodedBatch
		flush := func() {
			if len(batch.Events) == 0 {
				return
			}
			p, err := enc.AppendBatch(nil, &batch)
			if err != nil {
				ingestErr = err
				return
			}
			cur.payload = p
			ingestBatches = append(ingestBatches, cur)
			batch.Events = batch.Events[:0]
			cur = encodedBatch{}
		}
		for _, ev := range w.Events {
			if len(batch.Events) == 4 || (len(batch.Events) > 0 && ev.Rank != cur.rank) {
				flush()
			}
			cur.rank = ev.Rank
			batch.TS, batch.HasDPRank, batch.DPRank = 1.5, true, int32(ev.Rank.DPRank)
			e := events.Event{Medium: "GPU"}
			switch ev.Op.Kind {
			case indexer.OpStore:
				s := ev.Op.Store
				e.Kind, e.BlockHashes, e.ParentHash, e.HasParent = events.KindBlockStored, s.Hashes, s.Parent, s.HasParent
				e.TokenIDs, e.BlockSize = s.Tokens, s.BlockSize
				e.GroupIdx, e.HasGroupIdx, e.KVCacheSpecKind = 0, true, "full_attention"
				cur.blocks += len(s.Hashes)
			case indexer.OpRemove:
				e.Kind, e.BlockHashes = events.KindBlockRemoved, ev.Op.Remove.Hashes
				cur.blocks += len(ev.Op.Remove.Hashes)
			case indexer.OpClear:
				e = events.Event{Kind: events.KindAllBlocksCleared}
			}
			batch.Events = append(batch.Events, e)
		}
		flush()
	})
	if ingestErr != nil {
		b.Fatal(ingestErr)
	}
	return ingestBatches
}

// BenchmarkIngest measures the whole path from msgpack payload to index:
// Decode, AppendOps and Index.Apply (locking and watermark included), for
// the default workload. blocks/s counts stored and removed blocks.
func BenchmarkIngest(b *testing.B) {
	stream := ingestStream(b)
	key := indexer.PartitionKey{Model: "m", Group: "default"}
	var blocks, bytes int
	for _, e := range stream {
		blocks += e.blocks
		bytes += len(e.payload)
	}
	b.ReportAllocs()
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		ix := indexer.New(indexer.Options{})
		if err := ix.AddPartition(key, 16); err != nil {
			b.Fatal(err)
		}
		var d events.Decoder
		var batch events.Batch
		var ops []indexer.Op
		var filtered [events.NumFilters]uint64
		seq := map[indexer.Rank]uint64{}
		b.StartTimer()
		start := time.Now()
		for _, e := range stream {
			if err := d.Decode(e.payload, &batch); err != nil {
				b.Fatal(err)
			}
			ops = events.AppendOps(ops[:0], &batch, &filtered)
			if _, err := ix.Apply(key, e.rank, seq[e.rank], ops); err != nil {
				b.Fatal(err)
			}
			seq[e.rank]++
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(blocks)*float64(b.N)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(len(stream))*float64(b.N)/elapsed.Seconds(), "batches/s")
	b.ReportMetric(float64(bytes)*float64(b.N)/elapsed.Seconds()/1e6, "MB/s")
}
