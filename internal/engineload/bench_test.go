package engineload

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// bigBody is a /metrics body the size of a busy data-parallel vLLM's:
// the three gauges and 30 histograms of 25 buckets for each of ranks dp
// ranks.
func bigBody(ranks int) string {
	var b strings.Builder
	for _, g := range []string{vllmRunning, vllmWaiting, vllmUsage} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n", g, g)
		for r := range ranks {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d.0\n", g, r, r%2)
		}
	}
	for h := range 30 {
		fmt.Fprintf(&b, "# HELP vllm:histogram_%d x\n# TYPE vllm:histogram_%d histogram\n", h, h)
		for r := range ranks {
			for le := range 25 {
				fmt.Fprintf(&b, "vllm:histogram_%d_bucket{engine=\"%d\",le=\"%d.0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 12345.0\n", h, r, le)
			}
		}
	}
	return b.String()
}

// BenchmarkParse: the scraper's CPU per body (the line filter, then
// prometheus/common's parser over what is left).
func BenchmarkParse(b *testing.B) {
	for _, ranks := range []int{1, 8} {
		body := []byte(bigBody(ranks))
		rs := make([]uint32, ranks)
		for i := range rs {
			rs[i] = uint32(i)
		}
		b.Run(fmt.Sprintf("dp%d_%dKiB", ranks, len(body)>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if figs, _, _, err := parse(body, rs, DefaultMaxSeries); err != nil || len(figs) != ranks {
					b.Fatal(err, figs)
				}
			}
		})
	}
}

// BenchmarkScrape: one whole scrape over loopback HTTP (keep-alive), the
// figure handed on.
func BenchmarkScrape(b *testing.B) {
	body := bigBody(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
	defer srv.Close()
	s := New(Config{}, nil, &sink{})
	t := Target{Key: key(1), Endpoint: srv.URL, Ranks: []uint32{0}}
	b.ReportAllocs()
	for b.Loop() {
		s.scrape(context.Background(), t)
	}
}

// BenchmarkScrapeMocker: one whole scrape of a mock engine's /metrics
// (vLLM's gauges and prefix-cache counters, and its cache_config_info).
func BenchmarkScrapeMocker(b *testing.B) {
	e, err := mocker.New(mocker.Config{TotalBlocks: 64, BlockSize: 16, Worker: catalog.Worker{WorkerID: 1, ModelName: "m"}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(e)
	defer srv.Close()
	sk := &sink{}
	s := New(Config{}, nil, sk)
	t := Target{Key: key(1), Endpoint: srv.URL, Ranks: []uint32{0}}
	b.ReportAllocs()
	for b.Loop() {
		s.scrape(context.Background(), t)
	}
	if _, ok := sk.get(key(1), 0); !ok {
		b.Fatal("no figure")
	}
}
