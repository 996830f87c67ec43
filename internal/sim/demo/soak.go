package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/status"
)

// SoakConfig configures Soak.
type SoakConfig struct {
	Config // engines and workload; Requests is the length of one workload cycle

	// Daemon is the prefixd binary (`prefixd-bench soak --prefixd`) run
	// as `Daemon serve …` in its own process, so that its resident memory
	// is measured alone (required).
	Daemon string
	// Duration of the load (default 10 min), Sample interval (default
	// 10 s), Rate of requests per second (default 200) over Clients
	// concurrent clients (default 6), ChurnEvery: the interval between
	// fleet events — an engine restart, an engine crash replaced by a new
	// worker, a prefix-cache reset, in turn (default 60 s).
	Duration   time.Duration
	Sample     time.Duration
	Rate       float64
	Clients    int
	ChurnEvery time.Duration
	// Warmup is excluded from the flatness verdict (default 20 % of
	// Duration). MaxGrowth is the tolerated RSS growth of the last third
	// over the middle third of the measured samples (default 0.10).
	Warmup    time.Duration
	MaxGrowth float64
	// CSV, if set, receives one line per sample.
	CSV io.Writer
	// ProbeInterval is the daemon's --probe-interval (default 30 s, as in
	// production): how soon it finds an engine's last batch dropped.
	ProbeInterval time.Duration
}

func (c *SoakConfig) defaults() {
	c.Config.defaults()
	if c.Requests == 600 {
		c.Requests = 5000
	}
	if c.TotalBlocks == 384 {
		c.TotalBlocks = 1024
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 3 * time.Second
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Duration, 10*time.Minute)
	def(&c.Sample, 10*time.Second)
	def(&c.ChurnEvery, time.Minute)
	def(&c.Warmup, c.Duration/5)
	def(&c.ProbeInterval, 30*time.Second)
	if c.Rate <= 0 {
		c.Rate = 200
	}
	if c.Clients <= 0 {
		c.Clients = 6
	}
	if c.MaxGrowth <= 0 {
		c.MaxGrowth = 0.10
	}
}

// SoakSample is one measurement of the daemon process.
type SoakSample struct {
	At           time.Duration // since the load started
	RSS          int64         // resident set, bytes (/proc/<pid>/status VmRSS)
	HeapInuse    float64       // go_memstats_heap_inuse_bytes
	Goroutines   float64       // go_goroutines
	IndexEntries float64       // prefixd_index_entries, all partitions
	IndexBytes   float64       // prefixd_index_bytes, all partitions
	Workers      float64       // prefixd_catalog_workers
	Requests     int64         // requests completed so far
	Events       float64       // prefixd_stream_events_total so far
}

// SoakReport is Soak's outcome.
type SoakReport struct {
	Samples  []SoakSample
	Warmup   time.Duration
	Requests int64
	Failed   map[string]int64 // requests not served, by cause (a crashed worker, a full engine)
	Churn    map[string]int   // fleet events done
	Gaps     float64
	Replays  float64
	// RSS growth of the last third of the measured samples over the
	// middle third (max over max), and the least-squares slope after the
	// warm-up.
	Growth       float64
	SlopePerHour int64 // bytes per hour
	MaxGrowth    float64
	Mismatches   []string // per worker: index block count or last seq differs from the engine
	Elapsed      time.Duration
}

