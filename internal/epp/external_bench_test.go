package epp_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/openloop"
)

// The load generator of BenchmarkEPPExternal runs in its own process:
// this test binary, re-executed with these variables set, runs
// openloop.Run instead of the tests (TestMain) and prints its
// openloop.Result as JSON.
const eppgenTarget = "PREFIXD_EPPGEN_TARGET" // "grpc://host:port" (the picker) or an http:// URL

var eppWindow = flag.Duration("epp.window", 2*time.Second, "how long each BenchmarkEPPExternal run measures")

// eppWarm is how long each run sends before it measures, on the same
// connections.
const eppWarm = 250 * time.Millisecond

// gatewayChunk is the size of the body chunks the generator sends the
// picker, as a gateway forwards a body in the pieces it reads.
const gatewayChunk = 16 << 10

func TestMain(m *testing.M) {
	if target := os.Getenv(eppgenTarget); target != "" {
		os.Exit(runEPPGen(target))
	}
	os.Exit(m.Run())
}

func runEPPGen(target string) int {
	body, rate, window, err := openloop.ReadArgs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "eppgen:", err)
		return 2
	}
	var newSender func() (openloop.Sender, error)
	if addr, ok := strings.CutPrefix(target, "grpc://"); ok {
		// One connection, as one gateway worker multiplexes its
		// requests' streams; flow-control windows as large as Envoy's
		// defaults, so that a body is not held up by the window.
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(64<<20))
		if err != nil {
			fmt.Fprintln(os.Stderr, "eppgen:", err)
			return 2
		}
		defer conn.Close()
		pc := extprocv3.NewExternalProcessorClient(conn)
		var n atomic.Uint64
		newSender = func() (openloop.Sender, error) { return &gateway{pc: pc, body: body, n: &n}, nil }
	} else {
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: openloop.Senders, DisableCompression: true}}
		newSender = func() (openloop.Sender, error) { return openloop.HTTPSender{Client: hc, URL: target, Body: body}, nil }
	}
	r := openloop.Run(newSender, rate, eppWarm, window)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "eppgen:", err)
		return 1
	}
	return 0
}

// gateway is an openloop.Sender that plays a gateway's ext_proc stream
// for one request, as Envoy sends it in FULL_DUPLEX_STREAMED mode: the
// request headers, the body in gatewayChunk pieces, then — once the
// picker has answered the headers (the mark) and passed the body back —
// the response headers and body, and the half-close.
type gateway struct {
	pc   extprocv3.ExternalProcessorClient
	body []byte
	n    *atomic.Uint64 // request ids
	mark time.Time
}

var _ openloop.Marker = (*gateway)(nil)

func (g *gateway) Mark() time.Time { return g.mark }
func (g *gateway) Close()          {}

