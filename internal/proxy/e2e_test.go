package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

const model = "m"

// spec is one mock engine of a stack.
type spec struct {
	id     uint64
	role   catalog.Role
	domain string // its rack (KV-transfer domain), if any
	// unindexed engines are registered without KV-event endpoints: prefixd
	// has no index of them.
	unindexed bool
	// noEndpoint engines are registered without their HTTP endpoint:
	// indexed, but not schedulable.
	noEndpoint bool
	// batched is the engine's max_num_batched_tokens (0: not registered).
	batched uint64
	// gate, when not nil, stands in front of the engine's HTTP API (the
	// endpoint registered is the gate's).
	gate *gate
	// timing prices the engine's steps (zero: as fast as it runs).
	timing mocker.Timing
}

// stack is a real etcd, prefixd serve, mock engines speaking vLLM's
// OpenAI API and prefixd proxy, on loopback.
type stack struct {
	t       testing.TB
	prefixd *client.Client
	store   *etcdstore.Store
	fleet   *mocker.Fleet
	engines map[uint64]*mocker.Engine
	urls    map[uint64]string
	proxy   *proxy.Proxy
	url     string
	logs    *testlog.Recorder
}

func startStack(t testing.TB, pcfg proxy.Config, coord coordinator.CoordinatorConfig, specs ...spec) *stack {
	t.Helper()
	return startStackToken(t, "", pcfg, coord, specs...)
}

// startStackToken is startStack with prefixd serve guarding its booking
// routes with apiToken (serve --api-token).
func startStackToken(t testing.TB, apiToken string, pcfg proxy.Config, coord coordinator.CoordinatorConfig, specs ...spec) *stack {
	t.Helper()
	return startStackDaemon(t, func(c *daemon.Config) { c.APIToken = apiToken }, pcfg, coord, specs...)
}

// startStackDaemon is startStack with prefixd serve's configuration
// edited by edit (nil: none).
func startStackDaemon(t testing.TB, edit func(*daemon.Config), pcfg proxy.Config, coord coordinator.CoordinatorConfig, specs ...spec) *stack {
	t.Helper()
	etcd := storetest.StartEtcd(t)
	addr, _ := testsupport.Ready(t, "daemon", func(ctx context.Context, ready func(string)) error {
		cfg := daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
			OnReady: ready, ReadyTimeout: 30 * time.Second, Coordinator: coord, Logger: slog.New(slog.DiscardHandler),
			Subscriber: stream.SubscriberConfig{ProbeInterval: 100 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond}}
		if edit != nil {
			edit(&cfg)
		}
		return daemon.Run(ctx, cfg)
	})
	ctx := context.Background()
	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	s := &stack{t: t, prefixd: client.New("http://"+addr, ""), store: store, engines: map[uint64]*mocker.Engine{}, urls: map[uint64]string{}}
	s.fleet = mocker.NewFleet(ctx, store, nil)
	t.Cleanup(func() {
		if err := s.fleet.Stop(); err != nil {
			t.Errorf("fleet: %v", err)
		}
	})
	for _, sp := range specs {
		s.startEngine(sp)
	}
	s.waitIndexed(specs)
	s.logs, pcfg.Logger = testlog.New(t)
	if pcfg.Prefixd != nil { // the test's own client (its transport), to this daemon
		pcfg.Prefixd.BaseURL = s.prefixd.BaseURL
	} else {
		pcfg.Prefixd = s.prefixd
	}
	pcfg.Refresh = 50 * time.Millisecond
	if s.proxy, err = proxy.New(pcfg); err != nil {
		t.Fatal(err)
	}
	// The proxy's own server (its timeouts and limits), as prefixd proxy
	// runs it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Go(t, "proxy", func(ctx context.Context) error { return s.proxy.Serve(ctx, ln, 10*time.Second) })
	s.url = "http://" + ln.Addr().String()
	testsupport.Eventually(t, 20*time.Second, "the proxy's fleet view", func() bool {
		_, body := s.get("/v1/models")
		return strings.Contains(body, `"id":"m"`)
	})
	t.Cleanup(s.checkNoBookings)
	return s
}