// Soak runs the daemon binary in its own process against an embedded etcd
// and the demo's mock engines, drives the demo's routing modes at a steady
// rate with fleet churn for Duration, samples the daemon's memory, and
// finally checks that the daemon followed every engine. The error is
// non-nil if the soak could not run, resident memory grew by more than
// MaxGrowth, or the index disagrees with an engine.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	cfg.defaults()
	if cfg.Daemon == "" {
		return nil, errors.New("soak: no prefixd binary to run")
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "prefixd-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	emb, err := etcdstore.StartEmbedded(ctx, etcdstore.EmbeddedConfig{Dir: filepath.Join(dir, "etcd"), UnsafeNoFsync: true})
	if err != nil {
		return nil, err
	}
	defer emb.Close()

	d, err := startDaemonProcess(ctx, cfg, emb.Endpoints(), filepath.Join(dir, "daemon.log"))
	if err != nil {
		return nil, err
	}
	defer d.stop()
	cl := &client.Client{BaseURL: d.url}
	fmt.Fprintf(cfg.Out, "prefixd (pid %d) serving on %s; its log is kept until the end in %s\n", d.cmd.Process.Pid, d.url, d.log)

	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	fl, err := startEngines(ctx, cfg.Config, store, mocker.Timing{})
	defer fl.Stop()
	if err != nil {
		return nil, err
	}
	if err := waitStreams(ctx, cl, len(fl.Engines())); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Out, "%d mock engines; %v of load at %.0f requests/s over %d clients, fleet churn every %v, a sample every %v\n",
		len(fl.Engines()), cfg.Duration, cfg.Rate, cfg.Clients, cfg.ChurnEvery, cfg.Sample)

	rep := &SoakReport{Warmup: cfg.Warmup, MaxGrowth: cfg.MaxGrowth, Failed: map[string]int64{}, Churn: map[string]int{}}
	ld := &load{cfg: cfg, cl: cl, fleet: fl, failed: map[string]int64{}}
	lctx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	loadDone := make(chan error, 1)
	go func() { loadDone <- ld.run(lctx) }()
	var loadErr error
	loading := true
	defer func() { // on early returns: stop the load before the engines and the daemon
		if loading {
			stopLoad()
			<-loadDone
		}
	}()

	if cfg.CSV != nil {
		fmt.Fprintln(cfg.CSV, "seconds,rss_bytes,heap_inuse_bytes,goroutines,index_entries,index_bytes,workers,requests,events")
	}
	fmt.Fprintf(cfg.Out, "%8s %9s %9s %6s %9s %9s %7s %9s %10s\n", "t", "RSS MiB", "heap MiB", "gorout", "entries", "index MiB", "workers", "requests", "events")
	loadStart := time.Now()
	tick := time.NewTicker(cfg.Sample)
	churn := time.NewTicker(cfg.ChurnEvery)
	defer tick.Stop()
	defer churn.Stop()
	nextID := uint64(100)
	churned := 0 // fleet events so far
sampling:
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case loadErr = <-loadDone:
			loading = false
			stopLoad()
			break sampling
		case <-churn.C:
			what, err := ld.churn(ctx, churned, &nextID)
			if err != nil {
				return nil, fmt.Errorf("soak: %s: %w", what, err)
			}
			rep.Churn[what]++
			churned++
		case <-tick.C:
			s, err := d.sample(ctx)
			if err != nil {
				return nil, fmt.Errorf("soak: sample: %w", err)
			}
			s.At = time.Since(loadStart).Round(time.Second)
			s.Requests = ld.done.Load()
			rep.Samples = append(rep.Samples, s)
			fmt.Fprintf(cfg.Out, "%8v %9.1f %9.1f %6.0f %9.0f %9.1f %7.0f %9d %10.0f\n", s.At, mib(float64(s.RSS)), mib(s.HeapInuse),
				s.Goroutines, s.IndexEntries, mib(s.IndexBytes), s.Workers, s.Requests, s.Events)
			if cfg.CSV != nil {
				fmt.Fprintf(cfg.CSV, "%.0f,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%d,%.0f\n", s.At.Seconds(), s.RSS, s.HeapInuse, s.Goroutines,
					s.IndexEntries, s.IndexBytes, s.Workers, s.Requests, s.Events)
			}
		}
	}
	if loadErr != nil {
		return nil, fmt.Errorf("soak: load: %w", loadErr)
	}
	rep.Requests = ld.done.Load()
	ld.mu.Lock()
	for k, v := range ld.failed {
		rep.Failed[k] = v
	}
	ld.mu.Unlock()

	fmt.Fprintln(cfg.Out, "load stopped; waiting for the daemon to catch up with every engine …")
	engines := fl.Engines()
	rep.Mismatches = followed(ctx, cl, engines, cfg.ProbeInterval)
	m, err := d.metrics(ctx)
	if err != nil {
		return nil, err
	}
	rep.Gaps = m.Sum("prefixd_stream_gaps_total")
	rep.Replays = m.Sum("prefixd_stream_replays_total")
	rep.Growth, rep.SlopePerHour = flatness(rep.Samples, cfg.Warmup)
	rep.Elapsed = time.Since(start)
	d.keepLog = true // until the verdict says otherwise
	switch {
	case len(rep.Samples) < 6:
		return rep, fmt.Errorf("soak: only %d samples; run longer or sample more often", len(rep.Samples))
	case rep.Growth > cfg.MaxGrowth:
		return rep, fmt.Errorf("soak: resident memory grew %.1f%% (limit %.0f%%)", 100*rep.Growth, 100*cfg.MaxGrowth)
	case len(rep.Mismatches) > 0:
		return rep, fmt.Errorf("soak: the index disagrees with %d engines", len(rep.Mismatches))
	}
	d.keepLog = false
	return rep, nil
}

func mib(b float64) float64 { return b / (1 << 20) }

