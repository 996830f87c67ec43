package engineload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// sink records what the scraper hands on.
type sink struct {
	mu   sync.Mutex
	last map[rankKey]coordinator.EngineLoad
	sets int
}

func (s *sink) SetEngineLoad(k coordinator.EngineKey, r uint32, l coordinator.EngineLoad) error {
	if !l.At.IsZero() {
		if err := l.Validate(); err != nil {
			panic(fmt.Sprintf("the scraper handed on a refused figure: %v", err))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[rankKey]coordinator.EngineLoad{}
	}
	s.last[rankKey{k, r}] = l
	s.sets++
	return nil
}

func (s *sink) get(k coordinator.EngineKey, r uint32) (coordinator.EngineLoad, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.last[rankKey{k, r}]
	return l, ok
}

func key(id uint64) coordinator.EngineKey {
	return coordinator.EngineKey{Model: "m", Group: "g", WorkerID: id}
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	s     *Scraper
	sink  *sink
	clock *clock
	reg   *prometheus.Registry
	mu    sync.Mutex
	ts    []Target
}

func newFixture(t *testing.T, cfg Config) *fixture {
	f := &fixture{sink: &sink{}, clock: &clock{t: time.Unix(1_000_000, 0)}, reg: prometheus.NewRegistry()}
	cfg.Now, cfg.Registry = f.clock.now, f.reg
	f.s = New(cfg, func() []Target { f.mu.Lock(); defer f.mu.Unlock(); return f.ts }, f.sink)
	return f
}

func (f *fixture) set(ts ...Target) { f.mu.Lock(); f.ts = ts; f.mu.Unlock() }

// round runs one round to its end.
func (f *fixture) round() {
	var wg sync.WaitGroup
	f.s.round(context.Background(), &wg)
	wg.Wait()
}

func (f *fixture) failures(reason string) float64 {
	return testutil.ToFloat64(f.s.m.failures.WithLabelValues(reason))
}

func serve(t *testing.T, h http.HandlerFunc) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func text(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, body)
	}
}

