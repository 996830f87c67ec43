package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/events/zmtp"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/engineload"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/replica"
)

type serveOptions struct {
	etcd         etcdFlags
	probe        time.Duration
	dataDir      string
	embeddedURL  string
	listen       string
	apiToken     string
	readToken    string
	maxEntries   int
	indexShards  int
	peers        []string
	replays      int
	readyTimeout time.Duration
	noFastLane   bool
	disagg       disaggFlags
	temperature  float64
	predictedTTL time.Duration
	overlap      float64
	logLevel     string
	maxMessage   int64
	handshake    time.Duration
	maxRanks     int
	writeTimeout time.Duration
	dumpProgress time.Duration
	epp          eppFlags
	replica      replicaFlags
	engineLoad   engineLoadFlags
	queue        queueFlags
}

// queueFlags are the router queue's flags.
type queueFlags struct {
	threshold      float64
	order          string
	aging, maxWait time.Duration
	maxLen         int
	sessionTTL     time.Duration // session affinity, beside the queue
	maxSessions    int
}

// Bounds of the router queue's flags.
const (
	maxQueueThreshold = 100
	maxQueueLen       = 1 << 20
	maxQueueWait      = time.Hour
	maxSessions       = 1 << 22
)

// replicaFlags are booking sync's flags.
type replicaFlags struct {
	listen, advertise, id string
	leaseTTL              time.Duration
	spread                float64
}

// engineLoadFlags are the flags of the scrape of every engine's load.
type engineLoadFlags struct {
	interval, timeout time.Duration
	concurrency       int
	maxBody           int64
}

// eppFlags are the endpoint picker's flags.
type eppFlags struct {
	listen            string
	certFile, keyFile string
	selfSigned        bool
	group             string
	disagg            bool
	bodyMode          string
	fallbacks         int
	maxBody           int64
	bodyTimeout       time.Duration
	priorities        []string // name=N entries of --epp-objective-priority
}

// maxObjectives bounds --epp-objective-priority's entries.
const maxObjectives = 1024

// objectivePriorities parses --epp-objective-priority: name=N entries, N
// from -epp.MaxPriority to epp.MaxPriority, each name once. An error
// names the entry (clipped).
func (f *eppFlags) objectivePriorities() (map[string]int, error) {
	if len(f.priorities) > maxObjectives {
		return nil, fmt.Errorf("--epp-objective-priority: %d entries, at most %d", len(f.priorities), maxObjectives)
	}
	m := make(map[string]int, len(f.priorities))
	for _, e := range f.priorities {
		name, v, ok := strings.Cut(e, "=")
		name = strings.TrimSpace(name)
		p, err := strconv.Atoi(strings.TrimSpace(v))
		switch {
		case !ok || name == "" || err != nil:
			return nil, fmt.Errorf("--epp-objective-priority %q: want name=N, N an integer", clip.String(e))
		case p < -epp.MaxPriority || p > epp.MaxPriority:
			return nil, fmt.Errorf("--epp-objective-priority %q: priority %d, want %d to %d", clip.String(e), p, -epp.MaxPriority, epp.MaxPriority)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("--epp-objective-priority %q: objective %q given twice", clip.String(e), clip.String(name))
		}
		m[name] = p
	}
	return m, nil
}

// eppBodyModes are --epp-body-mode's values.
var eppBodyModes = map[string]filterv3.ProcessingMode_BodySendMode{
	"full-duplex": filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	"buffered":    filterv3.ProcessingMode_BUFFERED,
}

// maxEPPBody bounds --epp-max-body-bytes: a body is held whole while the
// picker decides.
const maxEPPBody = 256 << 20

func newServeOptions() *serveOptions {
	return &serveOptions{overlap: coordinator.DefaultOverlapWeight, etcd: newEtcdFlags(), probe: 30 * time.Second, dataDir: "prefixd-data", embeddedURL: "http://127.0.0.1:2379", listen: "127.0.0.1:8090", replays: 8,
		disagg: newDisaggFlags(), readyTimeout: time.Minute, logLevel: "info", maxMessage: zmtp.DefaultMaxMessageBytes, handshake: zmtp.DefaultHandshakeTimeout,
		maxRanks: daemon.DefaultMaxRanks, writeTimeout: daemon.DefaultCatalogWriteTimeout,
		dumpProgress: apiserver.DefaultDumpProgressTimeout,
		epp:          eppFlags{bodyMode: "full-duplex", fallbacks: 2, maxBody: 8 << 20, bodyTimeout: 30 * time.Second},
		replica:      replicaFlags{listen: "127.0.0.1:0", leaseTTL: replica.DefaultLeaseTTL, spread: coordinator.DefaultPeerSpread},
		engineLoad: engineLoadFlags{interval: 0, timeout: engineload.DefaultTimeout, concurrency: engineload.DefaultConcurrency,
			maxBody: engineload.DefaultMaxBodyBytes},
		queue: queueFlags{order: coordinator.QueueShortestWork.String(), aging: coordinator.DefaultQueueAging, maxLen: coordinator.DefaultQueueMaxLen,
			maxWait: coordinator.DefaultQueueMaxWait, maxSessions: coordinator.DefaultMaxSessions}}
}

