package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/engineload"
	"github.com/prefixd/prefixd/internal/epp"
	"github.com/prefixd/prefixd/internal/leaf/httpserve"
	"github.com/prefixd/prefixd/internal/peer"
	"github.com/prefixd/prefixd/internal/replica"
)

// Config configures a daemon. Zero fields take the defaults noted.
type Config struct {
	// Etcd is the catalog's etcd; no Endpoints means an embedded etcd in
	// DataDir (default ./prefixd-data) on EmbeddedURL.
	Etcd    etcdstore.Config
	DataDir string
	// EmbeddedURL is the embedded etcd's client URL (default: a free loopback
	// port). Sidecars and mock engines on the same host register there.
	EmbeddedURL string
	// Listen is the HTTP address (default 127.0.0.1:8090; port 0 picks one).
	Listen string
	// APIToken, when set, guards the endpoints that change the catalog
	// or bookings, and GET /dump; peers are sent it for their /dump.
	APIToken string
	// ReadToken, when set, guards every other endpoint but /health and
	// /ready (the API token works there too).
	ReadToken string
	// MaxEntries caps indexed (block, rank) entries: 0 derives the cap
	// from the memory the process may use (half of it, at
	// indexer.MemoryPerEntry each); negative means no cap.
	MaxEntries int
	// IndexShards is the index's shards per partition (indexer.Options.Shards;
	// 0: indexer.DefaultShards).
	IndexShards int
	// Index, when set, is the index to fill (MaxEntries is then ignored);
	// the demo reads it in-process to check it against the engines.
	Index *indexer.Index
	// Peers are other prefixd replicas (base URLs): the daemon restores its
	// index from the first healthy one's /dump before it serves.
	Peers []string
	// ReadyTimeout opens /ready even if some streams have not finished
	// their initial replay (default 60 s).
	ReadyTimeout time.Duration
	// ShutdownTimeout bounds draining in-flight HTTP requests (default 10 s).
	ShutdownTimeout time.Duration
	// MaxConcurrentReplays bounds replay attempts running at once over all
	// streams (default 8; negative = unbounded).
	MaxConcurrentReplays int
	Subscriber           stream.SubscriberConfig
	Logger               *slog.Logger
	// Registry receives every metric; nil makes a new one.
	Registry *prometheus.Registry
	// OnReady, if set, is called once with the HTTP address when the
	// daemon serves (tests use it to find a port-0 listener).
	OnReady func(httpAddr string)
	// Coordinator configures disaggregated plans (order, prefill-failure
	// policy, conditional-disaggregation policy); the zero value is
	// decode-first, free_decode, policy off.
	Coordinator coordinator.CoordinatorConfig
	// Temperature is the default selection temperature (0 = argmin).
	Temperature float64
	// OverlapWeight is the cost function's default credit per cached
	// block; nil is coordinator.DefaultOverlapWeight.
	OverlapWeight *float64
	// PeerSpread is the pools' coordinator.PoolConfig.PeerSpread, in force
	// while peer replicas share bookings; nil is
	// coordinator.DefaultPeerSpread.
	PeerSpread *float64
	// CatalogWriteTimeout bounds each catalog write of POST /register and
	// POST /unregister, compare-and-swap retries included (default
	// DefaultCatalogWriteTimeout): while etcd does not answer, they answer
	// 503 then instead of waiting for it.
	CatalogWriteTimeout time.Duration
	// DumpProgressTimeout bounds each write of a GET /dump: a client that
	// takes nothing for that long is cut off (0:
	// apiserver.DefaultDumpProgressTimeout).
	DumpProgressTimeout time.Duration
	// MaxRanks caps the worker ranks streamed, over all workers (0:
	// DefaultMaxRanks; negative: no cap). POST /register refuses a
	// registration that would take the catalog beyond it (409); a record
	// beyond it written to etcd directly (a sidecar's) is ignored until
	// ranks leave (rankCap).
	MaxRanks int
	// EPP, when its Listen is set, serves the Gateway API Inference
	// Extension's endpoint picker (package epp) beside the HTTP API,
	// sharing the coordinator.
	EPP EPPConfig
	// Replica, when its Listen is set, shares bookings with the other
	// replicas on the same etcd (package replica).
	Replica ReplicaConfig
	// PredictedTTL, when positive, turns booking predictions on: every
	// booking's prompt counts as cached on its worker for this long, or
	// until the worker's events arrive (indexer.Predictions); /query
	// shows them apart.
	PredictedTTL time.Duration
	// EngineLoad configures the scrape of every engine's /metrics for its
	// own load (package engineload), which selection counts with the
	// bookings made since (coordinator.EngineLoad). An Interval of 0
	// scrapes nothing: selection counts bookings alone (prefixd serve's
	// --engine-load-interval default: on the routing bench, engine
	// figures do not help replicas agree and cost one router's TTFT).
	// Logger and Registry are the daemon's.
	EngineLoad engineload.Config
	// Queue configures the router queue; Threshold 0 = no queue (the default).
	Queue QueueConfig
	// SessionTTL turns session affinity on: a request naming a session
	// goes back to its session's worker, used within SessionTTL, while
	// that worker is under the busy thresholds (coordinator
	// ServiceConfig.SessionTTL). 0 (the default): off. MaxSessions bounds
	// the sessions remembered (0: coordinator's default).
	SessionTTL  time.Duration
	MaxSessions int
}

