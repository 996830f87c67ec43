package epp_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

const model = "m"

// stack is a real etcd, prefixd serve with its endpoint picker, and mock
// engines speaking vLLM's OpenAI API, on loopback.
type stack struct {
	t       testing.TB
	api     string // prefixd's HTTP API
	eppAddr string // the picker's gRPC address
	envoy   *envoy
	picker  *epp.Server
	addrs   map[uint64]string // engine ip:port by worker id
}

type engineSpec struct {
	id     uint64
	role   catalog.Role
	blocks int // KV blocks of 16 tokens (default 512)
	// batched is the engine's max_num_batched_tokens (0: not registered).
	batched uint64
}

func startStack(t testing.TB, edit func(*daemon.Config), specs ...engineSpec) *stack {
	t.Helper()
	etcd := storetest.StartEtcd(t)
	var picker atomic.Pointer[epp.Server]
	eppAddr := make(chan string, 1)
	cfg := daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second}, Listen: "127.0.0.1:0",
		ReadyTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler),
		EPP:        daemon.EPPConfig{Listen: "127.0.0.1:0", OnReady: func(a string) { eppAddr <- a }, Server: func(s *epp.Server) { picker.Store(s) }},
		Subscriber: stream.SubscriberConfig{ProbeInterval: 100 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond}}
	if edit != nil {
		edit(&cfg)
	}
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// The engines start first, and so stop last: the picker's connections
	// to them close before they drain.
	fleet := mocker.NewFleet(context.Background(), store, nil)
	t.Cleanup(func() {
		if err := fleet.Stop(); err != nil {
			t.Errorf("fleet: %v", err)
		}
	})
	addrs := map[uint64]string{}
	for _, sp := range specs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		blocks := cmp.Or(sp.blocks, 512)
		w := catalog.Worker{WorkerID: sp.id, ModelName: model, Endpoint: "http://" + ln.Addr().String(), Attributes: catalog.Attributes{Role: sp.role, TotalKVBlocks: uint64(blocks), MaxNumBatchedTokens: sp.batched}}
		if _, err := fleet.Start(context.Background(), mocker.Config{TotalBlocks: blocks, BlockSize: 16, Worker: w}, ln); err != nil {
			t.Fatal(err)
		}
		addrs[sp.id] = ln.Addr().String()
	}
	api, _ := testsupport.Ready(t, "daemon", func(ctx context.Context, ready func(string)) error {
		cfg.OnReady = ready
		return daemon.Run(ctx, cfg)
	})
	s := &stack{t: t, api: "http://" + api, picker: picker.Load(), addrs: addrs}
	var conn *grpc.ClientConn
	addr := <-eppAddr
	s.eppAddr = addr
	creds := insecure.NewCredentials()
	if cfg.EPP.TLS.SelfSigned {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) // as a gateway trusts a self-signed picker
	}
	if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(creds)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.envoy = &envoy{t: t, conn: conn}
	// Ready: every engine routable through the picker, and prefixd ready.
	testsupport.Eventually(t, 30*time.Second, "the picker serving every engine", func() bool {
		st, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: epp.ReadinessService})
		if err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
			return false
		}
		var prefill, dests []string
		for _, sp := range specs {
			if sp.role == catalog.RolePrefill {
				prefill = append(prefill, s.addrs[sp.id])
			} else {
				dests = append(dests, s.addrs[sp.id])
			}
		}
		for _, d := range dests {
			a, err := s.envoy.do(req{body: `{"model":"m","prompt":"warm up","max_tokens":1}`, subset: append([]string{d}, prefill...)}, "x")
			if err != nil || a.status != 0 {
				return false
			}
		}
		return true
	})
	t.Cleanup(s.checkNoBookings)
	return s
}