func (o *serveOptions) AddFlags(fs *pflag.FlagSet) {
	o.etcd.AddFlags(fs, "etcd client URLs; empty runs an embedded etcd in --data-dir")
	fs.DurationVar(&o.probe, "probe-interval", o.probe, "after this long without a live batch from a worker rank, ask its replay endpoint for anything newer (finds a last batch the engine's PUB dropped)")
	fs.StringVar(&o.dataDir, "data-dir", o.dataDir, "directory for the embedded etcd's data")
	fs.StringVar(&o.embeddedURL, "embedded-etcd-url", o.embeddedURL, "client URL of the embedded etcd (without --etcd-endpoints); sidecars and mockers register there")
	fs.StringVar(&o.listen, "listen", o.listen, "HTTP listen address")
	fs.StringVar(&o.apiToken, "api-token", o.apiToken, "bearer token required by the endpoints that change the catalog or bookings and by GET /dump; sent to --peers (prefer PREFIXD_API_TOKEN)")
	fs.StringVar(&o.readToken, "read-token", o.readToken, "bearer token required by every other endpoint but /health and /ready (the API token works there too; prefer PREFIXD_READ_TOKEN)")
	fs.IntVar(&o.maxEntries, "index-max-entries", o.maxEntries, "cap on indexed (block, rank) entries; 0 = derived from the memory limit (half of it); -1 = no cap")
	fs.IntVar(&o.indexShards, "index-shards", o.indexShards, "trees each partition's ranks are spread over, written in parallel (0 = one per core, at most 8; see docs/index.md)")
	fs.StringSliceVar(&o.peers, "peers", o.peers, "other prefixd replicas: base URLs, or dns+http://host:port for every address host resolves to (a headless Service); the index is restored from the first ready one's /dump at start")
	o.disagg.AddFlags(fs)
	fs.Float64Var(&o.temperature, "temperature", o.temperature, "selection temperature: 0 picks the cheapest worker, > 0 samples a softmax")
	fs.Float64Var(&o.overlap, "overlap-weight", o.overlap, "the cost function's credit per cached block (Dynamo's overlap_score_weight, whose default is 1; a request's router_config_override still wins)")
	fs.DurationVar(&o.predictedTTL, "predicted-ttl", o.predictedTTL, "count a booking's prompt as cached on its worker for this long, until its KV events arrive (0 = off; docs/benchmarks.md measures it)")
	fs.DurationVar(&o.engineLoad.interval, "engine-load-interval", o.engineLoad.interval, fmt.Sprintf("read every engine's running and waiting requests and KV usage from its /metrics this often; selection counts that figure plus the bookings made since, and bookings alone for a rank whose figure is %d intervals old (0, the default = off: bookings alone; %v is a good start when other routers or clients reach the engines; docs/operations.md)", engineload.DefaultStaleIntervals, engineload.DefaultInterval))
	fs.DurationVar(&o.engineLoad.timeout, "engine-load-timeout", o.engineLoad.timeout, "the longest one engine /metrics scrape may take, the body read included")
	fs.IntVar(&o.engineLoad.concurrency, "engine-load-concurrency", o.engineLoad.concurrency, "engine /metrics scrapes running at once")
	fs.Int64Var(&o.engineLoad.maxBody, "engine-load-max-bytes", o.engineLoad.maxBody, "the largest engine /metrics body read; a bigger one is refused and counted")
	fs.IntVar(&o.replays, "max-concurrent-replays", o.replays, "replays running at once over all worker ranks; 0 = unbounded")
	fs.DurationVar(&o.writeTimeout, "catalog-write-timeout", o.writeTimeout, "longest wait for etcd of one POST /register or /unregister; past it they answer 503 with Retry-After")
	fs.DurationVar(&o.dumpProgress, "dump-progress-timeout", o.dumpProgress, "a GET /dump client that takes nothing of the dump for this long is cut off, freeing its slot")
	fs.IntVar(&o.maxRanks, "max-ranks", o.maxRanks, "worker ranks streamed, over all workers: POST /register refuses more (409); a record beyond it written to etcd directly is ignored until ranks leave; 0 = no cap")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", o.readyTimeout, "open /ready after this long even if some streams are still replaying")
	// The fast lane is gone; a command line that still asks for it is
	// told so rather than refused as an unknown flag.
	fs.BoolVar(&o.noFastLane, "no-fast-lane", false, "removed: net/http serves every route")
	fs.MarkHidden("no-fast-lane")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "debug, info, warn or error")
	fs.Int64Var(&o.maxMessage, "max-message-bytes", o.maxMessage, "largest KV-event message accepted from an engine; a bigger frame closes that connection before anything is allocated for it")
	fs.DurationVar(&o.handshake, "handshake-timeout", o.handshake, "an engine socket that has not completed the ZMTP handshake after this long is closed and retried")
	fs.StringVar(&o.epp.listen, "epp-listen", o.epp.listen, "serve the Gateway API Inference Extension's endpoint picker (Envoy ext_proc and gRPC health) on this address, e.g. :9002; empty = off")
	fs.StringVar(&o.epp.certFile, "epp-cert-file", o.epp.certFile, "the endpoint picker's TLS certificate (PEM; with --epp-key-file)")
	fs.StringVar(&o.epp.keyFile, "epp-key-file", o.epp.keyFile, "the endpoint picker's TLS key (PEM; with --epp-cert-file)")
	fs.BoolVar(&o.epp.selfSigned, "epp-self-signed", o.epp.selfSigned, "serve the endpoint picker over TLS with a certificate made in memory at start")
	fs.StringVar(&o.epp.group, "epp-routing-group", catalog.DefaultRoutingGroup, "the routing group the endpoint picker picks in")
	fs.StringVar(&o.epp.bodyMode, "epp-body-mode", o.epp.bodyMode, "the body mode the endpoint picker assumes when the gateway sends no protocol_config: full-duplex (FULL_DUPLEX_STREAMED, GIE's default) or buffered")
	fs.IntVar(&o.epp.fallbacks, "epp-fallbacks", o.epp.fallbacks, fmt.Sprintf("next-best endpoints the endpoint picker lists after the primary (0 to %d)", epp.MaxFallbacks))
	fs.Int64Var(&o.epp.maxBody, "epp-max-body-bytes", o.epp.maxBody, "the largest request body the endpoint picker reads (413 beyond)")
	fs.DurationVar(&o.epp.bodyTimeout, "epp-body-timeout", o.epp.bodyTimeout, "how long the endpoint picker waits from a request's headers to its body's end (408 beyond)")
	fs.StringSliceVar(&o.epp.priorities, "epp-objective-priority", o.epp.priorities, fmt.Sprintf("router-queue priorities of the gateway's InferenceObjectives (x-gateway-inference-objective), name=N,… with N from %d to %d, higher first (an objective not listed: 0; x-prefixd-priority wins)", -epp.MaxPriority, epp.MaxPriority))
	fs.BoolVar(&o.epp.disagg, "epp-disagg", o.epp.disagg, "the endpoint picker books decode-first plans (--disagg-order, --disagg-policy, …): the decode engine is the destination, the prefill engine goes in x-prefiller-host-port")
	fs.StringVar(&o.replica.listen, "replica-sync-listen", o.replica.listen, "share bookings with the other replicas on the same etcd over a gRPC stream on this address (port 0 picks one; \"off\" = no sharing); for replicas on other hosts listen on a reachable address and set --replica-advertise")
	fs.StringVar(&o.replica.advertise, "replica-advertise", o.replica.advertise, "the host:port other replicas dial for this one's bookings (default: the sync listener's address; required when it listens on all interfaces, e.g. $(POD_IP):8092)")
	fs.StringVar(&o.replica.id, "replica-id", o.replica.id, "this replica's name in etcd and in peers' metrics (default: host name and process id)")
	fs.Float64Var(&o.replica.spread, "peer-spread", o.replica.spread, "while other replicas share their bookings, pick among engines that cost about the same at random, weighted by exp(−Δcost / (spread × the prompt's blocks)): replicas routing requests that arrive together then do not all pick the same engine (0 = always the cheapest; docs/operations.md)")
	fs.DurationVar(&o.replica.leaseTTL, "replica-lease-ttl", o.replica.leaseTTL, "the replica record's lease: a replica killed without a word leaves the others (with its bookings) within it")
	fs.Float64Var(&o.queue.threshold, "queue-threshold", o.queue.threshold, "router queue: a request that may wait (an API call with \"wait\", prefixd proxy's and the endpoint picker's) waits in prefixd while every engine of its pool holds more booked prefill than this × its max_num_batched_tokens, and is placed when one frees (0, the default = no queue; 0.5 is what the routing bench measured; docs/operations.md)")
	fs.StringVar(&o.queue.order, "queue-order", o.queue.order, "the router queue's order within a priority: fcfs (arrival) or shortest-work (least uncached prefill first, with --queue-aging)")
	fs.DurationVar(&o.queue.aging, "queue-aging", o.queue.aging, "shortest-work: a request that has waited this long is no longer overtaken by younger requests of its priority")
	fs.IntVar(&o.queue.maxLen, "queue-max-len", o.queue.maxLen, "requests a pool's router queue holds; past it the lowest priority is answered 429 with Retry-After")
	fs.DurationVar(&o.queue.maxWait, "queue-max-wait", o.queue.maxWait, "the longest a request waits in the router queue (a request's wait.timeout_ms may be shorter); past it a 429 with Retry-After")
	fs.DurationVar(&o.queue.sessionTTL, "session-ttl", o.queue.sessionTTL, "session affinity: a request naming a session (session_id, the proxy's x-session-id, OpenAI user) goes back to its session's worker, used within this long, while that worker is not busy (0 = off; the routing bench measured 2m best)")
	fs.IntVar(&o.queue.maxSessions, "max-sessions", o.queue.maxSessions, "sessions remembered for --session-ttl, least recently used dropped first")
	enum(fs, "log-level", "debug", "info", "warn", "error")
	enum(fs, "epp-body-mode", "full-duplex", "buffered")
	enum(fs, "queue-order", "fcfs", "shortest-work")
}

