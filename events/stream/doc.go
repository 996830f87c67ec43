// Package stream is prefixd's I/O side of the engine KV-event stream: one
// Subscriber per worker rank dials the engine's ZMQ PUB (and, for replay,
// its ROUTER) through the events/zmtp guard, parses and decodes frames with
// events/wire, lets an events/cursor Cursor decide what to apply, reset or
// replay, and hands batches in order to an Applier; IndexApplier applies
// them to a partition of indexer.Index. ReplaySlots bounds concurrent
// replays across subscribers, and Metrics are the stream metrics
// (Prometheus).
//
// The decisions are the cursor's, which does no I/O; what this package
// adds is the sockets, the timers the cursor asks for, the live queue
// between socket and applier, reconnects with backoff, and logging.
package stream
