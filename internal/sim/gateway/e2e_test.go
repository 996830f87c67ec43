package gateway

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// The end-to-end tests: a client sends OpenAI requests to the gateway,
// which asks prefixd serve's endpoint picker (the daemon as it runs: etcd,
// the catalog watch, the event streams into the index, the coordinator)
// and forwards to mock engines serving vLLM's OpenAI API and publishing
// their KV events.

const e2eModel = "m"

// e2eSpec is one mock engine of a stack.
type e2eSpec struct {
	id   uint64
	role catalog.Role
	rack string // KV-transfer domain ("" none)
}

// e2eEngine is a mock engine whose HTTP server the test owns (it can be
// closed: connections to its endpoint are then refused, the engine stays
// registered) and which records the generation requests it received.
type e2eEngine struct {
	e2eSpec
	e     *mocker.Engine
	addr  string
	srv   *httptest.Server
	pacer *pacer // nil: the engine takes no time

	mu   sync.Mutex // guards seen
	seen []received
}

// received is a generation request as an engine got it.
type received struct {
	path, prefiller, id string
}

func (en *e2eEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/completions") {
		en.mu.Lock()
		en.seen = append(en.seen, received{r.URL.Path, r.Header.Get(mocker.PrefillerHeader), r.Header.Get("X-Request-Id")})
		en.mu.Unlock()
	}
	en.e.ServeHTTP(w, r)
}

// name is en for an error message ("none" when nil).
func (en *e2eEngine) name() string {
	if en == nil {
		return "none"
	}
	return fmt.Sprintf("%d (%s, rack %q)", en.id, cmp.Or(string(en.role), "aggregated"), en.rack)
}

// received returns the requests received since the first n.
func (en *e2eEngine) received(n int) []received {
	en.mu.Lock()
	defer en.mu.Unlock()
	return append([]received(nil), en.seen[min(n, len(en.seen)):]...)
}

// pacer drives an engine's virtual clock: on autopilot every step ends
// as soon as it is planned; held, a step ends only when step is called,
// so a request stays in flight, mid-stream, for as long as the test
// wants.
type pacer struct {
	vc   *mocker.VirtualClock
	kick chan struct{}
	mu   sync.Mutex // guards held; held while the autopilot advances
	held bool
}

func (p *pacer) run(ctx context.Context) error {
	for {
		changed := p.vc.Changed()
		p.mu.Lock()
		for !p.held && p.vc.Waiters() > 0 {
			p.vc.AdvanceToNext()
		}
		p.mu.Unlock()
		select {
		case <-changed:
		case <-p.kick:
		case <-ctx.Done():
			return nil
		}
	}
}

// hold stops the autopilot: once it returns no step ends on its own.
func (p *pacer) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

