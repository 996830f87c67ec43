package coordinator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// benchOverlaps is an overlap source where every eighth worker holds the
// first half of every prompt.
type benchOverlaps struct{}

func (benchOverlaps) Overlaps(model, group string, tokens []uint32, _, _ string) ([]indexer.Overlap, int, error) {
	var out []indexer.Overlap
	half := uint32(len(tokens) / bs / 2)
	for id := uint64(0); id < 64; id += 8 {
		out = append(out, indexer.Overlap{Rank: indexer.Rank{WorkerID: 1000 + id}, Device: half, Host: half, Disk: half})
	}
	return out, bs, nil
}

// BenchmarkPlanCreateRelease: a decode-first plan (preview, policy, decode
// booking, prefill booking constrained to the decode worker's rack) and its
// release, with 64 decode and 64 prefill workers in 8 racks, 2,048-token
// prompts, and 256 plans live at any time.
func BenchmarkPlanCreateRelease(b *testing.B) {
	pools := NewPools(DefaultPoolConfig(), seeded(1))
	c := NewCoordinator(pools, benchOverlaps{}, CoordinatorConfig{BlockSize: bs})
	for i := uint64(0); i < 64; i++ {
		rack := fmt.Sprintf("r%d", i%8)
		for _, w := range []Worker{decodeW(1000+i, rack), prefillW(2000+i, rack)} {
			w.TotalKVBlocks, w.MaxNumBatchedTokens = 1<<20, 1<<20
			if _, err := c.SetWorker(w, t0); err != nil {
				b.Fatal(err)
			}
		}
	}
	const live = 256
	reqs := make([]Request, live)
	for i := range reqs {
		reqs[i] = req(fmt.Sprintf("r%d", i), 128)
		for j := range reqs[i].Tokens {
			reqs[i].Tokens[j] += uint32(i) << 20
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	i := 0
	for b.Loop() {
		r := reqs[i%live]
		if i >= live {
			if _, err := c.Release(r.ID, t0); err != nil {
				b.Fatal(err)
			}
		}
		s := time.Now()
		if _, err := c.Plan(r, t0); err != nil {
			b.Fatal(err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(s))
		}
		i++
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-plan-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-plan-ns")
}
