// Package daemon wires prefixd together: the catalog watch, the stream
// manager that turns worker changes into one events.Subscriber per worker
// rank feeding the index, the coordinator service (coordinator.Service,
// over the index as its overlap source, fed the catalog's engines, its
// metrics the Observer), the HTTP API, metrics, embedded etcd and the
// shutdown order. It keeps no coordinator state of its own.
package daemon
