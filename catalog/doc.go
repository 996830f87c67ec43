// Package catalog owns prefixd's worker catalog: the worker record, its
// validation and every change to it, the Store contract records live
// behind (package catalog/etcdstore implements it on etcd), lease-backed
// registration, and the watch that turns record changes into workers
// coming, changing and going. It links neither etcd nor ZMQ (TestLight),
// so the API's types and the Go client can carry its records.
//
// # The record
//
// A Worker is a versioned JSON record ("version": 1) of one engine serving
// one (model_name, routing_group) partition: its registrant-chosen
// worker_id (stable across re-registrations; not a lease id), role, engine
// HTTP endpoint, KV-events and replay endpoints per data-parallel rank
// (explicit per-rank maps, or a base that each global dp rank offsets as
// vLLM does; see Worker.Streams), block size, dp ranks, capacity,
// topology and KV-transfer constraints, taints (a sorted list of strings),
// lifecycle (active or draining) and the engine's first event seq.
// WithDefaults fills defaults; Validate returns a *ValidationError whose
// FieldErrors name the JSON field ("block_size: must be positive").
// json.Marshal of a Worker is stable, so Equal compares encodings. The
// fields that describe the engine are Attributes, embedded in Worker and,
// with the same JSON names, in the API's /register body and /workers
// listing: a field added there is stored, registered and listed.
//
// # Changes
//
// RegisterRanks merges a Registration (one or more consecutive dp ranks
// of an engine, as POST /register gives them) into its persistent record,
// and UnregisterRanks removes a worker, a worker from every group of its
// model, or one rank; both go through Store.Update's compare-and-swap, so
// concurrent changes to different ranks all land, and both refuse a
// record a sidecar keeps under a lease (*ConflictError).
//
// # Keys
//
// A record lives at <prefix>/workers/<model>/<group>/<worker_id> (prefix
// DefaultPrefix, "/prefixd/v1"), model and group path-escaped so that
// "meta-llama/Llama-3-8B" is one segment; Key.Path and ParseKey convert,
// and ParseKey accepts only canonical keys.
//
// # Stores
//
// Store is the contract: put with or without a lease, get, delete (one
// record, or a worker from every group of a model), list at a revision,
// watch from a revision, and leases (grant, keep alive once, revoke).
// etcdstore.Store implements it on etcd (client v3; etcdstore.Config
// carries endpoints, TLS files and credentials, and etcdstore.New fails
// early with an error that says whether etcd is unreachable, wants
// credentials or rejected them); etcdstore.Embedded runs a single-member
// etcd in process for a daemon given no etcd endpoints.
// storetest.MemoryStore (test support) implements it in memory with etcd's
// revision, compaction and lease semantics. Package catalog/storetest is
// the conformance suite both pass.
//
// Records registered by sidecars are attached to the sidecar's lease
// (DefaultSessionTTL, 10 s) and vanish when it expires; records written
// with NoLease (POST /register) stay until deleted.
//
// # Registration
//
// Register writes a record with a new lease and returns a Session, shaped
// like etcd's concurrency.Session: Run renews the lease (every TTL/3),
// closes Done's channel when the lease is lost, and registers the same
// record again with a new lease once the store takes writes; Close revokes
// the lease, deleting the record at once. A registrant that dies without
// Close is removed when its TTL runs out.
//
// # Watching
//
// A Watcher lists at a revision, delivers the difference from what it
// delivered before as Changes (Added, Updated with old and new record,
// Removed) through a callback, then watches from the next revision. On
// compaction (ErrCompacted), a dropped connection or restarted etcd
// (ErrInterrupted) or any watch error it lists again and diffs, so every
// real change is delivered once. A bad record is counted (Stats,
// OnBadRecord) and ignored. Synced reports that the first list was
// delivered.
//
// Concurrency: stores, Session and Watcher methods are safe for concurrent
// use; Session.Run and Watcher.Run each run once, return ctx's error, and
// leave no goroutine behind. Constructors start nothing.
package catalog
