// Package events drives prefixd's side of the engine KV-event stream: the
// ZMQ subscriber with verified replay, fair replay slots, the index applier
// and the stream metrics, and the test publisher. The wire codec it decodes
// with is package events/wire; the per-stream sequence cursor it drives is
// package events/cursor.
package events
