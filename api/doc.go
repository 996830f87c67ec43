// Package api holds the request and response types of prefixd's HTTP
// API: what a router sends and reads, on the wire of Dynamo's standalone
// indexer and selection service (and the Mooncake KV indexer RFC) with
// prefixd's additions. The Go client (package client) and the daemon's
// server (internal/apiserver) share them; docs/api.md lists the routes.
//
// The package is light: it links neither the daemon's index, coordinator
// and streams nor etcd, ZMQ or Prometheus (TestLight), so a router that
// imports it, or the client, carries only these types.
//
// The prompt arrays (TokenIDs, HashList) and the bounded lists
// (WorkerIDs, RequiredTaints, TaintWeights) decode themselves with
// encoding/json as the server reads them: strictly, within their bounds
// (checked before anything is allocated), with errors naming the element
// ("token_ids[3]: -1 is out of range …", a *jsonlex.Error).
package api
