package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// exchange is one request's life through the gateway. Its methods run on
// the handler's goroutine, except receive (the stream's receiver) and the
// body senders, which the handler waits for.
type exchange struct {
	g      *Gateway
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	stream extprocv3.ExternalProcessor_ProcessClient
	recv   chan recvResult

	hasBody    bool
	origHeader http.Header // the client's headers, hop-by-hop ones left out
	header     http.Header // as the picker mutated them
	path       string
	orig       []byte      // the client's body, as read (for FailOpen)
	bodyRead   atomic.Bool // orig holds the whole body: the client's is read to its end
	body       []byte      // the body the picker passed back

	// sendDone reports the request body's sender (FULL_DUPLEX_STREAMED);
	// nil when none runs.
	sendDone chan error

	metaDest string // envoy.lb / x-gateway-destination-endpoint
	metaSet  bool

	servedBy   string // the endpoint that answered
	responding bool   // the response phase has begun

	resp    *http.Response
	written bool // the client's response has begun
	abort   bool // reset the client's connection at the end
}

type recvResult struct {
	msg *extprocv3.ProcessingResponse
	err error
}

// errTooLarge is a request body beyond Config.MaxRequestBody.
var errTooLarge = errors.New("request body too large")

// ServeHTTP runs one request through the picker and an endpoint.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.requests.Add(1)
	ctx, cancel := context.WithCancel(r.Context())
	// Read the body while the response is written, as Envoy does: an
	// answer may come before the body's end.
	_ = http.NewResponseController(w).EnableFullDuplex()
	h := forwardHeader(r.Header)
	x := &exchange{g: g, w: w, r: r, ctx: ctx, cancel: cancel, recv: make(chan recvResult),
		hasBody: r.ContentLength != 0, origHeader: h, header: h.Clone(), path: r.URL.RequestURI()}
	x.run()
	x.finish()
	if x.abort {
		panic(http.ErrAbortHandler) // as Envoy resets the downstream stream
	}
}

func (x *exchange) run() {
	stream, err := x.g.epp.Process(x.ctx)
	if err != nil {
		x.eppDown(err)
		return
	}
	x.stream = stream
	x.wg.Go(x.receive)
	var decided bool
	if x.g.cfg.RequestBodyMode == Buffered {
		decided = x.requestBuffered()
	} else {
		decided = x.requestStreamed()
	}
	if !decided {
		return
	}
	eps, ok := x.destination()
	if !ok {
		return
	}
	if !x.forward(eps, x.header, x.body) {
		return
	}
	x.responding = true
	if x.g.cfg.ResponseBodyMode == Buffered {
		x.responseBuffered()
	} else {
		x.responseStreamed()
	}
}

// finish ends the exchange: the stream is cancelled (a no-op after a
// clean end) and every goroutine waited for. A client's body the
// exchange left unread (an early answer) is read and discarded, within
// Config.MaxRequestBody and closeWait, so the client reads the answer
// rather than a reset; its connection is closed after the answer (see
// writeHeader).
func (x *exchange) finish() {
	x.cancel()
	unread := x.hasBody && !x.bodyRead.Load()
	if unread {
		_ = http.NewResponseController(x.w).SetReadDeadline(time.Now().Add(closeWait))
	}
	x.wg.Wait()
	if unread && !x.bodyRead.Load() {
		_, _ = io.CopyN(io.Discard, x.r.Body, x.g.cfg.MaxRequestBody)
	}
	if x.resp != nil {
		x.resp.Body.Close()
	}
}

// receive passes the picker's messages to the handler until the stream
// ends.
func (x *exchange) receive() {
	for {
		msg, err := x.stream.Recv()
		select {
		case x.recv <- recvResult{msg, err}:
		case <-x.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// next is the picker's next message; ok false when the client went away.
func (x *exchange) next() (recvResult, bool) {
	select {
	case res := <-x.recv:
		return res, true
	case <-x.ctx.Done():
		return recvResult{}, false
	}
}

// send sends a message on the stream.
func (x *exchange) send(m *extprocv3.ProcessingRequest) error {
	return x.stream.Send(m)
}

// subsetMetadata is the request's subset hint, nil without one.
func (x *exchange) subsetMetadata() *corev3.Metadata {
	if x.g.cfg.Subset == nil {
		return nil
	}
	eps, ok := x.g.cfg.Subset(x.r)
	if !ok {
		return nil
	}
	list := make([]*structpb.Value, len(eps))
	for i, ep := range eps {
		list[i] = structpb.NewStringValue(ep)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{
		SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: list}),
	}}}}
}

