package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func TestProxyRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "cheapest"}, `unknown policy "cheapest"`},
		{[]string{"--disagg-order", "prefill-first"}, "need --disagg"},
		{[]string{"--prefill-failure", "bypass_on_decode"}, "need --disagg"},
		{[]string{"--disagg", "--bypass-max-eff-isl-ratio", "2"}, "--bypass-max-eff-isl-ratio 2"},
		{[]string{"--request-timeout", "0s"}, "--request-timeout 0s: want > 0"},
		{[]string{"--tokenize-cache", "0"}, "--tokenize-cache 0: want > 0"},
		{[]string{"--read-timeout", "0s"}, "--read-timeout 0s: want > 0"},
		{[]string{"--tokenize-cache-bytes", "0"}, "--tokenize-cache-bytes 0: want > 0"},
		{[]string{"--pass-through", "/tokenize,faults"}, `--pass-through "faults": a path starts with /`},
		{[]string{"--pass-through", "/metrics"}, `pass-through path "/metrics" is served by the proxy itself`},
		{[]string{"--body-budget-bytes", "1000", "--max-body-bytes", "1000"}, "--body-budget-bytes 1000: want more than --max-body-bytes (1000)"},
		{[]string{"--server", "ftp://x"}, `--server "ftp://x"`},
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
	} {
		_, err := runCommand(t, append([]string{"proxy", "--listen", "127.0.0.1:0"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestProxyServes: prefixd proxy starts against a prefixd API, says so,
// serves /health and stops with its context.
func TestProxyServes(t *testing.T) {
	srv := httptest.NewServer(apiserver.NewHandler(apiserver.Config{Index: indexer.New(indexer.Options{})}))
	defer srv.Close()
	var out bytes.Buffer
	var errOut testsupport.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs([]string{"proxy", "--server", srv.URL, "--listen", "127.0.0.1:0", "--disagg"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	testsupport.Eventually(t, 10*time.Second, "the serving line", func() bool {
		return strings.Contains(errOut.String(), "prefixd proxy serving") && strings.Contains(errOut.String(), "mode=\"disaggregated decode-first\"")
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("proxy: %v\n%s", err, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("proxy did not stop")
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `msg="prefixd proxy stopped" took=`) {
		t.Errorf("last line %q, want the shutdown line", last)
	}
}
