package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/sim/demo"
)

type soakOptions struct {
	demo.SoakConfig
	csv     string
	prefixd string // the binary run as the daemon; "": findPrefixd's default
}

func newSoakOptions() *soakOptions {
	return &soakOptions{SoakConfig: demo.SoakConfig{Duration: 10 * time.Minute, Sample: 10 * time.Second, Rate: 200, Clients: 6,
		ChurnEvery: time.Minute, MaxGrowth: 0.10}}
}

func (o *soakOptions) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long to load the daemon")
	fs.DurationVar(&o.Sample, "sample", o.Sample, "interval between memory samples")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "samples before this are not judged (0: a fifth of --duration)")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "requests per second (a ceiling: fewer if the clients fall behind)")
	fs.IntVar(&o.Clients, "clients", o.Clients, "concurrent clients")
	fs.DurationVar(&o.ChurnEvery, "churn-every", o.ChurnEvery, "interval between fleet events (engine restart, crash and replacement, prefix-cache reset)")
	fs.Float64Var(&o.MaxGrowth, "max-growth", o.MaxGrowth, "fail if resident memory in the last third exceeds the middle third by more than this fraction")
	fs.StringVar(&o.csv, "csv", o.csv, "write the samples to this CSV file")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed")
	fs.StringVar(&o.prefixd, "prefixd", o.prefixd, "the prefixd binary to run as the daemon (default: the prefixd next to this executable, else prefixd on PATH)")
}

func (o *soakOptions) Validate() error {
	switch {
	case o.Duration < 10*time.Second || o.Sample <= 0 || o.Sample > o.Duration/6:
		return fmt.Errorf("--duration ≥ 10s and 0 < --sample ≤ duration/6 (got %v, %v)", o.Duration, o.Sample)
	case o.Rate <= 0 || o.Clients < 1 || o.ChurnEvery <= 0 || o.MaxGrowth <= 0 || o.Warmup < 0 || o.Warmup >= o.Duration:
		return fmt.Errorf("--rate, --clients, --churn-every and --max-growth must be positive, 0 ≤ --warmup < --duration")
	}
	return nil
}

func newSoakCommand() *cobra.Command {
	o := newSoakOptions()
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Load a prefixd process for a long while and check that its memory stays flat",
		Long: "soak runs `prefixd serve` as a separate process on an embedded etcd (the prefixd of\n" +
			"--prefixd, else the one next to this executable, else the one on PATH), starts the demo's 12\n" +
			"mock engines and routes the demo's workload (KV-aware, random and disaggregated plans) at a\n" +
			"steady rate while engines restart, crash and are replaced, and reset their caches. It samples\n" +
			"the daemon's resident memory and metrics, prints the curve, and exits non-zero if memory grew\n" +
			"by more than --max-growth after the warm-up or the index does not follow every engine at the end.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				self = "" // unknown: findPrefixd says so if it needs it
			}
			if o.Daemon, err = findPrefixd(o.prefixd, self); err != nil {
				return err
			}
			o.Out = cmd.OutOrStdout()
			if o.csv != "" {
				f, err := os.Create(o.csv)
				if err != nil {
					return err
				}
				defer f.Close()
				o.CSV = f
			}
			rep, err := demo.Soak(cmd.Context(), o.SoakConfig)
			if rep != nil {
				writeSoakReport(cmd.OutOrStdout(), rep)
			}
			return err
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// findPrefixd returns the prefixd binary the soak runs as the daemon:
// flag if set (a path, or a name looked up on PATH), else the prefixd in
// the directory of self (this executable, as make build places them),
// else prefixd on PATH. The error names every place tried.
func findPrefixd(flag, self string) (string, error) {
	if flag != "" {
		path, err := exec.LookPath(flag)
		if err != nil {
			return "", fmt.Errorf("--prefixd: %w", err)
		}
		return filepath.Abs(path)
	}
	var tried []string
	if self != "" {
		next := filepath.Join(filepath.Dir(self), "prefixd")
		if path, err := exec.LookPath(next); err == nil {
			return path, nil
		}
		tried = append(tried, next)
	} else {
		tried = append(tried, "next to this executable (its path unknown)")
	}
	path, err := exec.LookPath("prefixd")
	if err == nil {
		return filepath.Abs(path)
	}
	tried = append(tried, "prefixd on PATH")
	return "", fmt.Errorf("no prefixd binary to run as the daemon (tried %s): build it (make build puts it in bin/) or pass --prefixd", strings.Join(tried, ", then "))
}

func writeSoakReport(w io.Writer, r *demo.SoakReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\nsoak finished in %v\n", r.Elapsed.Round(time.Second))
	fmt.Fprintf(tw, "requests served\t%d\n", r.Requests)
	fmt.Fprintf(tw, "requests failed\t%s\n", counts(r.Failed))
	churn := map[string]int64{}
	for k, v := range r.Churn {
		churn[k] = int64(v)
	}
	fmt.Fprintf(tw, "fleet events\t%s\n", counts(churn))
	fmt.Fprintf(tw, "gaps / replays\t%.0f / %.0f\n", r.Gaps, r.Replays)
	if n := len(r.Samples); n > 0 {
		var first demo.SoakSample
		for _, s := range r.Samples {
			if s.At >= r.Warmup {
				first = s
				break
			}
		}
		last := r.Samples[n-1]
		fmt.Fprintf(tw, "resident memory after warm-up (%v)\t%.1f MiB → %.1f MiB at the end\n", r.Warmup, mib(first.RSS), mib(last.RSS))
		fmt.Fprintf(tw, "growth, last third over middle third\t%+.1f%% (limit %.0f%%)\n", 100*r.Growth, 100*r.MaxGrowth)
		fmt.Fprintf(tw, "trend after warm-up\t%+.1f MiB/hour\n", mib(r.SlopePerHour))
		fmt.Fprintf(tw, "goroutines first → last sample\t%.0f → %.0f\n", r.Samples[0].Goroutines, last.Goroutines)
	}
	if len(r.Mismatches) > 0 {
		fmt.Fprintf(tw, "index vs engines\t%d differ: %s\n", len(r.Mismatches), strings.Join(r.Mismatches[:min(3, len(r.Mismatches))], "; "))
	} else {
		fmt.Fprintf(tw, "index vs engines\tevery engine's last seq and block count followed\n")
	}
	tw.Flush()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func counts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
