// Package gateway is a small HTTP gateway that behaves as Envoy with the
// ext_proc filter configured as the Gateway API Inference Extension (GIE)
// configures it in front of an InferencePool: for every request it opens
// an envoy.service.ext_proc.v3.ExternalProcessor Process stream to the
// endpoint picker (EPP), sends the request's headers and body, applies
// what the picker answers, forwards the request to the endpoints it names
// (x-gateway-destination-endpoint, in the header and in dynamic metadata
// envoy.lb), and streams the response through the picker, reporting the
// endpoint that served (x-gateway-destination-endpoint-served).
//
// It exists for tests and the demo: it lets prefixd's EPP run end to end
// on a laptop, in front of mock engines, without Envoy. The protocol
// follows Envoy's ext_proc documentation (processing modes, the
// FULL_DUPLEX_STREAMED body mode, ProcessingResponse, CommonResponse,
// HeaderMutation, BodyMutation, StreamedBodyResponse, ImmediateResponse,
// dynamic_metadata) and GIE's endpoint picker protocol
// (docs/proposals/004-endpoint-picker-protocol).
//
// # One request
//
// The stream's first message is the request headers: the pseudo-headers
// :method, :path, :authority and :scheme, then the client's headers
// (lower-cased, hop-by-hop ones left out), end_of_stream set when the
// request has no body, protocol_config naming the body modes, and, when
// Config.Subset gives one, metadata_context filter metadata
// envoy.lb.subset_hint / x-gateway-destination-endpoint-subset (a list of
// ip:port strings). Then, in FULL_DUPLEX_STREAMED (the default), the body
// in chunks as it arrives, end_of_stream on the last (an empty one when
// the end is only known after the last bytes), without waiting for the
// picker; the picker answers the headers (a HeadersResponse), then the
// body as StreamedBodyResponse chunks until one has end_of_stream, which
// is the body forwarded. In BUFFERED the gateway waits for the headers'
// answer, then sends the whole body in one message with end_of_stream and
// takes one BodyResponse: its body_mutation (body, clear_body, or none:
// unchanged) and, in this mode only, its header_mutation. Header
// mutations set (append false or unset: replace; true: add) and remove
// headers; :path may be set, other pseudo-headers, host and x-envoy-*
// are left alone, as Envoy leaves them. An ImmediateResponse at any point
// is relayed to the client (status, headers, body; text/plain unless it
// sets content-type) and ends the exchange.
//
// The destination is read from the header x-gateway-destination-endpoint
// and from the dynamic metadata envoy.lb / x-gateway-destination-endpoint
// of the answers: both must be present and equal (a mismatch is a 500,
// neither a 503 — Envoy's original-destination cluster finds no host —
// each a counted protocol error), a list of at most MaxEndpoints ip:port
// entries (an IP address, a port from 1 to 65535) separated by commas.
// The request, with every header the picker set (x-prefiller-host-port
// among them), goes to the first endpoint, then to the next ones in order
// only when the connection cannot be established (the dial fails:
// refused, unreachable, or not connected within Config.ConnectTimeout),
// as Envoy's retry on connect-failure does. Every attempt opens a new
// connection, so a dead endpoint is always a connect failure and never a
// reset on a stale pooled connection. An endpoint that accepted the
// connection serves whatever it answers (a 5xx too); an error after the
// connection is a 503, as are endpoints that all failed to connect.
//
// The response goes back through the picker: its headers (:status first)
// with metadata_context filter metadata envoy.lb /
// x-gateway-destination-endpoint-served = the ip:port that served, then,
// in FULL_DUPLEX_STREAMED, its body chunks as they arrive (end_of_stream
// on the last), the client receiving the picker's StreamedBodyResponse
// chunks as they come back, each flushed, so a server-sent-event stream
// streams; in BUFFERED, the whole body in one message and its
// BodyResponse. Once the last chunk is relayed the gateway half-closes
// the stream and waits (at most a second) for the picker to end it, so
// when the client has the whole response the picker has seen the end of
// the request. A client that goes away, or an upstream that breaks off
// its body, resets the stream (the picker's Recv fails with Canceled) and
// the client's connection.
//
// The picker unreachable, or its stream failing before the destination
// is known, is InferencePool's failureMode: FailClose answers 503,
// FailOpen forwards the original request to Config.FailOpenEndpoints in
// order, without the picker. A stream that fails during the response
// resets the client's response (or answers 502 before its headers).
//
// Stats counts requests, immediate responses by status, fallbacks used,
// protocol errors, picker failures and fail-open requests. The gateway
// logs state changes only: the picker becoming unreachable and reachable
// again, and protocol errors at most once per ten seconds with the number
// left out.
//
// A Gateway is an http.Handler, safe for concurrent use. Each request's
// exchange runs in its handler: the goroutines it starts (the stream's
// receiver, the body's sender) end before the handler returns.
package gateway