// EPPConfig configures the endpoint picker.
type EPPConfig struct {
	// Listen is the gRPC address ("" = no picker; port 0 picks one).
	Listen string
	TLS    epp.TLS
	// Group is the routing group picked in (default "default").
	Group string
	// Disagg books decode-first plans (Config.Coordinator's order and
	// policy); the destination is the decode engine.
	Disagg bool
	// BodyMode, Fallbacks, MaxBodyBytes and BodyTimeout are epp.Config's
	// (zero: its defaults).
	BodyMode     filterv3.ProcessingMode_BodySendMode
	Fallbacks    int
	MaxBodyBytes int64
	BodyTimeout  time.Duration
	// Priorities is epp.Config's: router-queue priorities by objective.
	Priorities map[string]int
	// OnReady, if set, is called with the picker's address when it serves.
	OnReady func(addr string)
	// Server, if set, is called with the picker (tests read its bookings).
	Server func(*epp.Server)
}

// ReplicaConfig configures booking sync between replicas.
type ReplicaConfig struct {
	// Listen is the sync gRPC address ("" = no sync; port 0 picks one).
	Listen string
	// Advertise is the host:port peers dial (default: the listener's
	// address, which needs a specified host).
	Advertise string
	// ID names the replica (default: host name and process id).
	ID string
	// LeaseTTL is the replica record's lease (default
	// replica.DefaultLeaseTTL): a replica killed without a word leaves
	// its peers within it.
	LeaseTTL time.Duration
	// Resync lists the replica records this often besides the watch
	// (default replica.DefaultResync).
	Resync time.Duration

	// store, if set, wraps the replica records' store (tests: one that
	// never revokes its lease is a replica killed with SIGKILL).
	store func(catalog.ReplicaStore) catalog.ReplicaStore
}