func (s *stack) startEngine(sp spec) {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	if sp.gate != nil {
		url = sp.gate.start(s.t, url)
	}
	w := catalog.Worker{WorkerID: sp.id, ModelName: model, Endpoint: url, Attributes: catalog.Attributes{Role: sp.role, TotalKVBlocks: 512, MaxNumBatchedTokens: sp.batched}}
	if sp.domain != "" {
		w.TopologyDomains = map[string]string{"rack": sp.domain}
		w.KVTransferDomain, w.KVTransferEnforcement = "rack", catalog.EnforcementRequired
	}
	if sp.noEndpoint {
		w.Endpoint = ""
	}
	cfg := mocker.Config{TotalBlocks: 512, BlockSize: 16, Worker: w, Timing: sp.timing}
	fleet := s.fleet
	if sp.unindexed {
		// An engine whose events prefixd never sees: its HTTP API is
		// registered, not its KV-event endpoints.
		fleet = mocker.NewFleet(context.Background(), nil, nil)
		s.t.Cleanup(func() { fleet.Stop() })
	}
	e, err := fleet.Start(context.Background(), cfg, ln)
	if err != nil {
		s.t.Fatal(err)
	}
	if sp.unindexed {
		w.BlockSize = 16
		rec := w.WithDefaults()
		if _, err := s.store.Put(context.Background(), rec, catalog.NoLease); err != nil {
			s.t.Fatal(err)
		}
	}
	s.engines[sp.id], s.urls[sp.id] = e, url
}

// waitIndexed waits until prefixd lists every engine, the indexed ones
// with active streams.
func (s *stack) waitIndexed(specs []spec) {
	testsupport.Eventually(s.t, 30*time.Second, "every engine listed by prefixd", func() bool {
		ws, err := s.prefixd.Workers(context.Background(), model, "")
		if err != nil || len(ws) != len(specs) {
			return false
		}
		for _, w := range ws {
			for _, l := range w.Listeners {
				if l.Endpoint != "" && l.Status != api.StatusActive { // a rank without an events endpoint has no stream
					return false
				}
			}
		}
		return true
	})
}

// checkNoBookings: once the test's requests are done, the proxy holds no
// booking and prefixd holds no reservation and no plan.
func (s *stack) checkNoBookings() {
	testsupport.Eventually(s.t, 10*time.Second, "no bookings left", func() bool {
		if s.proxy.Bookings() != 0 {
			return false
		}
		m, err := s.prefixd.Metrics(context.Background())
		return err == nil && gauge(string(m), "prefixd_reservations_live") == 0 && gauge(string(m), "prefixd_plans_live") == 0
	})
}

// gauge reads an unlabelled gauge from a metrics page (-1 if absent).
func gauge(page, name string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

func (s *stack) get(path string) (int, string) {
	resp, err := http.Get(s.url + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends an OpenAI request to the proxy and returns the status and
// body (for a stream, the whole SSE text).
func (s *stack) post(path string, body any, hdr ...string) (int, string) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.url+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// completion is the part of a non-streamed answer the tests read.
type completion struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeCompletion(t *testing.T, body string) completion {
	t.Helper()
	var c completion
	if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("answer %q: %v", body, err)
	}
	return c
}

// sseEvents splits an SSE body into its data payloads, checking the
// framing and the final [DONE].
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q", line)
		}
		out = append(out, data)
	}
	if len(out) == 0 || out[len(out)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	return out[:len(out)-1]
}

// longPrompt is a prompt of a few hundred tokens, distinct per seed.
func longPrompt(seed int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "conversation %d:", seed)
	for i := range 200 {
		fmt.Fprintf(&b, " word%d", (i*7+seed)%97)
	}
	return b.String()
}

