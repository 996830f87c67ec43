// Package events holds the Go publisher of the KV-event stream: PUB and
// ROUTER sockets with vLLM's semantics, for the mock engines, the demo and
// tests. The stream's other parts are its subpackages: the wire codec
// (events/wire), the sequence cursor (events/cursor), the subscriber
// (events/stream) and the ZMTP guard (events/zmtp).
package events