// Run runs the daemon until ctx ends: (embedded) etcd, the catalog watch,
// one stream per worker rank into the index, and the HTTP API. Shutdown
// order: stop accepting HTTP and drain in-flight requests, stop the
// catalog watch, stop the streams (closing their sockets), close the etcd
// client, stop the embedded etcd.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8090"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = time.Minute
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	started := time.Now()
	// stopping is when shutdown began; the line saying it ended is logged
	// last, after the embedded etcd and the data dir's lock are released.
	var stopping time.Time
	defer func() {
		if !stopping.IsZero() {
			log.Info("prefixd stopped", "took", time.Since(stopping).Round(time.Millisecond))
		}
	}()

	etcdCfg := cfg.Etcd
	if len(etcdCfg.Endpoints) == 0 {
		dir := cfg.DataDir
		if dir == "" {
			dir = "prefixd-data"
		}
		lock, err := lockDataDir(dir)
		if err != nil {
			return err
		}
		defer lock.Close()
		dir = filepath.Join(dir, "etcd")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("embedded etcd data dir: %w", err)
		}
		emb, err := etcdstore.StartEmbedded(ctx, etcdstore.EmbeddedConfig{Dir: dir, ClientURL: cfg.EmbeddedURL})
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("embedded etcd: %s is in use (another prefixd or etcd?): pass --embedded-etcd-url with a free port, or --etcd-endpoints to use that etcd: %w", cfg.EmbeddedURL, err)
		}
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer emb.Close()
		etcdCfg.Endpoints = emb.Endpoints()
		log.Info("no --etcd-endpoints: running an embedded etcd", "endpoints", etcdCfg.Endpoints, "data_dir", dir)
	}
	store, err := etcdstore.New(ctx, etcdCfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer store.Close()

	ix := cfg.Index
	if ix == nil {
		maxEntries := cfg.MaxEntries
		switch {
		case maxEntries < 0:
			maxEntries = 0
			log.Info("index cap off (--index-max-entries -1)")
		case maxEntries == 0:
			mem, source := memoryLimit("/")
			maxEntries = indexer.MaxEntriesForMemory(mem / 2)
			log.Info("index cap from memory: half of the memory limit", "max_entries", maxEntries, "memory_limit_bytes", mem, "from", source)
		}
		ix = indexer.New(indexer.Options{MaxEntries: maxEntries, Shards: cfg.IndexShards})
		log.Info("index shards: each partition's ranks spread over this many trees, written in parallel", "shards", ix.Options().Shards)
	}
	reg.MustRegister(NewIndexCollector(ix, ix.MaxEntries()))
	if len(cfg.Peers) > 0 {
		bctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
		from, err := peer.Bootstrap(bctx, cfg.Peers, ix, nil, cfg.APIToken, log)
		cancel()
		if err != nil {
			log.Warn("starting without a peer's index; streams replay from the engines", "err", err)
		} else {
			entries := 0
			for _, ps := range ix.Stats() {
				entries += ps.Entries
			}
			log.Info("index restored from peer", "peer", from, "partitions", len(ix.Partitions()), "entries", entries)
		}
	}
	// Listen before anything long-lived starts, so a taken port fails
	// with nothing to stop.
	ln, err := net.Listen("tcp", cfg.Listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listen %s: the address is in use (another prefixd?): pass --listen with a free port: %w", cfg.Listen, err)
	}
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close() // a no-op once the server has it
	var syncLn net.Listener
	var hub *replica.Hub
	replicaID := cfg.Replica.ID
	if cfg.Replica.Listen != "" {
		if syncLn, err = net.Listen("tcp", cfg.Replica.Listen); err != nil {
			return fmt.Errorf("listen %s (--replica-sync-listen): %w", cfg.Replica.Listen, err)
		}
		defer syncLn.Close()
		hub = replica.NewHub(0)
		if replicaID == "" {
			host, _ := os.Hostname()
			replicaID = fmt.Sprintf("%s-%d", cmp.Or(host, "prefixd"), os.Getpid())
		}
	}
	var eppLn net.Listener
	if cfg.EPP.Listen != "" {
		if eppLn, err = net.Listen("tcp", cfg.EPP.Listen); err != nil {
			return fmt.Errorf("listen %s (--epp-listen): %w", cfg.EPP.Listen, err)
		}
		defer eppLn.Close()
	}
	subCfg := cfg.Subscriber
	if subCfg.Metrics == nil {
		subCfg.Metrics = stream.NewMetrics(reg)
	}
	if subCfg.Logger == nil {
		subCfg.Logger = log
	}
	if subCfg.ReplaySlots == nil {
		n := cfg.MaxConcurrentReplays
		if n == 0 {
			n = 8
		}
		subCfg.ReplaySlots = stream.NewReplaySlots(n, 0)
	}
	streams := stream.NewManager(ix, subCfg, log)
	pcfg := coordinator.DefaultPoolConfig()
	pcfg.Options = coordinator.ServedOptions()
	if cfg.OverlapWeight != nil {
		pcfg.Options.OverlapCredit = *cfg.OverlapWeight
	}
	pcfg.Options.Temperature = cfg.Temperature
	pcfg.PeerSpread = coordinator.DefaultPeerSpread
	if cfg.PeerSpread != nil {
		pcfg.PeerSpread = *cfg.PeerSpread
	}
	var pred *indexer.Predictions
	if cfg.PredictedTTL > 0 {
		pred = indexer.NewPredictions(cfg.PredictedTTL, 0, 0)
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_predicted_entries",
			Help: "Booking predictions held: (block, rank) entries a booked worker is about to hold."}, func() float64 { return float64(pred.Len()) }))
	}
	queue, err := cfg.Queue.queueConfig()
	if err != nil {
		return fmt.Errorf("router queue: %w", err)
	}
	qm := newQueueMetrics(reg)
	svcCfg := coordinator.ServiceConfig{Pool: pcfg, Coordinator: cfg.Coordinator, Source: coordinator.IndexOverlaps{Index: ix},
		Predicted: pred, Observer: newPlanMetrics(reg), SessionTTL: cfg.SessionTTL, MaxSessions: cfg.MaxSessions}
	if queue != nil {
		svcCfg.Queue, svcCfg.QueueObserver = queue, qm
		svcCfg.QueueBusy = coordinator.Thresholds{PrefillTokensFrac: cfg.Queue.Threshold}
	}
	if hub != nil {
		svcCfg.Origin, svcCfg.OnBooking = replicaID, hub.Booked
	}
	svc := coordinator.NewService(svcCfg)
	if cfg.SessionTTL > 0 {
		registerSessionMetrics(reg, svc)
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_reservations_live",
		Help: "Reservations every pool holds: /select_and_reserve bookings and the plans' bookings, made here or by a peer replica (prefixd_replica_peer_bookings of them are peers')."}, func() float64 { return float64(svc.Reservations()) }))
	maxRanks := cfg.MaxRanks
	switch {
	case maxRanks == 0:
		maxRanks = DefaultMaxRanks
	case maxRanks < 0:
		maxRanks = 0
	}
	view := newWorkerView(store, ix, streams, svc, maxRanks, log)
	if eppLn != nil {
		view.endpoints = epp.NewEndpoints(log, 0)
	}
	view.writeTimeout = cmp.Or(cfg.CatalogWriteTimeout, DefaultCatalogWriteTimeout)
	reg.MustRegister(view.collectors()...)
	badRecords := prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_catalog_bad_records_total",
		Help: "Worker records in etcd that failed to decode or validate, ignored."})
	reg.MustRegister(badRecords)

	g, gctx := errgroup.WithContext(ctx)
	// The streams outlive the HTTP server and the watch: they stop last.
	streamsCtx, stopStreams := context.WithCancel(context.WithoutCancel(gctx))
	defer stopStreams()
	streamsDone := make(chan error, 1)
	go func() { streamsDone <- streams.Run(streamsCtx) }()

	watcher := catalog.NewWatcher(store, catalog.WatcherConfig{
		Logger:   log,
		OnChange: view.apply, // returns at once: streams start and stop on their own goroutine
		// The watcher logs each bad record (clipped); here it is counted.
		OnBadRecord: func(string, error) { badRecords.Inc() },
	})
	reg.MustRegister(newCatalogCollector(store.Ping, watcher.Stats))
	var peers *replica.Sync
	if syncLn != nil {
		advertise := cmp.Or(cfg.Replica.Advertise, syncLn.Addr().String())
		var rs catalog.ReplicaStore = store
		if cfg.Replica.store != nil {
			rs = cfg.Replica.store(rs)
		}
		if peers, err = replica.New(replica.Config{ID: replicaID, Advertise: advertise, Listener: syncLn, Service: svc, Hub: hub, Store: rs,
			LeaseTTL: cfg.Replica.LeaseTTL, Resync: cfg.Replica.Resync, Logger: log, Synced: watcher.Synced()}); err != nil {
			return fmt.Errorf("--replica-advertise: %w", err)
		}
		reg.MustRegister(peers.Collector())
	}
	g.Go(func() error { return watcher.Run(gctx) })
	g.Go(func() error {
		select {
		case <-watcher.Synced():
			streams.Prune() // the catalog is known: drop restored ranks no worker wants
			log.Info("catalog synced", "workers", watcher.Stats().Workers, "revision", watcher.Stats().Revision)
		case <-gctx.Done():
		}
		return nil
	})
	g.Go(func() error { return svc.Run(gctx, ExpireInterval) })
	if queue != nil {
		log.Info("router queue on: requests that may wait wait while every engine of their pool is busy",
			"threshold", cfg.Queue.Threshold, "order", queue.Order.String(), "aging", queue.Aging,
			"max_len", queue.MaxLen, "max_wait", queue.MaxWait, "bands", len(queue.Bands))
		g.Go(func() error { return qm.runLog(gctx, log, shedLogInterval) })
	}
	if cfg.SessionTTL > 0 {
		log.Info("session affinity on: a request naming a session goes back to its worker while that worker is not busy",
			"ttl", cfg.SessionTTL, "max_sessions", cmp.Or(cfg.MaxSessions, coordinator.DefaultMaxSessions))
	}
	if peers != nil {
		// It stops with the others: its record is revoked, so the peers
		// drop this replica's bookings at once.
		g.Go(func() error { return peers.Run(gctx) })
	}
	if cfg.EngineLoad.Interval > 0 {
		elc := cfg.EngineLoad
		elc.Logger, elc.Registry = log, reg
		scraper := engineload.New(elc, view.engineTargets, svc)
		elc = scraper.Config()
		log.Info("reading every engine's load from its /metrics", "interval", elc.Interval, "stale_after", elc.StaleAfter,
			"timeout", elc.Timeout, "concurrency", elc.Concurrency, "max_body_bytes", elc.MaxBodyBytes)
		g.Go(func() error { return scraper.Run(gctx) })
	} else {
		log.Info("engine load not read (--engine-load-interval 0): selection counts this replica's bookings alone")
	}

	var wasReady atomic.Bool
	ready := func() (bool, string) {
		select {
		case <-watcher.Synced():
		default:
			return false, "catalog not synced yet"
		}
		if wasReady.Load() || streams.Synced() || time.Since(started) > cfg.ReadyTimeout {
			wasReady.Store(true) // ready once, ready for good: a worker joining later must not fail the probe
			return true, ""
		}
		return false, "streams still replaying"
	}
	handler := apiserver.NewHandler(apiserver.Config{
		Index: ix, Predicted: pred, Workers: view, Selector: svc, Ready: ready, APIToken: cfg.APIToken, ReadToken: cfg.ReadToken, Logger: log, Registerer: reg,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}), DumpProgressTimeout: cfg.DumpProgressTimeout,
	})
	srv := apiserver.NewServer(handler, apiserver.ServerConfig{Logger: log})
	g.Go(func() error { return httpserve.Serve(gctx, srv, ln, cfg.ShutdownTimeout) }) // drains in-flight requests
	if eppLn != nil {
		picker, err := epp.New(epp.Config{Service: svc, Endpoints: view.endpoints, Group: cfg.EPP.Group, Disagg: cfg.EPP.Disagg,
			BodyMode: cfg.EPP.BodyMode, Fallbacks: cfg.EPP.Fallbacks, MaxBodyBytes: cfg.EPP.MaxBodyBytes, BodyTimeout: cfg.EPP.BodyTimeout, Priorities: cfg.EPP.Priorities,
			Ready: func() bool { ok, _ := ready(); return ok }, Logger: log, Registerer: reg})
		if err != nil {
			return err
		}
		if cfg.EPP.Server != nil {
			cfg.EPP.Server(picker)
		}
		g.Go(func() error { return view.endpoints.Run(gctx) })
		g.Go(func() error { return picker.Serve(gctx, eppLn, cfg.EPP.TLS, cfg.ShutdownTimeout) }) // drains streams in flight
		mode := "aggregated"
		if cfg.EPP.Disagg {
			mode = "disaggregated (decode-first plans)"
		}
		log.Info("prefixd endpoint picker serving (ext_proc)", "grpc", eppLn.Addr().String(), "tls", cfg.EPP.TLS.Mode(), "mode", mode,
			"routing_group", cmp.Or(cfg.EPP.Group, catalog.DefaultRoutingGroup))
		if cfg.EPP.OnReady != nil {
			cfg.EPP.OnReady(eppLn.Addr().String())
		}
	}
	log.Info("prefixd serving", "http", ln.Addr().String())
	if cfg.OnReady != nil {
		cfg.OnReady(ln.Addr().String())
	}
	<-gctx.Done()
	stopping = time.Now()
	if ctx.Err() != nil {
		log.Info("shutting down: draining HTTP, then stopping the catalog watch and the streams", "drain_timeout", cfg.ShutdownTimeout)
	}
	err = g.Wait()
	stopStreams()
	<-streamsDone
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// workerView is the catalog and streams as the API sees them. It keeps
// the latest record of every worker the watch delivered and the rank cap
// admitted.
type workerView struct {
	store   catalog.Store
	ix      *indexer.Index
	streams *stream.Manager
	svc     *coordinator.Service // nil in tests that build a view by hand
	log     *slog.Logger
	// endpoints, when set, are the endpoint picker's engine addresses.
	endpoints *epp.Endpoints

	// writeTimeout bounds each catalog write (Register, Unregister); 0:
	// none (tests that build a view by hand).
	writeTimeout time.Duration

	mu    sync.Mutex // guards known and ranks
	known map[catalog.Key]catalog.Worker
	ranks *rankCap
}