// TestAggregated: completions and chat, streamed and not, through the
// proxy to KV-aware engines; a repeated prompt is served from the cache
// of the engine that computed it.
func TestAggregated(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	prompt := longPrompt(1)
	code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 8})
	if code != 200 {
		t.Fatalf("completions: %d %s", code, body)
	}
	first := decodeCompletion(t, body)
	if first.Usage.CompletionTokens != 8 || first.Usage.PromptTokens < 200 {
		t.Fatalf("usage %+v", first.Usage)
	}
	// prefixd sees the engine's stores and sends the same prompt back.
	testsupport.Eventually(t, 10*time.Second, "the prompt indexed", func() bool {
		sc, err := s.prefixd.Query(context.Background(), api.QueryRequest{TokenIDs: mocker.Tokenize(prompt), ModelName: model})
		return err == nil && len(sc.Instances) == 1
	})
	s.checkNoBookings() // the first request's booking is given back after its answer
	code, body = s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt + " and more", "max_tokens": 4})
	again := decodeCompletion(t, body)
	if code != 200 || again.Usage.PromptTokensDetails.CachedTokens < first.Usage.PromptTokens-16 {
		t.Fatalf("the extended prompt: %d, cached %d of the %d computed before", code, again.Usage.PromptTokensDetails.CachedTokens, first.Usage.PromptTokens)
	}

	// Streamed chat: role first, content chunks, finish, usage, [DONE].
	msgs := []map[string]string{{"role": "system", "content": prompt}, {"role": "user", "content": "hello"}}
	code, body = s.post("/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 5, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	if code != 200 {
		t.Fatalf("chat stream: %d %s", code, body)
	}
	events := sseEvents(t, body)
	var content strings.Builder
	for _, ev := range events {
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil || chunk.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %q: %v", ev, err)
		}
		for _, c := range chunk.Choices {
			content.WriteString(c.Delta.Content)
		}
	}
	if content.Len() == 0 || !strings.Contains(events[len(events)-1], `"usage"`) {
		t.Fatalf("stream without content or usage: %q", body)
	}
	// Non-streamed chat, and the models the catalog knows.
	code, body = s.post("/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 3})
	if c := decodeCompletion(t, body); code != 200 || c.Choices[0].Message.Content == "" {
		t.Fatalf("chat: %d %s", code, body)
	}
	if code, body := s.get("/v1/models"); code != 200 || !strings.Contains(body, `"object":"list"`) {
		t.Fatalf("models: %d %s", code, body)
	}
	// Bad requests are the proxy's to refuse, naming the field.
	if code, body := s.post("/v1/completions", map[string]any{"prompt": "x"}); code != 400 || !strings.Contains(body, "model: required") {
		t.Fatalf("no model: %d %s", code, body)
	}
	// Other routes go to an engine.
	if code, body := s.post("/tokenize", map[string]any{"model": model, "prompt": "a b c"}); code != 200 || !strings.Contains(body, `"tokens"`) {
		t.Fatalf("pass-through /tokenize: %d %s", code, body)
	}
	s.logs.Wait(t, 5*time.Second, "proxy: fleet view changed", "engines=2")
}

// fault arms engine id's next generation requests to fail.
func (s *stack) fault(id uint64, query string) {
	s.t.Helper()
	resp, err := http.Post(s.urls[id]+"/faults/fail?"+query, "", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		s.t.Fatalf("arm fault %s on engine %d: %d", query, id, resp.StatusCode)
	}
}

// selected returns the engine prefixd would choose for prompt now.
func (s *stack) selected(prompt string) uint64 {
	s.t.Helper()
	sel, err := s.prefixd.Select(context.Background(), api.SelectRequest{Prompt: api.Prompt{TokenIDs: mocker.Tokenize(prompt)}, ModelName: model})
	if err != nil {
		s.t.Fatal(err)
	}
	return sel.WorkerID
}

