package epp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixd/prefixd/internal/epp"
)

// envoy plays the gateway: one ext_proc stream per HTTP request, sending
// what Envoy sends in the body mode in use (Envoy's ext_proc filter,
// ProcessingMode; GIE docs/proposals/004-endpoint-picker-protocol).
type envoy struct {
	t    testing.TB
	conn *grpc.ClientConn
}

// req is one HTTP request as the gateway sees it.
type req struct {
	path string // default /v1/completions
	body string
	id   string // x-request-id; "" sends none
	// subset, when not nil, is the endpoint subset hint (empty: an empty list).
	subset []string
	mode   filterv3.ProcessingMode_BodySendMode // default FULL_DUPLEX_STREAMED
	chunk  int                                  // body chunk size (full duplex), default 1000
	// trailers ends the body with request trailers instead of end_of_stream.
	trailers bool
	// noConfig sends no protocol_config, as a gateway that leaves the
	// picker to assume its body mode.
	noConfig bool
	// noLength sends no content-length (a chunked request body); length,
	// if set, is the content-length sent, whatever the body's.
	noLength bool
	length   string
	// headers are more request headers: key, value, key, value, ….
	headers []string
}

// answer is what the picker answered to a request.
type answer struct {
	header, meta, prefiller string
	status                  int    // of an immediate response, 0 otherwise
	errBody                 string // an immediate response's body
	retryAfter              string // an immediate response's retry-after header
	body                    string // the body passed back (full duplex)
}

// exchange is one open stream.
type exchange struct {
	e      *envoy
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	mode   filterv3.ProcessingMode_BodySendMode
}

func (e *envoy) open() *exchange {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := extprocv3.NewExternalProcessorClient(e.conn).Process(ctx)
	if err != nil {
		cancel()
		e.t.Fatalf("open stream: %v", err)
	}
	e.t.Cleanup(cancel)
	return &exchange{e: e, s: s, cancel: cancel}
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// request sends r and reads the picker's answer.
func (x *exchange) request(r req) (answer, error) {
	x.mode = r.mode
	if x.mode == 0 {
		x.mode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	path := r.path
	if path == "" {
		path = "/v1/completions"
	}
	kv := []string{":method", "POST", ":path", path, "content-type", "application/json"}
	switch {
	case r.length != "":
		kv = append(kv, "content-length", r.length)
	case r.body != "" && !r.noLength:
		kv = append(kv, "content-length", strconv.Itoa(len(r.body))) // Envoy forwards the client's
	}
	if r.id != "" {
		kv = append(kv, "x-request-id", r.id)
	}
	kv = append(kv, r.headers...)
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...)}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: x.mode, ResponseBodyMode: x.mode}}
	if r.noConfig {
		first.ProtocolConfig = nil
	}
	if r.subset != nil {
		vals := make([]*structpb.Value, len(r.subset))
		for i, s := range r.subset {
			vals[i] = structpb.NewStringValue(s)
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.SubsetNamespace: {Fields: map[string]*structpb.Value{
			epp.SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
	}
	if err := x.s.Send(first); err != nil {
		return answer{}, err
	}
	body := []byte(r.body)
	if x.mode == filterv3.ProcessingMode_BUFFERED {
		// Envoy waits for the headers' answer before it sends the body.
		resp, err := x.s.Recv()
		if err != nil {
			return answer{}, err
		}
		if a, done := immediateOf(resp); done {
			return a, nil
		}
		if resp.GetRequestHeaders() == nil {
			return answer{}, fmt.Errorf("buffered: want the headers' answer first, got %T", resp.Response)
		}
		if err := x.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return answer{}, err
		}
		resp, err = x.s.Recv()
		if err != nil {
			return answer{}, err
		}
		if a, done := immediateOf(resp); done {
			return a, nil
		}
		if resp.GetRequestBody() == nil {
			return answer{}, fmt.Errorf("buffered: want the body's answer, got %T", resp.Response)
		}
		a := destination(resp.GetRequestBody().GetResponse(), resp)
		if resp.GetRequestBody().GetResponse().GetBodyMutation() != nil {
			return a, errors.New("buffered: the body was mutated")
		}
		return a, nil
	}
	chunk := r.chunk
	if chunk <= 0 {
		chunk = 1000
	}
	// Full duplex: the body streams without waiting for any answer.
	for len(body) > 0 || r.body == "" {
		n := min(chunk, len(body))
		last := n == len(body)
		m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[:n], EndOfStream: last && !r.trailers}}}
		if err := x.s.Send(m); err != nil {
			return answer{}, err
		}
		body = body[n:]
		if last {
			break
		}
	}
	if r.trailers {
		if err := x.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: hdrs("x-t", "1")}}}); err != nil {
			return answer{}, err
		}
	}
	resp, err := x.s.Recv()
	if err != nil {
		return answer{}, err
	}
	if a, done := immediateOf(resp); done {
		return a, nil
	}
	if resp.GetRequestHeaders() == nil {
		return answer{}, fmt.Errorf("full duplex: want the headers' answer first, got %T", resp.Response)
	}
	a := destination(resp.GetRequestHeaders().GetResponse(), resp)
	var got []byte
	for {
		resp, err := x.s.Recv()
		if err != nil {
			return a, err
		}
		sb := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			return a, fmt.Errorf("full duplex: want a streamed body, got %v", resp)
		}
		if len(sb.Body) > 32000 {
			return a, fmt.Errorf("a body chunk of %d bytes", len(sb.Body))
		}
		got = append(got, sb.Body...)
		if sb.EndOfStream || (r.trailers && len(got) == len(r.body)) {
			break
		}
	}
	a.body = string(got)
	if r.trailers {
		resp, err := x.s.Recv()
		if err != nil || resp.GetRequestTrailers() == nil {
			return a, fmt.Errorf("want the trailers' answer: %v %v", resp, err)
		}
	}
	return a, nil
}

