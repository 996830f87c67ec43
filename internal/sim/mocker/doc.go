// Package mocker simulates vLLM engine ranks for tests and demos: a KV
// block pool with prefix caching and LRU eviction (Pool) whose events are
// published on the real wire through a Publisher (Engine), optionally
// registered in the catalog with a lease.
//
// Publisher is the Go KV-event publisher: PUB and ROUTER sockets with the
// semantics of vLLM's ZmqEventPublisher, and fault knobs (dropped live
// and replayed batches, restarts, stalls). Besides the Engine, the stream's,
// the daemon's, the demo's and deploy's tests publish through it directly;
// internal/testsupport/pypub is its counterpart on real libzmq.
package mocker