func bodyMode(m BodyMode) filterv3.ProcessingMode_BodySendMode {
	if m == Buffered {
		return filterv3.ProcessingMode_BUFFERED
	}
	return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// sendRequestHeaders sends the stream's first message.
func (x *exchange) sendRequestHeaders() error {
	r := x.r
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	hs := []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte(r.Host)},
		{Key: ":path", RawValue: []byte(x.path)},
		{Key: ":method", RawValue: []byte(r.Method)},
		{Key: ":scheme", RawValue: []byte(scheme)},
	}
	hs = appendHeaders(hs, x.origHeader)
	if r.ContentLength > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.FormatInt(r.ContentLength, 10))})
	}
	return x.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: !x.hasBody}},
		MetadataContext: x.subsetMetadata(),
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: bodyMode(x.g.cfg.RequestBodyMode),
			ResponseBodyMode: bodyMode(x.g.cfg.ResponseBodyMode)},
	})
}

func (x *exchange) requestBodyMessage(chunk []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}},
		MetadataContext: x.subsetMetadata(),
	}
}

// requestStreamed runs the request phase in FULL_DUPLEX_STREAMED: the body
// goes to the picker as it arrives while its answers are read. It returns
// true once the picker has answered the headers and passed the whole body
// back; otherwise the client has been answered (or is gone).
func (x *exchange) requestStreamed() bool {
	if err := x.sendRequestHeaders(); err != nil {
		x.eppDown(err)
		return false
	}
	if x.hasBody {
		x.sendDone = make(chan error, 1)
		x.wg.Go(func() { x.sendDone <- x.sendRequestBody() })
	}
	headersDone, bodyDone := false, !x.hasBody
	for !headersDone || !bodyDone {
		var res recvResult
		select {
		case res = <-x.recv:
		case err := <-x.sendDone:
			x.sendDone = nil
			if !x.senderEnded(err) {
				return false
			}
			continue
		case <-x.ctx.Done():
			return false
		}
		if res.err != nil {
			x.eppDown(res.err)
			return false
		}
		x.g.eppAnswered()
		if !x.takeMetadata(res.msg) {
			return false
		}
		switch v := res.msg.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			x.immediate(v.ImmediateResponse)
			return false
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if headersDone {
				return x.protocolFail("a second request headers response")
			}
			headersDone = true
			if err := applyMutation(x.header, v.RequestHeaders.GetResponse().GetHeaderMutation(), &x.path, nil); err != nil {
				return x.protocolFail("request headers response: %v", err)
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			if !headersDone || bodyDone {
				return x.protocolFail("a request body response before the headers response, or after the body's end_of_stream")
			}
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return x.protocolFail("a request body response without streamed_response in FULL_DUPLEX_STREAMED")
			}
			if int64(len(x.body)+len(sr.Body)) > x.g.cfg.MaxRequestBody {
				return x.protocolFail("the request body passed back is longer than %d bytes", x.g.cfg.MaxRequestBody)
			}
			x.body = append(x.body, sr.Body...)
			bodyDone = sr.EndOfStream
		default:
			return x.protocolFail("%T during the request", res.msg.Response)
		}
	}
	// The picker may end the body before the sender has read all of it;
	// the stream takes one sender at a time.
	if x.sendDone != nil {
		select {
		case err := <-x.sendDone:
			x.sendDone = nil
			return x.senderEnded(err)
		case <-x.ctx.Done():
			return false
		}
	}
	return true
}

// senderEnded handles the request body sender's end: false when the
// client has been answered (a body too large) or is gone.
func (x *exchange) senderEnded(err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, errTooLarge):
		x.local(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", x.g.cfg.MaxRequestBody))
		return false
	case errors.Is(err, errStreamSend):
		return true // the receiver reports the stream's failure
	}
	x.cancel() // the client's body failed: it is gone
	return false
}

// errStreamSend is a body the sender could not pass to the picker.
var errStreamSend = errors.New("stream send failed")

