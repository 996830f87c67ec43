// Package daemon wires prefixd together: the catalog watch feeding the
// coordinator service (coordinator.Service, its engines from the records,
// over the index as its overlap source, its metrics the Observer), the
// API's worker view and the stream manager (events/stream's Manager: one
// Subscriber per worker rank into the index); the HTTP API; peer bootstrap
// (internal/peer); metrics; embedded etcd; and the shutdown order. It
// keeps no state of its own but the records the watch delivered, makes no
// decision but a registration's block size against the index partition,
// and maps no types.
package daemon
