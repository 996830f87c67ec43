package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/sim/indexdemo"
)

type indexDemoOptions struct {
	indexdemo.Options
	era string
}

func newIndexDemoOptions() *indexDemoOptions {
	return &indexDemoOptions{Options: indexdemo.NewOptions(), era: "map"}
}

func (o *indexDemoOptions) AddFlags(fs *pflag.FlagSet) {
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed (same seed, same events)")
	fs.IntVar(&o.Workers, "workers", o.Workers, "simulated engine workers")
	fs.IntVar(&o.TargetEntries, "entries", o.TargetEntries, "indexed (block, rank) entries to reach before churn")
	fs.IntVar(&o.ChurnBlocks, "churn", o.ChurnBlocks, "blocks stored with caches full after the target (evictions)")
	fs.IntVar(&o.Queries, "queries", o.Queries, "scoring queries to check and time")
	fs.StringVar(&o.era, "era", o.era, "vLLM wire era of the payloads: map (v0.26+) or array")
}

func (o *indexDemoOptions) Validate() error {
	switch o.era {
	case "map":
		o.Era = wire.EraMap
	case "array":
		o.Era = wire.EraArray
	default:
		return fmt.Errorf("--era %q: want map or array", o.era)
	}
	return o.Options.Validate()
}

func newIndexDemoCommand() *cobra.Command {
	o := newIndexDemoOptions()
	cmd := &cobra.Command{
		Use:   "index-demo",
		Short: "Run the event codec and prefix index on a simulated fleet and check them against the truth",
		Long: "index-demo generates a deterministic fleet workload (64 workers with LRU caches, shared\n" +
			"system prompts, multi-turn chats with forks), encodes it as vLLM KV-event payloads,\n" +
			"ingests them through the real decoder and index, checks every rank's overlap against the\n" +
			"engines' true caches, times scoring, and round-trips a snapshot. It exits non-zero if the\n" +
			"index ever disagrees with the truth.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return indexdemo.Run(cmd.Context(), o.Options, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