// sendRequestBody reads the client's body and sends it to the picker as
// it arrives. The last chunk has end_of_stream: the one that completes a
// declared Content-Length, or an empty one after the end. With FailOpen
// it keeps reading after the stream failed, so the request can go on
// without the picker.
func (x *exchange) sendRequestBody() error {
	buf := make([]byte, bodyChunk)
	sending := true
	var sendErr error
	cl := x.r.ContentLength
	for {
		n, err := x.r.Body.Read(buf)
		if n > 0 {
			if int64(len(x.orig)+n) > x.g.cfg.MaxRequestBody {
				return errTooLarge
			}
			x.orig = append(x.orig, buf[:n]...)
			eos := err == io.EOF || (cl > 0 && int64(len(x.orig)) == cl)
			if sending {
				// The chunk is a slice of orig, which only grows: the
				// bytes stay as sent.
				if serr := x.send(x.requestBodyMessage(x.orig[len(x.orig)-n:], eos)); serr != nil {
					sending, sendErr = false, errStreamSend
					if x.g.cfg.FailureMode == FailClose {
						return sendErr
					}
				}
			}
			if eos {
				x.bodyRead.Store(true)
				return sendErr
			}
		}
		if err == io.EOF {
			x.bodyRead.Store(true)
			if sending {
				if serr := x.send(x.requestBodyMessage(nil, true)); serr != nil {
					sendErr = errStreamSend
				}
			}
			return sendErr
		}
		if err != nil {
			return fmt.Errorf("reading the request body: %w", err)
		}
	}
}

// readBody reads the rest of the client's body into orig, within
// Config.MaxRequestBody (413 beyond it); false when the client has been
// answered or is gone.
func (x *exchange) readBody() bool {
	if !x.hasBody || x.bodyRead.Load() {
		return true
	}
	b, err := io.ReadAll(io.LimitReader(x.r.Body, x.g.cfg.MaxRequestBody+1-int64(len(x.orig))))
	x.orig = append(x.orig, b...)
	switch {
	case err != nil:
		x.cancel()
		return false
	case int64(len(x.orig)) > x.g.cfg.MaxRequestBody:
		x.local(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", x.g.cfg.MaxRequestBody))
		return false
	}
	x.bodyRead.Store(true)
	return true
}

// requestBuffered runs the request phase in BUFFERED: the headers and
// their answer, then the whole body and its answer.
func (x *exchange) requestBuffered() bool {
	if err := x.sendRequestHeaders(); err != nil {
		x.eppDown(err)
		return false
	}
	res, ok := x.answer()
	if !ok {
		return false
	}
	hr, isHeaders := res.Response.(*extprocv3.ProcessingResponse_RequestHeaders)
	if !isHeaders {
		return x.protocolFail("%T in answer to the request headers", res.Response)
	}
	if err := applyMutation(x.header, hr.RequestHeaders.GetResponse().GetHeaderMutation(), &x.path, nil); err != nil {
		return x.protocolFail("request headers response: %v", err)
	}
	if !x.hasBody {
		return true
	}
	if !x.readBody() {
		return false
	}
	if err := x.send(x.requestBodyMessage(x.orig, true)); err != nil {
		x.eppDown(err)
		return false
	}
	if res, ok = x.answer(); !ok {
		return false
	}
	br, isBody := res.Response.(*extprocv3.ProcessingResponse_RequestBody)
	if !isBody {
		return x.protocolFail("%T in answer to the request body", res.Response)
	}
	common := br.RequestBody.GetResponse()
	if err := applyMutation(x.header, common.GetHeaderMutation(), &x.path, nil); err != nil {
		return x.protocolFail("request body response: %v", err)
	}
	body, err := bufferedBody(x.orig, common.GetBodyMutation())
	if err != nil {
		return x.protocolFail("request body response: %v", err)
	}
	x.body = body
	return true
}

// answer is the picker's answer to a message in BUFFERED mode: ok false
// when the client has been answered (an ImmediateResponse, a failure) or
// is gone.
func (x *exchange) answer() (*extprocv3.ProcessingResponse, bool) {
	res, ok := x.next()
	if !ok {
		return nil, false
	}
	if res.err != nil {
		if x.responding {
			x.responseStreamFailed(res.err)
		} else {
			x.eppDown(res.err)
		}
		return nil, false
	}
	x.g.eppAnswered()
	if !x.takeMetadata(res.msg) {
		return nil, false
	}
	if v, ok := res.msg.Response.(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		x.immediate(v.ImmediateResponse)
		return nil, false
	}
	return res.msg, true
}

// bufferedBody applies a BUFFERED body response's mutation to body.
func bufferedBody(body []byte, m *extprocv3.BodyMutation) ([]byte, error) {
	switch v := m.GetMutation().(type) {
	case nil:
		return body, nil
	case *extprocv3.BodyMutation_Body:
		return v.Body, nil
	case *extprocv3.BodyMutation_ClearBody:
		if v.ClearBody {
			return nil, nil
		}
		return body, nil
	}
	return nil, errors.New("streamed_response in BUFFERED mode")
}

// takeMetadata reads the destination from a message's dynamic metadata;
// false (after a 500) when it is not a string.
func (x *exchange) takeMetadata(m *extprocv3.ProcessingResponse) bool {
	ns, ok := m.GetDynamicMetadata().GetFields()[DestinationNamespace]
	if !ok {
		return true
	}
	st := ns.GetStructValue()
	if st == nil {
		return x.protocolFail("dynamic metadata %s is not a struct", DestinationNamespace)
	}
	v, ok := st.GetFields()[DestinationKey]
	if !ok {
		return true
	}
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return x.protocolFail("dynamic metadata %s/%s is not a string", DestinationNamespace, DestinationKey)
	}
	x.metaDest, x.metaSet = s.StringValue, true
	return true
}