var _ apiserver.Workers = (*workerView)(nil)

// newWorkerView returns the view over store, feeding ix through streams
// and the coordinator svc, admitting at most maxRanks ranks (0: no cap).
func newWorkerView(store catalog.Store, ix *indexer.Index, streams *stream.Manager, svc *coordinator.Service, maxRanks int, log *slog.Logger) *workerView {
	return &workerView{store: store, ix: ix, streams: streams, svc: svc, log: log, known: map[catalog.Key]catalog.Worker{}, ranks: newRankCap(maxRanks)}
}

// ignoredMsg is the line logged when a record's ranks do not fit under
// the rank cap. docs/operations.md quotes it.
const ignoredMsg = "worker ignored: its ranks would exceed --max-ranks; it joins when ranks leave"

// apply passes a catalog change through the rank cap, then applies what
// the cap admits. It runs on the watcher's goroutine and returns at once.
func (v *workerView) apply(c catalog.Change) {
	v.mu.Lock()
	out, held := v.ranks.Apply(c)
	streamed, limit := v.ranks.Admitted(), v.ranks.limit
	v.mu.Unlock()
	if held {
		v.log.Warn(ignoredMsg, "worker", c.Key.WorkerID, "model", c.Key.Model, "group", c.Key.Group, "ranks", ranksOf(c.Worker),
			"streamed_ranks", streamed, "max_ranks", limit, "registration", registration(c.Lease), "revision", c.Revision)
	}
	for _, ch := range out {
		v.applyAdmitted(ch)
	}
}