// flatness compares the maximum RSS of the last third of the samples after
// warm-up with that of the middle third, and fits a line through them.
func flatness(samples []SoakSample, warmup time.Duration) (growth float64, slopePerHour int64) {
	var post []SoakSample
	for _, s := range samples {
		if s.At >= warmup {
			post = append(post, s)
		}
	}
	if len(post) < 3 {
		return 0, 0
	}
	third := len(post) / 3
	maxOf := func(ss []SoakSample) int64 {
		var m int64
		for _, s := range ss {
			m = max(m, s.RSS)
		}
		return m
	}
	mid, last := maxOf(post[third:2*third]), maxOf(post[2*third:])
	if mid > 0 {
		growth = float64(last-mid) / float64(mid)
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(post))
	for _, s := range post {
		x, y := s.At.Hours(), float64(s.RSS)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	if den := n*sxx - sx*sx; den > 0 {
		slopePerHour = int64(math.Round((n*sxy - sx*sy) / den))
	}
	return growth, slopePerHour
}

// followed waits until the daemon reports, for every engine, its last
// published seq and as many blocks as the engine caches, and returns the
// engines for which it never did. It waits up to the probe interval +
// 15 s: when an engine's last batch was dropped, only the daemon's
// quiet-socket probe finds it.
func followed(ctx context.Context, cl *client.Client, engines []*mocker.Engine, probe time.Duration) []string {
	var diffs []string
	_ = pollFor(ctx, "index to follow every engine", probe+15*time.Second, func() error {
		ws, err := cl.Workers(ctx, model, "")
		if err != nil {
			return err
		}
		byID := map[uint64]api.Listener{}
		for _, w := range ws {
			byID[w.InstanceID] = w.Listeners[0]
		}
		diffs = diffs[:0]
		for _, e := range engines {
			l, ok := byID[e.Worker().WorkerID]
			last, published := e.LastSeq()
			blocks := len(e.Holds())
			switch {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("worker %d: not listed", e.Worker().WorkerID))
			case l.Blocks != blocks:
				diffs = append(diffs, fmt.Sprintf("worker %d: index %d blocks, engine %d (degraded %v)", e.Worker().WorkerID, l.Blocks, blocks, l.Degraded))
			case published && (l.LastSeq == nil || *l.LastSeq != last):
				diffs = append(diffs, fmt.Sprintf("worker %d: applied seq %v, engine published up to %d", e.Worker().WorkerID, l.LastSeq, last))
			}
		}
		if len(diffs) > 0 {
			return errors.New(diffs[0])
		}
		return nil
	})
	return diffs
}

// load drives the demo's three routing modes at a steady rate.
type load struct {
	cfg   SoakConfig
	cl    *client.Client
	fleet *fleet
	done  atomic.Int64 // requests served
	seq   atomic.Int64 // request ids

	mu     sync.Mutex // guards failed
	failed map[string]int64
}