// destination reads the endpoints from the header and the metadata,
// which must agree.
func (x *exchange) destination() ([]string, bool) {
	hv := x.header.Values(DestinationHeader)
	switch {
	case len(hv) == 0 && !x.metaSet:
		x.g.protocolError(errors.New("the picker named no destination"))
		x.local(http.StatusServiceUnavailable, "no healthy upstream: the endpoint picker named no destination")
		return nil, false
	case len(hv) > 1:
		return nil, x.protocolFail("%d %s headers", len(hv), DestinationHeader)
	case len(hv) == 0 || !x.metaSet || hv[0] != x.metaDest:
		h, m := "(none)", "(none)"
		if len(hv) == 1 {
			h = strconv.Quote(clip(hv[0]))
		}
		if x.metaSet {
			m = strconv.Quote(clip(x.metaDest))
		}
		return nil, x.protocolFail("destination header %s and metadata %s differ", h, m)
	}
	eps, err := parseEndpoints(hv[0])
	if err != nil {
		return nil, x.protocolFail("destination: %v", err)
	}
	return eps, true
}

// forward sends the request to the endpoints in order, going on to the
// next only when the connection fails. It sets x.resp and returns true
// once one answered; otherwise the client has been answered or is gone.
func (x *exchange) forward(eps []string, header http.Header, body []byte) bool {
	var last error
	for i, ep := range eps {
		var rd io.Reader
		if x.hasBody || len(body) > 0 {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(x.ctx, x.r.Method, "http://"+ep+x.path, rd)
		if err != nil {
			last = err
			break
		}
		req.Header = header.Clone()
		req.Host = x.r.Host
		resp, err := x.g.transport.RoundTrip(req)
		if err == nil {
			if i > 0 {
				x.g.fallbacks.Add(1)
			}
			x.resp, x.servedBy = resp, ep
			return true
		}
		last = err
		var ce *connectError
		if x.ctx.Err() != nil || !errors.As(err, &ce) {
			break
		}
	}
	if x.ctx.Err() != nil {
		return false
	}
	x.local(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers: "+last.Error())
	return false
}

// servedMetadata is the response phase's metadata_context.
func (x *exchange) servedMetadata() *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DestinationNamespace: {Fields: map[string]*structpb.Value{
		ServedKey: structpb.NewStringValue(x.servedBy),
	}}}}
}

// responseHasBody says whether the upstream's response carries a body.
func (x *exchange) responseHasBody() bool {
	s := x.resp.StatusCode
	return x.resp.ContentLength != 0 && x.r.Method != http.MethodHead && s != http.StatusNoContent && s != http.StatusNotModified
}

func (x *exchange) sendResponseHeaders(eos bool) error {
	hs := []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(x.resp.StatusCode))}}
	hs = appendHeaders(hs, forwardHeader(x.resp.Header))
	if x.resp.ContentLength > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.FormatInt(x.resp.ContentLength, 10))})
	}
	return x.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos}},
		MetadataContext: x.servedMetadata(),
	})
}

func (x *exchange) responseBodyMessage(chunk []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}},
		MetadataContext: x.servedMetadata(),
	}
}