func immediateOf(resp *extprocv3.ProcessingResponse) (answer, bool) {
	ir := resp.GetImmediateResponse()
	if ir == nil {
		return answer{}, false
	}
	a := answer{status: int(ir.GetStatus().GetCode()), errBody: string(ir.GetBody())}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			a.retryAfter = string(h.GetHeader().GetRawValue())
		}
	}
	return a, true
}

func destination(c *extprocv3.CommonResponse, resp *extprocv3.ProcessingResponse) answer {
	var a answer
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case epp.DestinationHeader:
			a.header = string(h.GetHeader().GetRawValue())
		case epp.PrefillerHeader:
			a.prefiller = string(h.GetHeader().GetRawValue())
		}
	}
	a.meta = resp.GetDynamicMetadata().GetFields()[epp.LBNamespace].GetStructValue().GetFields()[epp.DestinationKey].GetStringValue()
	return a
}

// respond plays the response: headers naming the endpoint that served
// (none if ""), then the body in chunks, each echoed back in full duplex.
func (x *exchange) respond(served string, status int, chunks ...string) error {
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":status", fmt.Sprint(status)), EndOfStream: len(chunks) == 0}}}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.LBNamespace: {Fields: map[string]*structpb.Value{
			epp.ServedKey: structpb.NewStringValue(served)}}}}
	}
	if err := x.s.Send(m); err != nil {
		return err
	}
	if resp, err := x.s.Recv(); err != nil || resp.GetResponseHeaders() == nil {
		return fmt.Errorf("want the response headers' answer: %v %v", resp, err)
	}
	for i, c := range chunks {
		last := i == len(chunks)-1
		if err := x.s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(c), EndOfStream: last}}}); err != nil {
			return err
		}
		resp, err := x.s.Recv()
		if err != nil || resp.GetResponseBody() == nil {
			return fmt.Errorf("want the response body's answer: %v %v", resp, err)
		}
		if x.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			sb := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil || string(sb.Body) != c || sb.EndOfStream != last {
				return fmt.Errorf("response chunk %d echoed as %v", i, sb)
			}
		}
	}
	return nil
}

// close ends the stream as Envoy does after a response: half-close, then
// the picker's end.
func (x *exchange) close() error {
	if err := x.s.CloseSend(); err != nil {
		return err
	}
	if _, err := x.s.Recv(); err != io.EOF {
		return fmt.Errorf("after close: %v, want EOF", err)
	}
	x.cancel()
	return nil
}

// do runs a whole request and its response, served where picked.
func (e *envoy) do(r req, chunks ...string) (answer, error) {
	x := e.open()
	a, err := x.request(r)
	if err != nil || a.status != 0 {
		x.cancel()
		return a, err
	}
	primary, _, _ := strings.Cut(a.header, ",")
	if err := x.respond(primary, 200, chunks...); err != nil {
		return a, err
	}
	return a, x.close()
}

// headersOnly is the request headers of a request without a body.
func headersOnly() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "GET", ":path", "/v1/models"), EndOfStream: true}}}
}
