// Package cli holds what prefixd's two commands share about their command
// lines: cmd/prefixd, the daemon and what operators run beside it, and
// cmd/prefixd-bench, the benchmark lab. It owns the root command's
// conventions (NewRoot), running it under a context that SIGINT and
// SIGTERM cancel (Execute), the version subcommand (NewVersionCommand,
// VersionText) and flags read from PREFIXD_<FLAG> variables (FromEnv,
// Prepare). It keeps no state, calls no os.Exit, and knows no subcommand
// but version.
package cli
