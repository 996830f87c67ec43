package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// BenchmarkProxyOverhead is the latency the proxy adds to a request:
// the same kind of non-streamed completion (a 200-word prompt, 4 tokens,
// on a mock engine that costs nothing) sent to the engine directly and
// through the proxy (tokenize, select and reserve, forward, prefill
// complete, free), one request at a time, alternated. "cached" repeats
// one prompt, so the proxy's tokenize cache answers; "uncached" makes
// every prompt new (a word appended), so the proxy asks an engine's
// /tokenize each time. Reported: p50 and p99 of each path, and the
// difference of the p50s.
//
//	go test -run '^$' -bench ProxyOverhead -benchtime 2000x ./internal/proxy
func BenchmarkProxyOverhead(b *testing.B) {
	s := benchStack(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	send := func(url string, body []byte) time.Duration {
		start := time.Now()
		resp, err := hc.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("HTTP %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	for _, fresh := range []bool{false, true} {
		b.Run(map[bool]string{false: "cached", true: "uncached"}[fresh], func(b *testing.B) {
			n := 0
			body := func() []byte {
				p := longPrompt(1)
				if fresh {
					n++
					p += " w" + strconv.Itoa(n)
				}
				out, _ := json.Marshal(map[string]any{"model": model, "prompt": p, "max_tokens": 4})
				return out
			}
			send(s.url, body()) // warm the connections (and the cache)
			send(s.urls[1], body())
			var direct, proxied []time.Duration
			for b.Loop() {
				direct = append(direct, send(s.urls[1], body()))
				proxied = append(proxied, send(s.url, body()))
			}
			d, p := quantile.Of(direct), quantile.Of(proxied)
			µs := func(s quantile.Samples[time.Duration], f float64) float64 { return float64(s.At(f).Microseconds()) }
			b.ReportMetric(µs(d, 0.5), "direct-p50-µs")
			b.ReportMetric(µs(d, 0.99), "direct-p99-µs")
			b.ReportMetric(µs(p, 0.5), "proxy-p50-µs")
			b.ReportMetric(µs(p, 0.99), "proxy-p99-µs")
			b.ReportMetric(µs(p, 0.5)-µs(d, 0.5), "added-p50-µs")
		})
	}
}

// BenchmarkProxyThroughput is requests per second through the proxy with
// 32 clients, the proxy, prefixd and the engines on this machine's cores.
func BenchmarkProxyThroughput(b *testing.B) {
	s := benchStack(b)
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": longPrompt(2), "max_tokens": 4})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var wg sync.WaitGroup
	jobs := make(chan struct{})
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				resp, err := hc.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

func benchStack(b *testing.B) *stack {
	b.Helper()
	return startStack(b, proxy.Config{}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
}
