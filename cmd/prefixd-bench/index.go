package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/internal/sim/indexbench"
)

type indexOptions struct {
	indexbench.Options
	appliers []string
	out      string
}

func newIndexOptions() *indexOptions {
	return &indexOptions{Options: indexbench.NewOptions(), appliers: []string{"rank", "core"}}
}

func (o *indexOptions) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Record.Engines, "engines", o.Record.Engines, "mock engines (one rank each) the trace's requests are spread over at random")
	fs.IntVar(&o.Record.GPUBlocks, "gpu-blocks", o.Record.GPUBlocks, "KV-cache blocks per engine")
	fs.IntVar(&o.Record.BlockSize, "block-size", o.Record.BlockSize, "tokens per KV block")
	fs.Uint64Var(&o.Record.Seed, "seed", o.Record.Seed, "seed of the requests' assignment to engines")
	fs.IntVar(&o.Requests, "requests", o.Requests, "replay only the trace's first N requests (0: all 12,031)")
	fs.IntSliceVar(&o.CPUs, "cpu", o.CPUs, "core counts (GOMAXPROCS) to run at, in order")
	fs.StringSliceVar(&o.appliers, "appliers", o.appliers, "the ways of applying the events to sweep at each core count: rank (a goroutine per rank, as the daemon), core (one per core, ranks sticky: Dynamo's thread pool) or a number of goroutines, ranks sticky")
	fs.IntVar(&o.Lookupers, "lookupers", o.Lookupers, "lookup goroutines (0: the core count)")
	fs.Float64SliceVar(&o.Rates, "rates", o.Rates, "offered loads in ops/s (default: --fractions of the unpaced capacity)")
	fs.Float64SliceVar(&o.Fractions, "fractions", o.Fractions, "offered loads as fractions of the unpaced capacity measured first")
	fs.IntVar(&o.Repeats, "repeats", o.Repeats, "replays of each offered load (its point is the median)")
	fs.Float64Var(&o.Track, "track", o.Track, "achieved tracks offered while it is at least this fraction of it")
	fs.IntVar(&o.IdleProbes, "idle-probes", o.IdleProbes, "scores timed at idle")
	fs.IntVar(&o.Shards, "shards", o.Shards, "index shards per partition (0: the index's default, one per core, at most 8)")
	fs.StringVar(&o.out, "out", "", "also write the report (report.md, report.json) and SVG charts into this directory")
	fs.IntVar(&o.WriteChunk, "write-chunk", o.WriteChunk, "blocks a batch applies per hold of its shard's write lock (0: the index's default)")
}

func (o *indexOptions) Validate() error {
	o.Appliers = o.Appliers[:0]
	for _, a := range o.appliers {
		switch a {
		case "rank":
			o.Appliers = append(o.Appliers, indexbench.PerRank)
		case "core":
			o.Appliers = append(o.Appliers, indexbench.PerCore)
		default:
			n, err := strconv.Atoi(a)
			if err != nil || n < 1 {
				return fmt.Errorf("appliers %q: want rank, core or a positive number of goroutines", a)
			}
			o.Appliers = append(o.Appliers, n)
		}
	}
	return o.Options.Validate()
}

func newIndexCommand() *cobra.Command {
	o := newIndexOptions()
	cmd := &cobra.Command{
		Use:   "index",
		Short: "Replay the Mooncake trace's KV events and lookups into the index at a swept offered load",
		Long: "index is Dynamo's mooncake_bench shape: the Mooncake FAST'25 conversation trace is served by\n" +
			"mock engines on a virtual clock, their KV events and the requests' lookups are recorded once,\n" +
			"and the stream is fed to the index at offered rates made by compressing the trace's time, with\n" +
			"each rank's events applied in order (by a goroutine of its own, as the daemon's streams apply\n" +
			"them, and by a pool of one goroutine per core with ranks sticky, as Dynamo's harness) and\n" +
			"lookups concurrent. Ops are KV-event blocks applied plus\n" +
			"lookup blocks matched. At each core count it reports the unpaced capacity (and checks the index\n" +
			"against the engines' caches), achieved against offered ops/s, and the score latency of\n" +
			"8,192-token prompts at idle and under saturating ingest.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			var text strings.Builder
			out := io.Writer(cmd.OutOrStdout())
			if o.out != "" {
				out = io.MultiWriter(out, &text)
			}
			reports, err := indexbench.Run(cmd.Context(), o.Options, out)
			if err != nil || o.out == "" {
				return err
			}
			files, err := indexbench.WriteReport(o.out, reports, text.String())
			for _, f := range files {
				fmt.Fprintln(cmd.OutOrStdout(), "wrote", f)
			}
			return err
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
