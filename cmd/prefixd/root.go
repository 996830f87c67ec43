package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/internal/cli"
)

// newRootCommand builds the whole command tree, writing normal output to
// stdout and diagnostics to stderr. Tests run commands in-process through it:
//
//	cmd := newRootCommand(&out, &errOut)
//	cmd.SetArgs([]string{"version"})
//	err := cmd.Execute()
//
// The returned command owns no global state, so each call is independent.
//
// Adding a subcommand: put it in its own file as newXxxCommand() *cobra.Command
// and register it below. A subcommand with flags keeps them in an xxxOptions
// struct with a newXxxOptions() constructor holding the defaults, an
// AddFlags(*pflag.FlagSet) method that binds every field, and a Validate()
// error method called first thing in RunE. Long-running subcommands take the
// context from cmd.Context(), which main cancels on SIGINT/SIGTERM, and return
// only after their goroutines exit. Subcommands return errors; only main exits.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := cli.NewRoot("prefixd", "KV-cache-aware routing daemon for vLLM and SGLang fleets",
		"prefixd tracks which prompt prefixes each engine worker holds in its KV cache,\n"+
			"from the engines' own KV event streams, so that a router can send each request\n"+
			"to the worker that already caches most of its prompt.",
		stdout, stderr)

	// Subcommands, one file each; "prefixd --help" lists them by name.
	// What operators run goes here; the benchmark lab (routing and index
	// benchmarks, index-demo, soak) is cmd/prefixd-bench, kept out of this
	// binary (TestBinaryShipsNoLab).
	root.AddCommand(
		cli.NewVersionCommand("prefixd", version),
		newDemoCommand(),
		newServeCommand(),
		newSidecarCommand(),
		newWorkersCommand(),
		newQueryCommand(),
		newMockerCommand(),
		newStatusCommand(),
		newProxyCommand(),
	)
	return root
}

// stoppedLine returns a func that logs msg with how long the shutdown
// took, from when ctx ended (a signal); called when the command is done
// (deferred), after everything it ran has stopped. Nothing is logged if
// ctx has not ended: the command failed, and main prints why.
func stoppedLine(ctx context.Context, log *slog.Logger, msg string) func() {
	stopping := make(chan time.Time, 1)
	stop := context.AfterFunc(ctx, func() { stopping <- time.Now() })
	return func() {
		if stop() {
			return // ctx did not end
		}
		log.Info(msg, "took", time.Since(<-stopping).Round(time.Millisecond))
	}
}

// enum makes the --help line of the flag name show the values it takes in
// place of a type, e.g. "--policy kv|random". The flag must exist.
func enum(fs *pflag.FlagSet, name string, values ...string) {
	f := fs.Lookup(name)
	f.Value = enumValue{Value: f.Value, values: strings.Join(values, "|")}
}

// enumValue is a flag's value with its values as its type.
type enumValue struct {
	pflag.Value
	values string
}

func (v enumValue) Type() string { return v.values }
