// Package daemon wires prefixd together: the catalog watch feeding the
// coordinator service (coordinator.Service, over the index as its overlap
// source, its metrics the Observer), the API's worker view and the stream
// manager (events/stream's Manager: one Subscriber per worker rank into
// the index); the HTTP API; peer bootstrap; metrics; embedded etcd; and
// the shutdown order. It keeps no coordinator state of its own.
package daemon