func (p *pacer) resume() {
	p.mu.Lock()
	p.held = false
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// step ends the engine's current step (waiting for one to be planned).
func (p *pacer) step(t *testing.T) {
	t.Helper()
	testsupport.Eventually(t, 10*time.Second, "the engine planning a step", func() bool { return p.vc.Waiters() > 0 })
	p.vc.AdvanceToNext()
}

// e2eStack is etcd, prefixd serve with its endpoint picker, and mock
// engines, on loopback.
type e2eStack struct {
	t       *testing.T
	cl      *client.Client
	epp     string
	picker  *epp.Server
	ix      *indexer.Index
	reg     *prometheus.Registry
	engines []*e2eEngine
}

// startE2E starts the stack. paced engines run on a virtual clock
// (pacer, on autopilot until held); disagg makes the picker plan
// decode-first with the demo's policy (bypass under 256 uncached tokens).
func startE2E(t *testing.T, disagg, paced bool, specs ...e2eSpec) *e2eStack {
	t.Helper()
	etcd := storetest.StartEtcd(t)
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// The engines start first and stop last.
	fleet := mocker.NewFleet(context.Background(), store, nil)
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Errorf("fleet: %v", err)
		}
	})
	s := &e2eStack{t: t, ix: indexer.New(indexer.Options{}), reg: prometheus.NewRegistry()}
	for _, sp := range specs {
		en := &e2eEngine{e2eSpec: sp}
		en.srv = httptest.NewUnstartedServer(en)
		en.addr = en.srv.Listener.Addr().String()
		w := catalog.Worker{WorkerID: sp.id, ModelName: e2eModel, Endpoint: "http://" + en.addr, Attributes: catalog.Attributes{Role: sp.role, TotalKVBlocks: 512}}
		if sp.rack != "" {
			w.TopologyDomains = map[string]string{"rack": sp.rack}
			w.KVTransferDomain = "rack"
			w.KVTransferEnforcement = catalog.EnforcementRequired
		}
		mcfg := mocker.Config{TotalBlocks: 512, BlockSize: 16, Worker: w}
		if paced {
			en.pacer = &pacer{vc: mocker.NewVirtualClock(time.Now()), kick: make(chan struct{}, 1)}
			mcfg.Clock, mcfg.Timing = en.pacer.vc, mocker.Timing{StepOverhead: time.Millisecond}
			testsupport.Go(t, "pacer", en.pacer.run)
		}
		if en.e, err = fleet.Start(context.Background(), mcfg, nil); err != nil {
			t.Fatal(err)
		}
		en.srv.Start()
		t.Cleanup(en.srv.Close)
		s.engines = append(s.engines, en)
	}
	eppAddr := make(chan string, 1)
	var pk *epp.Server
	cfg := daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
		Index: s.ix, Registry: s.reg, ReadyTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler),
		EPP: daemon.EPPConfig{Listen: "127.0.0.1:0", Disagg: disagg, OnReady: func(a string) { eppAddr <- a },
			Server: func(p *epp.Server) { pk = p }},
		Subscriber: stream.SubscriberConfig{ProbeInterval: 100 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond}}
	if disagg {
		cfg.Coordinator.Policy = coordinator.Policy{Kind: coordinator.PolicyISLBounding, EffISLThreshold: 256,
			EffISLRatioThreshold: coordinator.DefaultEffISLRatioThreshold}
	}
	apiAddr, _ := testsupport.Ready(t, "daemon", func(ctx context.Context, ready func(string)) error {
		cfg.OnReady = ready
		return daemon.Run(ctx, cfg)
	})
	s.epp, s.picker = <-eppAddr, pk // both set before OnReady
	s.cl = &client.Client{BaseURL: "http://" + apiAddr}
	testsupport.Eventually(t, 30*time.Second, "prefixd ready, following every engine", func() bool {
		ctx := context.Background()
		ws, err := s.cl.Workers(ctx, e2eModel, "")
		if err != nil || s.cl.Ready(ctx) != nil {
			return false
		}
		active := 0
		for _, w := range ws {
			for _, l := range w.Listeners {
				if l.Status == api.StatusActive {
					active++
				}
			}
		}
		return active == len(specs)
	})
	return s
}

// metric sums the series of a metric whose labels include labels.
func (s *e2eStack) metric(name string, labels ...string) float64 {
	s.t.Helper()
	return testsupport.MetricSum(s.t, s.reg, name, labels...)
}

// bookings is what the picker and prefixd hold: the picker's bookings and
// request bodies, prefixd's reservations and plans.
func (s *e2eStack) bookings() string {
	return fmt.Sprintf("picker bookings %d, body bytes %d; prefixd reservations %v, plans %v",
		s.picker.Bookings(), s.picker.BodyBytes(), s.metric("prefixd_reservations_live"), s.metric("prefixd_plans_live"))
}

const noBookings = "picker bookings 0, body bytes 0; prefixd reservations 0, plans 0"

// checkNoBookings: nothing is booked now. A request whose response the
// client has read to its end is over at the picker: the picker frees at
// the response's end, before it passes that end on.
func (s *e2eStack) checkNoBookings(after string) {
	s.t.Helper()
	if b := s.bookings(); b != noBookings {
		s.t.Fatalf("after %s: %s", after, b)
	}
}

