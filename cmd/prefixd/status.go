package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/status"
)

type statusOptions struct {
	serverOptions
	interval time.Duration
	timeout  time.Duration
	once     bool
	asJSON   bool
}

func newStatusOptions() *statusOptions {
	return &statusOptions{interval: 2 * time.Second, timeout: 5 * time.Second}
}

func (o *statusOptions) AddFlags(fs *pflag.FlagSet) {
	o.serverOptions.AddFlags(fs)
	fs.DurationVar(&o.interval, "interval", o.interval, "time between refreshes")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "bound on reading /workers and /metrics, per refresh")
	fs.BoolVar(&o.once, "once", false, "print one frame and exit (non-zero if the server cannot be read)")
	fs.BoolVar(&o.asJSON, "json", false, "with --once: print the frame as JSON")
}

func (o *statusOptions) Validate() error {
	if o.interval <= 0 {
		return fmt.Errorf("--interval %v: must be positive", o.interval)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive", o.timeout)
	}
	if o.asJSON && !o.once {
		return fmt.Errorf("--json needs --once")
	}
	return nil
}

func newStatusCommand() *cobra.Command {
	o := newStatusOptions()
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show worker ranks, stream lag, replays, index size and plans, refreshing in place",
		Long: "status reads a running prefixd's /workers and /metrics and shows every worker rank\n" +
			"(state ok, replaying, degraded or down; applied and seen seqs and the lag between\n" +
			"them; blocks; replays, gaps, restarts, routed requests), the index's size, the\n" +
			"catalog's health and the disaggregated plans. On a terminal it redraws every\n" +
			"--interval until interrupted; otherwise it prints one frame per interval. --once\n" +
			"prints one frame (--json: as JSON) and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !o.once {
				return o.watch(cmd.Context(), c, out, isTerminal(out))
			}
			f, err := o.frame(cmd.Context(), c)
			if err != nil {
				return err
			}
			if o.asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(f)
			}
			return f.WriteText(out)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// frame reads the server's workers and metrics once.
func (o *statusOptions) frame(ctx context.Context, c *client.Client) (status.Frame, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ws, err := c.Workers(ctx, "", "")
	if err != nil {
		return status.Frame{}, fmt.Errorf("prefixd at %s: %w", o.server, err)
	}
	page, err := c.Metrics(ctx)
	if err != nil {
		return status.Frame{}, fmt.Errorf("prefixd at %s: %w", o.server, err)
	}
	m, err := status.ParseMetrics(bytes.NewReader(page))
	if err != nil {
		return status.Frame{}, fmt.Errorf("prefixd at %s: %w", o.server, err)
	}
	f := status.Build(ws, m)
	f.Server, f.Time = o.server, time.Now()
	return f, nil
}

// watch writes a frame every interval until ctx ends: redrawn in place on
// a terminal, one after another (blank-line separated) otherwise. A server
// that cannot be read is shown as such, and tried again next time.
func (o *statusOptions) watch(ctx context.Context, c *client.Client, out io.Writer, tty bool) error {
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	var buf bytes.Buffer
	for first := true; ; first = false {
		buf.Reset()
		f, err := o.frame(ctx, c)
		switch {
		case ctx.Err() != nil:
			return nil // interrupted
		case err != nil:
			fmt.Fprintf(&buf, "prefixd %s  %s\n\n%v\n(retrying every %v)\n", o.server, time.Now().Format(time.DateTime), err, o.interval)
		default:
			if err := f.WriteText(&buf); err != nil {
				return err
			}
		}
		page := buf.Bytes()
		switch {
		case tty:
			page = status.Redraw(page)
		case !first:
			page = append([]byte("\n"), page...)
		}
		if _, err := out.Write(page); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
