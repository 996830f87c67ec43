package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// This file is the tests' side of the protocol: a scripted endpoint
// picker over real gRPC (the gateway is what is under test), a record of
// what it received, and real HTTP upstreams.

// transcript records, one line each, the messages a picker received and
// how its stream ended. Safe for concurrent use.
type transcript struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every line
}

func newTranscript() *transcript { return &transcript{changed: make(chan struct{})} }

func (tr *transcript) add(format string, args ...any) {
	tr.mu.Lock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
	close(tr.changed)
	tr.changed = make(chan struct{})
	tr.mu.Unlock()
}

func (tr *transcript) Lines() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.lines)
}

// waitFor waits until a line starts with prefix.
func (tr *transcript) waitFor(t *testing.T, prefix string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		tr.mu.Lock()
		ch := tr.changed
		found := slices.ContainsFunc(tr.lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
		tr.mu.Unlock()
		if found {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no picker line %q within 30 s; got %q", prefix, tr.Lines())
		}
	}
}

// headerLine is a header map as "k=v k=v", in the order sent, without
// :authority (the loopback port changes) and user-agent.
func headerLine(m *corev3.HeaderMap) string {
	var parts []string
	for _, h := range m.GetHeaders() {
		if h.Key == ":authority" || h.Key == "user-agent" || h.Key == "accept-encoding" {
			continue
		}
		v := string(h.RawValue)
		if len(h.RawValue) == 0 {
			v = h.Value
		}
		parts = append(parts, h.Key+"="+v)
	}
	return strings.Join(parts, " ")
}

func headerValue(m *corev3.HeaderMap, key string) string {
	for _, h := range m.GetHeaders() {
		if h.Key == key {
			return string(h.RawValue)
		}
	}
	return ""
}

// metaLine is a message's metadata_context in one line.
func metaLine(md *corev3.Metadata) string {
	if md == nil {
		return ""
	}
	var parts []string
	for _, ns := range slices.Sorted(func(yield func(string) bool) {
		for k := range md.FilterMetadata {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s=%v", ns, md.FilterMetadata[ns].AsMap()))
	}
	return " meta " + strings.Join(parts, " ")
}

// decision is what a picker answers once it has the request.
type decision struct {
	header, meta string // the destination in the header and the metadata ("": left out)
	set          map[string]string
	remove       []string
	body         func([]byte) []byte // the body passed back; nil: unchanged
	immediate    *extprocv3.ImmediateResponse
	respHeader   map[string]string   // set on the response
	respBody     func([]byte) []byte // BUFFERED: the response body passed back
}

func destMeta(v string) *structpb.Struct {
	if v == "" {
		return nil
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{DestinationNamespace: structpb.NewStructValue(&structpb.Struct{
		Fields: map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(v)}})}}
}

func setHeaders(m map[string]string) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(m[k])}})
	}
	return out
}