// waitNoBookings waits until nothing is booked (a stream broken off ends
// at the picker after the client has gone).
func (s *e2eStack) waitNoBookings(after string) {
	s.t.Helper()
	testsupport.Eventually(s.t, 10*time.Second, "no bookings after "+after, func() bool { return s.bookings() == noBookings })
}

// loads is every engine's prefix-cache counters.
func (s *e2eStack) loads() map[uint64]mocker.Load {
	out := map[uint64]mocker.Load{}
	for _, en := range s.engines {
		out[en.id] = en.e.Load()
	}
	return out
}

// computed returns the engines that computed prompt tokens between two
// loads, and how many tokens each computed and took from its cache.
func computed(before, after map[uint64]mocker.Load) map[uint64][2]uint64 {
	out := map[uint64][2]uint64{}
	for id, a := range after {
		if q := a.PrefixQueries - before[id].PrefixQueries; q > 0 {
			out[id] = [2]uint64{q, a.PrefixHits - before[id].PrefixHits}
		}
	}
	return out
}

// waitIndex waits until the index has applied every engine's last batch.
func (s *e2eStack) waitIndex() {
	s.t.Helper()
	testsupport.Eventually(s.t, 20*time.Second, "the index caught up with every engine", func() bool {
		for _, en := range s.engines {
			last, ok := en.e.LastSeq()
			if !ok {
				continue
			}
			st, err := s.ix.Rank(indexer.PartitionKey{Model: e2eModel, Group: catalog.DefaultRoutingGroup}, indexer.Rank{WorkerID: en.id})
			if err != nil || !st.HasSeq || st.Watermark != last {
				return false
			}
		}
		return true
	})
}

// checkIndexExact: once caught up, the index holds exactly what every
// engine's cache holds.
func (s *e2eStack) checkIndexExact() {
	s.t.Helper()
	s.waitIndex()
	for _, en := range s.engines {
		holds := en.e.Holds()
		rank := indexer.Rank{WorkerID: en.id}
		err := s.ix.ReadRank(indexer.PartitionKey{Model: e2eModel, Group: catalog.DefaultRoutingGroup}, rank, func(tr *indexer.Tree) {
			if got := tr.RankBlocks(rank); got != len(holds) {
				s.t.Errorf("engine %d: the index holds %d blocks, the engine %d", en.id, got, len(holds))
			}
			for h, n := range holds {
				if c, ok := tr.Holds(rank, h); !ok || int(c[indexer.TierDevice]) != n {
					s.t.Errorf("engine %d block %#x: the index has %d copies, the engine %d", en.id, h, c[indexer.TierDevice], n)
				}
			}
		})
		if err != nil {
			s.t.Errorf("engine %d: %v", en.id, err)
		}
	}
}

// hold holds every engine's clock once no engine has work left (a request
// broken off ends at an engine's next step), until resume or t's end.
func (s *e2eStack) hold(t *testing.T) {
	t.Helper()
	t.Cleanup(s.resume)
	testsupport.Eventually(s.t, 10*time.Second, "every engine idle", func() bool {
		for _, en := range s.engines {
			if l := en.e.Load(); l.Running+l.Waiting+l.Transferring > 0 {
				return false
			}
		}
		return true
	})
	for _, en := range s.engines {
		en.pacer.hold()
	}
}

func (s *e2eStack) resume() {
	for _, en := range s.engines {
		en.pacer.resume()
	}
}

// planning returns the engine that planned a step, its clock held: the
// one serving the request in flight.
func (s *e2eStack) planning() *e2eEngine {
	s.t.Helper()
	var serving *e2eEngine
	testsupport.Eventually(s.t, 10*time.Second, "an engine planning a step", func() bool {
		for _, en := range s.engines {
			if en.pacer.vc.Waiters() > 0 {
				serving = en
				return true
			}
		}
		return false
	})
	return serving
}

