// Command prefixd is the KV-cache-aware routing daemon and what operators
// run beside it: serve, sidecar, proxy, status, workers, query, mocker,
// demo and version. This package holds only the cobra command tree: each
// subcommand lives in its own file, parses and validates its flags into an
// Options struct, and hands off to a library package. The benchmark lab is
// cmd/prefixd-bench; this binary must not link it (TestBinaryShipsNoLab).
// Nothing here keeps state in package variables except version, which the
// linker sets.
package main
