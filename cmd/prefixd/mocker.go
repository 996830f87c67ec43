package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

type mockerOptions struct {
	etcd         etcdFlags
	model        string
	group        string
	role         string
	engines      int
	firstID      uint64
	blockSize    int
	totalBlocks  int
	host         string
	httpPort     int
	timing       mocker.Timing
	maxModelLen  int
	maxBodyBytes int64
	era          string
	layout       string
	dropLive     float64
	dropReplay   float64
	kvDomain     string
	topology     map[string]string
	ttl          time.Duration
	kvGroups     string
	groups       []mocker.Group // parsed from kvGroups by Validate
	register     bool
	flavor       string
	serverInfo   bool
	caching      bool
}

func newMockerOptions() *mockerOptions {
	return &mockerOptions{etcd: newEtcdFlags("http://127.0.0.1:2379"), model: "mock-model",
		group: catalog.DefaultRoutingGroup, role: string(catalog.RoleAggregated), engines: 1, firstID: 1, blockSize: 16,
		totalBlocks: 4096, host: "127.0.0.1", httpPort: 18000, timing: mocker.H100Llama8B.WithDefaults(),
		maxBodyBytes: mocker.DefaultMaxBodyBytes, era: "map", layout: "topic", ttl: catalog.DefaultSessionTTL,
		register: true, flavor: mocker.FlavorVLLM, serverInfo: true, caching: true}
}

func (o *mockerOptions) AddFlags(fs *pflag.FlagSet) {
	o.etcd.AddFlags(fs, "etcd client URLs of the catalog the engines register in")
	fs.StringVar(&o.model, "model", o.model, "model name the engines serve")
	fs.StringVar(&o.group, "routing-group", o.group, "routing group")
	fs.StringVar(&o.role, "role", o.role, "aggregated, prefill or decode")
	fs.IntVar(&o.engines, "engines", o.engines, "simulated engines to run in this process")
	fs.Uint64Var(&o.firstID, "first-worker-id", o.firstID, "worker id of the first engine; the others follow")
	fs.IntVar(&o.blockSize, "block-size", o.blockSize, "KV block size in tokens")
	fs.IntVar(&o.totalBlocks, "total-kv-blocks", o.totalBlocks, "KV cache capacity of each engine, in blocks")
	fs.StringVar(&o.host, "host", o.host, "address the engines bind and advertise")
	fs.IntVar(&o.httpPort, "http-port", o.httpPort, "HTTP port of the first engine (the OpenAI routes, POST /generate); the others follow (0: each picks a free port)")
	t := &o.timing
	fs.DurationVar(&t.StepOverhead, "step-overhead", t.StepOverhead, "fixed cost of each scheduler step (the timing defaults model Llama-3.1-8B on one H100)")
	fs.DurationVar(&t.PrefillPerToken, "prefill-per-token", t.PrefillPerToken, "cost of each uncached prompt token a step prefills")
	fs.DurationVar(&t.DecodePerSeq, "decode-per-token", t.DecodePerSeq, "cost of each running sequence a step decodes one token for")
	fs.IntVar(&t.MaxNumBatchedTokens, "max-num-batched-tokens", t.MaxNumBatchedTokens, "token budget of a step (vLLM's max_num_batched_tokens): decodes take 1, chunked prefills the rest")
	fs.IntVar(&t.MaxNumSeqs, "max-num-seqs", t.MaxNumSeqs, "sequences a step may run (vLLM's max_num_seqs)")
	fs.DurationVar(&t.TransferPerBlock, "kv-transfer-per-block", t.TransferPerBlock, "time to receive one KV block from a remote prefill")
	fs.Float64Var(&t.CrossDomainFactor, "kv-transfer-cross-domain-factor", t.CrossDomainFactor, "how many times slower a KV transfer from another KV-transfer domain value is")
	fs.IntVar(&o.maxModelLen, "max-model-len", o.maxModelLen, "longest prompt plus completion the OpenAI routes accept (0: what the KV pool holds)")
	fs.Int64Var(&o.maxBodyBytes, "max-body-bytes", o.maxBodyBytes, "largest HTTP request body an engine reads")
	fs.StringVar(&o.era, "era", o.era, "wire era: map (vLLM v0.26+) or array")
	fs.StringVar(&o.layout, "replay-layout", o.layout, "replay reply layout: topic (vLLM v0.26+) or legacy")
	fs.Float64Var(&o.dropLive, "drop-live", o.dropLive, "fault: fraction of live batches not sent")
	fs.Float64Var(&o.dropReplay, "drop-replay", o.dropReplay, "fault: fraction of replay messages not sent")
	fs.StringVar(&o.kvDomain, "kv-transfer-domain", o.kvDomain, "topology domain that constrains KV transfers (with --topology)")
	fs.StringToStringVar(&o.topology, "topology", o.topology, "topology domains, e.g. zone=a")
	fs.DurationVar(&o.ttl, "ttl", o.ttl, "registration lease TTL")
	fs.BoolVar(&o.register, "register", o.register, "register each engine in etcd under a lease; --register=false leaves registration to a sidecar (prefixd sidecar --engine-url)")
	fs.StringVar(&o.flavor, "flavor", o.flavor, "what the HTTP API describes the engine as: vllm (vllm:cache_config_info on /metrics, /server_info) or sglang (/server_info)")
	fs.BoolVar(&o.serverInfo, "server-info", o.serverInfo, "vllm flavor: serve GET /server_info?config_format=json, as vLLM does with VLLM_SERVER_DEV_MODE=1")
	fs.BoolVar(&o.caching, "prefix-caching", o.caching, "what the engine says of its prefix caching (--prefix-caching=false: says off, for testing a sidecar's refusal; the pool still caches)")
	fs.StringVar(&o.kvGroups, "kv-groups", o.kvGroups, "hybrid KV-cache layout in group_idx order, e.g. sliding_window:1024,full_attention (Gemma 3's groups); empty: one full-attention group")
	enum(fs, "role", "aggregated", "prefill", "decode")
	enum(fs, "era", "map", "array")
	enum(fs, "replay-layout", "topic", "legacy")
	enum(fs, "flavor", "vllm", "sglang")
}