// responseStreamed runs the response phase in FULL_DUPLEX_STREAMED: the
// upstream's body goes to the picker as it arrives, and what the picker
// passes back goes to the client, flushed chunk by chunk.
func (x *exchange) responseStreamed() {
	hasBody := x.responseHasBody()
	if err := x.sendResponseHeaders(!hasBody); err != nil {
		x.responseStreamFailed(err)
		return
	}
	var upstreamDone chan error
	if hasBody {
		upstreamDone = make(chan error, 1)
		x.wg.Go(func() { upstreamDone <- x.sendResponseBody() })
	}
	status := x.resp.StatusCode
	header := forwardHeader(x.resp.Header)
	flusher, _ := x.w.(http.Flusher)
	headersDone, bodyDone := false, !hasBody
	for !headersDone || !bodyDone {
		var res recvResult
		select {
		case res = <-x.recv:
		case err := <-upstreamDone:
			upstreamDone = nil
			if err != nil { // the upstream broke off: reset
				x.abort = true
				return
			}
			continue
		case <-x.ctx.Done():
			return
		}
		if res.err != nil {
			x.responseStreamFailed(res.err)
			return
		}
		switch v := res.msg.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			x.immediate(v.ImmediateResponse)
			return
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			if headersDone {
				x.protocolFail("a second response headers response")
				return
			}
			headersDone = true
			if err := applyMutation(header, v.ResponseHeaders.GetResponse().GetHeaderMutation(), nil, &status); err != nil {
				x.protocolFail("response headers response: %v", err)
				return
			}
			x.writeHeader(header, status)
			if flusher != nil {
				flusher.Flush()
			}
		case *extprocv3.ProcessingResponse_ResponseBody:
			sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if !headersDone || bodyDone || sr == nil {
				x.protocolFail("a response body response out of order or without streamed_response")
				return
			}
			if len(sr.Body) > 0 {
				if _, err := x.w.Write(sr.Body); err != nil {
					x.cancel() // the client is gone
					return
				}
				if flusher != nil {
					flusher.Flush()
				}
			}
			bodyDone = sr.EndOfStream
		default:
			x.protocolFail("%T during the response", res.msg.Response)
			return
		}
	}
	if upstreamDone != nil {
		select {
		case err := <-upstreamDone:
			if err != nil {
				x.abort = true
				return
			}
		case <-x.ctx.Done():
			return
		}
	}
	x.closeStream()
}

