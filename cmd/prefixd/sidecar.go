package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/sidecar"
)

type sidecarOptions struct {
	etcd        etcdFlags
	workerID    uint64
	model       string
	group       string
	role        string
	blockSize   uint32
	events      string
	replay      string
	topic       string
	dpStart     uint32
	dpSize      uint32
	totalBlocks uint64
	hostBlocks  uint64
	diskBlocks  uint64
	maxBatched  uint64
	engineURL   string
	healthPath  string
	advertise   string
	ttl         time.Duration
	kvDomain    string
	kvEnforce   string
	topology    map[string]string
	taints      []string
	askEngine   bool
	fs          *pflag.FlagSet // to tell the flags given from the defaults
}

// learned maps the flags whose value the sidecar can learn from the
// engine to the record's JSON field names.
var learned = map[string]string{
	"model": "model_name", "block-size": "block_size", "events-endpoint": "events_endpoint",
	"replay-endpoint": "replay_endpoint", "topic": "topic", "data-parallel-start-rank": "data_parallel_start_rank",
	"data-parallel-size": "data_parallel_size", "total-kv-blocks": "total_kv_blocks", "max-num-batched-tokens": "max_num_batched_tokens",
}

func newSidecarOptions() *sidecarOptions {
	return &sidecarOptions{etcd: newEtcdFlags("http://127.0.0.1:2379"),
		group: catalog.DefaultRoutingGroup, role: string(catalog.RoleAggregated), blockSize: 16,
		events: "tcp://*:5557", dpSize: 1, healthPath: "/health", ttl: catalog.DefaultSessionTTL, askEngine: true}
}

func (o *sidecarOptions) AddFlags(fs *pflag.FlagSet) {
	o.fs = fs
	o.etcd.AddFlags(fs, "etcd client URLs of the catalog")
	fs.Uint64Var(&o.workerID, "worker-id", o.workerID, "stable worker id (required; not a lease id)")
	fs.StringVar(&o.engineURL, "engine-url", o.engineURL, "the engine's HTTP base URL: asked what the engine is (--ask-engine), registered, and probed at --health-path")
	fs.BoolVar(&o.askEngine, "ask-engine", o.askEngine, "learn the model, block size, capacity, event endpoints and dp ranks from the engine at --engine-url (vLLM, SGLang); flags given must agree with it")
	fs.StringVar(&o.model, "model", o.model, "model name as served (default: the engine's, with --ask-engine)")
	fs.StringVar(&o.group, "routing-group", o.group, "routing group within the model")
	fs.StringVar(&o.role, "role", o.role, "aggregated, prefill, decode or encoder")
	fs.Uint32Var(&o.blockSize, "block-size", o.blockSize, "engine KV block size in tokens (vLLM --block-size; with --ask-engine the engine's, and a different value is refused)")
	fs.StringVar(&o.events, "events-endpoint", o.events, "the engine's kv-events endpoint (vLLM kv_events_config.endpoint; * is advertised)")
	fs.StringVar(&o.replay, "replay-endpoint", o.replay, "the engine's replay endpoint (vLLM kv_events_config.replay_endpoint)")
	fs.StringVar(&o.topic, "topic", o.topic, "the engine's kv-events topic")
	fs.Uint32Var(&o.dpStart, "data-parallel-start-rank", o.dpStart, "first dp rank of this engine")
	fs.Uint32Var(&o.dpSize, "data-parallel-size", o.dpSize, "dp ranks of this engine (ports offset by rank)")
	fs.Uint64Var(&o.totalBlocks, "total-kv-blocks", o.totalBlocks, "KV cache capacity of one rank, in blocks (vLLM's num_gpu_blocks)")
	fs.Uint64Var(&o.hostBlocks, "host-kv-blocks", o.hostBlocks, "CPU offload capacity of one rank, in blocks, if the engine offloads")
	fs.Uint64Var(&o.diskBlocks, "disk-kv-blocks", o.diskBlocks, "disk offload capacity of one rank, in blocks, if the engine offloads")
	fs.Uint64Var(&o.maxBatched, "max-num-batched-tokens", o.maxBatched, "the engine's prefill budget per step")
	fs.StringVar(&o.healthPath, "health-path", o.healthPath, "health path on --engine-url; empty disables probing")
	fs.StringVar(&o.advertise, "advertise-host", o.advertise, "host to advertise for wildcard endpoints (default: first non-loopback IPv4)")
	fs.DurationVar(&o.ttl, "ttl", o.ttl, "registration lease TTL")
	fs.StringVar(&o.kvDomain, "kv-transfer-domain", o.kvDomain, "topology domain that constrains KV transfers")
	fs.StringVar(&o.kvEnforce, "kv-transfer-enforcement", o.kvEnforce, "required or preferred")
	fs.StringToStringVar(&o.topology, "topology", o.topology, "topology domains, e.g. rack=r7,zone=a")
	fs.StringSliceVar(&o.taints, "taint", o.taints, "taints (repeatable)")
	enum(fs, "role", "aggregated", "prefill", "decode", "encoder")
	enum(fs, "kv-transfer-enforcement", "required", "preferred")
}