func TestScrapeHandsOnFigures(t *testing.T) {
	f := newFixture(t, Config{})
	f.set(Target{Key: key(1), Endpoint: serve(t, text(vllmBody)), Ranks: []uint32{0, 1}},
		Target{Key: key(2), Endpoint: serve(t, text(sglangBody)) + "/", Ranks: []uint32{4, 5}})
	f.round()
	at := f.clock.now()
	for _, c := range []struct {
		id   uint64
		rank uint32
		want coordinator.EngineLoad
	}{
		{1, 0, coordinator.EngineLoad{At: at, Running: 3, Waiting: 2, KVUsage: 0.25}},
		{1, 1, coordinator.EngineLoad{At: at}},
		{2, 4, coordinator.EngineLoad{At: at, Running: 7, Waiting: 1, KVUsage: 0.5}},
	} {
		if got, _ := f.sink.get(key(c.id), c.rank); got != c.want {
			t.Errorf("worker %d rank %d: %+v, want %+v", c.id, c.rank, got, c.want)
		}
	}
	for _, r := range reasons {
		if n := f.failures(r); n != 0 {
			t.Errorf("failures{reason=%q} = %v", r, n)
		}
	}
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP prefixd_engine_load_ranks Ranks whose engine figure counts in selection (state=engine), and ranks counted by bookings alone (state=bookings_only: no figure yet, stale, or unreachable).
# TYPE prefixd_engine_load_ranks gauge
prefixd_engine_load_ranks{state="bookings_only"} 0
prefixd_engine_load_ranks{state="engine"} 4
`), "prefixd_engine_load_ranks"); err != nil {
		t.Fatal(err)
	}
}

// TestScrapeHostile: every hostile /metrics is bounded and counted, its
// rank never gets a figure, and the honest engine beside it does.
func TestScrapeHostile(t *testing.T) {
	good := "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n"
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	for _, tc := range []struct {
		reason string
		h      http.HandlerFunc
	}{
		{"too_large", func(w http.ResponseWriter, r *http.Request) { // declared
			w.Header().Set("Content-Length", "100000000")
			fmt.Fprint(w, good)
		}},
		{"too_large", func(w http.ResponseWriter, r *http.Request) { // chunked, endless
			for i := 0; i < 1<<20; i++ {
				if _, err := fmt.Fprintf(w, "# padding %d\n", i); err != nil {
					return
				}
			}
		}},
		{"timeout", func(w http.ResponseWriter, r *http.Request) { // headers, then nothing
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}},
		{"parse", text("vllm:num_requests_running{engine=\"0\" garbage\n")},
		{"bad_value", text("vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n")},
		{"bad_value", text("vllm:num_requests_running 1\nvllm:num_requests_waiting -4\nvllm:kv_cache_usage_perc 0.5\n")},
		{"bad_value", text("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc +Inf\n")},
		{"bad_value", text("vllm:num_requests_running 1e15\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n")},
		{"too_many_series", text(strings.Repeat("vllm:num_requests_running 1\n", 200))},
		{"too_many_series", text(strings.Repeat("# HELP vllm:num_requests_running x\n", 200))},
		{"parse", text("vllm:num_requests_running{engine=\"" + strings.Repeat("9", 70<<10) + "\"} 1\n")}, // a line over 64 KiB
		{"status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }},
		{"missing", text("something_else 1\n")},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			timeout := 10 * time.Second // the honest engine answers, however loaded the machine
			if tc.reason == "timeout" {
				timeout = 200 * time.Millisecond
			}
			f := newFixture(t, Config{Timeout: timeout, MaxBodyBytes: 128 << 10, MaxSeries: 100})
			f.set(Target{Key: key(1), Endpoint: serve(t, tc.h), Ranks: []uint32{0}},
				Target{Key: key(2), Endpoint: serve(t, text(good)), Ranks: []uint32{0}})
			start := time.Now()
			f.round()
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("a round took %v", took)
			}
			if n := f.failures(tc.reason); n != 1 {
				t.Fatalf("failures{reason=%q} = %v, want 1", tc.reason, n)
			}
			if l, ok := f.sink.get(key(1), 0); ok {
				t.Fatalf("the hostile engine's rank got a figure: %+v", l)
			}
			if l, _ := f.sink.get(key(2), 0); l.Running != 1 || l.KVUsage != 0.5 {
				t.Fatalf("the honest engine's figure: %+v", l)
			}
		})
	}
}

// TestScrapeStale: a figure that cannot be refreshed stops counting after
// StaleAfter, at once when the engine is unreachable, and counts again
// when a scrape succeeds.
func TestScrapeStale(t *testing.T) {
	var fail atomic.Bool
	good := "vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n"
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, good)
	})
	f := newFixture(t, Config{Interval: time.Second, StaleAfter: 3 * time.Second})
	f.set(Target{Key: key(1), Endpoint: url, Ranks: []uint32{0}})
	f.round()
	if l, _ := f.sink.get(key(1), 0); l.At.IsZero() {
		t.Fatal("no figure")
	}
	fail.Store(true)
	for range 2 {
		f.clock.add(time.Second)
		f.round()
		if l, _ := f.sink.get(key(1), 0); l.At.IsZero() {
			t.Fatal("forgotten before StaleAfter")
		}
	}
	f.clock.add(time.Second)
	f.round()
	if l, _ := f.sink.get(key(1), 0); !l.At.IsZero() {
		t.Fatalf("a figure StaleAfter old still counts: %+v", l)
	}
	if rs := f.s.Ranks(); len(rs) != 1 || rs[0].Counts {
		t.Fatalf("ranks %+v", rs)
	}
	fail.Store(false)
	f.clock.add(time.Second)
	f.round()
	if l, _ := f.sink.get(key(1), 0); l.Running != 2 {
		t.Fatalf("a good scrape did not count again: %+v", l)
	}

	// Unreachable: forgotten at the first failure.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	f.set(Target{Key: key(1), Endpoint: dead, Ranks: []uint32{0}})
	f.clock.add(time.Second)
	f.round()
	if l, _ := f.sink.get(key(1), 0); !l.At.IsZero() {
		t.Fatalf("an unreachable engine's figure still counts: %+v", l)
	}
	if n := f.failures("unreachable"); n != 1 {
		t.Fatalf("unreachable = %v", n)
	}
}

// TestScrapeConcurrency: at most Concurrency scrapes run at once, and an
// engine still being scraped is not scraped again.
func TestScrapeConcurrency(t *testing.T) {
	var cur, peak, total atomic.Int32
	release := make(chan struct{})
	h := func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		total.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		cur.Add(-1)
		fmt.Fprint(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
	}
	f := newFixture(t, Config{Concurrency: 2, Timeout: 30 * time.Second})
	var ts []Target
	for i := range 6 {
		ts = append(ts, Target{Key: key(uint64(i)), Endpoint: serve(t, h), Ranks: []uint32{0}})
	}
	f.set(ts...)
	var wg sync.WaitGroup
	f.s.round(context.Background(), &wg)
	testsupport.Eventually(t, 10*time.Second, "two scrapes running", func() bool { return cur.Load() >= 2 })
	f.s.round(context.Background(), &wg) // every engine is in flight: starts nothing
	close(release)
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak concurrency %d, want 2", p)
	}
	if n := total.Load(); n != 6 {
		t.Fatalf("%d scrapes, want 6 (one per engine)", n)
	}
}

// TestRunStops: Run returns once ctx ends, with scrapes in flight.
func TestRunStops(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})
	s := New(Config{Interval: 10 * time.Millisecond, Timeout: time.Minute}, func() []Target {
		return []Target{{Key: key(1), Endpoint: url, Ranks: []uint32{0}}}
	}, &sink{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}