func (l *load) run(ctx context.Context) error {
	tokens := make(chan struct{}, l.cfg.Clients)
	errc := make(chan error, l.cfg.Clients)
	var wg sync.WaitGroup
	for c := range l.cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- l.client(ctx, c, tokens)
		}()
	}
	// Pace: one token per request, at Rate.
	every := time.Duration(float64(time.Second) / l.cfg.Rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
pace:
	for {
		select {
		case <-ctx.Done():
			break pace
		case err := <-errc:
			errc <- err
			break pace
		case <-tick.C:
			select {
			case tokens <- struct{}{}:
			default: // the clients are behind; the rate is a ceiling
			}
		}
	}
	close(tokens)
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// client serves one request per token: half KV-aware, a quarter random,
// a quarter as disaggregated plans, each cycle of the workload with a new
// seed so that the caches keep turning over.
func (l *load) client(ctx context.Context, c int, tokens <-chan struct{}) error {
	rng := rand.New(rand.NewPCG(l.cfg.Seed, uint64(c)))
	cycle := uint64(c)
	wl := l.cfg.Config
	wl.Seed = l.cfg.Seed + cycle
	prompts := Workload(wl)
	i := 0
	for range tokens {
		if i == len(prompts) {
			cycle += uint64(l.cfg.Clients)
			wl.Seed = l.cfg.Seed + cycle
			prompts, i = Workload(wl), 0
		}
		p := prompts[i]
		i++
		n := int(l.seq.Add(1))
		engines := l.fleet.Engines()
		m := &ModeResult{PerWorker: map[uint64]int{}}
		var err error
		switch k := rng.IntN(4); {
		case k < 2:
			err = routeKV(ctx, l.cl, engines, n, p, m, l.cfg.Config)
		case k == 2:
			pool := byGroup(engines, groupRandom, "")
			err = serve(ctx, pool[rng.IntN(len(pool))], p, m, l.cfg.Config)
		default:
			err = routePlan(ctx, l.cl, engines, n, p, m, l.cfg.Config)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			cause := failure(err)
			if cause == "" {
				return err
			}
			l.mu.Lock()
			l.failed[cause]++
			l.mu.Unlock()
			continue
		}
		l.done.Add(1)
	}
	return nil
}

// failure names the expected failures of a churning fleet: a request
// routed to an engine that just crashed (its record lives until its lease
// expires), or an engine momentarily full. Others are errors.
func failure(err error) string {
	switch {
	case errors.Is(err, mocker.ErrNotRunning), errors.Is(err, errNotInFleet):
		return "worker crashed"
	case errors.Is(err, mocker.ErrNoSpace):
		return "engine full"
	}
	return ""
}

// churn does the n-th fleet event: restart an engine, crash one and
// replace it by a new worker, reset one's prefix cache.
func (l *load) churn(ctx context.Context, n int, nextID *uint64) (string, error) {
	var pool []*mocker.Engine
	engines := l.fleet.Engines()
	for _, e := range engines {
		if e.Worker().Role == catalog.RoleAggregated {
			pool = append(pool, e)
		}
	}
	e := pool[n%len(pool)]
	switch n % 3 {
	case 0:
		e.Restart()
		return "engine restarted", nil
	case 1:
		l.fleet.Crash(e)
		*nextID++
		_, err := l.fleet.start(ctx, engineSpec{id: *nextID, group: e.Worker().RoutingGroup, role: e.Worker().Role})
		return "engine crashed and replaced", err
	default:
		return "prefix cache reset", e.ResetPrefixCache(ctx)
	}
}

// daemonProcess is prefixd serve running as a child process.
type daemonProcess struct {
	cmd     *exec.Cmd
	url     string
	log     string
	logFile *os.File
	keepLog bool
	exited  chan error
}

func startDaemonProcess(ctx context.Context, cfg SoakConfig, etcd []string, logPath string) (*daemonProcess, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.Daemon, "serve", "--etcd-endpoints", strings.Join(etcd, ","), "--listen", addr, "--log-level", "warn",
		"--probe-interval", cfg.ProbeInterval.String())
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", cfg.Daemon, err)
	}
	d := &daemonProcess{cmd: cmd, url: "http://" + addr, log: logPath, logFile: lf, exited: make(chan error, 1)}
	go func() { d.exited <- cmd.Wait() }()
	err = poll(ctx, "daemon to serve", func() error {
		select {
		case err := <-d.exited:
			d.exited <- err
			return fmt.Errorf("exited: %v", err)
		default:
		}
		return ready(ctx, d.url)
	})
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}

// stop interrupts the daemon and waits for it.
func (d *daemonProcess) stop() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(os.Interrupt)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.logFile.Close()
	if d.keepLog {
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("prefixd-soak-daemon-%d.log", d.cmd.Process.Pid))
		if os.Rename(d.log, keep) == nil {
			d.log = keep
		}
	}
}

// ready returns nil once the daemon's /ready answers 200.
func ready(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ready", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/ready: %s", resp.Status)
	}
	return nil
}

// sample reads the daemon's RSS and metrics.
func (d *daemonProcess) sample(ctx context.Context) (SoakSample, error) {
	rss, err := residentBytes(d.cmd.Process.Pid)
	if err != nil {
		return SoakSample{}, err
	}
	m, err := d.metrics(ctx)
	if err != nil {
		return SoakSample{}, err
	}
	return SoakSample{RSS: rss, HeapInuse: m.Sum("go_memstats_heap_inuse_bytes"), Goroutines: m.Sum("go_goroutines"),
		IndexEntries: m.Sum("prefixd_index_entries"), IndexBytes: m.Sum("prefixd_index_bytes"), Workers: m.Sum("prefixd_catalog_workers"),
		Events: m.Sum("prefixd_stream_events_total")}, nil
}

// metrics scrapes the daemon's /metrics.
func (d *daemonProcess) metrics(ctx context.Context) (status.Metrics, error) {
	raw, err := (&client.Client{BaseURL: d.url}).Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return status.ParseMetrics(bytes.NewReader(raw))
}

// residentBytes reads VmRSS of a Linux process.
func residentBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("resident memory of pid %d (Linux /proc only): %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil || len(f) < 2 || f[1] != "kB" {
				return 0, fmt.Errorf("pid %d: VmRSS %q", pid, v)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS", pid)
}