func (o *sidecarOptions) options() sidecar.Options {
	w := catalog.Worker{WorkerID: o.workerID, ModelName: o.model, RoutingGroup: o.group,
		Endpoint: o.engineURL, EventsEndpoint: o.events, ReplayEndpoint: o.replay, BlockSize: o.blockSize,
		DataParallelStartRank: o.dpStart, DataParallelSize: o.dpSize,
		Attributes: catalog.Attributes{Role: catalog.Role(o.role), Topic: o.topic,
			TotalKVBlocks: o.totalBlocks, HostKVBlocks: o.hostBlocks, DiskKVBlocks: o.diskBlocks, MaxNumBatchedTokens: o.maxBatched,
			TopologyDomains: o.topology, KVTransferDomain: o.kvDomain, KVTransferEnforcement: catalog.Enforcement(o.kvEnforce), Taints: o.taints},
	}
	so := sidecar.Options{Worker: w, AdvertiseHost: o.advertise, TTL: o.ttl,
		Etcd: o.etcd.Config(), AskEngine: o.askEngine}
	if o.askEngine {
		so.Given = map[string]string{}
		for flag, field := range learned {
			if o.fs != nil && o.fs.Changed(flag) {
				so.Given[field] = "--" + flag
			}
		}
	}
	if o.engineURL != "" && o.healthPath != "" {
		so.HealthURL = o.engineURL + o.healthPath
	}
	return so
}

func (o *sidecarOptions) Validate() error {
	if o.workerID == 0 {
		return fmt.Errorf("--worker-id: required (a stable id of your choosing)")
	}
	if o.askEngine && o.engineURL == "" {
		return fmt.Errorf("--engine-url: required to ask the engine (or --ask-engine=false and the values as flags)")
	}
	if o.model == "" && !o.askEngine {
		return fmt.Errorf("--model: required with --ask-engine=false")
	}
	if o.ttl < 2*time.Second {
		return fmt.Errorf("--ttl %v: etcd's minimum lease is 2s", o.ttl)
	}
	if err := o.etcd.Validate(); err != nil {
		return err
	}
	if o.askEngine {
		return nil // the record is complete once the engine said what it is
	}
	so := o.options()
	_, err := so.Record()
	return err
}

func newSidecarCommand() *cobra.Command {
	o := newSidecarOptions()
	cmd := &cobra.Command{
		Use:   "sidecar",
		Short: "Register an engine in the worker catalog and keep it there while it is healthy",
		Long: "sidecar runs next to a vLLM or SGLang engine started with KV events, e.g.\n\n" +
			"  VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --kv-events-config \\\n" +
			"    '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5600\"}'\n" +
			"  prefixd sidecar --worker-id 1 --engine-url http://127.0.0.1:8000\n\n" +
			"It asks the engine what it is (vLLM: GET /metrics vllm:cache_config_info, GET /v1/models and,\n" +
			"with VLLM_SERVER_DEV_MODE=1, GET /server_info; SGLang: GET /server_info): model, block size,\n" +
			"KV capacity, event endpoints, dp ranks, batch budget. Flags still win, but one that contradicts\n" +
			"the engine is refused, naming both values, and so is an engine with prefix caching off; the\n" +
			"record says where each value came from. Without the dev mode, vLLM does not say its event\n" +
			"endpoints: give --events-endpoint and --replay-endpoint.\n\n" +
			"It writes the worker's record under a lease (TTL --ttl), advertises a routable host for\n" +
			"wildcard endpoints, deregisters while the engine's health check fails, and revokes the\n" +
			"lease on exit. Flags can also be set as PREFIXD_<FLAG>.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			so := o.options()
			so.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return sidecar.Run(cmd.Context(), so)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
