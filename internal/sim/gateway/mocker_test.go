package gateway

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// startMocker runs a mock engine serving model "m" behind a real HTTP
// server and returns it with its ip:port.
func startMocker(t *testing.T, id uint64) (*mocker.Engine, string) {
	t.Helper()
	e, err := mocker.New(mocker.Config{TotalBlocks: 64, BlockSize: 4, Worker: catalog.Worker{WorkerID: id, ModelName: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Ready(t, "engine", func(ctx context.Context, ready func(string)) error {
		go func() {
			select {
			case <-e.Ready():
				ready(e.Publisher().Endpoint())
			case <-ctx.Done():
			}
		}()
		return e.Run(ctx)
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	testsupport.Eventually(t, 30*time.Second, "engine serving", func() bool {
		resp, err := http.Get(srv.URL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return e, srv.Listener.Addr().String()
}

// TestGatewayDisaggregatedMockers: the whole P/D path without GPUs. A
// picker names the decode engine as the destination and the prefill
// engine in x-prefiller-host-port; the decode engine's routing sidecar
// runs the prefill there, then decodes, and the client gets the stream
// token by token through the gateway.
func TestGatewayDisaggregatedMockers(t *testing.T) {
	t.Parallel()
	pre, preAddr := startMocker(t, 1)
	dec, decAddr := startMocker(t, 2)
	tr := newTranscript()
	epp := startEPP(t, nil, picker(tr, FullDuplexStreamed, func(*corev3.HeaderMap, []byte) decision {
		d := route(decAddr)
		d.set = map[string]string{"x-prefiller-host-port": preAddr}
		return d
	}))
	g, url := startGateway(t, Config{EPP: epp})
	prompt := "Disaggregated serving behind a gateway"
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"`+prompt+`","max_tokens":4,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	var events []string
	for {
		ev := readEvent(t, rd)
		if ev == "data: [DONE]" {
			break
		}
		events = append(events, ev)
	}
	if len(events) != 4 {
		t.Fatalf("events %q", events)
	}
	if got := dec.Sidecar(); got != (mocker.SidecarStats{Prefills: 1}) {
		t.Fatalf("decode sidecar %+v", got)
	}
	toks := mocker.Tokenize(prompt)
	if pre.Hit(toks) != len(toks)/4 || dec.Hit(toks) != len(toks)/4 {
		t.Fatalf("prefill engine hits %d blocks, decode engine %d; want %d on both", pre.Hit(toks), dec.Hit(toks), len(toks)/4)
	}
	if l := dec.Load(); l.PrefixQueries != 0 {
		t.Fatalf("the decode engine computed %d prompt tokens; want 0 (the KV came from the prefill)", l.PrefixQueries)
	}
	tr.waitFor(t, "end EOF")
	if st := g.Stats(); st.Requests != 1 || st.ProtocolErrors+st.EPPFailures+st.Fallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}
}