// collectors are the rank cap's gauges.
func (v *workerView) collectors() []prometheus.Collector {
	read := func(f func(*rankCap) int) func() float64 {
		return func() float64 {
			v.mu.Lock()
			defer v.mu.Unlock()
			return float64(f(v.ranks))
		}
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_catalog_ranks",
			Help: "Worker ranks streamed: the ranks of the records admitted under --max-ranks."}, read((*rankCap).Admitted)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_catalog_ignored_ranks",
			Help: "Worker ranks of catalog records ignored because they would exceed --max-ranks."}, read((*rankCap).Held)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixd_catalog_max_ranks",
			Help: "The cap on worker ranks streamed (--max-ranks; 0 = none)."}, read(func(c *rankCap) int { return c.limit })),
	}
}

// applyAdmitted turns a catalog change into pool and stream changes, and
// logs it.
func (v *workerView) applyAdmitted(c catalog.Change) {
	// The coordinator's pools first, so a worker listed by /workers is
	// selectable; a worker leaving leaves the pools and the index before
	// /workers stops listing it.
	if v.svc != nil {
		if c.Kind == catalog.Removed {
			v.svc.RemoveRecord(c.Key)
		} else if err := v.svc.SetRecord(c.Worker); err != nil {
			v.log.Error("worker not selectable", "worker", c.Worker.WorkerID, "err", err)
		}
	}
	if c.Kind == catalog.Removed {
		v.streams.Remove(c.Key.WorkerID)
	}
	if v.endpoints != nil {
		if c.Kind == catalog.Removed {
			v.endpoints.Remove(c.Key.WorkerID)
		} else {
			v.endpoints.Set(c.Worker)
		}
	}
	v.mu.Lock()
	if c.Kind == catalog.Removed {
		delete(v.known, c.Key)
	} else {
		v.known[c.Key] = c.Worker
	}
	v.mu.Unlock()
	w := c.Worker
	attrs := []any{"worker", c.Key.WorkerID, "model", c.Key.Model, "group", c.Key.Group}
	switch c.Kind {
	case catalog.Removed:
		v.log.Info("worker left", append(attrs, "revision", c.Revision)...)
		return
	case catalog.Added:
		v.log.Info("worker joined", append(attrs, "role", w.Role, "ranks", w.Ranks(), "registration", registration(c.Lease), "revision", c.Revision)...)
	default:
		v.log.Info("worker updated", append(attrs, "ranks", w.Ranks(), "was", c.Old.Ranks(), "lifecycle", w.Lifecycle, "registration", registration(c.Lease), "revision", c.Revision)...)
	}
	ws, err := workerStreams(w)
	if err != nil {
		v.log.Error("worker not indexed", append(attrs, "err", err)...)
		v.streams.Remove(c.Key.WorkerID)
		return
	}
	v.streams.Set(ws)
}

