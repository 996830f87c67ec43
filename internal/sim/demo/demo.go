// Package demo runs prefixd's main job end to end in one process: an
// embedded etcd, simulated engines on the real wire registering through
// the catalog, the daemon, and a deterministic chat workload routed three
// ways (KV-aware through prefixd, at random, and as decode-first
// disaggregated plans), then a report and an exact check of the index
// against every engine's true cache.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	"github.com/prefixd/prefixd/internal/sim/mocker"
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
	// PrefillPerToken prices an uncached prompt token in the simulated
	// TTFT (default 50 µs).
	PrefillPerToken time.Duration
	Seed            uint64
	// Concurrency is the number of clients routing at once in each mode
	// (default 2), so that bookings overlap and load spreads.
	Concurrency int
	// LeaseTTL is the mock engines' registration lease (default 5 s).
	LeaseTTL time.Duration
	Out      io.Writer // report and progress (default stdout)
	Log      *slog.Logger
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
	def(&c.Concurrency, 2)
	switch {
	case c.DropLive == 0:
		c.DropLive = 0.01
	case c.DropLive < 0:
		c.DropLive = 0
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

// The three pools, each its own routing group (its own index partition).
const (
	groupKV     = "kv-aware"
	groupRandom = "random"
	groupDisagg = "disagg"
)

// ModeResult is what one routing mode achieved.
type ModeResult struct {
	Name         string
	Requests     int
	PromptTokens int
	CachedTokens int
	TTFT         []time.Duration // simulated, sorted
	PerWorker    map[uint64]int
	Bypass       int // disaggregated mode: prefill ran on the decode worker
	Remote       int // disaggregated mode: remote prefill
}

// HitRate is the fraction of prompt tokens served from the prefix cache.
func (m ModeResult) HitRate() float64 {
	if m.PromptTokens == 0 {
		return 0
	}
	return float64(m.CachedTokens) / float64(m.PromptTokens)
}

// Percentile returns the q-quantile of the simulated TTFT.
func (m ModeResult) Percentile(q float64) time.Duration {
	if len(m.TTFT) == 0 {
		return 0
	}
	return m.TTFT[min(len(m.TTFT)-1, int(q*float64(len(m.TTFT))))]
}

// Report is the demo's outcome.
type Report struct {
	Modes         []ModeResult
	Engines       int
	Concurrency   int
	Batches       uint64 // batches published by the engines
	LiveDropped   uint64
	EventsApplied float64
	Gaps          float64
	Replays       float64
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
	addrCh := make(chan string, 1)
	dctx, stopDaemon := context.WithCancel(ctx)
	daemonDone := make(chan error, 1)
	go func() {
		daemonDone <- daemon.Run(dctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: emb.Endpoints()}, Listen: "127.0.0.1:0",
			Index: ix, Registry: reg, Logger: cfg.Log, OnReady: func(a string) { addrCh <- a },
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
	fmt.Fprintf(cfg.Out, "prefixd serving on %s\n", addr)

	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	fl, err := startEngines(ctx, cfg, store)
	defer fl.Stop()
	if err != nil {
		return nil, err
	}
	engines := fl.Engines()
	fmt.Fprintf(cfg.Out, "%d mock engines registered: 4 %s, 4 %s, 2 prefill + 2 decode %s in two KV-transfer domains\n",
		len(engines), groupKV, groupRandom, groupDisagg)
	if err := waitStreams(ctx, cl, len(engines)); err != nil {
		return nil, err
	}

	prompts := Workload(cfg)
	rep := &Report{Engines: len(engines), Concurrency: cfg.Concurrency}
	modes := []struct {
		name string
		run  func(i int, p mocker.Request, m *ModeResult) error
	}{
		{"prefixd (KV-aware)", func(i int, p mocker.Request, m *ModeResult) error { return routeKV(ctx, cl, engines, i, p, m, cfg) }},
		{"random", func(i int, p mocker.Request, m *ModeResult) error {
			pool := byGroup(engines, groupRandom, "")
			pick := rand.New(rand.NewPCG(cfg.Seed, uint64(i))).IntN(len(pool)) // per request, whatever the interleaving
			return serve(ctx, pool[pick], p, m, cfg)
		}},
		{"prefixd disaggregated", func(i int, p mocker.Request, m *ModeResult) error { return routePlan(ctx, cl, engines, i, p, m, cfg) }},
	}
	for _, md := range modes {
		m, err := runMode(ctx, md.name, prompts, cfg, md.run)
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
	rep.Restarts = sumMetric(mf, "prefixd_stream_restarts_total")
	rep.Compensations = sumMetric(mf, "prefixd_plan_compensations_total")
	rep.Elapsed = time.Since(start)
	if len(rep.Mismatches) > 0 {
		return rep, fmt.Errorf("index differs from the engines' caches in %d places", len(rep.Mismatches))
	}
	return rep, nil
}

// demoSpecs are the demo's three pools.
func demoSpecs() []engineSpec {
	var specs []engineSpec
	for i := range 4 {
		specs = append(specs, engineSpec{uint64(1 + i), groupKV, catalog.RoleAggregated, ""},
			engineSpec{uint64(11 + i), groupRandom, catalog.RoleAggregated, ""})
	}
	for i := range 2 {
		rack := "r" + strconv.Itoa(i+1)
		specs = append(specs, engineSpec{uint64(21 + i), groupDisagg, catalog.RolePrefill, rack}, engineSpec{uint64(31 + i), groupDisagg, catalog.RoleDecode, rack})
	}
	return specs
}

// runMode routes prompts with cfg.Concurrency clients taking the next
// prompt in turn, and merges what they saw.
func runMode(ctx context.Context, name string, prompts []mocker.Request, cfg Config, run func(i int, p mocker.Request, m *ModeResult) error) (ModeResult, error) {
	total := ModeResult{Name: name, PerWorker: map[uint64]int{}}
	var (
		mu           sync.Mutex // guards total
		next, done   atomic.Int64
		promptTokens atomic.Int64
		cachedTokens atomic.Int64
	)
	quarter := int64(max(len(prompts)/4, 1))
	g, gctx := errgroup.WithContext(ctx)
	for range cfg.Concurrency {
		g.Go(func() error {
			m := ModeResult{PerWorker: map[uint64]int{}}
			for {
				i := int(next.Add(1) - 1)
				if i >= len(prompts) || gctx.Err() != nil {
					break
				}
				before := m
				if err := run(i, prompts[i], &m); err != nil {
					return fmt.Errorf("%s request %d: %w", name, i, err)
				}
				promptTokens.Add(int64(m.PromptTokens - before.PromptTokens))
				cachedTokens.Add(int64(m.CachedTokens - before.CachedTokens))
				if n := done.Add(1); n%quarter == 0 {
					fmt.Fprintf(cfg.Out, "  %-22s %4d/%d requests, cache hit rate so far %5.1f%%\n", name, n, len(prompts),
						100*float64(cachedTokens.Load())/float64(max(promptTokens.Load(), 1)))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			total.Requests += m.Requests
			total.PromptTokens += m.PromptTokens
			total.CachedTokens += m.CachedTokens
			total.TTFT = append(total.TTFT, m.TTFT...)
			total.Bypass += m.Bypass
			total.Remote += m.Remote
			for id, n := range m.PerWorker {
				total.PerWorker[id] += n
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return total, err
	}
	slices.Sort(total.TTFT)
	return total, nil
}

// startEngines starts the demo's pools and waits until all are registered.
func startEngines(ctx context.Context, cfg Config, store *etcdstore.Store) (*fleet, error) {
	f := newFleet(ctx, cfg, store)
	for _, s := range demoSpecs() {
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

// errNotInFleet: prefixd chose a worker the demo does not run (in the
// soak, one that just crashed and is still in the catalog until its
// lease expires).
var errNotInFleet = errors.New("not an engine the demo runs")

func find(engines []*mocker.Engine, id uint64) (*mocker.Engine, error) {
	for _, e := range engines {
		if e.Worker().WorkerID == id {
			return e, nil
		}
	}
	return nil, fmt.Errorf("prefixd chose worker %d: %w", id, errNotInFleet)
}

// serve runs p on e and records it; the simulated TTFT is the prefill of
// the uncached prompt tokens.
func serve(ctx context.Context, e *mocker.Engine, p mocker.Request, m *ModeResult, cfg Config) error {
	res, err := e.Serve(ctx, p)
	if err != nil {
		return fmt.Errorf("worker %d: %w", e.Worker().WorkerID, err)
	}
	m.Requests++
	m.PromptTokens += res.PromptTokens
	m.CachedTokens += res.CachedTokens
	m.TTFT = append(m.TTFT, time.Duration(res.PromptTokens-res.CachedTokens)*cfg.PrefillPerToken)
	m.PerWorker[e.Worker().WorkerID]++
	return nil
}

func routeKV(ctx context.Context, cl *client.Client, engines []*mocker.Engine, i int, p mocker.Request, m *ModeResult, cfg Config) error {
	id := "kv-" + strconv.Itoa(i)
	sel, err := cl.SelectAndReserve(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: p.TokenIDs}, ModelName: model,
		RoutingGroup: groupKV, SelectionID: id})
	if err != nil {
		return err
	}
	e, err := find(engines, sel.WorkerID)
	if err == nil {
		err = serve(ctx, e, p, m, cfg)
	}
	return errors.Join(err, cl.FreeReservation(ctx, id))
}

// routePlan runs one request as a decode-first plan: bypass serves it on
// the decode worker; remote prefill runs the prompt on the prefill worker,
// then the decode worker receives the KV blocks (it caches the prompt, as
// after a KV transfer) and decodes.
func routePlan(ctx context.Context, cl *client.Client, engines []*mocker.Engine, i int, p mocker.Request, m *ModeResult, cfg Config) error {
	id := "plan-" + strconv.Itoa(i)
	plan, err := cl.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: p.TokenIDs}, ID: id, ModelName: model,
		RoutingGroup: groupDisagg, Policy: &api.PlanPolicy{Kind: "isl_bounding", EffISLThreshold: 256}})
	if err != nil {
		return err
	}
	if plan.Decode == nil || plan.Decision == nil {
		return fmt.Errorf("plan %s has no decode booking or decision: %+v", id, plan)
	}
	dec, err := find(engines, plan.Decode.WorkerID)
	if err != nil {
		return err
	}
	if plan.Decision.Kind == "bypass" {
		m.Bypass++
		err = serve(ctx, dec, p, m, cfg)
	} else {
		m.Remote++
		err = remotePrefill(ctx, cl, engines, plan, dec, p, m, cfg)
	}
	_, rerr := cl.ReleasePlan(ctx, id)
	return errors.Join(err, rerr)
}

func remotePrefill(ctx context.Context, cl *client.Client, engines []*mocker.Engine, plan api.PlanInfo, dec *mocker.Engine, p mocker.Request, m *ModeResult, cfg Config) error {
	if plan.Prefill == nil {
		return fmt.Errorf("plan %s: remote prefill without a prefill booking", plan.ID)
	}
	pre, err := find(engines, plan.Prefill.WorkerID)
	if err != nil {
		return err
	}
	if pre.Worker().TopologyDomains["rack"] != dec.Worker().TopologyDomains["rack"] {
		return fmt.Errorf("plan %s: prefill worker %d and decode worker %d are in different KV-transfer domains", plan.ID, pre.Worker().WorkerID, dec.Worker().WorkerID)
	}
	if err := serve(ctx, pre, mocker.Request{TokenIDs: p.TokenIDs, MaxTokens: 1}, m, cfg); err != nil {
		return err
	}
	if _, err := cl.PlanPrefillComplete(ctx, plan.ID); err != nil {
		return err
	}
	_, err = dec.Serve(ctx, p)
	return err
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
		err := ix.Read(indexer.PartitionKey{Model: model, Group: e.Worker().RoutingGroup}, func(t *indexer.Tree) {
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
