// Package cursor is the per-source sequence state machine of the KV-event
// stream: for one engine publisher (one worker rank's socket) it decides,
// for every live batch, replay message and replay outcome, what must be
// applied, reset or requested. It is to the stream what a Raft RawNode is
// to a transport: the driver (events/stream's Subscriber) feeds it what
// arrived and the time, and carries out the Actions it returns, in order.
//
// It does no I/O and reads no clock, so every gap, restart, lost history
// and replay outcome is a deterministic scenario: testdata/*.txt, run by
// TestCursorScenarios (go test ./events/cursor -run TestCursorScenarios
// -rewrite regenerates the expected output). Payloads are opaque bytes
// here: the cursor never decodes them, it only digests them (xxh3) to tell
// a duplicate from a new engine incarnation.
//
// It imports the standard library, xxh3 and internal/retry (the replay
// backoff, retry.Interval, a pure function) only; TestNoIOImports fails if
// it reaches ZMQ, etcd, net, net/http or Prometheus.
package cursor
