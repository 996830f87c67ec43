// Package demo runs prefixd's main job end to end in one process: an
// embedded etcd, simulated engines on the real wire registering through
// the catalog (with vLLM's OpenAI API and a timing model of continuous
// batching), the daemon, and a deterministic chat workload sent as OpenAI
// requests four ways: through prefixd proxy KV-aware, at random and as
// decode-first disaggregated plans, and through a gateway (package
// gateway) that asks the daemon's endpoint picker; then a report of what
// the clients measured and an exact check of the index against every
// engine's true cache.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// Config sizes the demo. Zero fields take the defaults noted.
type Config struct {
	Requests      int     // requests per routing mode (default 600)
	Conversations int     // concurrent conversations (default 48)
	SystemPrompts int     // shared system prompts (default 8)
	SystemTokens  int     // tokens per system prompt (default 384)
	BlockSize     int     // default 16
	TotalBlocks   int     // KV capacity of each engine, in blocks (default 384)
	DropLive      float64 // fraction of live batches each engine drops (default 0.01; negative: none)
	// PrefillPerToken prices an uncached prompt token in the soak's
	// simulated TTFT (default 50 µs).
	PrefillPerToken time.Duration
	// TimeScale scales the engines' timing model (mocker.H100Llama8B) so
	// the demo runs in seconds: 0.05 (the default) runs every step 20
	// times faster than the modelled GPU; negative: no engine time.
	TimeScale float64
	Seed      uint64
	// Concurrency is the number of clients sending at once in each mode
	// (default 8), so that bookings overlap, engines batch and load
	// spreads.
	Concurrency int
	// LeaseTTL is the mock engines' registration lease (default 5 s).
	LeaseTTL time.Duration
	Out      io.Writer // report and progress (default stdout)
	Log      *slog.Logger

	// groups, when not empty, runs only the pools (routing groups) it
	// names, in the report's order (tests).
	groups []string
}

// runs says whether the demo runs the pool of group.
func (c Config) runs(group string) bool {
	return len(c.groups) == 0 || slices.Contains(c.groups, group)
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	c.defaults()
	return c
}