// TestEngineFailures: an engine failing before its first byte is retried
// once on the next-best engine; one failing after it cuts the client's
// stream; a client going away mid-stream frees everything.
func TestEngineFailures(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	prompt := longPrompt(2)
	// Warm one engine with the prompt: prefixd then chooses it.
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2}); code != 200 {
		t.Fatalf("warm: %d %s", code, body)
	}
	var first uint64
	testsupport.Eventually(t, 10*time.Second, "the prompt indexed", func() bool {
		sc, err := s.prefixd.Query(context.Background(), api.QueryRequest{TokenIDs: mocker.Tokenize(prompt), ModelName: model})
		for id := range sc.Instances {
			first = id
		}
		return err == nil && len(sc.Instances) == 1
	})
	s.checkNoBookings() // the warm request's booking is given back after its answer
	if got := s.selected(prompt); got != first {
		t.Fatalf("prefixd chooses %d, not %d which holds the prompt", got, first)
	}
	s.fault(first, "status=503")
	code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 4})
	if code != 200 {
		t.Fatalf("after a 503 before the first byte: %d %s", code, body)
	}
	s.logs.Wait(t, 5*time.Second, "proxy: engine failed before its first byte; retrying on the next-best engine", "engine="+strconv.FormatUint(first, 10))
	// Both engines failing: a clear 502, no retry beyond one.
	s.fault(1, "status=500")
	s.fault(2, "status=500")
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 4}); code != http.StatusBadGateway || !strings.Contains(body, "answered 500") {
		t.Fatalf("both engines failing: %d %s", code, body)
	}
	// A 400 is the request's fault: passed to the client as the engine
	// sent it, not retried.
	s.fault(1, "status=400")
	s.fault(2, "status=400")
	retries := s.logs.Count("proxy: engine failed before its first byte; retrying on the next-best engine")
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 4}); code != http.StatusBadRequest ||
		!strings.Contains(body, "injected fault: 400 before the first byte") || !strings.Contains(body, `"type":"BadRequestError"`) {
		t.Fatalf("a 400 from the engine: %d %s", code, body)
	}
	if n := s.logs.Count("proxy: engine failed before its first byte; retrying on the next-best engine"); n != retries {
		t.Fatalf("a 400 was retried")
	}
	s.fault(1, "count=0")
	s.fault(2, "count=0")

	// Cut after the first tokens: the client sees a broken stream.
	s.fault(1, "after_tokens=2")
	s.fault(2, "after_tokens=2")
	code, body = s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 20, "stream": true})
	if code != 200 || strings.Contains(body, "[DONE]") || !strings.Contains(body, "data: ") {
		t.Fatalf("a cut stream: %d %q", code, body)
	}
	s.fault(1, "count=0")
	s.fault(2, "count=0")

	// A client that hangs up mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 10000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	// checkNoBookings (at cleanup) waits for the booking to be freed.
}

// disaggStack is two prefill and two decode engines in racks r1 and r2.
func disaggStack(t *testing.T, pcfg proxy.Config, extra ...spec) *stack {
	pcfg.Disagg = true
	specs := append([]spec{
		{id: 11, role: catalog.RolePrefill, domain: "r1"}, {id: 12, role: catalog.RolePrefill, domain: "r2"},
		{id: 21, role: catalog.RoleDecode, domain: "r1"}, {id: 22, role: catalog.RoleDecode, domain: "r2"},
	}, extra...)
	return startStack(t, pcfg, coordinator.CoordinatorConfig{Policy: coordinator.DefaultPolicy()}, specs...)
}

// trace returns the states a plan of the proxy went through, from its
// logged transitions.
func (s *stack) trace(plan string) []string {
	var out []string
	for _, r := range s.logs.Records() {
		if r.Msg == "proxy: plan transition" && r.Attrs["plan"] == plan {
			if len(out) == 0 {
				out = append(out, r.Attrs["from"])
			}
			out = append(out, r.Attrs["to"])
		}
	}
	return out
}