func (o *mockerOptions) Validate() error {
	if len(o.etcd.endpoints) == 0 && o.register {
		return fmt.Errorf("--etcd-endpoints: required (or --register=false)")
	}
	if o.flavor != mocker.FlavorVLLM && o.flavor != mocker.FlavorSGLang {
		return fmt.Errorf("--flavor %q: want %s or %s", o.flavor, mocker.FlavorVLLM, mocker.FlavorSGLang)
	}
	if err := o.etcd.Validate(); err != nil {
		return err
	}
	switch {
	case o.engines < 1:
		return fmt.Errorf("--engines %d: at least 1", o.engines)
	case o.blockSize < 1 || o.totalBlocks < 1:
		return fmt.Errorf("--block-size and --total-kv-blocks must be positive")
	case o.era != "map" && o.era != "array":
		return fmt.Errorf("--era %q: want map or array", o.era)
	case o.layout != "topic" && o.layout != "legacy":
		return fmt.Errorf("--replay-layout %q: want topic or legacy", o.layout)
	case o.httpPort < 0 || o.httpPort+o.engines-1 > 65535:
		return fmt.Errorf("--http-port %d: engines need ports %d..%d", o.httpPort, o.httpPort, o.httpPort+o.engines-1)
	case o.dropLive < 0 || o.dropLive > 1 || o.dropReplay < 0 || o.dropReplay > 1:
		return fmt.Errorf("--drop-live and --drop-replay are fractions in [0, 1]")
	case o.maxModelLen < 0:
		return fmt.Errorf("--max-model-len %d: must not be negative", o.maxModelLen)
	case o.maxBodyBytes < 1:
		return fmt.Errorf("--max-body-bytes %d: must be positive", o.maxBodyBytes)
	}
	if err := validateTiming(o.timing); err != nil {
		return err
	}
	groups, err := mocker.ParseGroups(o.kvGroups)
	if err == nil {
		_, err = mocker.NewHybridPool(1, 1, groups)
	}
	if err != nil {
		return fmt.Errorf("--kv-groups %q: %w", o.kvGroups, err)
	}
	o.groups = groups
	return o.worker(0, max(o.httpPort, 1)).WithDefaults().Validate()
}

// validateTiming checks the timing flags, naming the flag at fault.
func validateTiming(t mocker.Timing) error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--step-overhead", t.StepOverhead}, {"--prefill-per-token", t.PrefillPerToken}, {"--decode-per-token", t.DecodePerSeq},
		{"--kv-transfer-per-block", t.TransferPerBlock}} {
		if d.v < 0 {
			return fmt.Errorf("%s %v: must not be negative", d.flag, d.v)
		}
	}
	switch {
	case t.MaxNumBatchedTokens < 1:
		return fmt.Errorf("--max-num-batched-tokens %d: at least 1", t.MaxNumBatchedTokens)
	case t.MaxNumSeqs < 1:
		return fmt.Errorf("--max-num-seqs %d: at least 1", t.MaxNumSeqs)
	case t.MaxNumBatchedTokens < t.MaxNumSeqs:
		return fmt.Errorf("--max-num-batched-tokens %d must be at least --max-num-seqs %d, as vLLM requires", t.MaxNumBatchedTokens, t.MaxNumSeqs)
	case !(t.CrossDomainFactor >= 1) || math.IsInf(t.CrossDomainFactor, 0):
		return fmt.Errorf("--kv-transfer-cross-domain-factor %v: want a finite factor of at least 1", t.CrossDomainFactor)
	}
	return t.Validate()
}

