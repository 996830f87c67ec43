package stream

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/events/cursor"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// BenchmarkSubscriberIngest measures loopback ingest end to end: a Go
// Publisher sends vLLM map-era batches of one BlockStored with 32 blocks
// (16 tokens each) over real ZMQ; one Subscriber decodes and applies them
// to an indexer.Index. Time runs from the first publish until the last
// batch is applied. Each chain of 4 batches (128 blocks) is evicted again
// two chains later, so the index stays small and removes are half the work.
func BenchmarkSubscriberIngest(b *testing.B) {
	payloads, blocks := ingestPayloads(b)
	var elapsed time.Duration
	var batches, gaps uint64
	for b.Loop() {
		b.StopTimer()
		d, g := ingestOnce(b, payloads)
		b.StartTimer()
		elapsed += d
		gaps += g
		batches += uint64(len(payloads))
	}
	b.ReportMetric(float64(batches)*float64(blocks)/float64(len(payloads))/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(batches)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(gaps), "gaps")
}

// ingestPayloads pre-encodes chains of 4 stored batches of 32 blocks,
// each chain removed again two chains later.
func ingestPayloads(b *testing.B) (payloads [][]byte, blocks int) {
	const blocksPerBatch, tokens = 32, 16
	enc := wire.Encoder{}
	tok := make([]uint32, blocksPerBatch*tokens)
	var h uint64 = 1 << 40
	var chains [][]uint64
	for chain := 0; len(payloads) < 4096; chain++ {
		var parent uint64
		var all []uint64
		for i := 0; i < 4; i++ {
			hashes := make([]uint64, blocksPerBatch)
			for j := range hashes {
				h++
				hashes[j] = h
			}
			for j := range tok {
				tok[j] = uint32(chain*1_000_003 + i*7919 + j)
			}
			ev := wire.Event{Kind: wire.KindBlockStored, BlockHashes: hashes, TokenIDs: tok, BlockSize: tokens, Medium: "GPU",
				ParentHash: parent, HasParent: i > 0}
			p, err := enc.AppendBatch(nil, &wire.Batch{TS: 1, Events: []wire.Event{ev}, HasDPRank: true})
			if err != nil {
				b.Fatal(err)
			}
			payloads = append(payloads, p)
			blocks += blocksPerBatch
			parent = hashes[blocksPerBatch-1]
			all = append(all, hashes...)
		}
		chains = append(chains, all)
		if chain >= 2 {
			old := chains[chain-2]
			for i := len(old); i > 0; i -= blocksPerBatch {
				ev := wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: old[i-blocksPerBatch : i], Medium: "GPU"}
				p, err := enc.AppendBatch(nil, &wire.Batch{TS: 1, Events: []wire.Event{ev}, HasDPRank: true})
				if err != nil {
					b.Fatal(err)
				}
				payloads = append(payloads, p)
				blocks += blocksPerBatch
			}
		}
	}
	return payloads, blocks
}

// ingestOnce runs a fresh publisher, subscriber and index, and times
// publishing every payload until the last one is applied.
func ingestOnce(b *testing.B, payloads [][]byte) (time.Duration, uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := mocker.NewPublisher(mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Run(ctx) }()
	<-pub.Ready()
	ix := indexer.New(indexer.Options{})
	key := indexer.PartitionKey{Model: "m", Group: "g"}
	if err := ix.AddPartition(key, 16); err != nil {
		b.Fatal(err)
	}
	target := uint64(len(payloads) - 1)
	synced, applied := make(chan struct{}), make(chan struct{})
	var syncOnce, appliedOnce sync.Once
	sub, err := NewSubscriber(Source{Worker: 1, Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint()},
		&IndexApplier{Index: ix, Partition: key}, SubscriberConfig{LiveQueue: 1 << 16, ProbeInterval: 100 * time.Millisecond,
			OnStateChange: func(s State) {
				if s.Synced {
					syncOnce.Do(func() { close(synced) })
				}
				if s.HasApplied && s.Applied == target && s.Mode == cursor.ModeLive {
					appliedOnce.Do(func() { close(applied) })
				}
			}})
	if err != nil {
		b.Fatal(err)
	}
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Run(ctx) }()
	<-synced
	start := time.Now()
	for _, p := range payloads {
		if _, err := pub.Publish(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-applied:
	case <-time.After(time.Minute):
		b.Fatalf("not applied: %+v", sub.State())
	}
	d := time.Since(start)
	st := sub.State().Stats
	cancel()
	<-pubDone
	<-subDone
	return d, st.Gaps + st.Probes
}