// lastPlan is the id of the last plan the proxy logged.
func (s *stack) lastPlan() string {
	recs := s.logs.Records()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Msg == "proxy: plan transition" {
			return recs[i].Attrs["plan"]
		}
	}
	return ""
}

func wantTrace(t *testing.T, s *stack, want ...string) {
	t.Helper()
	id := s.lastPlan()
	testsupport.Eventually(t, 5*time.Second, "plan "+id+" traced "+strings.Join(want, " → "), func() bool {
		return strings.Join(s.trace(id), " → ") == strings.Join(want, " → ")
	})
}

// TestDisaggregated runs the coordinator's cases through the proxy: a
// linked plan (prefill in the decode worker's rack, its KV handed over),
// a policy bypass, a prefill failure under each policy, and the
// fallbacks to prefill-first.
func TestDisaggregated(t *testing.T) {
	s := disaggStack(t, proxy.Config{})
	prompt := longPrompt(3)
	code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 6, "stream": true})
	if code != 200 || len(sseEvents(t, body)) == 0 {
		t.Fatalf("disaggregated stream: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "PrefillReleased", "Released")
	// The decode engine took the prompt's blocks from the prefill engine
	// of its rack and published them: prefixd indexes them on both.
	testsupport.Eventually(t, 10*time.Second, "the prompt indexed on a prefill and a decode engine of one rack", func() bool {
		sc, err := s.prefixd.Query(context.Background(), api.QueryRequest{TokenIDs: mocker.Tokenize(prompt), ModelName: model})
		if err != nil || len(sc.Instances) != 2 {
			return false
		}
		var racks []int
		for id := range sc.Instances {
			racks = append(racks, int(id%10))
		}
		return racks[0] == racks[1]
	})
}

func TestDisaggregatedBypassAndFailures(t *testing.T) {
	s := disaggStack(t, proxy.Config{})
	prompt := longPrompt(4)
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 4}); code != 200 {
		t.Fatalf("first: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "PrefillReleased", "Released")
	// The decode worker now holds the prompt: the policy (isl_bounding)
	// bypasses remote prefill for its extension.
	testsupport.Eventually(t, 10*time.Second, "the decode worker's copy indexed", func() bool {
		sc, err := s.prefixd.Query(context.Background(), api.QueryRequest{TokenIDs: mocker.Tokenize(prompt), ModelName: model})
		return err == nil && len(sc.Instances) == 2
	})
	s.checkNoBookings()
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt + " again", "max_tokens": 4}); code != 200 {
		t.Fatalf("bypass: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Bypass", "Released")

	// A prefill that fails (prefill_failure free_decode, serve's default):
	// the plan is compensated and the client told which worker failed.
	s.fault(11, "status=500")
	s.fault(12, "status=500")
	code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(5), "max_tokens": 4})
	if code != http.StatusBadGateway || !strings.Contains(body, "prefill on engine 1") || !strings.Contains(body, "decode booking was freed") {
		t.Fatalf("prefill failure, free_decode: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "Compensated")
	s.logs.Wait(t, 5*time.Second, "proxy: prefill failed; decode freed", "plan_state=Compensated")
	s.fault(11, "count=0")
	s.fault(12, "count=0")
}

func TestDisaggregatedPrefillFailureBypassOnDecode(t *testing.T) {
	s := disaggStack(t, proxy.Config{PrefillFailure: "bypass_on_decode"})
	s.fault(11, "status=500")
	s.fault(12, "status=500")
	code, body := s.post("/v1/chat/completions", map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": longPrompt(6)}},
		"max_tokens": 4, "stream": true})
	if code != 200 || len(sseEvents(t, body)) == 0 {
		t.Fatalf("prefill failure, bypass_on_decode: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "BypassAfterPrefillFailure", "Released")
	s.logs.Wait(t, 5*time.Second, "proxy: prefill failed; prefilling on the decode worker (bypass_on_decode)")
}

func TestDisaggregatedFallbacks(t *testing.T) {
	t.Run("pinned_prefill", func(t *testing.T) {
		s := disaggStack(t, proxy.Config{})
		code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(7), "max_tokens": 4},
			"X-Prefixd-Prefill-Worker", "12")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		wantTrace(t, s, "Idle", "PrefillCommitted", "PrefillReleased", "Released")
		s.logs.Wait(t, 5*time.Second, "proxy: plan falls back to prefill-first", "reason=pinned_prefill")
		if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": "x"}, "X-Prefixd-Prefill-Worker", "twelve"); code != 400 || !strings.Contains(body, "X-Prefixd-Prefill-Worker") {
			t.Fatalf("a bad pin: %d %s", code, body)
		}
	})
	t.Run("decode_not_indexed", func(t *testing.T) {
		s := startStack(t, proxy.Config{Disagg: true}, coordinator.CoordinatorConfig{},
			spec{id: 11, role: catalog.RolePrefill}, spec{id: 21, role: catalog.RoleDecode, unindexed: true})
		if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(8), "max_tokens": 4}); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		wantTrace(t, s, "Idle", "PrefillCommitted", "PrefillReleased", "Released")
		s.logs.Wait(t, 5*time.Second, "proxy: plan falls back to prefill-first", "reason=decode_not_indexed")
	})
	t.Run("no_decode_host", func(t *testing.T) {
		s := startStack(t, proxy.Config{Disagg: true}, coordinator.CoordinatorConfig{},
			spec{id: 11, role: catalog.RolePrefill}, spec{id: 21, role: catalog.RoleDecode, noEndpoint: true})
		code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(9), "max_tokens": 4})
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "no decode engine after prefill") {
			t.Fatalf("%d %s", code, body)
		}
		s.logs.Wait(t, 5*time.Second, "proxy: plan falls back to prefill-first", "reason=no_decode_host")
		wantTrace(t, s, "Idle", "PrefillCommitted", "PrefillReleased", "Compensated")
	})
}

