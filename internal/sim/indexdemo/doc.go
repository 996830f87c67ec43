// Package indexdemo runs the foundation of prefixd end to end in one
// process: a deterministic fleet workload encoded as real vLLM KV-event
// payloads, decoded and applied to the index, then verified and scored.
// It is what `prefixd-bench index-demo` and `make index-demo` run.
// Nothing in it is simulated beyond the engines themselves: the codec, the
// conversion and the index are the ones the daemon uses.
package indexdemo
