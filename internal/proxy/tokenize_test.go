package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// tokenizeEngine serves POST /tokenize on loopback, answering every
// prompt with the same ids, and counts the calls.
func tokenizeEngine(t *testing.T, ids int) (url string, calls *atomic.Int64) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"count":`)
	fmt.Fprint(&b, ids)
	b.WriteString(`,"max_model_len":2000000,"tokens":[`)
	for i := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, 100000+i%50000)
	}
	b.WriteString(`]}`)
	answer := b.String()
	calls = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// liveHeap returns the bytes of live heap after a collection.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestTokenizeCacheBytes: many large answers to unique prompts (500,000
// ids, 2 MB each in the cache) keep the heap within the cache's byte
// bound, the oldest evicted and counted (the cache was bounded only by
// its 4,096 entries: 100 unique prompts of 2 million tokens took the
// proxy's heap past 1 GiB).
func TestTokenizeCacheBytes(t *testing.T) {
	const (
		prompts = 100
		ids     = 500_000
		bound   = 64 << 20
	)
	url, calls := tokenizeEngine(t, ids)
	m := newMetrics(func() int64 { return 0 })
	c := newTokenCache(4096, bound, m.cacheEvictions, m.cacheRefusals)
	m.watchCache(c)
	reg := prometheus.NewRegistry()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	tok := newTokenizer(http.DefaultClient, c)
	before := liveHeap()
	for i := range prompts {
		got, hit, err := tok.tokens(context.Background(), url, fmt.Appendf(nil, `{"model":"m","prompt":"unique %d"}`, i))
		if err != nil || hit || len(got) != ids {
			t.Fatalf("prompt %d: %d ids, hit %v, %v", i, len(got), hit, err)
		}
	}
	growth := liveHeap() - before
	entry := entryBytes(slices.Clone(make([]uint32, ids))) // with the allocator's rounding
	kept := int(bound / entry)
	t.Logf("heap grew by %.1f MiB for %d answers of %.1f MiB (cache bound %d MiB)", float64(growth)/(1<<20), prompts, float64(4*ids)/(1<<20), bound>>20)
	if growth > bound+8<<20 {
		t.Errorf("heap grew by %d bytes, beyond the cache's bound of %d", growth, bound)
	}
	want := fmt.Sprintf(`
# HELP prefixd_proxy_tokenize_cache_bytes Bytes the tokenize cache holds (the ids and a fixed cost per entry), of --tokenize-cache-bytes.
# TYPE prefixd_proxy_tokenize_cache_bytes gauge
prefixd_proxy_tokenize_cache_bytes %d
# HELP prefixd_proxy_tokenize_cache_entries Tokenize answers the cache holds, of --tokenize-cache.
# TYPE prefixd_proxy_tokenize_cache_entries gauge
prefixd_proxy_tokenize_cache_entries %d
# HELP prefixd_proxy_tokenize_cache_evictions_total Tokenize answers pushed out of the cache (least recently used first) by its entry or byte bound.
# TYPE prefixd_proxy_tokenize_cache_evictions_total counter
prefixd_proxy_tokenize_cache_evictions_total %d
# HELP prefixd_proxy_tokenize_cache_refusals_total Tokenize answers not cached: larger than a sixteenth of the cache's byte bound.
# TYPE prefixd_proxy_tokenize_cache_refusals_total counter
prefixd_proxy_tokenize_cache_refusals_total 0
`, int64(kept)*entry, kept, prompts-kept)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "prefixd_proxy_tokenize_cache_bytes", "prefixd_proxy_tokenize_cache_entries",
		"prefixd_proxy_tokenize_cache_evictions_total", "prefixd_proxy_tokenize_cache_refusals_total"); err != nil {
		t.Error(err)
	}
	// The most recent answers are kept, the oldest were evicted.
	for _, c := range []struct {
		i   int
		hit bool
	}{{prompts - 1, true}, {prompts - kept, true}, {0, false}} {
		n := calls.Load()
		_, hit, err := tok.tokens(context.Background(), url, fmt.Appendf(nil, `{"model":"m","prompt":"unique %d"}`, c.i))
		if err != nil || hit != c.hit || (calls.Load() == n) != c.hit {
			t.Errorf("prompt %d: hit %v, want %v (%v)", c.i, hit, c.hit, err)
		}
	}
}

// TestTokenizeCacheRefusesLarge: an answer larger than a sixteenth of the
// byte bound is answered but not kept, and counted.
func TestTokenizeCacheRefusesLarge(t *testing.T) {
	url, calls := tokenizeEngine(t, 300_000) // 1.2 MB of ids
	m := newMetrics(func() int64 { return 0 })
	c := newTokenCache(4096, 16<<20, m.cacheEvictions, m.cacheRefusals) // keeps answers up to 1 MiB
	tok := newTokenizer(http.DefaultClient, c)
	for range 2 {
		if _, hit, err := tok.tokens(context.Background(), url, []byte(`{"model":"m","prompt":"p"}`)); err != nil || hit {
			t.Fatalf("hit %v, %v", hit, err)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the engine was asked %d times, want 2", n)
	}
	if b, n := c.Size(); b != 0 || n != 0 {
		t.Errorf("the cache holds %d bytes in %d entries", b, n)
	}
	if got := testutil.ToFloat64(m.cacheRefusals); got != 2 {
		t.Errorf("refusals %v, want 2", got)
	}
}