func (c *Config) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Requests, 600)
	def(&c.Conversations, 48)
	def(&c.SystemPrompts, 8)
	def(&c.SystemTokens, 384)
	def(&c.BlockSize, 16)
	def(&c.TotalBlocks, 384)
	def(&c.Concurrency, 8)
	switch {
	case c.DropLive == 0:
		c.DropLive = 0.01
	case c.DropLive < 0:
		c.DropLive = 0
	}
	if c.TimeScale == 0 {
		c.TimeScale = 0.05
	}
	if c.PrefillPerToken <= 0 {
		c.PrefillPerToken = 50 * time.Microsecond
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

const model = "demo-model"

// The four pools, each its own routing group (its own index partition).
const (
	groupKV      = "kv-aware"
	groupRandom  = "random"
	groupDisagg  = "disagg"
	groupGateway = "gateway" // the endpoint picker's
)

// ModeResult is what one routing mode achieved.
type ModeResult struct {
	Name     string
	Requests int
	// PromptTokens and CachedTokens are the prompt tokens the mode's
	// engines computed or took from their prefix cache (their vLLM
	// prefix_cache_queries and _hits).
	PromptTokens int
	CachedTokens int
	// TTFT and E2E are measured at the client, sorted: the time to the
	// first streamed token and to the end of the stream, queueing and the
	// proxy included (in the soak, TTFT is computed from token counts).
	TTFT, E2E    []time.Duration
	OutputTokens int
	Elapsed      time.Duration // the mode's wall time
	PerWorker    map[uint64]int
	Roles        map[uint64]catalog.Role
	Bypass       int // disaggregated mode: prefill ran on the decode worker
	Remote       int // disaggregated mode: remote prefill
}

// Throughput is the mode's requests per second.
func (m ModeResult) Throughput() float64 {
	if m.Elapsed <= 0 {
		return 0
	}
	return float64(m.Requests) / m.Elapsed.Seconds()
}

// HitRate is the fraction of prompt tokens served from the prefix cache.
func (m ModeResult) HitRate() float64 {
	if m.PromptTokens == 0 {
		return 0
	}
	return float64(m.CachedTokens) / float64(m.PromptTokens)
}

// Percentile returns the q-quantile of the TTFT (nearest rank).
func (m ModeResult) Percentile(q float64) time.Duration { return quantile.Of(m.TTFT).At(q) }

// E2EPercentile returns the q-quantile of the end-to-end latency (nearest
// rank).
func (m ModeResult) E2EPercentile(q float64) time.Duration { return quantile.Of(m.E2E).At(q) }

// Report is the demo's outcome.
type Report struct {
	Modes         []ModeResult
	Engines       int
	Concurrency   int
	TimeScale     float64
	Batches       uint64 // batches published by the engines
	LiveDropped   uint64
	EventsApplied float64
	// Gaps are live batches seen after a hole in a stream's seq numbers
	// (batches the engines dropped on purpose, DropLive); Replays the
	// replays that fetched missed batches (one per stream when it joins,
	// then one per gap or run of gaps); Probes the idle probes of quiet
	// streams (asking for anything newer), which are not replays.
	Gaps          float64
	Replays       float64
	Probes        float64
	Restarts      float64
	Compensations float64
	IndexEntries  int
	IndexBytes    int64
	Elapsed       time.Duration
	Mismatches    []string // index vs engine cache differences; empty on success
}

// Run runs the demo and returns its report; the error is non-nil when the
// demo could not run or the index did not match the engines' caches.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	dir, err := os.MkdirTemp("", "prefixd-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(cfg.Out, "starting embedded etcd in %s …\n", dir)
	emb, err := etcdstore.StartEmbedded(ctx, etcdstore.EmbeddedConfig{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		return nil, err
	}
	defer emb.Close()

	ix := indexer.New(indexer.Options{})
	reg := prometheus.NewRegistry()
	addrCh, eppCh := make(chan string, 1), make(chan string, 1)
	dctx, stopDaemon := context.WithCancel(ctx)
	daemonDone := make(chan error, 1)
	go func() {
		daemonDone <- daemon.Run(dctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: emb.Endpoints()}, Listen: "127.0.0.1:0",
			Index: ix, Registry: reg, Logger: cfg.Log, OnReady: func(a string) { addrCh <- a },
			EPP:        daemon.EPPConfig{Listen: "127.0.0.1:0", Group: groupGateway, OnReady: func(a string) { eppCh <- a }},
			Subscriber: stream.SubscriberConfig{ProbeInterval: 200 * time.Millisecond}})
	}()
	defer func() {
		stopDaemon()
		<-daemonDone
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case err := <-daemonDone:
		return nil, fmt.Errorf("daemon: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cl := &client.Client{BaseURL: "http://" + addr}
	eppAddr := <-eppCh // sent before OnReady
	fmt.Fprintf(cfg.Out, "prefixd serving on %s, its endpoint picker on %s\n", addr, eppAddr)

	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	var timing mocker.Timing
	if cfg.TimeScale > 0 {
		timing = scaled(cfg.TimeScale)
	}
	fl, err := startEngines(ctx, cfg, store, timing)
	defer fl.Stop()
	if err != nil {
		return nil, err
	}
	engines := fl.Engines()
	if len(cfg.groups) == 0 {
		fmt.Fprintf(cfg.Out, "%d mock engines registered: 4 %s, 4 %s, 2 prefill + 2 decode %s in two KV-transfer domains, 4 %s\n",
			len(engines), groupKV, groupRandom, groupDisagg, groupGateway)
	} else {
		fmt.Fprintf(cfg.Out, "%d mock engines registered for %v\n", len(engines), cfg.groups)
	}
	if err := waitStreams(ctx, cl, len(engines)); err != nil {
		return nil, err
	}

	rep := &Report{Engines: len(engines), Concurrency: cfg.Concurrency, TimeScale: cfg.TimeScale}
	modes := []struct {
		name string
		pcfg proxy.Config
	}{
		{"prefixd (KV-aware)", proxy.Config{RoutingGroup: groupKV}},
		{"random", proxy.Config{RoutingGroup: groupRandom, Policy: proxy.Random, Rand: rand.New(rand.NewPCG(cfg.Seed, 2))}},
		{"prefixd disaggregated", proxy.Config{RoutingGroup: groupDisagg, Disagg: true,
			PlanPolicy: &api.PlanPolicy{Kind: "isl_bounding", EffISLThreshold: 256}}},
	}
	requests := ChatWorkload(cfg)
	for _, md := range modes {
		if !cfg.runs(md.pcfg.RoutingGroup) {
			continue
		}
		url, stop, err := startProxy(ctx, cl, md.pcfg, cfg.Log)
		if err != nil {
			return nil, err
		}
		m, err := runMode(ctx, md.name, url, requests, byGroup(engines, md.pcfg.RoutingGroup, ""), cfg)
		stop()
		if err != nil {
			return nil, err
		}
		rep.Modes = append(rep.Modes, m)
	}
	if cfg.runs(groupGateway) {
		m, err := runGateway(ctx, eppAddr, reg, requests, byGroup(engines, groupGateway, ""), cfg)
		if err != nil {
			return nil, err
		}
		rep.Modes = append(rep.Modes, m)
	}

	fmt.Fprintln(cfg.Out, "waiting for the index to catch up with every engine …")
	if err := caughtUp(ctx, ix, engines); err != nil {
		return nil, err
	}
	rep.Mismatches = compare(ix, engines)
	for _, e := range engines {
		st := e.Publisher().Stats()
		rep.Batches += st.Published
		rep.LiveDropped += st.LiveDropped
	}
	for _, s := range ix.Stats() {
		rep.IndexEntries += s.Entries
		rep.IndexBytes += s.Bytes
	}
	mf, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	rep.EventsApplied = sumMetric(mf, "prefixd_stream_events_total")
	rep.Gaps = sumMetric(mf, "prefixd_stream_gaps_total")
	rep.Replays = sumMetric(mf, "prefixd_stream_replays_total")
	rep.Probes = sumMetric(mf, "prefixd_stream_probes_total")
	rep.Restarts = sumMetric(mf, "prefixd_stream_restarts_total")
	rep.Compensations = sumMetric(mf, "prefixd_plan_compensations_total")
	rep.Elapsed = time.Since(start)
	if len(rep.Mismatches) > 0 {
		return rep, fmt.Errorf("index differs from the engines' caches in %d places", len(rep.Mismatches))
	}
	return rep, nil
}

// demoSpecs are the demo's four pools.
func demoSpecs() []engineSpec {
	var specs []engineSpec
	for i := range 4 {
		specs = append(specs, engineSpec{uint64(1 + i), groupKV, catalog.RoleAggregated, ""},
			engineSpec{uint64(11 + i), groupRandom, catalog.RoleAggregated, ""},
			engineSpec{uint64(41 + i), groupGateway, catalog.RoleAggregated, ""})
	}
	for i := range 2 {
		rack := "r" + strconv.Itoa(i+1)
		specs = append(specs, engineSpec{uint64(21 + i), groupDisagg, catalog.RolePrefill, rack}, engineSpec{uint64(31 + i), groupDisagg, catalog.RoleDecode, rack})
	}
	return specs
}

// startProxy runs a prefixd proxy in front of the fleet, on a loopback
// port, until stop.
func startProxy(ctx context.Context, cl *client.Client, pcfg proxy.Config, log *slog.Logger) (url string, stop func(), err error) {
	pcfg.Prefixd, pcfg.Logger, pcfg.Refresh = cl, log, 100*time.Millisecond
	p, err := proxy.New(pcfg)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Serve(pctx, ln, 5*time.Second) }()
	stop = func() {
		cancel()
		<-done
	}
	select {
	case <-p.Synced():
	case err := <-done:
		return "", nil, fmt.Errorf("proxy: %w", err)
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// runMode sends requests through the proxy at url, cfg.Concurrency
// clients taking the next one in turn, and merges what they measured;
// the hit rate is the pool's engines' own prefix-cache counts.
func runMode(ctx context.Context, name, url string, requests []ChatRequest, pool []*mocker.Engine, cfg Config) (ModeResult, error) {
	total := ModeResult{Name: name, PerWorker: map[uint64]int{}, Roles: map[uint64]catalog.Role{}}
	var q0, h0 uint64
	for _, e := range pool {
		l := e.Load()
		q0, h0 = q0+l.PrefixQueries, h0+l.PrefixHits
		total.Roles[e.Worker().WorkerID] = e.Worker().Role
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency}}
	defer hc.CloseIdleConnections()
	var (
		mu         sync.Mutex // guards total
		next, done atomic.Int64
	)
	quarter := int64(max(len(requests)/4, 1))
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range cfg.Concurrency {
		g.Go(func() error {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(requests) || gctx.Err() != nil {
					return nil
				}
				res, err := chat(gctx, hc, url, model, requests[i])
				if err != nil {
					return fmt.Errorf("%s request %d: %w", name, i, err)
				}
				mu.Lock()
				total.Requests++
				total.TTFT = append(total.TTFT, res.TTFT)
				total.E2E = append(total.E2E, res.Latency)
				total.OutputTokens += res.Tokens
				total.PerWorker[res.Worker]++
				switch {
				case res.PrefillWorker != 0:
					total.PerWorker[res.PrefillWorker]++
					total.Remote++
				case total.Roles[res.Worker] == catalog.RoleDecode:
					total.Bypass++
				}
				mu.Unlock()
				if n := done.Add(1); n%quarter == 0 {
					fmt.Fprintf(cfg.Out, "  %-22s %4d/%d requests\n", name, n, len(requests))
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return total, err
	}
	total.Elapsed = time.Since(start)
	var q1, h1 uint64
	for _, e := range pool {
		l := e.Load()
		q1, h1 = q1+l.PrefixQueries, h1+l.PrefixHits
	}
	total.PromptTokens, total.CachedTokens = int(q1-q0), int(h1-h0)
	slices.Sort(total.TTFT)
	slices.Sort(total.E2E)
	return total, nil
}

// startEngines starts the demo's pools, the engines on timing, and waits
// until all are registered.
func startEngines(ctx context.Context, cfg Config, store *etcdstore.Store, timing mocker.Timing) (*fleet, error) {
	f := newFleet(ctx, cfg, store)
	f.timing = timing
	for _, s := range demoSpecs() {
		if !cfg.runs(s.group) {
			continue
		}
		if _, err := f.start(ctx, s); err != nil {
			return f, err
		}
	}
	return f, nil
}

// waitStreams waits until the daemon follows every engine's stream.
func waitStreams(ctx context.Context, cl *client.Client, n int) error {
	return poll(ctx, "daemon to follow every engine stream", func() error {
		ws, err := cl.Workers(ctx, model, "")
		if err != nil {
			return err
		}
		active := 0
		for _, w := range ws {
			for _, l := range w.Listeners {
				if l.Status == api.StatusActive {
					active++
				}
			}
		}
		if active != n {
			return fmt.Errorf("%d of %d streams active", active, n)
		}
		return nil
	})
}

// poll calls f every 20 ms until it returns nil, for at most 30 s; then
// it reports f's last error.
func poll(ctx context.Context, what string, f func() error) error {
	return pollFor(ctx, what, 30*time.Second, f)
}

// pollFor is poll with another limit.
func pollFor(ctx context.Context, what string, limit time.Duration, f func() error) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting %v for the %s: %w", limit, what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func byGroup(engines []*mocker.Engine, group string, role catalog.Role) []*mocker.Engine {
	var out []*mocker.Engine
	for _, e := range engines {
		if e.Worker().RoutingGroup == group && (role == "" || e.Worker().Role == role) {
			out = append(out, e)
		}
	}
	return out
}

// caughtUp waits until the index has applied every engine's last batch.
func caughtUp(ctx context.Context, ix *indexer.Index, engines []*mocker.Engine) error {
	return poll(ctx, "index to catch up", func() error {
		behind := 0
		for _, e := range engines {
			last, ok := e.LastSeq()
			if !ok {
				continue
			}
			st, err := ix.Rank(indexer.PartitionKey{Model: model, Group: e.Worker().RoutingGroup}, indexer.Rank{WorkerID: e.Worker().WorkerID})
			if err != nil || !st.HasSeq || st.Watermark != last {
				behind++
			}
		}
		if behind > 0 {
			return fmt.Errorf("%d engines ahead of the index", behind)
		}
		return nil
	})
}

// compare lists every difference between the index and the engines'
// true caches.
func compare(ix *indexer.Index, engines []*mocker.Engine) []string {
	var diffs []string
	for _, e := range engines {
		holds := e.Holds()
		rank := indexer.Rank{WorkerID: e.Worker().WorkerID}
		err := ix.ReadRank(indexer.PartitionKey{Model: model, Group: e.Worker().RoutingGroup}, rank, func(t *indexer.Tree) {
			if got := t.RankBlocks(rank); got != len(holds) {
				diffs = append(diffs, fmt.Sprintf("worker %d: index holds %d blocks, engine %d", e.Worker().WorkerID, got, len(holds)))
			}
			for h, n := range holds {
				if c, ok := t.Holds(rank, h); !ok || int(c[indexer.TierDevice]) != n {
					diffs = append(diffs, fmt.Sprintf("worker %d block %#x: index %d copies, engine %d", e.Worker().WorkerID, h, c[indexer.TierDevice], n))
				}
			}
		})
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("worker %d: %v", e.Worker().WorkerID, err))
		}
	}
	return diffs
}
