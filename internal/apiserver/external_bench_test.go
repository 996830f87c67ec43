package apiserver

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/sim/pauses"
	"github.com/prefixd/prefixd/internal/testsupport/openloop"
)

// The load generator of BenchmarkQuery8KExternal runs in its own process:
// this test binary, re-executed with these variables set, runs openloop.Run
// instead of the tests (TestMain) and prints its openloop.Result as JSON.
const (
	loadgenURL    = "PREFIXD_LOADGEN_URL"
	loadgenClient = "PREFIXD_LOADGEN_CLIENT" // "raw" (rawSender) or "http" (net/http's client)
	// The generator's own CPU profile goes to this file, if set.
	loadgenProfile = "PREFIXD_LOADGEN_CPUPROFILE"
)

var (
	externalWindow = flag.Duration("external.window", 2*time.Second, "how long each BenchmarkQuery8KExternal run sends")
	externalClient = flag.String("external.client", "raw", "BenchmarkQuery8KExternal's client: raw (one Write per request, no allocation) or http (net/http's)")
	// With the benchmark itself under `taskset -c 0` and GOMAXPROCS=1,
	// -external.gen-cpus=1 gives server and generator a core each.
	externalGenCPUs = flag.String("external.gen-cpus", "", "BenchmarkQuery8KExternal runs its load generator on these CPUs (taskset -c), if set")
)

// externalWarm is how long each external run sends before it measures,
// on the same connections: a router's connections are long-lived, and
// a new connection's first requests (its goroutine's stack growing, the
// first reads of its buffers) are not what it sees.
const externalWarm = 250 * time.Millisecond

func TestMain(m *testing.M) {
	if url := os.Getenv(loadgenURL); url != "" {
		os.Exit(runLoadgen(url))
	}
	os.Exit(m.Run())
}

func runLoadgen(url string) int {
	body, rate, window, err := openloop.ReadArgs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	var newSender func() (openloop.Sender, error)
	switch c := os.Getenv(loadgenClient); c {
	case "", "raw":
		newSender = func() (openloop.Sender, error) { return newRawSender(url, body) }
	case "http":
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: openloop.Senders, DisableCompression: true}}
		newSender = func() (openloop.Sender, error) { return openloop.HTTPSender{Client: client, URL: url, Body: body}, nil }
	default:
		fmt.Fprintf(os.Stderr, "loadgen: %s=%q: want raw or http\n", loadgenClient, c)
		return 2
	}
	if file := os.Getenv(loadgenProfile); file != "" {
		f, err := os.Create(file)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			return 2
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	r := openloop.Run(newSender, rate, externalWarm, window)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	return 0
}

// loadgenCmd is the load generator's process for route at rate. The
// runtime settings of the process under test (GOGC, GOMEMLIMIT,
// GOMAXPROCS, GODEBUG) are not passed on: the generator runs with the
// defaults whatever the server is tried with.
func loadgenCmd(srvURL, route, bodyFile string, rate int, window time.Duration, client string) *exec.Cmd {
	var prefix []string
	if *externalGenCPUs != "" {
		prefix = []string{"taskset", "-c", *externalGenCPUs}
	}
	return openloop.Child(prefix, bodyFile, rate, window, loadgenURL+"="+srvURL+"/"+route, loadgenClient+"="+client)
}

