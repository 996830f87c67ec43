// Package etcdstore is the catalog.Store on etcd (client v3): records
// under <prefix>/workers/<model>/<group>/<worker_id>, each worker id
// claimed under <prefix>/ids/<id> in the same transaction, leases as etcd
// leases, watches that list again when etcd restarts or loses history.
// Config carries endpoints, TLS files and credentials; New fails early
// with an error that says whether etcd is unreachable, wants credentials
// or rejected them. Embedded runs a single-member etcd in process, for a
// daemon given no etcd endpoints.
//
// It is kept apart from package catalog so that what reads and writes
// records without running a store (the API's types, the Go client, the
// record schema itself) does not link etcd.
package etcdstore