// sendResponseBody reads the upstream's body and sends it to the picker
// as it arrives, end_of_stream on the last chunk.
func (x *exchange) sendResponseBody() error {
	buf := make([]byte, bodyChunk)
	cl := x.resp.ContentLength
	var total int64
	for {
		n, err := x.resp.Body.Read(buf)
		if n > 0 {
			total += int64(n)
			eos := err == io.EOF || (cl > 0 && total == cl)
			if serr := x.send(x.responseBodyMessage(bytes.Clone(buf[:n]), eos)); serr != nil {
				return nil // the receiver reports the stream's failure
			}
			if eos {
				return nil
			}
		}
		if err == io.EOF {
			if serr := x.send(x.responseBodyMessage(nil, true)); serr != nil {
				return nil
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the upstream's body: %w", err)
		}
	}
}

// responseBuffered runs the response phase in BUFFERED: the headers and
// their answer, then the whole body and its answer, then the client's
// response with its Content-Length.
func (x *exchange) responseBuffered() {
	hasBody := x.responseHasBody()
	if err := x.sendResponseHeaders(!hasBody); err != nil {
		x.responseStreamFailed(err)
		return
	}
	status := x.resp.StatusCode
	header := forwardHeader(x.resp.Header)
	res, ok := x.answer()
	if !ok {
		return
	}
	hr, isHeaders := res.Response.(*extprocv3.ProcessingResponse_ResponseHeaders)
	if !isHeaders {
		x.protocolFail("%T in answer to the response headers", res.Response)
		return
	}
	if err := applyMutation(header, hr.ResponseHeaders.GetResponse().GetHeaderMutation(), nil, &status); err != nil {
		x.protocolFail("response headers response: %v", err)
		return
	}
	var body []byte
	if hasBody {
		b, err := io.ReadAll(io.LimitReader(x.resp.Body, x.g.cfg.MaxResponseBody+1))
		switch {
		case err != nil:
			if x.ctx.Err() == nil {
				x.local(http.StatusBadGateway, "upstream reset while sending its body")
			}
			return
		case int64(len(b)) > x.g.cfg.MaxResponseBody:
			x.local(http.StatusInternalServerError, fmt.Sprintf("response body larger than the buffer limit, %d bytes", x.g.cfg.MaxResponseBody))
			return
		}
		if err := x.send(x.responseBodyMessage(b, true)); err != nil {
			x.responseStreamFailed(err)
			return
		}
		if res, ok = x.answer(); !ok {
			return
		}
		br, isBody := res.Response.(*extprocv3.ProcessingResponse_ResponseBody)
		if !isBody {
			x.protocolFail("%T in answer to the response body", res.Response)
			return
		}
		common := br.ResponseBody.GetResponse()
		if err := applyMutation(header, common.GetHeaderMutation(), nil, &status); err != nil {
			x.protocolFail("response body response: %v", err)
			return
		}
		if body, err = bufferedBody(b, common.GetBodyMutation()); err != nil {
			x.protocolFail("response body response: %v", err)
			return
		}
	}
	header.Set("Content-Length", strconv.Itoa(len(body)))
	x.writeHeader(header, status)
	if _, err := x.w.Write(body); err != nil {
		x.cancel()
		return
	}
	x.closeStream()
}

// closeStream half-closes a finished stream and waits, at most closeWait,
// for the picker to end it.
func (x *exchange) closeStream() {
	if err := x.stream.CloseSend(); err != nil {
		return
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	for {
		select {
		case res := <-x.recv:
			if res.err != nil {
				return
			}
		case <-t.C:
			return
		case <-x.ctx.Done():
			return
		}
	}
}

// writeHeader starts the client's response. An answer given before the
// client's body ended closes the connection after it, as Envoy does: the
// body's rest is discarded, not read as a next request.
func (x *exchange) writeHeader(h http.Header, status int) {
	dst := x.w.Header()
	for k, v := range h {
		dst[k] = v
	}
	if x.hasBody && !x.bodyRead.Load() {
		dst.Set("Connection", "close")
	}
	x.written = true
	x.w.WriteHeader(status)
}

// local answers the client with a gateway's own reply, as Envoy's local
// replies: text/plain.
func (x *exchange) local(status int, msg string) {
	if x.written {
		x.abort = true
		return
	}
	h := http.Header{"Content-Type": {"text/plain; charset=utf-8"}}
	h.Set("Content-Length", strconv.Itoa(len(msg)))
	x.writeHeader(h, status)
	_, _ = io.WriteString(x.w, msg)
}

// protocolFail counts a picker answer the gateway cannot follow and
// answers 500 (or resets a response already begun). It returns false.
func (x *exchange) protocolFail(format string, args ...any) bool {
	err := fmt.Errorf(format, args...)
	x.g.protocolError(err)
	x.local(http.StatusInternalServerError, "endpoint picker protocol error: "+err.Error())
	return false
}

// immediate relays an ImmediateResponse: its status, headers (text/plain
// unless they set content-type) and body.
func (x *exchange) immediate(ir *extprocv3.ImmediateResponse) {
	status := int(ir.GetStatus().GetCode())
	if status < 200 || status > 599 {
		x.protocolFail("immediate response status %d", status)
		return
	}
	h := http.Header{"Content-Type": {"text/plain"}}
	if err := applyMutation(h, ir.GetHeaders(), nil, nil); err != nil {
		x.protocolFail("immediate response headers: %v", err)
		return
	}
	if x.written {
		x.abort = true
		return
	}
	x.g.countImmediate(status)
	h.Set("Content-Length", strconv.Itoa(len(ir.Body)))
	x.writeHeader(h, status)
	_, _ = x.w.Write(ir.Body)
}

// eppDown handles a stream that could not be opened or failed before the
// picker decided: FailClose answers 503, FailOpen forwards the original
// request to the fail-open endpoints and relays their answer.
func (x *exchange) eppDown(err error) {
	if x.ctx.Err() != nil {
		return // the client went away
	}
	x.g.eppFailed(err)
	if x.g.cfg.FailureMode == FailClose {
		x.local(http.StatusServiceUnavailable, "endpoint picker unavailable")
		return
	}
	if x.sendDone != nil { // the sender reads the rest of the body
		select {
		case serr := <-x.sendDone:
			x.sendDone = nil
			if serr != nil && !errors.Is(serr, errStreamSend) {
				x.senderEnded(serr)
				return
			}
		case <-x.ctx.Done():
			return
		}
	}
	if !x.readBody() {
		return
	}
	x.g.failOpened.Add(1)
	x.path = x.r.URL.RequestURI()
	if !x.forward(x.g.failOpen, x.origHeader, x.orig) {
		return
	}
	header := forwardHeader(x.resp.Header)
	x.writeHeader(header, x.resp.StatusCode)
	flusher, _ := x.w.(http.Flusher)
	buf := make([]byte, bodyChunk)
	for {
		n, rerr := x.resp.Body.Read(buf)
		if n > 0 {
			if _, werr := x.w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			return
		}
		if rerr != nil {
			x.abort = true
			return
		}
	}
}

// responseStreamFailed handles a stream that failed during the response:
// a 502 before the client's headers, a reset after.
func (x *exchange) responseStreamFailed(err error) {
	if x.ctx.Err() != nil {
		return
	}
	x.g.eppFailed(err)
	x.local(http.StatusBadGateway, "endpoint picker stream failed during the response")
}

// hopByHop are the headers a proxy does not forward (RFC 9110 7.6.1),
// with Content-Length, which the gateway sets for the body it sends.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length"}

// forwardHeader is h without the hop-by-hop headers.
func forwardHeader(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for _, f := range out.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	return out
}

// appendHeaders appends h to hs as Envoy sends headers: lower-case names,
// one entry per value, the value in raw_value; sorted by name.
func appendHeaders(hs []*corev3.HeaderValue, h http.Header) []*corev3.HeaderValue {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range h[k] {
			hs = append(hs, &corev3.HeaderValue{Key: lk, RawValue: []byte(v)})
		}
	}
	return hs
}

// applyMutation applies a header mutation to h. path, when not nil, takes
// a :path set (the request); status, when not nil, a :status set (the
// response). Other pseudo-headers, host and x-envoy-* are left alone, as
// Envoy leaves them. A set replaces the header unless append is true
// (append unset is false in ext_proc) or append_action says otherwise.
func applyMutation(h http.Header, m *extprocv3.HeaderMutation, path *string, status *int) error {
	if m == nil {
		return nil
	}
	if n := len(m.SetHeaders) + len(m.RemoveHeaders); n > maxMutations {
		return fmt.Errorf("%d header mutations, more than %d", n, maxMutations)
	}
	for _, k := range m.RemoveHeaders {
		k = strings.ToLower(k)
		if strings.HasPrefix(k, ":") || k == "host" || strings.HasPrefix(k, "x-envoy-") {
			continue
		}
		h.Del(k)
	}
	for _, o := range m.SetHeaders {
		hv := o.GetHeader()
		k := strings.ToLower(hv.GetKey())
		v := string(hv.GetRawValue())
		if len(hv.GetRawValue()) == 0 {
			v = hv.GetValue()
		}
		if !validName(k) {
			return fmt.Errorf("header name %q is not a token", clip(k))
		}
		if len(v) > maxHeaderValue || strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("header %s: value of %d bytes, or with CR, LF or NUL", k, len(v))
		}
		switch {
		case k == ":path" && path != nil:
			if !strings.HasPrefix(v, "/") {
				return fmt.Errorf(":path %q: want an absolute path", clip(v))
			}
			*path = v
			continue
		case k == ":status" && status != nil:
			n, err := strconv.Atoi(v)
			if err != nil || n < 200 || n > 599 {
				return fmt.Errorf(":status %q: want 200 to 599", clip(v))
			}
			*status = n
			continue
		case strings.HasPrefix(k, ":") || k == "host" || strings.HasPrefix(k, "x-envoy-"):
			continue
		}
		//lint:ignore SA1019 Envoy still honours the deprecated append field when set, and so does a gateway standing in for it
		switch appendOld := o.GetAppend(); {
		case appendOld != nil:
			if appendOld.GetValue() {
				h.Add(k, v)
			} else {
				h.Set(k, v)
			}
		case o.GetAppendAction() == corev3.HeaderValueOption_ADD_IF_ABSENT:
			if len(h.Values(k)) == 0 {
				h.Set(k, v)
			}
		case o.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if len(h.Values(k)) > 0 {
				h.Set(k, v)
			}
		default:
			h.Set(k, v)
		}
	}
	return nil
}

// validName says whether k is a header name: a token, or a pseudo-header.
func validName(k string) bool {
	k = strings.TrimPrefix(k, ":")
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