// booked is how many blocks prefixd has booked on a worker: a /select
// pinned there with a prompt of no whole block previews the worker's
// load, which is its bookings' blocks.
func (s *e2eStack) booked(id uint64) int {
	s.t.Helper()
	sel, err := s.cl.Select(context.Background(), api.SelectRequest{Prompt: api.Prompt{TokenIDs: []uint32{1}}, ModelName: e2eModel,
		PinnedWorker: &api.WorkerRef{WorkerID: id}})
	if err != nil {
		s.t.Fatal(err)
	}
	return sel.PotentialDecodeBlocks
}

func (s *e2eStack) engine(id uint64) *e2eEngine {
	for _, en := range s.engines {
		if en.id == id {
			return en
		}
	}
	s.t.Fatalf("no engine %d", id)
	return nil
}

func (s *e2eStack) byAddr(addr string) *e2eEngine {
	for _, en := range s.engines {
		if en.addr == addr {
			return en
		}
	}
	s.t.Fatalf("no engine at %s", addr)
	return nil
}

// words is a prompt of n words no other prompt of the test shares.
func words(seed string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s_%d ", seed, i)
	}
	return strings.TrimSpace(b.String())
}

// oaiRequest is one OpenAI request of a test: completions (prompt) or
// chat (messages), streamed or not.
type oaiRequest struct {
	chat     bool
	stream   bool
	prompt   string    // completions
	messages []Message // chat
	tokens   int       // max_tokens
	id       string    // X-Request-Id, "" none
}

// Message is a chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (r oaiRequest) path() string {
	if r.chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

func (r oaiRequest) body() string {
	m := map[string]any{"model": e2eModel, "max_tokens": cmp.Or(r.tokens, 4), "stream": r.stream}
	if r.chat {
		m["messages"] = r.messages
	} else {
		m["prompt"] = r.prompt
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// followUp is r's next turn: its prompt extended by n words.
func (r oaiRequest) followUp(seed string, n int) oaiRequest {
	f := r
	if r.chat {
		f.messages = append(append([]Message(nil), r.messages...), Message{"assistant", words(seed+"a", 8)}, Message{"user", words(seed+"u", n)})
	} else {
		f.prompt = r.prompt + " " + words(seed, n)
	}
	return f
}

func (r oaiRequest) String() string {
	kind := "completion"
	if r.chat {
		kind = "chat"
	}
	if r.stream {
		kind += ", streamed"
	}
	return kind
}

func (r oaiRequest) header() map[string]string {
	h := map[string]string{"Content-Type": "application/json"}
	if r.id != "" {
		h["X-Request-Id"] = r.id
	}
	return h
}

// send sends r through the gateway at url and checks the answer: a 200
// with the whole OpenAI response (every event of a stream, then [DONE]).
func send(t *testing.T, url string, r oaiRequest) {
	t.Helper()
	resp, body := post(t, url+r.path(), r.body(), r.header())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%v: %d %.300s", r, resp.StatusCode, body)
	}
	if !r.stream {
		var c struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("%v: %v %.300s", r, err, body)
		}
		return
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	if len(events) < 2 || events[len(events)-1] != "data: [DONE]" {
		t.Fatalf("%v: the stream did not end with [DONE]: %.300q", r, body)
	}
	for _, ev := range events[:len(events)-1] {
		if !strings.HasPrefix(ev, "data: {") || !json.Valid([]byte(strings.TrimPrefix(ev, "data: "))) {
			t.Fatalf("%v: event %.200q", r, ev)
		}
	}
}

// inflight is a request sent in the background.
type inflight struct {
	gone func() // the client goes away
	resp chan *http.Response
	err  chan error
}

// start sends r in the background: its response's headers come on resp
// (in BUFFERED response mode only once the gateway has the whole body).
func start(t *testing.T, url string, r oaiRequest) *inflight {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+r.path(), strings.NewReader(r.body()))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.header() {
		req.Header.Set(k, v)
	}
	in := &inflight{gone: cancel, resp: make(chan *http.Response, 1), err: make(chan error, 1)}
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			in.err <- err
			return
		}
		in.resp <- resp
	}()
	return in
}

