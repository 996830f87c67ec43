package indexer_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// benchShards are the shard counts the shard benchmarks compare; 0 is
// the default at the benchmark's GOMAXPROCS (indexer.DefaultShards).
var benchShards = []int{0, 1, 2, 4, 8, 16}

func shardsName(shards int) string {
	if shards == 0 {
		return fmt.Sprintf("shards=default(%d)", indexer.DefaultShards())
	}
	return fmt.Sprintf("shards=%d", shards)
}

// BenchmarkIndexScore8192 is BenchmarkScore8192 through an Index whose
// one partition spreads the benchmark workload's ranks over each count of
// shards (a match walks every shard): the hash and match of the
// workload's 8,192-token prompts by MatchTokens, one iteration per score.
// It also times 10,000 single scores and hashes, interleaved, and
// reports their p50 and p99 and x-hash = p50(score) / p50(hash), the
// cost of the match over the hashing floor.
//
//	go test -run '^$' -bench IndexScore8192 -cpu 1,2 ./indexer
func BenchmarkIndexScore8192(b *testing.B) {
	w, _ := benchIndex(b)
	prompts := longTokens(w)
	k := indexer.PartitionKey{Model: "m"}
	for _, shards := range benchShards {
		b.Run(shardsName(shards), func(b *testing.B) {
			ix := indexer.New(indexer.Options{Shards: shards})
			if err := ix.AddPartition(k, w.BlockSize); err != nil {
				b.Fatal(err)
			}
			for i, e := range w.Events {
				if _, err := ix.ApplyBatch(k, e.Rank, indexer.Mark{Seq: uint64(i)}, []indexer.Op{e.Op}); err != nil {
					b.Fatal(err)
				}
			}
			var dst []indexer.Overlap
			var h []uint64
			var err error
			i := 0
			for b.Loop() {
				if dst, err = ix.MatchTokens(k, prompts[i%len(prompts)], indexer.BaseSeed, dst[:0]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			const samples = 10000
			score := make([]time.Duration, samples)
			hash := make([]time.Duration, samples)
			for i := range samples {
				p := prompts[i%len(prompts)]
				doHash := func() {
					t0 := time.Now()
					h = indexer.HashBlocks(h[:0], p, w.BlockSize, indexer.BaseSeed)
					hash[i] = time.Since(t0)
				}
				doScore := func() {
					t0 := time.Now()
					dst, _ = ix.MatchTokens(k, p, indexer.BaseSeed, dst[:0])
					score[i] = time.Since(t0)
				}
				if i%2 == 0 {
					doHash()
					doScore()
				} else {
					doScore()
					doHash()
				}
			}
			s, hs := quantile.Of(score), quantile.Of(hash)
			b.ReportMetric(float64(s.At(0.5)), "p50-ns")
			b.ReportMetric(float64(s.At(0.99)), "p99-ns")
			b.ReportMetric(float64(hs.At(0.5)), "hash-p50-ns")
			b.ReportMetric(float64(s.At(0.5))/float64(hs.At(0.5)), "x-hash")
		})
	}
}

// BenchmarkIndexApplyRanks replays the benchmark workload into a fresh
// Index with a goroutine per rank, each applying its own rank's events in
// order, as the daemon's streams do, at each count of shards: how the
// shards let writers of different ranks run in parallel (run it at -cpu
// 1,2). One iteration per replay; blocks/s counts stored and removed
// blocks.
//
//	go test -run '^$' -bench IndexApplyRanks -cpu 1,2 ./indexer
func BenchmarkIndexApplyRanks(b *testing.B) {
	w, _ := benchIndex(b)
	byRank := map[indexer.Rank][][]indexer.Op{}
	for _, e := range w.Events {
		byRank[e.Rank] = append(byRank[e.Rank], []indexer.Op{e.Op})
	}
	stored, removed := blockOps(w.Events)
	k := indexer.PartitionKey{Model: "m"}
	for _, shards := range benchShards {
		b.Run(shardsName(shards), func(b *testing.B) {
			var elapsed time.Duration
			for b.Loop() {
				b.StopTimer()
				ix := indexer.New(indexer.Options{Shards: shards})
				if err := ix.AddPartition(k, w.BlockSize); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				b.StartTimer()
				t0 := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, len(byRank))
				for r, batches := range byRank {
					wg.Go(func() {
						for seq, ops := range batches {
							if _, err := ix.ApplyBatch(k, r, indexer.Mark{Seq: uint64(seq)}, ops); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed += time.Since(t0)
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*(stored+removed))/elapsed.Seconds(), "blocks/s")
		})
	}
}