// checkNoBookings: once the test's requests are done, the picker holds
// no booking and prefixd no reservation and no plan.
func (s *stack) checkNoBookings() {
	testsupport.Eventually(s.t, 10*time.Second, "no bookings left", func() bool {
		page := s.metrics()
		return s.picker.Bookings() == 0 && s.picker.BodyBytes() == 0 && gauge(page, "prefixd_reservations_live") == 0 && gauge(page, "prefixd_plans_live") == 0
	})
}

func (s *stack) metrics() string {
	resp, err := http.Get(s.api + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// gauge reads a metric's value from a metrics page (labels included in
// name; -1 if absent).
func gauge(page, name string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// generate runs a completion on the engine at addr, as the gateway would
// send it there: its KV cache then holds the prompt.
func (s *stack) generate(addr, body string) {
	s.t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
		s.t.Fatalf("engine %s: %d %s", addr, resp.StatusCode, b)
	}
}

func prompt(words int, seed int) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "w%d_%d ", seed, i)
	}
	return b.String()
}

func completion(p string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": p, "max_tokens": 1})
	return string(b)
}

// TestEPPPicksCachedPrefix: with both body modes, a follow-up prompt is
// picked onto the engine that caches its prefix; the header equals the
// metadata; the fallbacks are the other engines; the body comes back
// unchanged (in chunks of at most 32,000 bytes in full duplex).
func TestEPPPicksCachedPrefix(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil, engineSpec{id: 1}, engineSpec{id: 2}, engineSpec{id: 3})
	for i, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
		base := prompt(400, i)
		first, err := s.envoy.do(req{body: completion(base), mode: mode}, "data: a\n\n", "data: [DONE]\n\n")
		if err != nil || first.status != 0 {
			t.Fatalf("%v: first: %+v %v", mode, first, err)
		}
		if first.header != first.meta || first.header == "" {
			t.Fatalf("%v: header %q, metadata %q", mode, first.header, first.meta)
		}
		list := strings.Split(first.header, ",")
		if len(list) != 3 || len(slices.Compact(slices.Sorted(slices.Values(list)))) != 3 {
			t.Fatalf("%v: endpoints %v, want the primary and two fallbacks, all distinct", mode, list)
		}
		// The gateway sent it to the primary: the engine caches it.
		s.generate(list[0], completion(base))
		follow := completion(base + "and a follow-up question")
		testsupport.Eventually(t, 20*time.Second, "the follow-up picked onto the caching engine", func() bool {
			a, err := s.envoy.do(req{body: follow, mode: mode, chunk: 700}, "ok")
			if err != nil {
				t.Fatal(err)
			}
			if mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && a.body != follow {
				t.Fatalf("the body came back as %q", a.body)
			}
			return strings.HasPrefix(a.header, list[0]+",")
		})
	}
	// A large body passes back whole, in chunks of at most 32,000 bytes;
	// trailers end a body too.
	big := completion(prompt(30000, 9))
	a, err := s.envoy.do(req{body: big, chunk: 100000, trailers: true}, "ok")
	if err != nil || a.body != big {
		t.Fatalf("large body: %d bytes back of %d, %v", len(a.body), len(big), err)
	}
	page := s.metrics()
	if gauge(page, `prefixd_epp_tokenize_total{source="cache"}`) < 1 || gauge(page, "prefixd_epp_decision_seconds_count") < 5 {
		t.Errorf("metrics: cache hits %v, decisions %v", gauge(page, `prefixd_epp_tokenize_total{source="cache"}`), gauge(page, "prefixd_epp_decision_seconds_count"))
	}
}

