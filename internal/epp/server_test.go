package epp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// picker is a Server on loopback gRPC over a real coordinator Service
// with engines at the given addresses (no etcd, no index).
type picker struct {
	srv   *epp.Server
	svc   *coordinator.Service
	envoy *envoy
}

func startPicker(t testing.TB, cfg epp.Config, pcfg coordinator.PoolConfig, engines map[uint64]string) *picker {
	t.Helper()
	return startPickerWith(t, cfg, coordinator.ServiceConfig{Pool: pcfg}, engines, 0)
}

// startPickerWith is startPicker over a Service of scfg, its engines
// given batched as their max_num_batched_tokens (0: unknown).
func startPickerWith(t testing.TB, cfg epp.Config, scfg coordinator.ServiceConfig, engines map[uint64]string, batched uint64) *picker {
	t.Helper()
	svc := coordinator.NewService(scfg)
	eps := epp.NewEndpoints(nil, 0)
	for id, base := range engines {
		w := catalog.Worker{WorkerID: id, ModelName: model, RoutingGroup: catalog.DefaultRoutingGroup, Endpoint: base, BlockSize: 16,
			Attributes: catalog.Attributes{TotalKVBlocks: 512, MaxNumBatchedTokens: batched}}.WithDefaults()
		if err := svc.SetRecord(w); err != nil {
			t.Fatal(err)
		}
		eps.Set(w)
	}
	cfg.Service, cfg.Endpoints, cfg.Logger = svc, eps, slog.New(slog.DiscardHandler)
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	srv, err := epp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Go(t, "picker", func(ctx context.Context) error { return srv.Serve(ctx, ln, epp.TLS{}, 5*time.Second) })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p := &picker{srv: srv, svc: svc, envoy: &envoy{t: t, conn: conn}}
	t.Cleanup(func() {
		testsupport.Eventually(t, 10*time.Second, "no bookings left", func() bool {
			return srv.Bookings() == 0 && svc.Reservations() == 0 && srv.BodyBytes() == 0
		})
	})
	return p
}

// TestPickerBounds: a body over the cap is a 413, a content-length over
// it or not the body's is read as the body comes, a body that stops
// arriving a 408, a prompt of token ids that keeps every engine over its
// busy threshold a 429.
func TestPickerBounds(t *testing.T) {
	t.Parallel()
	pcfg := coordinator.DefaultPoolConfig()
	pcfg.Thresholds.PrefillTokens = 50
	p := startPicker(t, epp.Config{MaxBodyBytes: 4096, BodyTimeout: 200 * time.Millisecond, TokenizeTimeout: time.Second}, pcfg,
		map[uint64]string{1: "http://127.0.0.1:1"})

	a, err := p.envoy.do(req{body: completion(strings.Repeat("x", 5000))})
	if err != nil || a.status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the cap: %+v %v", a, err)
	}

	// A content-length that is not the body's: the buffer is bounded by
	// the cap, and the body read as it came.
	for _, length := range []string{"1099511627776", "-5", "x", "3"} {
		a, err := p.envoy.do(req{body: `{"model":"m","prompt":[1,2,3]}`, length: length}, "ok")
		if err != nil || a.header != "127.0.0.1:1" {
			t.Errorf("content-length %s: %+v %v", length, a, err)
		}
	}

	x := p.envoy.open()
	if err := x.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":path", "/v1/completions")}}}); err != nil {
		t.Fatal(err)
	}
	if err := x.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":`)}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := x.s.Recv(); err != nil || resp.GetImmediateResponse().GetStatus().GetCode() != http.StatusRequestTimeout {
		t.Errorf("a stalled body: %v %v", resp, err)
	}
	x.cancel()

	ids := strings.Repeat("7,", 99) + "7"
	x = p.envoy.open()
	first, err := x.request(req{body: `{"model":"m","prompt":[` + ids + `]}`})
	if err != nil || first.header != "127.0.0.1:1" {
		t.Fatalf("first: %+v %v", first, err)
	}
	if a, err := p.envoy.do(req{body: `{"model":"m","prompt":[` + ids + `]}`}); err != nil || a.status != http.StatusTooManyRequests {
		t.Errorf("every engine busy: %+v %v", a, err)
	}
	if err := x.respond("127.0.0.1:1", 200, "done"); err != nil {
		t.Fatal(err)
	}
	if err := x.close(); err != nil {
		t.Fatal(err)
	}
}

