// Package importcheck enforces the rule that prefixd's cores (indexer,
// coordinator, events/cursor, events/wire) do no I/O: their transitive
// imports must not reach ZMQ, etcd, net/http, Prometheus or the net
// package. It also keeps etcd and ZMQ out of the light packages (Light),
// test support out of what ships (NoTestSupport) and the benchmark lab out
// of the production binary (NoLab). It is a test helper, imported only
// from _test.go files.
package importcheck