// TestEPPSubsetAndErrors: the subset hint restricts the pick; an empty or
// ineligible subset is a 503; an unknown model a 404 with OpenAI's error
// object; a malformed body a 400; a body without a model a 400; a
// request without a body a 400.
func TestEPPSubsetAndErrors(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil, engineSpec{id: 1}, engineSpec{id: 2})
	for range 5 {
		a, err := s.envoy.do(req{body: completion("x"), subset: []string{s.addrs[2]}}, "ok")
		if err != nil || a.header != s.addrs[2] {
			t.Fatalf("subset of engine 2: %+v %v", a, err)
		}
	}
	for _, c := range []struct {
		name   string
		r      req
		status int
		param  string
	}{
		{"empty subset", req{body: completion("x"), subset: []string{}}, 503, ""},
		{"ineligible subset", req{body: completion("x"), subset: []string{"10.9.9.9:80"}}, 503, ""},
		{"unknown model", req{body: `{"model":"nope","prompt":"x"}`}, 404, "model"},
		{"malformed", req{body: `{"model":"m","prompt":`}, 400, ""},
		{"no model", req{body: `{"prompt":"x"}`}, 400, ""},
		{"chat without messages", req{path: "/v1/chat/completions", body: `{"model":"m"}`}, 400, ""},
		{"buffered unknown model", req{body: `{"model":"nope","prompt":"x"}`, mode: filterv3.ProcessingMode_BUFFERED}, 404, "model"},
	} {
		a, err := s.envoy.do(c.r)
		if err != nil || a.status != c.status {
			t.Errorf("%s: %+v %v, want %d", c.name, a, err, c.status)
			continue
		}
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   any    `json:"param"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(a.errBody), &e); err != nil || e.Error.Message == "" || e.Error.Code != c.status || e.Error.Type == "" || (c.param != "" && e.Error.Param != c.param) {
			t.Errorf("%s: error body %s", c.name, a.errBody)
		}
	}
	x := s.envoy.open()
	if err := x.s.Send(headersOnly()); err != nil {
		t.Fatal(err)
	}
	if resp, err := x.s.Recv(); err != nil || resp.GetImmediateResponse().GetStatus().GetCode() != 400 {
		t.Errorf("a request without a body: %v %v", resp, err)
	}
	x.cancel()
	page := s.metrics()
	for _, st := range []string{"400", "404", "503"} {
		if gauge(page, `prefixd_epp_errors_total{status="`+st+`"}`) < 1 {
			t.Errorf("errors{status=%s} not counted", st)
		}
	}
}

// TestEPPServedElsewhere: the gateway fell back to the first fallback;
// the response says so, and the booking moves there (counted).
func TestEPPServedElsewhere(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil, engineSpec{id: 1}, engineSpec{id: 2}, engineSpec{id: 3})
	x := s.envoy.open()
	a, err := x.request(req{body: completion(prompt(100, 1))})
	if err != nil || a.status != 0 {
		t.Fatalf("%+v %v", a, err)
	}
	list := strings.Split(a.header, ",")
	if err := x.respond(list[1], 200, "data: x\n\n"); err != nil {
		t.Fatal(err)
	}
	page := s.metrics()
	if gauge(page, "prefixd_epp_fallbacks_used_total") != 1 || gauge(page, `prefixd_epp_served_elsewhere_total{booking="moved"}`) != 1 {
		t.Errorf("fallbacks used %v, moved %v", gauge(page, "prefixd_epp_fallbacks_used_total"), gauge(page, `prefixd_epp_served_elsewhere_total{booking="moved"}`))
	}
	if err := x.close(); err != nil {
		t.Fatal(err)
	}
}

// TestEPPDisconnectFrees: a stream that breaks at any point — after the
// answer, after the response headers, mid-body — frees its booking.
func TestEPPDisconnectFrees(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil, engineSpec{id: 1}, engineSpec{id: 2})
	for phase := range 3 {
		x := s.envoy.open()
		a, err := x.request(req{body: completion(prompt(50, phase))})
		if err != nil || a.status != 0 {
			t.Fatalf("%+v %v", a, err)
		}
		switch phase {
		case 1:
			x.respond(a.header, 200)
		case 2:
			x.respond(a.header, 200, "data: 1\n\n") // one chunk is the last: send a first one by hand
		}
		if s.picker.Bookings() == 0 && phase == 0 {
			t.Fatal("no booking held after the answer")
		}
		x.cancel() // the gateway resets the stream
		testsupport.Eventually(t, 10*time.Second, "the booking freed", func() bool { return s.picker.Bookings() == 0 })
	}
}

// TestEPPRandomStreams: random requests in both modes, broken off at a
// random point, served by a random endpoint of the list, malformed or
// not, concurrently: the bookings always return to zero (checked by the
// stack at the end).
func TestEPPRandomStreams(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil, engineSpec{id: 1}, engineSpec{id: 2}, engineSpec{id: 3})
	done := make(chan error, 4)
	for w := range 4 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 25 {
				err := func() error {
					mode := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED}[r.IntN(2)]
					body := completion(prompt(1+r.IntN(300), r.IntN(5)))
					if r.IntN(8) == 0 {
						body = body[:len(body)/2]
					}
					x := s.envoy.open()
					defer x.cancel()
					a, err := x.request(req{body: body, mode: mode, id: fmt.Sprint("r", r.IntN(4)), chunk: 1 + r.IntN(2000), noLength: r.IntN(2) == 0})
					if err != nil || a.status != 0 || r.IntN(4) == 0 {
						return nil // refused, or broken off after the answer
					}
					list := strings.Split(a.header, ",")
					served := list[r.IntN(len(list))]
					if r.IntN(3) == 0 {
						x.respond(served, 200)
						return nil // broken off after the response headers
					}
					if err := x.respond(served, 200, "a", "b"); err != nil {
						return fmt.Errorf("request %d: %v", i, err)
					}
					return x.close()
				}()
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestEPPDisagg: decode-first plans: the destination is the decode
// engine, the prefill engine is the prefiller; no fallbacks; the plan is
// released at the end.
func TestEPPDisagg(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *daemon.Config) { c.EPP.Disagg = true },
		engineSpec{id: 1, role: catalog.RoleDecode}, engineSpec{id: 2, role: catalog.RoleDecode}, engineSpec{id: 3, role: catalog.RolePrefill})
	released := `prefixd_epp_plan_transitions_total{from="PrefillReleased",to="Released"}`
	linked := `prefixd_epp_plan_transitions_total{from="Linked",to="PrefillReleased"}`
	before := s.metrics()
	for range 3 {
		a, err := s.envoy.do(req{body: completion(prompt(200, 3))}, "data: x\n\n", "data: [DONE]\n\n")
		if err != nil || a.status != 0 {
			t.Fatalf("%+v %v", a, err)
		}
		if a.header != a.meta || (a.header != s.addrs[1] && a.header != s.addrs[2]) || a.prefiller != s.addrs[3] {
			t.Fatalf("destination %q (metadata %q), prefiller %q: want a decode engine alone, prefill on %s", a.header, a.meta, a.prefiller, s.addrs[3])
		}
	}
	page := s.metrics()
	if gauge(page, linked)-gauge(before, linked) != 3 || gauge(page, released)-gauge(before, released) != 3 {
		t.Errorf("transitions not counted:\n%s", grep(page, "prefixd_epp_plan_transitions_total"))
	}
}

func grep(page, prefix string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEPPSelfSignedTLS: --epp-self-signed serves TLS with a certificate
// made at start; a request and the health check work over it.
func TestEPPSelfSignedTLS(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *daemon.Config) { c.EPP.TLS.SelfSigned = true }, engineSpec{id: 1})
	if a, err := s.envoy.do(req{body: completion("hi")}, "ok"); err != nil || a.header != s.addrs[1] {
		t.Fatalf("%+v %v", a, err)
	}
	for _, svc := range []string{epp.LivenessService, epp.ReadinessService, epp.ServiceName} {
		st, err := healthpb.NewHealthClient(s.envoy.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %s: %v %v", svc, st, err)
		}
	}
}