// TestPickerAssumedBodyMode: a gateway that sends no protocol_config is
// read in Config.BodyMode: full duplex by default, buffered when so
// configured; a buffering gateway that does not say so, against a
// picker assuming full duplex, waits for the headers' answer while the
// picker waits for the body: the body timeout ends it with a 408.
func TestPickerAssumedBodyMode(t *testing.T) {
	t.Parallel()
	const full, buffered = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED
	engines := map[uint64]string{1: "http://127.0.0.1:1", 2: "http://127.0.0.2:1"}
	body := `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`
	for _, c := range []struct {
		assumed, gateway filterv3.ProcessingMode_BodySendMode
		status           int // 0: picked
	}{
		{0, full, 0},
		{full, full, 0},
		{buffered, buffered, 0},
		{0, buffered, http.StatusRequestTimeout},
	} {
		t.Run(fmt.Sprintf("%v/%v", c.assumed, c.gateway), func(t *testing.T) {
			p := startPicker(t, epp.Config{BodyMode: c.assumed, BodyTimeout: 300 * time.Millisecond}, coordinator.DefaultPoolConfig(), engines)
			x := p.envoy.open()
			a, err := x.request(req{body: body, mode: c.gateway, noConfig: true})
			if err != nil || a.status != c.status {
				t.Fatalf("answer %+v, %v; want status %d", a, err, c.status)
			}
			if c.status != 0 {
				x.cancel()
				return
			}
			if a.header == "" || a.header != a.meta || (c.gateway == full && a.body != body) {
				t.Fatalf("answer %+v", a)
			}
			primary, _, _ := strings.Cut(a.header, ",")
			if err := x.respond(primary, 200, "data: a\n\n", "data: [DONE]\n\n"); err != nil {
				t.Fatal(err)
			}
			if err := x.close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, cfg := range []epp.Config{{BodyMode: filterv3.ProcessingMode_STREAMED}, {Fallbacks: epp.MaxFallbacks + 1}} {
		cfg.Service, cfg.Endpoints = coordinator.NewService(coordinator.ServiceConfig{}), epp.NewEndpoints(nil, 0)
		if _, err := epp.New(cfg); err == nil || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("New(%+v): %v, want an error naming the field", cfg, err)
		}
	}
}

// TestPickerHealth: liveness serves; readiness and the ext_proc service
// follow the daemon's readiness both ways.
func TestPickerHealth(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	p := startPicker(t, epp.Config{Ready: ready.Load, HealthInterval: 10 * time.Millisecond}, coordinator.DefaultPoolConfig(), nil)
	hc := healthpb.NewHealthClient(p.envoy.conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		st, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("check %s: %v", svc, err)
		}
		return st.Status
	}
	want := func(st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		testsupport.Eventually(t, 5*time.Second, fmt.Sprint("readiness ", st), func() bool {
			return status(epp.ReadinessService) == st && status(epp.ServiceName) == st
		})
		if s := status(epp.LivenessService); s != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("liveness %v", s)
		}
	}
	want(healthpb.HealthCheckResponse_NOT_SERVING)
	ready.Store(true)
	want(healthpb.HealthCheckResponse_SERVING)
	ready.Store(false)
	want(healthpb.HealthCheckResponse_NOT_SERVING)
}

// BenchmarkEPPDecision: one full request — request headers in, header
// mutation out — for an 8,192-token prompt with the tokenize cache
// answering, over a real loopback gRPC stream, against 16 engines.
func BenchmarkEPPDecision(b *testing.B) {
	var answer strings.Builder
	answer.WriteString(`{"count":8192,"max_model_len":32768,"tokens":[`)
	for i := range 8192 {
		if i > 0 {
			answer.WriteByte(',')
		}
		fmt.Fprint(&answer, 1000+i)
	}
	answer.WriteString(`]}`)
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(answer.String())) }))
	b.Cleanup(tok.Close)
	engines := map[uint64]string{}
	for i := range uint64(16) {
		engines[i+1] = tok.URL // every engine tokenizes there; the addresses repeat
	}
	p := startPicker(b, epp.Config{}, coordinator.DefaultPoolConfig(), engines)
	body := completion(prompt(8192, 1))
	if a, err := p.envoy.do(req{body: body}, "ok"); err != nil || a.status != 0 { // fills the cache
		b.Fatal(a, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		x := p.envoy.open()
		a, err := x.request(req{body: body, chunk: 62000})
		if err != nil || a.header == "" {
			b.Fatal(a, err)
		}
		b.StopTimer()
		if err := x.respond(a.header, 200, "ok"); err != nil {
			b.Fatal(err)
		}
		if err := x.close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