// worker is engine i's catalog record, serving HTTP on port; the engine
// fills in its ZMQ endpoints once bound.
func (o *mockerOptions) worker(i, port int) catalog.Worker {
	w := catalog.Worker{WorkerID: o.firstID + uint64(i), ModelName: o.model, RoutingGroup: o.group,
		Endpoint: "http://" + net.JoinHostPort(o.host, strconv.Itoa(port)), BlockSize: uint32(o.blockSize), DataParallelSize: 1,
		EventsEndpoint: "tcp://" + o.host + ":5557",
		Attributes:     catalog.Attributes{Role: catalog.Role(o.role), TopologyDomains: o.topology, KVTransferDomain: o.kvDomain},
	}
	if o.kvDomain != "" {
		w.KVTransferEnforcement = catalog.EnforcementRequired
	}
	return w
}

func newMockerCommand() *cobra.Command {
	o := newMockerOptions()
	cmd := &cobra.Command{
		Use:   "mocker",
		Short: "Run simulated engines that publish vLLM KV events and register in the catalog",
		Long: "mocker runs --engines simulated vLLM engines in one process. Each has a KV block pool with\n" +
			"prefix caching and LRU eviction and a continuous-batching scheduler timed like Llama-3.1-8B on\n" +
			"one H100 (--step-overhead, --prefill-per-token, --decode-per-token), publishes its cache changes\n" +
			"on a real ZMQ PUB with a replay ROUTER (the vLLM wire protocol), serves vLLM's OpenAI routes\n" +
			"(/v1/completions, /v1/chat/completions, /tokenize, /v1/models, with NIXL-style\n" +
			"kv_transfer_params for prefill/decode handoffs) and POST /generate {token_ids, max_tokens} on\n" +
			"its HTTP port, describes itself as vLLM does (vllm:cache_config_info on /metrics, /server_info)\n" +
			"or as SGLang does (--flavor sglang), and registers itself in etcd under a lease, as a sidecar\n" +
			"would (--register=false leaves that to `prefixd sidecar --engine-url`).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return runMocker(cmd.Context(), o, log)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runMocker(ctx context.Context, o *mockerOptions, log *slog.Logger) error {
	defer stoppedLine(ctx, log, "mocker stopped")()
	var reg catalog.Registrar // nil: the engines do not register
	if o.register {
		store, err := etcdstore.New(ctx, o.etcd.Config())
		if err != nil {
			return err
		}
		defer store.Close()
		reg = store
	}
	enc := wire.Encoder{}
	if o.era == "array" {
		enc = wire.Encoder{Era: wire.EraArray, Wide: true}
	}
	layout := mocker.ReplayTopic
	if o.layout == "legacy" {
		layout = mocker.ReplayLegacy
	}
	fl := mocker.NewFleet(ctx, reg, log)
	for i := 0; i < o.engines; i++ {
		port := 0
		if o.httpPort != 0 {
			port = o.httpPort + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(port)))
		if err != nil {
			return errors.Join(fmt.Errorf("engine %d: %w", o.firstID+uint64(i), err), fl.Stop())
		}
		cfg := mocker.Config{TotalBlocks: o.totalBlocks, BlockSize: o.blockSize, Groups: o.groups, Encoder: enc,
			Publisher: mocker.PublisherConfig{Endpoint: "tcp://" + o.host + ":0", ReplayEndpoint: "tcp://" + o.host + ":0",
				Layout: layout, DropLive: o.dropLive, DropReplay: o.dropReplay},
			Timing: o.timing, MaxModelLen: o.maxModelLen, MaxBodyBytes: o.maxBodyBytes, Log: log,
			Worker: o.worker(i, ln.Addr().(*net.TCPAddr).Port), LeaseTTL: o.ttl,
			Flavor: o.flavor, ServerInfo: o.serverInfo, PrefixCachingOff: !o.caching}
		addr := ln.Addr().String()
		if _, err := fl.Start(ctx, cfg, ln); err != nil {
			if ctx.Err() != nil { // shut down while starting: not a failure
				return fl.Stop()
			}
			return errors.Join(err, fl.Stop())
		}
		log.Info("mock engine", "worker", o.firstID+uint64(i), "http", addr)
	}
	select {
	case <-ctx.Done():
	case <-fl.Failed():
	}
	return fl.Stop()
}