// picker is a GIE-style endpoint picker: it records what it receives and
// answers as decide says, in the given body mode (the gateway's must
// match). In FULL_DUPLEX_STREAMED it answers once the body has ended —
// the headers response, then the body as one StreamedBodyResponse — and
// echoes each response chunk as it comes; in BUFFERED it answers each
// message.
func picker(tr *transcript, mode BodyMode, decide func(headers *corev3.HeaderMap, body []byte) decision) func(extprocv3.ExternalProcessor_ProcessServer) error {
	return func(s extprocv3.ExternalProcessor_ProcessServer) error {
		var headers *corev3.HeaderMap
		var body []byte
		var d decision
		send := func(r *extprocv3.ProcessingResponse) error { return s.Send(r) }
		decideAndAnswer := func() error {
			d = decide(headers, body)
			if d.immediate != nil {
				return send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: d.immediate}})
			}
			set := setHeaders(d.set)
			if d.header != "" {
				set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(d.header)}})
			}
			common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: d.remove}}
			out := body
			if d.body != nil {
				out = d.body(body)
			}
			if mode == Buffered {
				if d.body != nil {
					common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
				}
				resp := &extprocv3.ProcessingResponse{DynamicMetadata: destMeta(d.meta)}
				if body == nil {
					resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
				} else {
					resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
				}
				return send(resp)
			}
			if err := send(&extprocv3.ProcessingResponse{
				Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
				DynamicMetadata: destMeta(d.meta),
			}); err != nil {
				return err
			}
			if body == nil {
				return nil
			}
			return send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: out, EndOfStream: true}}}}}}})
		}
		for {
			req, err := s.Recv()
			if err != nil {
				code := "EOF"
				if !errors.Is(err, io.EOF) {
					code = status.Code(err).String()
				}
				tr.add("end %s", code)
				return nil
			}
			switch v := req.Request.(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				headers = v.RequestHeaders.Headers
				pc := req.GetProtocolConfig()
				tr.add("request_headers eos=%v %s%s protocol=%v/%v", v.RequestHeaders.EndOfStream, headerLine(headers), metaLine(req.MetadataContext),
					pc.GetRequestBodyMode(), pc.GetResponseBodyMode())
				switch {
				case v.RequestHeaders.EndOfStream:
					if err := decideAndAnswer(); err != nil {
						return err
					}
				case mode == Buffered:
					if err := send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
						RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}}); err != nil {
						return err
					}
				}
			case *extprocv3.ProcessingRequest_RequestBody:
				tr.add("request_body %q eos=%v%s", v.RequestBody.Body, v.RequestBody.EndOfStream, metaLine(req.MetadataContext))
				body = append(body, v.RequestBody.Body...)
				if body == nil {
					body = []byte{}
				}
				if v.RequestBody.EndOfStream {
					if err := decideAndAnswer(); err != nil {
						return err
					}
				}
			case *extprocv3.ProcessingRequest_ResponseHeaders:
				tr.add("response_headers eos=%v :status=%s%s", v.ResponseHeaders.EndOfStream, headerValue(v.ResponseHeaders.Headers, ":status"), metaLine(req.MetadataContext))
				if err := send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: setHeaders(d.respHeader)}}}}}); err != nil {
					return err
				}
			case *extprocv3.ProcessingRequest_ResponseBody:
				tr.add("response_body %q eos=%v", v.ResponseBody.Body, v.ResponseBody.EndOfStream)
				var common *extprocv3.CommonResponse
				if mode == Buffered {
					common = &extprocv3.CommonResponse{}
					if d.respBody != nil {
						common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: d.respBody(v.ResponseBody.Body)}}
					}
				} else {
					common = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
						StreamedResponse: &extprocv3.StreamedBodyResponse{Body: v.ResponseBody.Body, EndOfStream: v.ResponseBody.EndOfStream}}}}
				}
				if err := send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}}); err != nil {
					return err
				}
			default:
				tr.add("unexpected %T", req.Request)
			}
		}
	}
}

// eppServer serves a scripted Process over real gRPC.
type eppServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	process func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (e *eppServer) Process(s extprocv3.ExternalProcessor_ProcessServer) error { return e.process(s) }

// startEPP serves process on a loopback port (TLS with tlsCfg) for the
// test's life and returns its address.
func startEPP(t *testing.T, tlsCfg *tls.Config, process func(extprocv3.ExternalProcessor_ProcessServer) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(srv, &eppServer{process: process})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("epp server: %v", err)
		}
	})
	return ln.Addr().String()
}

// closedAddr is a loopback address that refuses connections: a TCP
// socket bound to it but not listening, held for the test's life, so no
// other test's listener can take the port meanwhile.
func closedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// upstream is a real HTTP server that answers "<name> <method> <path>
// headers=... body=<body>" and counts its requests.
type upstream struct {
	name string
	addr string
	hits atomic.Int64
}

func startUpstream(t *testing.T, name string, status int) *upstream {
	t.Helper()
	u := &upstream{name: name}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream %s: %v", name, err)
		}
		var hs []string
		for _, k := range []string{"X-Prefiller-Host-Port", "X-Drop", "X-Request-Id", DestinationHeader, "Content-Type"} {
			if v, ok := r.Header[http.CanonicalHeaderKey(k)]; ok {
				hs = append(hs, strings.ToLower(k)+"="+strings.Join(v, ","))
			}
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		fmt.Fprintf(w, "%s %s %s host=%s headers=[%s] body=%s", name, r.Method, r.URL.RequestURI(), r.Host, strings.Join(hs, " "), b)
	}))
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

func immediateResponse(code typev3.StatusCode, contentType, body string) *extprocv3.ImmediateResponse {
	return &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: code},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte(contentType)}, Append: wrapperspb.Bool(false)}}},
		Body:    []byte(body),
	}
}
