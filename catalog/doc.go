// Package catalog owns the worker record, its validation, the worker Store
// (etcd and in-memory), lease-backed registration and the watch that turns
// key changes into worker up and down events.
//
// Implemented by the catalog issue; the package exists so the layout is fixed.
package catalog