func (o *serveOptions) Validate() error {
	if o.noFastLane {
		return fmt.Errorf("--no-fast-lane: the fast lane was removed and net/http serves every route; drop the flag")
	}
	if o.indexShards < 0 || o.indexShards > indexer.MaxShards {
		return fmt.Errorf("--index-shards %d: want 0 (one per core) to %d", o.indexShards, indexer.MaxShards)
	}
	if o.maxEntries < -1 {
		return fmt.Errorf("--index-max-entries %d: want a count, 0 (from memory) or -1 (no cap)", o.maxEntries)
	}
	if u, err := url.Parse(o.embeddedURL); err != nil || u.Scheme != "http" || u.Port() == "" {
		return fmt.Errorf("--embedded-etcd-url %q: want http://host:port", o.embeddedURL)
	}
	if o.probe < time.Second {
		return fmt.Errorf("--probe-interval %v: must be at least 1s", o.probe)
	}
	if o.readyTimeout <= 0 {
		return fmt.Errorf("--ready-timeout %v: must be positive", o.readyTimeout)
	}
	if o.maxMessage < 1<<10 {
		return fmt.Errorf("--max-message-bytes %d: must be at least 1024", o.maxMessage)
	}
	if o.writeTimeout <= 0 {
		return fmt.Errorf("--catalog-write-timeout %v: must be positive", o.writeTimeout)
	}
	if o.dumpProgress <= 0 {
		return fmt.Errorf("--dump-progress-timeout %v: must be positive", o.dumpProgress)
	}
	if o.maxRanks < 0 {
		return fmt.Errorf("--max-ranks %d: want a count of ranks, or 0 (no cap)", o.maxRanks)
	}
	if o.handshake <= 0 {
		return fmt.Errorf("--handshake-timeout %v: must be positive", o.handshake)
	}
	if (o.epp.certFile == "") != (o.epp.keyFile == "") {
		return fmt.Errorf("--epp-cert-file and --epp-key-file: give both or neither")
	}
	if o.epp.selfSigned && o.epp.certFile != "" {
		return fmt.Errorf("--epp-self-signed and --epp-cert-file: give one or the other")
	}
	if o.epp.listen == "" && (o.epp.selfSigned || o.epp.certFile != "" || o.epp.disagg) {
		return fmt.Errorf("--epp-self-signed, --epp-cert-file and --epp-disagg need --epp-listen")
	}
	if o.epp.group == "" {
		return fmt.Errorf("--epp-routing-group: must not be empty")
	}
	if _, ok := eppBodyModes[o.epp.bodyMode]; !ok {
		return fmt.Errorf("--epp-body-mode %q: want full-duplex or buffered", clip.String(o.epp.bodyMode))
	}
	if o.epp.fallbacks < 0 || o.epp.fallbacks > epp.MaxFallbacks {
		return fmt.Errorf("--epp-fallbacks %d: want 0 to %d", o.epp.fallbacks, epp.MaxFallbacks)
	}
	if o.epp.maxBody < 1<<10 || o.epp.maxBody > maxEPPBody {
		return fmt.Errorf("--epp-max-body-bytes %d: want 1024 to %d", o.epp.maxBody, maxEPPBody)
	}
	if o.epp.bodyTimeout <= 0 {
		return fmt.Errorf("--epp-body-timeout %v: must be positive", o.epp.bodyTimeout)
	}
	if _, err := o.epp.objectivePriorities(); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	if _, err := o.disagg.coordinator(); err != nil {
		return err
	}
	if !(o.overlap >= 0) || math.IsInf(o.overlap, 0) {
		return fmt.Errorf("--overlap-weight %v: want a finite weight ≥ 0", o.overlap)
	}
	if o.predictedTTL < 0 || o.predictedTTL > time.Hour {
		return fmt.Errorf("--predicted-ttl %v: want 0 (off) to 1h", o.predictedTTL)
	}
	if o.engineLoad.interval < 0 || (o.engineLoad.interval > 0 && o.engineLoad.interval < 10*time.Millisecond) || o.engineLoad.interval > time.Hour {
		return fmt.Errorf("--engine-load-interval %v: want 0 (off) or 10ms to 1h", o.engineLoad.interval)
	}
	if o.engineLoad.timeout <= 0 {
		return fmt.Errorf("--engine-load-timeout %v: must be positive", o.engineLoad.timeout)
	}
	if o.engineLoad.concurrency < 1 || o.engineLoad.concurrency > 1024 {
		return fmt.Errorf("--engine-load-concurrency %d: want 1 to 1024", o.engineLoad.concurrency)
	}
	if o.engineLoad.maxBody < 1<<10 || o.engineLoad.maxBody > 1<<30 {
		return fmt.Errorf("--engine-load-max-bytes %d: want 1024 to %d", o.engineLoad.maxBody, 1<<30)
	}
	if o.temperature < 0 {
		return fmt.Errorf("--temperature %v: must not be negative", o.temperature)
	}
	if err := o.replica.Validate(); err != nil {
		return err
	}
	if err := o.queue.Validate(); err != nil {
		return err
	}
	for _, p := range o.peers {
		u, err := url.Parse(strings.TrimPrefix(p, "dns+"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--peers %q: want http://host:port or dns+http://host:port", p)
		}
	}
	return o.etcd.Validate()
}

func newServeCommand() *cobra.Command {
	o := newServeOptions()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon: worker catalog (etcd), KV-event streams, prefix index and HTTP API",
		Long: "serve watches the worker catalog in etcd (an embedded etcd when --etcd-endpoints is empty),\n" +
			"subscribes to every worker rank's KV-event stream with verified replay, keeps the prefix\n" +
			"index, and serves the HTTP API (Dynamo standalone indexer compatible) on --listen.\n" +
			"Every flag can also be set as PREFIXD_<FLAG>, e.g. PREFIXD_ETCD_ENDPOINTS.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			var lvl slog.Level
			_ = lvl.UnmarshalText([]byte(o.logLevel))
			coord, _ := o.disagg.coordinator() // validated
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			priorities, _ := o.epp.objectivePriorities() // validated
			return daemon.Run(cmd.Context(), daemon.Config{Etcd: o.etcd.Config(), DataDir: o.dataDir, EmbeddedURL: o.embeddedURL, Listen: o.listen,
				APIToken: o.apiToken, ReadToken: o.readToken, MaxEntries: o.maxEntries, IndexShards: o.indexShards, Peers: o.peers, MaxConcurrentReplays: concurrency(o.replays), MaxRanks: concurrency(o.maxRanks), CatalogWriteTimeout: o.writeTimeout, DumpProgressTimeout: o.dumpProgress,
				EPP: daemon.EPPConfig{Listen: o.epp.listen, TLS: epp.TLS{CertFile: o.epp.certFile, KeyFile: o.epp.keyFile, SelfSigned: o.epp.selfSigned},
					Group: o.epp.group, Disagg: o.epp.disagg, BodyMode: eppBodyModes[o.epp.bodyMode], Fallbacks: cmp.Or(o.epp.fallbacks, -1),
					MaxBodyBytes: o.epp.maxBody, BodyTimeout: o.epp.bodyTimeout, Priorities: priorities},
				Replica: o.replica.config(),
				Queue:   o.queue.config(), SessionTTL: o.queue.sessionTTL, MaxSessions: o.queue.maxSessions,
				EngineLoad:  engineload.Config{Interval: o.engineLoad.interval, Timeout: o.engineLoad.timeout, Concurrency: o.engineLoad.concurrency, MaxBodyBytes: o.engineLoad.maxBody},
				Coordinator: coord, Temperature: o.temperature, PredictedTTL: o.predictedTTL, OverlapWeight: &o.overlap, PeerSpread: &o.replica.spread, ReadyTimeout: o.readyTimeout, Logger: log,
				Subscriber: stream.SubscriberConfig{ProbeInterval: o.probe, Limits: zmtp.Limits{MaxMessageBytes: o.maxMessage, HandshakeTimeout: o.handshake}}})
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// Validate checks the booking-sync flags.
func (r replicaFlags) Validate() error {
	if !(r.spread >= 0) || r.spread > 100 {
		return fmt.Errorf("--peer-spread %v: want 0 to 100", r.spread)
	}
	if r.listen == "off" || r.listen == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(r.listen)
	if err != nil {
		return fmt.Errorf("--replica-sync-listen %q: want host:port or off", clip.String(r.listen))
	}
	if r.advertise == "" {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("--replica-sync-listen %q listens on every interface: set --replica-advertise to the address other replicas dial (e.g. $(POD_IP):8092)", r.listen)
		}
	} else if h, p, err := net.SplitHostPort(r.advertise); err != nil || h == "" || p == "" || p == "0" {
		return fmt.Errorf("--replica-advertise %q: want host:port", clip.String(r.advertise))
	}
	if r.leaseTTL < time.Second || r.leaseTTL > 5*time.Minute {
		return fmt.Errorf("--replica-lease-ttl %v: want 1s to 5m", r.leaseTTL)
	}
	return nil
}

func (r replicaFlags) config() daemon.ReplicaConfig {
	if r.listen == "off" {
		return daemon.ReplicaConfig{}
	}
	return daemon.ReplicaConfig{Listen: r.listen, Advertise: r.advertise, ID: r.id, LeaseTTL: r.leaseTTL}
}

// concurrency maps a flag whose 0 means unbounded (--max-concurrent-replays,
// --max-ranks) onto daemon.Config's field (0 = default, negative =
// unbounded).
func concurrency(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// Validate checks the router queue's flags.
func (q queueFlags) Validate() error {
	if !(q.threshold >= 0) || q.threshold > maxQueueThreshold {
		return fmt.Errorf("--queue-threshold %v: want 0 (no queue) to %d", q.threshold, maxQueueThreshold)
	}
	if _, err := coordinator.ParseQueueOrder(q.order); err != nil {
		return fmt.Errorf("--queue-order %q: want fcfs or shortest-work", clip.String(q.order))
	}
	if q.aging <= 0 || q.aging > maxQueueWait {
		return fmt.Errorf("--queue-aging %v: want more than 0 to %v", q.aging, maxQueueWait)
	}
	if q.maxLen < 1 || q.maxLen > maxQueueLen {
		return fmt.Errorf("--queue-max-len %d: want 1 to %d", q.maxLen, maxQueueLen)
	}
	if q.maxWait <= 0 || q.maxWait > maxQueueWait {
		return fmt.Errorf("--queue-max-wait %v: want more than 0 to %v", q.maxWait, maxQueueWait)
	}
	if q.sessionTTL < 0 || q.sessionTTL > 24*time.Hour {
		return fmt.Errorf("--session-ttl %v: want 0 (off) to 24h", q.sessionTTL)
	}
	if q.maxSessions < 1 || q.maxSessions > maxSessions {
		return fmt.Errorf("--max-sessions %d: want 1 to %d", q.maxSessions, maxSessions)
	}
	return nil
}

// config is the daemon's queue configuration (validated flags).
func (q queueFlags) config() daemon.QueueConfig {
	order, _ := coordinator.ParseQueueOrder(q.order)
	return daemon.QueueConfig{Threshold: q.threshold,
		Queue: coordinator.QueueConfig{Order: order, Aging: q.aging, MaxLen: q.maxLen, MaxWait: q.maxWait}}
}
