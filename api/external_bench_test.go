package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// The load generator of BenchmarkQuery8KExternal runs in its own process:
// this test binary, re-executed with these variables set, runs openLoop
// instead of the tests (TestMain) and prints its loadResult as JSON.
const (
	loadgenURL    = "PREFIXD_LOADGEN_URL"
	loadgenBody   = "PREFIXD_LOADGEN_BODY" // a file holding the request body
	loadgenRate   = "PREFIXD_LOADGEN_RATE"
	loadgenWindow = "PREFIXD_LOADGEN_WINDOW"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(loadgenURL); url != "" {
		os.Exit(runLoadgen(url))
	}
	os.Exit(m.Run())
}

func runLoadgen(url string) int {
	body, err := os.ReadFile(os.Getenv(loadgenBody))
	rate, rerr := strconv.Atoi(os.Getenv(loadgenRate))
	window, werr := time.ParseDuration(os.Getenv(loadgenWindow))
	if err != nil || rerr != nil || werr != nil || rate <= 0 {
		fmt.Fprintln(os.Stderr, "loadgen:", err, rerr, werr)
		return 2
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
	r := openLoop(client, url, body, rate, window)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	return 0
}

// BenchmarkQuery8KExternal is BenchmarkQuery8K's open loop with the load
// generator in its own process (the test binary re-executed), so that the
// server's figures do not include the client's Go runtime: POST /query
// with the 8,192-token prompt (50 KB of token ids), and POST
// /query_by_hash with its 512 local block hashes (the fast path: a 10 KB
// body and no hashing on the server). Both processes share the machine's
// cores. Each sub-benchmark runs 2 s whatever b.N:
//
//	go test -run '^$' -bench Query8KExternal ./api/
func BenchmarkQuery8KExternal(b *testing.B) {
	ix, p := benchIndex(b)
	srv := httptest.NewServer(NewHandler(Config{Index: ix}))
	defer srv.Close()
	var hashes []string
	for _, h := range indexer.HashBlocks(nil, p, 16, indexer.BaseSeed) {
		hashes = append(hashes, strconv.FormatInt(int64(h), 10))
	}
	dir := b.TempDir()
	bodies := map[string][]byte{
		"query":         benchBody(b, p),
		"query_by_hash": []byte(`{"model_name":"m","block_hashes":[` + strings.Join(hashes, ",") + `]}`),
	}
	for _, route := range []string{"query", "query_by_hash"} {
		file := filepath.Join(dir, route+".json")
		if err := os.WriteFile(file, bodies[route], 0o644); err != nil {
			b.Fatal(err)
		}
		for _, rate := range []int{2000, 5000, 7500} {
			b.Run(fmt.Sprintf("%s/rate=%d", route, rate), func(b *testing.B) {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), loadgenURL+"="+srv.URL+"/"+route, loadgenBody+"="+file,
					loadgenRate+"="+strconv.Itoa(rate), loadgenWindow+"=2s")
				cmd.Stderr = os.Stderr
				out, err := cmd.Output()
				if err != nil {
					b.Fatalf("load generator: %v", err)
				}
				var r loadResult
				if err := json.Unmarshal(out, &r); err != nil {
					b.Fatalf("load generator's result: %v", err)
				}
				if r.Failed > 0 {
					b.Fatalf("%d requests failed", r.Failed)
				}
				r.report(b)
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
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), loadgenURL+"="+srv.URL+"/query", loadgenBody+"="+file, loadgenRate+"=200", loadgenWindow+"=500ms")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("load generator: %v", err)
	}
	var r loadResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.Failed != 0 || len(r.Latencies) < 50 || len(r.Latencies) > 100 {
		t.Fatalf("load generator sent %d requests (%d failed) in 500 ms at 200/s", len(r.Latencies), r.Failed)
	}
}
