package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/prefixd/prefixd/internal/cli"
)

// newRootCommand builds prefixd-bench's command tree, writing normal output
// to stdout and diagnostics to stderr. Tests run commands in-process through
// it, and each call is independent (no global state).
//
// Subcommands follow cmd/prefixd's conventions (its root.go says them in
// full): one file each, an xxxOptions struct with its defaults, AddFlags and
// Validate; long-running ones take cmd.Context(), which main cancels on
// SIGINT/SIGTERM; errors are returned and only main exits.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := cli.NewRoot("prefixd-bench", "prefixd's benchmark lab: routing and index benchmarks, the index demo, the soak",
		"prefixd-bench measures prefixd rather than runs it: the routing-quality and the index\n"+
			"benchmarks on the Mooncake trace (with their charts), the index demo, and the soak, which\n"+
			"loads a prefixd process for a long while. None of it is in the prefixd binary or image.",
		stdout, stderr)

	// Subcommands, one file each; "prefixd-bench --help" lists them by name.
	root.AddCommand(
		cli.NewVersionCommand("prefixd-bench", version),
		newRoutingCommand(),
		newIndexCommand(),
		newIndexDemoCommand(),
		newSoakCommand(),
	)
	return root
}