// TestBookingsReturnToZero: under random client disconnects and engine
// failures (before the first byte, mid-stream), aggregated and
// disaggregated, every booking is given back (checkNoBookings).
func TestBookingsReturnToZero(t *testing.T) {
	for _, disagg := range []bool{false, true} {
		t.Run(map[bool]string{false: "aggregated", true: "disaggregated"}[disagg], func(t *testing.T) {
			var s *stack
			if disagg {
				s = disaggStack(t, proxy.Config{})
			} else {
				s = startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
					spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated}, spec{id: 3, role: catalog.RoleAggregated})
			}
			ids := make([]uint64, 0, len(s.urls))
			for id := range s.urls {
				ids = append(ids, id)
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(ids))))
			type job struct {
				prompt     string
				stream     bool
				hangUpAt   int    // bytes read before the client goes away (0: read it all)
				faultOn    uint64 // engine armed before the request (0: none)
				faultQuery string
			}
			var jobs []job
			for i := range 48 {
				j := job{prompt: longPrompt(100 + i%6), stream: rng.IntN(2) == 0}
				if rng.IntN(3) == 0 {
					j.hangUpAt = 1 + rng.IntN(200)
				}
				if rng.IntN(3) == 0 {
					j.faultOn = ids[rng.IntN(len(ids))]
					j.faultQuery = []string{"status=503", "status=500", "after_tokens=1", "after_tokens=3"}[rng.IntN(4)]
				}
				jobs = append(jobs, j)
			}
			var wg sync.WaitGroup
			work := make(chan job)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range work {
						runJob(s, j.prompt, j.stream, j.hangUpAt)
					}
				}()
			}
			for _, j := range jobs {
				if j.faultOn != 0 {
					s.fault(j.faultOn, j.faultQuery)
				}
				work <- j
			}
			close(work)
			wg.Wait()
			for _, id := range ids {
				s.fault(id, "count=0")
			}
			// checkNoBookings runs at cleanup; the engines are idle too.
			testsupport.Eventually(t, 10*time.Second, "every engine idle", func() bool {
				for _, e := range s.engines {
					if l := e.Load(); l.Running+l.Waiting+l.Transferring != 0 {
						return false
					}
				}
				return true
			})
		})
	}
}

