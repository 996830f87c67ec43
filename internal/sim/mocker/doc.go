// Package mocker simulates vLLM engine ranks for tests, demos and router
// benchmarks: a KV block pool with prefix caching and LRU eviction (Pool),
// scheduled as vLLM V1 schedules — continuous batching with chunked
// prefill, steps priced by a calibrated Timing (Scheduler, a pure core
// driven with an explicit now) — on an injectable Clock (RealClock, or a
// VirtualClock that moves only when advanced), whose cache changes are
// published on the real wire through a Publisher (Engine), optionally
// registered in the catalog with a lease. An Engine serves vLLM's
// OpenAI routes (completions, chat completions, tokenize, models, with a
// deterministic prefix-stable tokenizer), the prefill/decode handoff of
// vLLM's NIXL connector (kv_transfer_params) and, on the decode side, the
// routing sidecar's prefill first (x-prefiller-host-port, sidecar.go),
// POST /generate, metrics and
// fault injection over HTTP; Fleet runs engines in one store.
//
// Publisher is the Go KV-event publisher: PUB and ROUTER sockets with the
// semantics of vLLM's ZmqEventPublisher, and fault knobs (dropped live
// and replayed batches, restarts, stalls). Besides the Engine, the stream's,
// the daemon's, the demo's and deploy's tests publish through it directly;
// internal/testsupport/pypub is its counterpart on real libzmq.
package mocker
