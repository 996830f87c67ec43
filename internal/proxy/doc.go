// Package proxy is prefixd's OpenAI-compatible frontend (prefixd proxy):
// it takes /v1/completions and /v1/chat/completions requests, gets their
// token ids from an engine's own tokenizer (POST /tokenize), asks
// prefixd serve (through package client) where to run them, and runs
// them there: aggregated — select and reserve, forward, prefill complete
// at the first streamed byte, free at the end or when the client goes
// away — or disaggregated over vLLM's KV-connector handoff — a plan
// (decode first by default), the prefill request with
// kv_transfer_params {"do_remote_decode": true}, its answer's
// kv_transfer_params into the decode request whose stream is the
// client's, the plan released at the end, with the plan's prefill-failure
// policy applied when prefill fails and prefill-first used when
// decode-first cannot apply. Every booking it takes is given back
// whatever happens to the request (Bookings counts those it holds).
//
// It keeps a view of the fleet (GET /workers, refreshed by Run) for the
// models it serves (GET /v1/models), the engines it may tokenize on,
// random routing, routing by load when prefixd or the tokenizer is
// unavailable, and passing the engine routes a client needs (vLLM's
// /tokenize and /detokenize, or Config.PassThrough) through to an engine:
// no other.
//
// It answers as a vLLM engine would: an engine's refusal of a request
// (4xx) reaches the client as sent and is not retried; the errors it
// makes itself are OpenAI's error object with vLLM's status and type
// (errors.go); a model no engine serves is a 404. It checks that prefixd
// accepts its token, and says once when it does not (access.go): the
// requests are then routed by load.
package proxy