// runJob sends one request, reading hangUpAt bytes of the answer before
// going away (all of it when 0); errors are the point, not failures.
func runJob(s *stack, prompt string, stream bool, hangUpAt int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 16, "stream": stream})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if hangUpAt > 0 {
		io.CopyN(io.Discard, resp.Body, int64(hangUpAt))
		cancel()
		return
	}
	io.Copy(io.Discard, resp.Body)
}

// failTokenize is an engine transport whose /tokenize calls fail, as
// when no engine's tokenizer answers.
type failTokenize struct{ http.RoundTripper }

func (f failTokenize) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/tokenize" {
		return nil, errors.New("tokenizer down")
	}
	return f.RoundTripper.RoundTrip(r)
}

// TestTokenizerUnavailable: without token ids the request is routed by
// load, counted and logged, and still served.
func TestTokenizerUnavailable(t *testing.T) {
	hc := proxy.EngineHTTPClient()
	hc.Transport = failTokenize{hc.Transport}
	s := startStack(t, proxy.Config{Engines: hc}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2}); code != 200 {
		t.Fatalf("without a tokenizer: %d %s", code, body)
	}
	s.logs.Wait(t, 5*time.Second, "proxy: no tokenizer answered; routing by load", "model=m")
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_tokenize_total{source="unavailable"} 1`) ||
		!strings.Contains(page, `prefixd_proxy_fallbacks_total{reason="no_tokens"} 1`) {
		t.Fatalf("metrics lack the fallback:\n%s", page)
	}
	// A prompt given as token ids needs no tokenizer.
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": []int{1, 2, 3, 4}, "max_tokens": 2}); code != 200 {
		t.Fatalf("token ids: %d %s", code, body)
	}
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_tokenize_total{source="client"} 1`) {
		t.Fatalf("metrics lack the client's ids:\n%s", page)
	}
}