// headers waits for the response's headers: a 200.
func (in *inflight) headers(t *testing.T) *bufio.Reader {
	t.Helper()
	guard := time.NewTimer(20 * time.Second)
	defer guard.Stop()
	select {
	case resp := <-in.resp:
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%d %.300s", resp.StatusCode, b)
		}
		return bufio.NewReader(resp.Body)
	case err := <-in.err:
		t.Fatal(err)
	case <-guard.C:
		t.Fatal("no response headers within 20 s")
	}
	return nil
}

func bodyModes() []BodyMode { return []BodyMode{FullDuplexStreamed, Buffered} }

// TestE2EAggregated: through the gateway, in both body modes (request and
// response), against prefixd serve's picker and three mock engines:
//   - completions and chat, streamed and not: a follow-up prompt lands on
//     the engine that computed the first and is served from its cache;
//   - nothing stays booked after any request: at once when the client
//     has read the response, soon after a client that went away
//     mid-stream or an engine that broke its stream off;
//   - a dead primary: the gateway falls back to the next endpoint listed,
//     the booking moves there (prefixd's own view of the engines' bookings
//     while the stream runs, and the picker's metrics), and the request
//     is served there;
//   - in the end the index equals every engine's cache.
func TestE2EAggregated(t *testing.T) {
	t.Parallel()
	for _, mode := range bodyModes() {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := startE2E(t, false, true, e2eSpec{id: 1}, e2eSpec{id: 2}, e2eSpec{id: 3})
			g, url := startGateway(t, Config{EPP: s.epp, RequestBodyMode: mode, ResponseBodyMode: mode})

			t.Run("follow-ups", func(t *testing.T) {
				for i, first := range []oaiRequest{
					{prompt: words("c", 200)},
					{prompt: words("cs", 200), stream: true},
					{chat: true, messages: []Message{{"system", words("sys", 120)}, {"user", words("q", 80)}}},
					{chat: true, stream: true, messages: []Message{{"system", words("syss", 120)}, {"user", words("qs", 80)}}},
				} {
					before := s.loads()
					send(t, url, first)
					s.checkNoBookings(first.String())
					ran := computed(before, s.loads())
					if len(ran) != 1 {
						t.Fatalf("%v: engines that computed it: %v, want one", first, ran)
					}
					var home uint64
					for id := range ran {
						home = id
					}
					s.waitIndex() // the picker decides on what the index holds
					follow := first.followUp(fmt.Sprint("f", i), 40)
					before = s.loads()
					send(t, url, follow)
					s.checkNoBookings("the follow-up " + follow.String())
					got := computed(before, s.loads())
					if c, ok := got[home]; len(got) != 1 || !ok || c[1] < 12*16 {
						t.Fatalf("%v: the follow-up computed on %v ([prompt tokens, cached]), want engine %d alone with ≥ 192 cached", first, got, home)
					}
				}
			})

			t.Run("client gone mid-stream", func(t *testing.T) {
				s.hold(t)
				r := oaiRequest{chat: true, stream: true, tokens: 64, messages: []Message{{"user", words("gone", 100)}}}
				in := start(t, url, r)
				serving := s.planning()
				serving.pacer.step(t) // the prefill, and the first token
				if mode == FullDuplexStreamed {
					// The client has the first token, and the stream runs.
					if ev := readEvent(t, in.headers(t)); !strings.HasPrefix(ev, "data: {") {
						t.Fatalf("first event %q", ev)
					}
				}
				if b := s.bookings(); b != "picker bookings 1, body bytes 0; prefixd reservations 1, plans 0" || s.booked(serving.id) == 0 {
					t.Fatalf("mid-stream: %s; %d blocks booked on engine %d", b, s.booked(serving.id), serving.id)
				}
				in.gone()
				s.waitNoBookings("the client went away mid-stream")
				s.resume()
			})

			t.Run("engine breaks its stream off", func(t *testing.T) {
				for _, en := range s.engines {
					fault(t, en.addr, "count=1&after_tokens=2")
				}
				r := oaiRequest{stream: true, tokens: 16, prompt: words("cut", 60)}
				req, err := http.NewRequest(http.MethodPost, url+r.path(), strings.NewReader(r.body()))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					if rerr == nil && strings.Contains(string(b), "[DONE]") {
						t.Fatalf("the stream was not cut: %d %.300q", resp.StatusCode, b)
					}
				}
				s.waitNoBookings("an engine broke its stream off")
				for _, en := range s.engines {
					fault(t, en.addr, "count=0")
				}
			})

			t.Run("dead primary", func(t *testing.T) {
				first := oaiRequest{prompt: words("dead", 200)}
				before := s.loads()
				send(t, url, first)
				var dead *e2eEngine
				for id := range computed(before, s.loads()) {
					dead = s.engine(id)
				}
				s.waitIndex()
				dead.srv.Close() // connections to its endpoint are refused; it stays registered
				s.hold(t)
				follow := first.followUp("deadf", 40)
				follow.stream, follow.tokens = true, 32
				used, moved := s.metric("prefixd_epp_fallbacks_used_total"), s.metric("prefixd_epp_served_elsewhere_total", "booking", "moved")
				before = s.loads()
				in := start(t, url, follow)
				// The picker named the dead engine first (it caches the
				// prefix); the gateway fell back to the next endpoint.
				serving := s.planning()
				if serving == dead {
					t.Fatal("the dead engine serves")
				}
				// The booking moves when the response's headers pass the
				// picker, after the engine took the request.
				testsupport.Eventually(t, 10*time.Second, "the booking moved to the engine that serves", func() bool {
					return s.booked(dead.id) == 0 && s.booked(serving.id) > 0
				})
				if du, dm := s.metric("prefixd_epp_fallbacks_used_total")-used, s.metric("prefixd_epp_served_elsewhere_total", "booking", "moved")-moved; du != 1 || dm != 1 {
					t.Fatalf("fallbacks used %v, bookings moved %v; want 1 and 1", du, dm)
				}
				s.resume()
				rd := in.headers(t)
				for {
					if ev := readEvent(t, rd); ev == "data: [DONE]" {
						break
					}
				}
				s.waitNoBookings("the request served by a fallback")
				if got := computed(before, s.loads()); len(got) != 1 || got[serving.id][0] == 0 {
					t.Fatalf("computed on %v, want engine %d alone", got, serving.id)
				}
				if st := g.Stats(); st.Fallbacks != 1 || st.ProtocolErrors+st.EPPFailures != 0 {
					t.Fatalf("gateway %+v", st)
				}
			})
			s.checkIndexExact()
		})
	}
}