func (g *gateway) Send() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := g.pc.Process(ctx)
	if err != nil {
		return err
	}
	full := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if err := st.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(
			":method", "POST", ":path", "/v1/completions", "content-type", "application/json",
			"content-length", strconv.Itoa(len(g.body)), "x-request-id", "gen-"+strconv.FormatUint(g.n.Add(1), 10))}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: full, ResponseBodyMode: full}}); err != nil {
		return err
	}
	for b := g.body; len(b) > 0; {
		n := min(len(b), gatewayChunk)
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b[:n], EndOfStream: n == len(b)}}}); err != nil {
			return err
		}
		b = b[n:]
	}
	resp, err := st.Recv()
	if err != nil {
		return err
	}
	g.mark = time.Now()
	if ir := resp.GetImmediateResponse(); ir != nil {
		return fmt.Errorf("the picker answered %d: %.200s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	set := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) == 0 || set[0].GetHeader().GetKey() != epp.DestinationHeader {
		return fmt.Errorf("want the headers' answer with the destination, got %v", resp)
	}
	for got := 0; ; {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		sb := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			return fmt.Errorf("want the body back, got %v", resp)
		}
		if got += len(sb.Body); sb.EndOfStream {
			if got != len(g.body) {
				return fmt.Errorf("%d bytes of body back, want %d", got, len(g.body))
			}
			break
		}
	}
	primary, _, _ := strings.Cut(string(set[0].GetHeader().GetRawValue()), ",")
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200")}},
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.LBNamespace: {Fields: map[string]*structpb.Value{
				epp.ServedKey: structpb.NewStringValue(primary)}}}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"choices":[]}`), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			return err
		}
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); err != io.EOF {
		return fmt.Errorf("after the half-close: %v, want EOF", err)
	}
	return nil
}

// eppgenCmd is the generator's process sending body to target at rate.
// The runtime settings of the process under test (GOGC, GOMEMLIMIT,
// GOMAXPROCS, GODEBUG) are not passed on.
func eppgenCmd(target, bodyFile string, rate int, window time.Duration) *exec.Cmd {
	return openloop.Child(nil, bodyFile, rate, window, eppgenTarget+"="+target)
}

// runGen runs the generator against target and returns its result,
// and reports the CPU each process used per request sent: srv-cpu-µs/req
// (this one: the picker, or the proxy with prefixd and the engines) and
// gen-cpu-µs/req. The benchmark fails on any failed request.
func runGen(b *testing.B, target, bodyFile string, rate int) openloop.Result {
	return openloop.RunProcess(b, eppgenCmd(target, bodyFile, rate, *eppWindow))
}

// wordsPrompt is a prompt of n words the mock engines' tokenizer reads
// as n tokens.
func wordsPrompt(n int) string {
	var s strings.Builder
	for i := range n {
		if i > 0 {
			s.WriteByte(' ')
		}
		s.WriteString("w" + strconv.Itoa(i))
	}
	return s.String()
}

// BenchmarkEPPExternal is the measurement of the endpoint
// picker: a generator in its own process (this test binary re-executed,
// openloop.Run) sends what a gateway sends in FULL_DUPLEX_STREAMED mode
// for an 8,192-token completions prompt (the request headers, the body
// in 16 KiB chunks, then a response) at 2,000 requests per second, open
// loop, to prefixd serve's picker (--epp-listen) with two mock engines,
// embedded etcd and the tokenize cache warm. Each run sends for 250 ms
// (not measured) and then -epp.window:
//
//	go test -run '^$' -bench EPPExternal -benchtime 1x ./internal/epp
//
// epp/rate=2000 reports the decision's latency, from each request's due
// time to the picker's header mutation (p50-µs, p99-µs). floor/rate=2000
// is its control: the same streams to an ext_proc server that answers
// with a fixed destination and passes the body back, reading nothing
// (floor). In the same run, engine/rate=N sends the same body to a mock
// engine's /v1/completions directly and proxy/rate=N through prefixd
// proxy (its tokenize cache warm too, booking through serve's API), at
// 200 and 2,000 requests per second; proxy reports what it adds to the
// engine's latency at the same rate: added-p50-µs and added-p99-µs, the
// differences of the quantiles. (On two cores a mock engine does not
// keep up with 2,000 such prompts a second: its latency there is its
// queue's.) Every run reports the CPU each process spent per request
// (srv-cpu-µs/req, gen-cpu-µs/req: at 2,000 req/s two cores have 1,000
// µs a request between them), and the generator's waits and rate
// (openloop.Result.Report).
func BenchmarkEPPExternal(b *testing.B) {
	s := startStack(b, nil, engineSpec{id: 1, blocks: 4096}, engineSpec{id: 2, blocks: 4096})
	px, err := proxy.New(proxy.Config{Prefixd: client.New(s.api, ""), Refresh: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	testsupport.Go(b, "proxy", func(ctx context.Context) error { return px.Serve(ctx, ln, 10*time.Second) })
	pxURL := "http://" + ln.Addr().String()
	testsupport.Eventually(b, 20*time.Second, "the proxy's fleet view", func() bool {
		resp, err := http.Get(pxURL + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		page, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(page), `"id":"m"`)
	})
	body := completionBody(wordsPrompt(8192))
	file := filepath.Join(b.TempDir(), "body.json")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		b.Fatal(err)
	}
	// The prompt in both tokenize caches, and in an engine's KV cache.
	if err := openloop.Post(http.DefaultClient, pxURL+"/v1/completions", body); err != nil {
		b.Fatalf("warm the proxy: %v", err)
	}
	if a, err := s.envoy.do(req{body: string(body)}, "ok"); err != nil || a.status != 0 {
		b.Fatalf("warm the picker: %+v %v", a, err)
	}
	// The floor and the picker first: the engine falls behind at 2,000
	// req/s, and its backlog would weigh on what follows. Then the engine
	// alone and through the proxy at each rate: the engine's figures at
	// a rate are the proxy's baseline.
	engine := map[int]openloop.Result{}
	type run struct {
		name, target string
		rate         int
	}
	runs := []run{{"floor", "grpc://" + startFloor(b), 2000}, {"epp", "grpc://" + s.eppAddr, 2000}}
	for _, rate := range []int{200, 2000} {
		runs = append(runs, run{"engine", "http://" + s.addrs[1] + "/v1/completions", rate}, run{"proxy", pxURL + "/v1/completions", rate})
	}
	for _, run := range runs {
		b.Run(fmt.Sprintf("%s/rate=%d", run.name, run.rate), func(b *testing.B) {
			r := runGen(b, run.target, file, run.rate)
			r.Report(b)
			switch run.name {
			case "engine":
				engine[run.rate] = r
			case "proxy":
				base := engine[run.rate]
				b.ReportMetric(openloop.Micros(r.Latencies, 0.5)-openloop.Micros(base.Latencies, 0.5), "added-p50-µs")
				b.ReportMetric(openloop.Micros(r.Latencies, 0.99)-openloop.Micros(base.Latencies, 0.99), "added-p99-µs")
			}
		})
	}
}

// floor is the control of BenchmarkEPPExternal: an ext_proc server that
// answers each request's headers with a fixed destination and passes the
// body back as it came, reading nothing: what gRPC, the generator and the
// machine cost a request, without the picker's reading, tokenizing and
// booking.
type floor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (floor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var held [][]byte
	answer := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: epp.DestinationHeader, RawValue: []byte("127.0.0.1:1")}}}}}}}}
	streamed := func(body []byte, eos bool) *extprocv3.CommonResponse {
		return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}
	}
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		var out []*extprocv3.ProcessingResponse
		switch v := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			if held = append(held, v.RequestBody.Body); !v.RequestBody.EndOfStream {
				continue
			}
			out = append(out, answer)
			for i, c := range held {
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
					Response: streamed(c, i == len(held)-1)}}})
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: streamed(v.ResponseBody.Body, v.ResponseBody.EndOfStream)}}})
		}
		for _, r := range out {
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
}

// startFloor serves floor on a loopback port for b's life.
func startFloor(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, floor{})
	testsupport.Go(b, "floor", func(ctx context.Context) error {
		go func() { <-ctx.Done(); srv.Stop() }()
		return srv.Serve(ln)
	})
	return ln.Addr().String()
}

// completionBody is a completions request of prompt for one token.
func completionBody(prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	return b
}
