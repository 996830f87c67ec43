// Package daemon wires prefixd together: the catalog watch feeding the
// coordinator's pools, the API's worker view and the stream manager
// (events/stream's Manager: one Subscriber per worker rank into the
// index); the HTTP API; peer bootstrap; metrics; embedded etcd; and the
// shutdown order.
package daemon
