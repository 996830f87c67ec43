package main

import "github.com/spf13/cobra"

// newBenchCommand is the parent of the benchmark subcommands, one file
// each (bench_<name>.go).
func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that need more than go test: the index and routing quality on a trace",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(
		newBenchIndexCommand(),
		newBenchRoutingCommand(),
	)
	return cmd
}
