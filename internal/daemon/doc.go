// Package daemon wires prefixd together: the stream manager that turns
// worker changes into one stream.Subscriber per worker rank feeding the
// index, and (as the serve issue lands) the catalog watch, the HTTP API,
// metrics, embedded etcd and the shutdown order.
package daemon
