package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// NewRoot returns an empty root command named use, writing normal output
// to stdout and diagnostics to stderr, with the conventions both commands
// follow: errors are returned to main, which prints them once and never
// follows them with the usage text; a flag error points at --help; there
// is no shell-completion subcommand. The caller adds the subcommands.
func NewRoot(use, short, long string, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           use,
		Short:         short,
		Long:          long,
		SilenceErrors: true,
		SilenceUsage:  true,
		// No shell-completion subcommand until someone needs it.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w\nRun '%s --help' for usage", err, c.CommandPath())
	})
	return root
}

// Execute runs root with the process's arguments and a context that
// SIGINT and SIGTERM cancel, which long-running subcommands take from
// cmd.Context() and return on. It returns root's error for main to print
// and exit on.
func Execute(root *cobra.Command) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return root.ExecuteContext(ctx)
}
