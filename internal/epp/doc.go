// Package epp is prefixd's endpoint picker for the Gateway API Inference
// Extension (GIE): an Envoy ext_proc server
// (envoy.service.ext_proc.v3.ExternalProcessor) that a gateway consults
// for every request of an InferencePool, answering with the engine to
// send it to, as GIE's Endpoint Picker Protocol (GIE
// docs/proposals/004-endpoint-picker-protocol) defines. It shares the
// daemon's coordinator Service, and so its index and catalog, in
// process.
//
//   - Server: one ext_proc stream per HTTP request. It reads the request
//     headers and the body (FULL_DUPLEX_STREAMED or BUFFERED, within a
//     per-request cap, a budget over every stream and a time bound),
//     tokenizes the prompt on an engine as prefixd proxy does (package
//     tokenize), books the request — a reservation with fallbacks, or a
//     decode-first plan — and answers with the header
//     x-gateway-destination-endpoint and the same value in dynamic
//     metadata envoy.lb. It follows the response: prefill complete at
//     its first byte, the booking moved where the gateway says it was
//     served, freed at its end or when the stream breaks.
//   - Endpoints: the engines' addresses (ip:port) from their catalog
//     records, names resolved in the background; a record that cannot
//     be given as ip:port is reported once and never picked.
//   - Serve: the gRPC server on one port, ext_proc and gRPC health
//     (liveness, readiness, and the ext_proc service, which follows
//     readiness), plaintext or TLS (files or a self-signed certificate
//     made at start), stopped gracefully within a drain bound.
//
// docs/epp.md describes the message sequences, failures and metrics.
package epp
