// Package coordinator owns worker selection, reservations and decode-first
// disaggregated coordination, with the semantics of Dynamo's KV router
// (lib/kv-router/src/scheduling, sequences and conditional_disagg.rs) and of
// the linked-booking coordinator in ishandhanani/dynamo
// lib/kv-router/src/services/selection/coordinator.rs; docs/coordinator.md
// describes them. The core does no I/O, starts no goroutines and reads no
// clock: every time-dependent method takes now, and randomness comes from
// an injected Rand. It is not safe for concurrent use; Service is the one
// lock around it.
//
//   - Worker, PoolKey: a schedulable (worker id, dp rank) of one pool
//     (model, routing group, role), with capacities, taints, topology
//     domains and KV-transfer metadata.
//   - Pool: filtering (pin, allow-set, required taints, busy thresholds),
//     the cost function with tier-weighted overlap credit and preferred-taint
//     multiplier, argmin/softmax sampling (Select), and reservations booked
//     by sequence hash so shared prefixes count once (SelectAndReserve,
//     PrefillComplete, Free, Expire; bounded by MaxReservations).
//   - Pools: one Pool per key, created on the first worker.
//   - EngineLoad: a rank's own report of its load (its /metrics), as of
//     its scrape. Selection's load of a rank is the engine's figure plus
//     the bookings made after it; a booking made before is assumed
//     inside the figure; prefill tokens count bookings alone; without a
//     figure, bookings alone (engineload.go states the rule).
//   - Policy: conditional disaggregation (off, isl_bounding, prefill_load,
//     isl_or_load) and the decode busy gate.
//   - Coordinator: linked plans across a decode and a prefill pool,
//     decode-first (preview, probe, decide, book decode pinned to the
//     preview, book prefill inside the decode worker's KV-transfer domain) or
//     prefill-first; every LinkedBookingState transition is recorded on the
//     Plan with a reason. Expire and WorkerRemoved are driven, and return the
//     plans they changed.
//   - Service: the core behind one mutex, for concurrent callers (the HTTP
//     API), as etcd's raft Node sits over RawNode. It reads the clock and
//     owns what the core leaves to its caller: engines and their dp ranks,
//     global reservation ids, the history of plans it finished, expiry.
//
// Role, Order, FailurePolicy and PolicyKind are named by their text forms
// (encoding.TextMarshaler and TextUnmarshaler), one spelling each.
package coordinator