// registration says who keeps a record: a sidecar's lease, or nobody.
func registration(l catalog.LeaseID) string {
	if l == catalog.NoLease {
		return "persistent"
	}
	return fmt.Sprintf("lease %x", l)
}

func workerStreams(w catalog.Worker) (stream.Worker, error) {
	ss, err := w.Streams()
	if err != nil {
		return stream.Worker{}, err
	}
	ranks := w.Ranks()
	out := stream.Worker{ID: w.WorkerID, Partition: indexer.PartitionKey{Model: w.ModelName, Group: w.RoutingGroup}, BlockSize: int(w.BlockSize)}
	out.Capacity[indexer.TierDevice] = withMargin(w.TotalKVBlocks)
	out.Capacity[indexer.TierHost] = withMargin(w.HostKVBlocks)
	out.Capacity[indexer.TierDisk] = withMargin(w.DiskKVBlocks)
	for _, s := range ss {
		out.Sources = append(out.Sources, stream.Source{Worker: w.WorkerID, Rank: s.Rank, Ranks: ranks,
			Endpoint: s.Endpoint, ReplayEndpoint: s.ReplayEndpoint, Topic: w.Topic, SeqBase: w.SeqBase})
	}
	return out, nil
}

// withMargin turns a registered capacity in blocks into the most blocks a
// rank may hold in the index in that tier (0: unbounded): an eighth more,
// plus a little, so that events in flight (a batch's stores ahead of the
// removals that made room for them) never trim an honest engine.
func withMargin(blocks uint64) int {
	if blocks == 0 {
		return 0
	}
	blocks = min(blocks, 1<<40)
	return int(blocks + blocks/8 + 64)
}
