package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/internal/clip"
	"github.com/prefixd/prefixd/internal/sim/routing"
)

type benchRoutingOptions struct {
	routing.BenchOptions
	policies, speedups, weights string
	quiet                       bool
}

func newBenchRoutingOptions() *benchRoutingOptions {
	o := &benchRoutingOptions{BenchOptions: routing.NewBenchOptions()}
	var ps, ss []string
	for _, p := range o.Policies {
		ps = append(ps, string(p))
	}
	for _, s := range o.Speedups {
		ss = append(ss, strconv.FormatFloat(s, 'g', -1, 64))
	}
	o.policies, o.speedups = strings.Join(ps, ","), strings.Join(ss, ",")
	return o
}

func (o *benchRoutingOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Trace, "trace", o.Trace, "Mooncake-format trace (JSONL, gzipped or not; default: the shipped FAST'25 conversation trace)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "replay only the trace's first N requests (0: all)")
	fs.StringVar(&o.policies, "policies", o.policies, "policies to compare, comma-separated")
	fs.StringVar(&o.speedups, "speedups", o.speedups, "load levels: factors compressing the trace's arrival times, comma-separated")
	fs.StringVar(&o.weights, "weights", o.weights, "also sweep prefixd's and the oracle's overlap weight over these values, comma-separated")
	fs.IntVar(&o.Engines, "engines", o.Engines, "engines in the simulated fleet")
	fs.IntVar(&o.PrefillEngines, "prefill-engines", o.PrefillEngines, "of them, prefill engines under prefixd-disagg (0: half)")
	fs.IntVar(&o.TotalBlocks, "kv-blocks", o.TotalBlocks, "KV blocks per engine")
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per KV block")
	fs.DurationVar(&o.EventDelay, "event-delay", o.EventDelay, "how long an engine's KV events take to reach the index")
	fs.DurationVar(&o.PredictedTTL, "predicted-ttl", o.PredictedTTL, "lifetime of prefixd-predicted's booking predictions")
	fs.DurationVar(&o.ApproxTTL, "approx-ttl", o.ApproxTTL, "lifetime of approx-prefix's router-side guess")
	fs.Float64Var(&o.Options.OverlapCredit, "overlap-weight", o.Options.OverlapCredit, "the cost function's weight of cached blocks (Dynamo's overlap_score_weight)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the random choices (same seed, same results)")
	fs.StringVar(&o.Out, "out", o.Out, "directory for report.json, report.md and the SVG charts (empty: none)")
	fs.IntVar(&o.Parallel, "parallel", o.Parallel, "runs at once (0: GOMAXPROCS)")
	fs.BoolVar(&o.quiet, "quiet", o.quiet, "no progress line per run on stderr")
}

func (o *benchRoutingOptions) Validate() error {
	o.Policies = nil
	for _, s := range strings.Split(o.policies, ",") {
		p, err := routing.ParsePolicy(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
		o.Policies = append(o.Policies, p)
	}
	var err error
	if o.Speedups, err = floats("--speedups", o.speedups); err != nil {
		return err
	}
	if o.Weights, err = floats("--weights", o.weights); err != nil {
		return err
	}
	return o.BenchOptions.Validate()
}

// floats parses a comma-separated list of numbers ("": none).
func floats(flag, list string) ([]float64, error) {
	var out []float64
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	for _, s := range strings.Split(list, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a number", flag, clip.String(s))
		}
		out = append(out, f)
	}
	return out, nil
}

func newBenchRoutingCommand() *cobra.Command {
	o := newBenchRoutingOptions()
	cmd := &cobra.Command{
		Use:   "routing",
		Short: "Compare routing policies on a request trace replayed against a simulated fleet",
		Long: "bench routing replays a Mooncake-format trace on a virtual clock against a fleet of mock\n" +
			"engines (prefix cache with LRU eviction, continuous batching, the H100 Llama-3.1-8B timing),\n" +
			"once per policy and load level: random, round-robin, least-loaded, consistent hashing,\n" +
			"approximate prefix affinity, prefixd (its index fed by the engines' KV events through the\n" +
			"real decoder and cursor; with booking predictions too), prefixd's decode-first plans\n" +
			"on a prefill/decode split, and the oracle (the same cost function reading the true caches).\n" +
			"It prints a table per load level and, with --out, writes report.json, report.md and charts.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			if !o.quiet {
				o.Progress = cmd.ErrOrStderr()
			}
			return routing.Bench(cmd.Context(), o.BenchOptions, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