// fault arms (or with count=0 disarms) an engine's injected failure.
func fault(t *testing.T, addr, query string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/faults/fail?"+query, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("fault %s: %d", query, resp.StatusCode)
	}
}

// TestE2EDisaggregated: through the gateway, in both body modes, against
// prefixd serve's picker planning decode-first (--epp-disagg, the demo's
// policy: bypass under 256 uncached tokens) over 2 prefill and 2 decode
// engines in two KV-transfer domains, as the demo places them:
//   - a long prompt: the gateway sends it to a decode engine with
//     x-prefiller-host-port naming a prefill engine of its domain; the
//     decode engine's sidecar runs the prefill there and decodes with its
//     KV (computing no prompt token itself);
//   - its follow-up: a bypass: the same decode engine, which holds the
//     prefix now, with no prefiller;
//   - every plan released, nothing booked; the index, fed by both
//     engines' KV events (the transferred blocks too), equals every
//     engine's cache.
func TestE2EDisaggregated(t *testing.T) {
	t.Parallel()
	for _, mode := range bodyModes() {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := startE2E(t, true, false,
				e2eSpec{id: 21, role: catalog.RolePrefill, rack: "r1"}, e2eSpec{id: 22, role: catalog.RolePrefill, rack: "r2"},
				e2eSpec{id: 31, role: catalog.RoleDecode, rack: "r1"}, e2eSpec{id: 32, role: catalog.RoleDecode, rack: "r2"})
			g, url := startGateway(t, Config{EPP: s.epp, RequestBodyMode: mode, ResponseBodyMode: mode})
			seen := func() map[uint64]int {
				out := map[uint64]int{}
				for _, en := range s.engines {
					out[en.id] = len(en.received(0))
				}
				return out
			}
			for i, first := range []oaiRequest{
				{stream: true, tokens: 8, prompt: words("pd", 400)},
				{chat: true, messages: []Message{{"system", words("pdsys", 200)}, {"user", words("pdq", 200)}}},
			} {
				first.id = fmt.Sprintf("pd-%d", i)
				n0, l0, sc0 := seen(), s.loads(), map[uint64]mocker.SidecarStats{}
				for _, en := range s.engines {
					sc0[en.id] = en.e.Sidecar()
				}
				send(t, url, first)
				s.checkNoBookings(first.String())
				var dec, pre *e2eEngine
				for _, en := range s.engines {
					got := en.received(n0[en.id])
					switch {
					case len(got) == 0:
					case len(got) != 1 || got[0].id != first.id:
						t.Fatalf("%v: engine %d received %+v", first, en.id, got)
					case en.role == catalog.RoleDecode && got[0].prefiller != "":
						dec, pre = en, s.byAddr(got[0].prefiller)
					case en.role == catalog.RolePrefill && got[0].prefiller == "":
					default:
						t.Fatalf("%v: engine %d (%s) received %+v", first, en.id, en.role, got)
					}
				}
				if dec == nil || pre.role != catalog.RolePrefill || pre.rack != dec.rack || len(pre.received(n0[pre.id])) != 1 {
					t.Fatalf("%v: decode engine %v, prefiller %v: want a decode engine and a prefill engine of its domain that ran the prefill", first, dec.name(), pre.name())
				}
				ran := computed(l0, s.loads())
				if d := dec.e.Sidecar(); d.Prefills != sc0[dec.id].Prefills+1 || d.Failures != sc0[dec.id].Failures || len(ran) != 1 || ran[pre.id][0] == 0 {
					t.Fatalf("%v: decode sidecar %+v; engines that computed the prompt %v, want prefill engine %d alone", first, d, ran, pre.id)
				}

				s.waitIndex() // the decode engine's transferred blocks are indexed
				follow := first.followUp(fmt.Sprint("pdf", i), 40)
				follow.id = first.id + "-f"
				n0, l0 = seen(), s.loads()
				send(t, url, follow)
				s.checkNoBookings("the follow-up " + follow.String())
				for _, en := range s.engines {
					got := en.received(n0[en.id])
					if want := map[bool]int{true: 1, false: 0}[en == dec]; len(got) != want || want == 1 && (got[0].prefiller != "" || got[0].id != follow.id) {
						t.Fatalf("the follow-up %v: engine %d received %+v; want engine %d alone, without a prefiller (a bypass)", follow, en.id, got, dec.id)
					}
				}
				if ran := computed(l0, s.loads()); len(ran) != 1 || ran[dec.id][1] < 400/16*16 {
					t.Fatalf("the follow-up %v: computed on %v ([prompt tokens, cached]); want decode engine %d alone, serving the first prompt from its cache", follow, ran, dec.id)
				}
			}
			if r := s.metric("prefixd_epp_plan_transitions_total", "to", "Released"); r != 4 {
				t.Errorf("%v plans released, want 4", r)
			}
			if st := g.Stats(); st.Fallbacks+st.ProtocolErrors+st.EPPFailures != 0 || len(st.Immediate) != 0 {
				t.Errorf("gateway %+v", st)
			}
			s.checkIndexExact()
		})
	}
}
