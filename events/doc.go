// Package events owns prefixd's side of the engine KV-event stream: the vLLM
// wire codec (every era of the msgpack KVEventBatch, decode and encode), and,
// as the stream issue lands, the per-stream sequence cursor, the ZMQ
// subscriber with verified replay, and the test publisher.
//
// The codec is allocation-light: a Decoder reuses the Batch it decodes into
// and reads msgpack with zero-copy readers, never reflection.
package events
