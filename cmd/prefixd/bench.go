package main

import "github.com/spf13/cobra"

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that need more than go test: routing quality on a trace",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newBenchRoutingCommand())
	return cmd
}
