// Package indexbench is the index benchmark in the shape of NVIDIA
// Dynamo's mooncake_bench (lib/kv-router benches): a Mooncake request
// trace is replayed through mock engines (internal/sim/mocker's Pool and
// Scheduler on a virtual clock), each engine's KV events and each
// request's lookup are recorded once (Record), and the recorded stream is
// then fed to an indexer.Index at an offered rate obtained by compressing
// the trace's time (Replay): one applier goroutine per group of ranks,
// sticky (a rank's batches always go through the same applier, in order),
// and lookup goroutines matching each request's prompt on arrival,
// concurrently. Ops are counted as Dynamo counts them: KV-event blocks
// applied plus lookup blocks matched. Sweep runs Replay over a range of
// offered rates; Latency times scores (hash + match of 8,192-token
// prompts) at idle and under saturating ingest.
//
// It is what `prefixd-bench index` and `make bench-index` run. The
// package does no I/O beyond writing its report to an io.Writer.
package indexbench