// TestDecodeBusyGateThroughProxy: the policy bypasses (the decode worker
// caches the prompt) while the decode worker's booked blocks stay under
// the gate (4 % of its 512 blocks); with another request booked on each
// decode worker the gate vetoes the bypass: remote prefill, linked.
func TestDecodeBusyGateThroughProxy(t *testing.T) {
	s := disaggStack(t, proxy.Config{PlanPolicy: &api.PlanPolicy{Kind: "isl_bounding", DecodeBusyThreshold: 0.04}})
	prompt := longPrompt(11)
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2}); code != 200 {
		t.Fatalf("first: %d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "the decode worker's copy indexed", func() bool {
		sc, err := s.prefixd.Query(context.Background(), api.QueryRequest{TokenIDs: mocker.Tokenize(prompt), ModelName: model})
		return err == nil && len(sc.Instances) == 2
	})
	s.checkNoBookings()
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt + " again", "max_tokens": 2}); code != 200 {
		t.Fatalf("bypass: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Bypass", "Released")
	s.checkNoBookings()
	// Other requests booked on both decode workers make them busy.
	ctx := context.Background()
	for _, id := range []uint64{21, 22} {
		wid := id
		if _, err := s.prefixd.Reserve(ctx, api.ReserveRequest{Prompt: api.Prompt{TokenIDs: mocker.Tokenize(longPrompt(int(id)))},
			SelectionID: fmt.Sprintf("busy-%d", id), ModelName: model, Role: "decode", WorkerID: &wid}); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": prompt + " once more", "max_tokens": 2}); code != 200 {
		t.Fatalf("vetoed bypass: %d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "PrefillReleased", "Released")
	for _, id := range []uint64{21, 22} {
		if err := s.prefixd.FreeReservation(ctx, fmt.Sprintf("busy-%d", id)); err != nil {
			t.Fatal(err)
		}
	}
}

// failPath is a transport whose requests to one path fail, as when
// prefixd does not answer them.
type failPath struct {
	path string
	http.RoundTripper
}

func (f failPath) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == f.path {
		return nil, errors.New("prefixd unreachable")
	}
	return f.RoundTripper.RoundTrip(r)
}

// TestPrefixdUnavailable: a selection prefixd does not answer is routed
// by load, counted and logged, and the request served.
func TestPrefixdUnavailable(t *testing.T) {
	pc := &client.Client{HTTP: &http.Client{Transport: failPath{"/select_and_reserve", http.DefaultTransport}}}
	s := startStack(t, proxy.Config{Prefixd: pc}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2}); code != 200 {
		t.Fatalf("without prefixd's selection: %d %s", code, body)
	}
	s.logs.Wait(t, 5*time.Second, "proxy: prefixd did not choose; routing by load")
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_fallbacks_total{reason="prefixd_unavailable"} 1`) {
		t.Fatalf("metrics lack the fallback:\n%s", page)
	}
}

// TestIncompleteKVTransferMetadata: the coordinator's case of a decode
// worker whose KV-transfer domain has no value (or no enforcement) cannot
// reach a plan through the proxy: the catalog refuses such a record at
// registration, naming the field, so the plans only ever see complete
// metadata.
func TestIncompleteKVTransferMetadata(t *testing.T) {
	s := disaggStack(t, proxy.Config{})
	for _, ext := range []api.Extensions{
		{Attributes: catalog.Attributes{Role: catalog.RoleDecode, KVTransferDomain: "rack", KVTransferEnforcement: catalog.EnforcementRequired}},
		{Attributes: catalog.Attributes{Role: catalog.RoleDecode, KVTransferDomain: "rack", TopologyDomains: map[string]string{"rack": "r9"}}},
	} {
		err := s.prefixd.Register(context.Background(), api.RegisterRequest{InstanceID: 99, Endpoint: "tcp://127.0.0.1:1", ModelName: model, BlockSize: 16, Extensions: ext})
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "kv_transfer") && !strings.Contains(err.Error(), "topology_domains") {
			t.Errorf("incomplete metadata %+v registered: %v", ext.Attributes, err)
		}
	}
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(12), "max_tokens": 2}); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	wantTrace(t, s, "Idle", "DecodePreviewed", "DecodeCommitted", "Linked", "PrefillReleased", "Released")
}

// TestRunClosesPrefixdConnections: once a proxy's Run has returned, it
// holds no connection to prefixd open. A connection left in its pool
// (idle keep-alive, or dialed for a refresh cancelled meanwhile) would
// hold up prefixd's graceful shutdown: net/http waits 5 s for a
// connection that never sent a request.
func TestRunClosesPrefixdConnections(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{}, spec{id: 1})
	// prefixd behind a hop that counts the connections open to it.
	target, err := url.Parse(s.prefixd.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	var open atomic.Int64
	hop := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	hop.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	hop.Start()
	defer hop.Close()
	p, err := proxy.New(proxy.Config{Prefixd: client.New(hop.URL, ""), Refresh: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stop := testsupport.Go(t, "proxy", p.Run)
	<-p.Synced()
	testsupport.Eventually(t, 10*time.Second, "the proxy's connection to prefixd", func() bool { return open.Load() > 0 })
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "the proxy's connections to prefixd closed", func() bool { return open.Load() == 0 })
}
