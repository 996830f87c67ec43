package main

import "github.com/spf13/cobra"

// newBenchCommand is the parent of the benchmark subcommands, one file
// each (bench_<name>.go).
func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run prefixd's benchmarks on the shipped Mooncake trace",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(
		newBenchIndexCommand(),
	)
	return cmd
}