// BenchmarkQuery8KExternal is BenchmarkQuery8K's open loop with the load
// generator in its own process (the test binary re-executed), so that the
// server's figures do not include the client's Go runtime: POST /query
// with the 8,192-token prompt (50 KB of token ids), and POST
// /query_by_hash with its 512 local block hashes (the fast path: a 10 KB
// body and no hashing on the server). Both processes share the machine's
// cores. Each sub-benchmark sends for externalWarm (250 ms, not
// measured) and then -external.window (2 s), whatever b.N:
//
//	go test -run '^$' -bench Query8KExternal ./internal/apiserver/
//
// Besides the latencies (openloop.Run: from the nominal millisecond each
// request was due) and the rate the generator reached (sent-req/s; a run
// under 99 % of its offered rate says so: short=1 and a line in the
// log), it reports wait-p99-µs, the part of the latency spent
// before the request was written (the generator's, or a core's), and
// the CPU time each process used per request: srv-cpu-µs/req (this
// process: the server, whose figure a CPU profile of this run breaks
// down) and gen-cpu-µs/req (the generator); and the machine's own pauses
// in 300 ms before the run, with the server idle (pauses.Watch): those
// of 250 µs or more per second (pauses-250µs/s) and the share of the
// time the core was away (paused-%). -external.client=http sends with
// net/http's client instead of rawSender; -external.gen-cpus runs the
// generator under taskset -c.
//
// The server is the daemon's, NewServer. The control, floor: the /query
// body to a handler that reads it and writes /query's response as canned
// bytes — what net/http, the kernel and the machine cost a request
// without prefixd's decoding, matching and scoring.
func BenchmarkQuery8KExternal(b *testing.B) {
	ix, p := benchIndex(b)
	h := NewHandler(Config{Index: ix})
	queryBody := benchBody(b, p)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/query", bytes.NewReader(queryBody)))
	if rec.Code != http.StatusOK {
		b.Fatalf("/query: %d %s", rec.Code, rec.Body)
	}
	canned := rec.Body.Bytes()
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/floor", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(canned)))
		w.Write(canned)
	})
	url := "http://" + liveServer(b, mux, ServerConfig{})
	dir := b.TempDir()
	bodies := map[string][]byte{"query": queryBody, "query_by_hash": byHashBody(p), "floor": queryBody}
	for route, body := range bodies {
		if err := os.WriteFile(filepath.Join(dir, route+".json"), body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	runs := []struct {
		route string
		rates []int
	}{
		{"query", []int{2000, 5000, 7500}},
		{"query_by_hash", []int{2000, 5000, 7500}},
		{"floor", []int{5000}},
	}
	for _, run := range runs {
		for _, rate := range run.rates {
			b.Run(fmt.Sprintf("%s/rate=%d", run.route, rate), func(b *testing.B) {
				// The machine's own pauses just before, with the server
				// idle: a pause of 250 µs or more takes a quarter of
				// the p99 goal from every request it catches.
				w := pauses.Watch(300 * time.Millisecond)
				r := openloop.RunProcess(b, loadgenCmd(url, run.route, filepath.Join(dir, run.route+".json"), rate, *externalWindow, *externalClient))
				r.Report(b)
				b.ReportMetric(w.Rate(250*time.Microsecond), "pauses-250µs/s")
				b.ReportMetric(w.Share(pauses.MinGap)*100, "paused-%")
			})
		}
	}
}

// TestLoadgen runs the external load generator briefly against a real
// server: it must send what it is asked at the rate, and report it.
func TestLoadgen(t *testing.T) {
	ix, p := dynamoExample(t)
	srv := httptest.NewServer(NewHandler(Config{Index: ix}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(file, []byte(`{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"raw", "http"} {
		t.Run(client, func(t *testing.T) {
			out, err := loadgenCmd(srv.URL, "query", file, 200, 500*time.Millisecond, client).Output()
			if err != nil {
				t.Fatalf("load generator: %v", err)
			}
			var r openloop.Result
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatal(err)
			}
			if r.Failed != 0 || len(r.Latencies) < 50 || len(r.Latencies) > 100 || len(r.Waits) != len(r.Latencies) {
				t.Fatalf("load generator sent %d requests (%d failed, %d waits) in 500 ms at 200/s", len(r.Latencies), r.Failed, len(r.Waits))
			}
			// It says what it offered and what it sent: every request due
			// in the window that was not dropped.
			if r.Offered != 200 || r.Sent+int(r.Dropped) != 100 || r.SentIn <= 0 || r.SentIn > 2*time.Second {
				t.Fatalf("load generator offered %v/s and sent %d (%d dropped) in %v; want 200/s and 100", r.Offered, r.Sent, r.Dropped, r.SentIn)
			}
			// Before them, externalWarm's worth, not measured.
			if want := int(200 * externalWarm / time.Second); r.Warmup != want {
				t.Fatalf("load generator warmed up with %d requests, want %d", r.Warmup, want)
			}
		})
	}
}

// TestLoadResultShort: a run that sent less than 99 % of its offered
// rate, or dropped a request, says so, in a metric and in the log.
func TestLoadResultShort(t *testing.T) {
	for _, c := range []struct {
		r     openloop.Result
		short bool
	}{
		{openloop.Result{Offered: 5000, Sent: 10000, SentIn: 2 * time.Second}, false},
		{openloop.Result{Offered: 5000, Sent: 10000, SentIn: 2*time.Second - time.Millisecond}, false},
		{openloop.Result{Offered: 5000, Sent: 9000, SentIn: 2 * time.Second}, true},
		{openloop.Result{Offered: 5000, Sent: 10000, SentIn: 2200 * time.Millisecond}, true},
		{openloop.Result{Offered: 5000, Sent: 9999, SentIn: 2 * time.Second, Dropped: 1}, true},
		{openloop.Result{Offered: 5000}, true},
	} {
		var rec metricRecorder
		c.r.Report(&rec)
		if c.r.Short() != c.short || (rec.metrics["short"] == 1) != c.short || strings.Contains(rec.log, "fell short") != c.short {
			t.Errorf("%+v: Short %v, metrics %v, log %q; want short=%v", c.r, c.r.Short(), rec.metrics, rec.log, c.short)
		}
	}
}

// metricRecorder records what report reports.
type metricRecorder struct {
	metrics map[string]float64
	log     string
}

func (m *metricRecorder) ReportMetric(v float64, unit string) {
	if m.metrics == nil {
		m.metrics = map[string]float64{}
	}
	m.metrics[unit] = v
}

func (m *metricRecorder) Logf(format string, args ...any) { m.log += fmt.Sprintf(format, args...) }

// TestRawSender checks that rawSender fails what is not a 200 with a
// Content-Length of at least 100 bytes, and dials again after the server
// closes the connection.
func TestRawSender(t *testing.T) {
	long := strings.Repeat("x", 100)
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			t.Error(err)
		}
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, long)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, long)
		case "/short":
			io.WriteString(w, "x")
		case "/chunked":
			io.WriteString(w, long)
			w.(http.Flusher).Flush() // no Content-Length
		default:
			http.Error(w, long, http.StatusNotFound)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	for _, c := range []struct {
		path  string
		ok    bool
		conns int64 // connections dialled after two sends
	}{
		{"/ok", true, 1},
		{"/close", true, 2},
		{"/short", false, 2},
		{"/chunked", false, 2},
		{"/missing", false, 2},
	} {
		conns.Store(0)
		s, err := newRawSender(srv.URL+c.path, []byte(`{"x":1}`))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := s.Send(); (err == nil) != c.ok {
				t.Errorf("%s: send %d: %v, want ok=%v", c.path, i, err, c.ok)
			}
		}
		s.Close()
		if n := conns.Load(); n != c.conns {
			t.Errorf("%s: %d connections, want %d", c.path, n, c.conns)
		}
	}
}

// TestOpenLoopPacedWrites runs openloop.Run's paced writes (rawSender)
// against servers that answer well, with an error, and by closing every
// connection: the first run must send all its requests and fail none,
// the others must fail, the last after each sender's one request.
func TestOpenLoopPacedWrites(t *testing.T) {
	long := strings.Repeat("x", 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
		}
		io.WriteString(w, long)
	}))
	defer srv.Close()
	const rate, window = 1000, 200 * time.Millisecond
	for _, c := range []struct {
		path   string
		ok     int  // requests that must succeed
		failed bool // whether the run must fail
	}{
		{"/ok", rate * int(window/time.Millisecond) / 1000, false},
		{"/missing", 0, true},
		{"/close", openloop.Senders, true}, // each sender retires after one: then none is left
	} {
		r := openloop.Run(func() (openloop.Sender, error) { return newRawSender(srv.URL+c.path, []byte(`{}`)) }, rate, 0, window)
		if len(r.Latencies) != c.ok || (r.Failed > 0) != c.failed {
			t.Errorf("%s: %d requests answered, %d failed; want %d answered, failed=%v", c.path, len(r.Latencies), r.Failed, c.ok, c.failed)
		}
		if c.path == "/ok" && len(r.Waits) != c.ok {
			t.Errorf("%s: %d waits for %d requests", c.path, len(r.Waits), c.ok)
		}
	}
}
