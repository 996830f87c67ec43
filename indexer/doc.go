// Package indexer owns block hashing and the prefix index: which blocks each
// (worker, dp rank) holds, and how many leading blocks of a prompt each one
// already caches.
//
// Tree is a single-threaded, path-compressed radix tree over prefixd's own
// local block hashes (XXH3-64 of the block's tokens), with a per-rank lookup
// from the engine's opaque block hashes for parent resolution and removal.
// For hybrid models (several KV-cache groups per engine, see Group) the
// tree holds each rank's main group, the lowest-numbered full-attention
// one, and per-rank sets track the other groups' blocks, so that Match
// reports the hit vLLM's hybrid coordinator would grant (Overlap).
// Index wraps one Tree per (model, routing group) partition and makes it safe
// for concurrent appliers and matchers. It enforces a memory cap over all
// partitions (least recently used leaves first, whichever partition holds
// them) and per-rank capacities, and flags the ranks these truncate.
// Index.Snapshot dumps a partition as a Snapshot and Index.Restore
// rebuilds it; the package has no wire format for snapshots (the JSON of
// GET /dump is the HTTP API server's).
//
// The package does no I/O: it imports nothing from ZMQ, etcd, net/http or
// Prometheus (TestNoIOImports enforces this).
package indexer
