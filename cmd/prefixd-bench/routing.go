package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/sim/routing"
)

type routingOptions struct {
	routing.BenchOptions
	policies []string
	quiet    bool
}

func newRoutingOptions() *routingOptions {
	o := &routingOptions{BenchOptions: routing.NewBenchOptions()}
	for _, p := range o.Policies {
		o.policies = append(o.policies, string(p))
	}
	return o
}

func (o *routingOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Trace, "trace", o.Trace, "Mooncake-format trace (JSONL, gzipped or not; default: the shipped FAST'25 conversation trace)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "replay only the trace's first N requests (0: all)")
	fs.StringSliceVar(&o.policies, "policies", o.policies, "policies to compare, comma-separated")
	fs.Float64SliceVar(&o.Speedups, "speedups", o.Speedups, "load levels: factors compressing the trace's arrival times, comma-separated")
	fs.Float64SliceVar(&o.Weights, "weights", o.Weights, "also sweep prefixd's and the oracle's overlap weight over these values, comma-separated")
	fs.IntSliceVar(&o.Replicas, "replicas", o.Replicas, "sweep these router counts, comma-separated: requests spread round-robin over N replicas, each with its own bookings and index; rows named <policy>/r<N> (unset: one router)")
	fs.DurationVar(&o.ReplicaSpread, "replica-spread", o.ReplicaSpread, "replicas after the first receive events up to this much later than --event-delay (drawn from the seed)")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", o.ScrapeInterval, "each replica reads every engine's own load (running, waiting, KV usage) this often, at its own phase (0: never; the daemon scrapes every 500ms)")
	fs.BoolVar(&o.Sync, "sync", o.Sync, "share bookings between replicas: every other replica applies each booking's delta --sync-delay later")
	fs.DurationVar(&o.SyncDelay, "sync-delay", o.SyncDelay, "with --sync, how long a booking takes to reach the other replicas")
	fs.Float64Var(&o.PeerSpread, "peer-spread", o.PeerSpread, "with --sync, each replica's spread among engines that cost about the same, in units of the request's blocks (serve --peer-spread)")
	fs.Float64Var(&o.QueueThreshold, "queue-threshold", o.QueueThreshold, "prefixd-queued: requests wait in the router while every engine holds more prefill than this fraction of its max_num_batched_tokens (serve --queue-threshold)")
	fs.DurationVar(&o.Queue.Aging, "queue-aging", o.Queue.Aging, "prefixd-queued: a request that has waited this long goes ahead of every later one of its priority (serve --queue-aging)")
	fs.Var(queueOrderFlag{&o.Queue.Order}, "queue-order", "prefixd-queued: the queue's order, fcfs or shortest-work (serve --queue-order)")
	fs.DurationVar(&o.SessionTTL, "session-ttl", o.SessionTTL, "prefixd-session: a session's requests go back to its engine while it is under the busy thresholds and the session was used within this long, on the replay's clock (after --speedups compress it); sessions come from the trace's hash ids")
	fs.DurationVar(&o.ArrivalJitter, "arrival-jitter", o.ArrivalJitter, "delay each request's arrival by up to this much (uniform, from the seed; before --speedups): 3s spreads the shipped trace's 3-second timestamp buckets")
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

func (o *routingOptions) Validate() error {
	o.Policies = nil
	for _, s := range o.policies {
		p, err := routing.ParsePolicy(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--policies: %w", err)
		}
		o.Policies = append(o.Policies, p)
	}
	return o.BenchOptions.Validate()
}

func newRoutingCommand() *cobra.Command {
	o := newRoutingOptions()
	cmd := &cobra.Command{
		Use:   "routing",
		Short: "Compare routing policies on a request trace replayed against a simulated fleet",
		Long: "routing replays a Mooncake-format trace on a virtual clock against a fleet of mock\n" +
			"engines (prefix cache with LRU eviction, continuous batching, the H100 Llama-3.1-8B timing),\n" +
			"once per policy and load level: random, round-robin, least-loaded, consistent hashing,\n" +
			"approximate prefix affinity, prefixd (its index fed by the engines' KV events through the\n" +
			"real decoder and cursor; with booking predictions too), prefixd's decode-first plans\n" +
			"on a prefill/decode split, and the oracle (the same cost function reading the true caches).\n" +
			"--replicas spreads the requests over N routers that share nothing but the engines;\n" +
			"--scrape-interval gives them the engines' own load, --sync each other's bookings.\n" +
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

// queueOrderFlag is a coordinator.QueueOrder as a flag.
type queueOrderFlag struct{ o *coordinator.QueueOrder }

func (f queueOrderFlag) String() string { return f.o.String() }
func (f queueOrderFlag) Set(s string) error {
	o, err := coordinator.ParseQueueOrder(s)
	if err != nil {
		return err
	}
	*f.o = o
	return nil
}
func (queueOrderFlag) Type() string { return "order" }
