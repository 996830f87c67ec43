package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/engineload"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestDaemonEngineLoad: the daemon reads two mock engines' /metrics; the
// one kept busy (requests running on a stopped clock, KV blocks held)
// shows its load in /workers and is avoided by selection, which books
// nothing there. Beside them, hostile /metrics servers (huge, slow,
// garbage, NaN, negative, absurd) are bounded and counted by reason, never
// reach /workers, and the daemon stays healthy.
func TestDaemonEngineLoad(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) {
		c.APIToken = "tok"
		// Figures stay for a minute: a loaded machine's slow scrape does
		// not make the honest engines' go stale mid-test.
		c.EngineLoad = engineload.Config{Interval: 50 * time.Millisecond, StaleAfter: time.Minute, Timeout: time.Second, MaxBodyBytes: 64 << 10}
	})
	store := storetest.NewEtcdStore(t, etcd.Endpoints(), catalog.DefaultPrefix)
	ctx, cancel := context.WithCancel(context.Background())
	fleet := mocker.NewFleet(ctx, store, nil)
	t.Cleanup(func() {
		cancel()
		if err := fleet.Stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("fleet: %v", err)
		}
	})
	clocks := map[uint64]*mocker.VirtualClock{}
	engines := map[uint64]*mocker.Engine{}
	for id := uint64(1); id <= 2; id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		clocks[id] = mocker.NewVirtualClock(time.Unix(1_000_000, 0))
		w := catalog.Worker{WorkerID: id, ModelName: "m", Endpoint: "http://" + ln.Addr().String()}
		e, err := fleet.Start(ctx, mocker.Config{TotalBlocks: 64, BlockSize: 16, Worker: w, LeaseTTL: 5 * time.Second,
			Clock: clocks[id], Timing: mocker.Timing{DecodePerSeq: time.Millisecond}}, ln)
		if err != nil {
			t.Fatal(err)
		}
		engines[id] = e
	}
	// Engine 1 takes three requests of two blocks each, on a clock that
	// does not move: those it runs hold their blocks, and the others
	// wait, as long as the test runs.
	for i := range 3 {
		toks := make([]uint32, 32)
		for j := range toks {
			toks[j] = uint32(1000*i + j)
		}
		go func() { _, _ = engines[1].Serve(ctx, mocker.Request{TokenIDs: toks, MaxTokens: 100}) }()
	}
	testsupport.Eventually(t, 20*time.Second, "engine 1 holding three requests", func() bool {
		l := engines[1].Load()
		return l.Running+l.Waiting == 3 && l.Running > 0
	})
	held := engines[1].Load()

	listener := func(model string, id uint64) (api.Listener, bool) {
		_, body := call(t, "GET", d.url+"/workers?model_name="+model, "", nil)
		var ws []api.WorkerInfo
		if json.Unmarshal(body, &ws) != nil {
			return api.Listener{}, false
		}
		for _, w := range ws {
			if w.InstanceID == id {
				l, ok := w.Listeners[0]
				return l, ok
			}
		}
		return api.Listener{}, false
	}
	var busy api.Listener
	testsupport.Eventually(t, 20*time.Second, "engine 1's load in /workers", func() bool {
		l, ok := listener("m", 1)
		busy = l
		return ok && l.Load != nil && l.Load.Engine != nil && l.Load.Engine.Running == held.Running && l.Load.Engine.Waiting == held.Waiting
	})
	if e := busy.Load.Engine; e.KVUsage != held.KVUsage || e.AgeSeconds < 0 || e.AgeSeconds > 5 {
		t.Fatalf("engine 1's figure %+v", e)
	}
	if want := int(busy.Load.Engine.KVUsage*64 + 0.5); busy.Load.Effective.Blocks != want || busy.Load.Effective.Requests != 3 || busy.Load.Booked != (api.LoadTerms{}) {
		t.Fatalf("engine 1's load %+v, want %d blocks and 3 requests from the engine, none booked", busy.Load, want)
	}
	testsupport.Eventually(t, 20*time.Second, "engine 2's idle figure in /workers", func() bool {
		l, ok := listener("m", 2)
		return ok && l.Load != nil && l.Load.Engine != nil && l.Load.Effective == (api.LoadTerms{})
	})
	// Without the figures the two are equal (nothing booked): a tie
	// broken at random. With them, every selection avoids engine 1.
	for i := range 16 {
		toks := make([]uint32, 32)
		for j := range toks {
			toks[j] = uint32(50_000 + 100*i + j)
		}
		code, body := call(t, "POST", d.url+"/select", "", map[string]any{"model_name": "m", "token_ids": toks})
		var s api.Selection
		if code != 200 || json.Unmarshal(body, &s) != nil {
			t.Fatalf("select: %d %s", code, body)
		}
		if s.WorkerID != 2 {
			t.Fatalf("selection %d chose the loaded engine %d: %s", i, s.WorkerID, body)
		}
	}

	// Hostile engines, in a model of their own.
	hostile := map[uint64]http.HandlerFunc{
		11: func(w http.ResponseWriter, r *http.Request) { // endless
			for i := 0; i < 1<<20; i++ {
				if _, err := fmt.Fprintf(w, "# padding %d\n", i); err != nil {
					return
				}
			}
		},
		12: func(w http.ResponseWriter, r *http.Request) { // slow
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		},
		13: func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\" {{{\n")
		},
		14: func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n")
		},
		15: func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_running 1\nvllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 7\n")
		},
		16: func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "vllm:num_requests_running 1e300\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n")
		},
	}
	for id, h := range hostile {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		reg := map[string]any{"instance_id": id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 1+id), "model_name": "h", "block_size": 16,
			"engine_endpoint": srv.URL, "total_kv_blocks": 64}
		if code, body := call(t, "POST", d.url+"/register", "tok", reg); code != http.StatusCreated {
			t.Fatalf("register %d: %d %s", id, code, body)
		}
	}
	failures := func() map[string]float64 {
		_, body := call(t, "GET", d.url+"/metrics", "", nil)
		out := map[string]float64{}
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, `prefixd_engine_load_scrape_failures_total{reason="`); ok {
				var v float64
				fmt.Sscan(rest[strings.IndexByte(rest, ' ')+1:], &v)
				out[rest[:strings.IndexByte(rest, '"')]] = v
			}
		}
		return out
	}
	testsupport.Eventually(t, 20*time.Second, "every hostile engine counted", func() bool {
		f := failures()
		return f["too_large"] > 0 && f["timeout"] > 0 && f["parse"] > 0 && f["bad_value"] >= 3
	})
	for id := range hostile {
		if l, ok := listener("h", id); !ok || l.Load == nil || l.Load.Engine != nil {
			t.Errorf("hostile engine %d: %+v", id, l.Load)
		}
	}
	if code, _ := call(t, "GET", d.url+"/health", "", nil); code != 200 {
		t.Fatalf("/health %d", code)
	}
	// The honest engines still count.
	if l, _ := listener("m", 1); l.Load == nil || l.Load.Engine == nil || l.Load.Effective.Requests != 3 {
		t.Fatalf("engine 1 after the hostile ones: %+v", l.Load)
	}
	_, body := call(t, "GET", d.url+"/metrics", "", nil)
	for _, want := range []string{fmt.Sprintf(`prefixd_engine_load_running{dp_rank="0",group="default",model="m",worker="1"} %d`, held.Running), `prefixd_engine_load_ranks{state="engine"} 2`,
		`prefixd_engine_load_ranks{state="bookings_only"} 6`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
