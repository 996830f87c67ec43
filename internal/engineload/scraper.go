// Package engineload reads every engine's own load from its /metrics
// (vLLM's and SGLang's running, waiting and KV-usage gauges) and hands
// each rank's figure to the coordinator (coordinator.Service.SetEngineLoad),
// which adds the bookings made since (coordinator/engineload.go).
//
// Every scrape is bounded: in time (Config.Timeout), in size (the
// Content-Length, then the bytes read, against Config.MaxBodyBytes), in
// memory (the body is filtered as it arrives: only the lines of the load
// gauges are kept, at most Config.MaxSeries of them, before
// prometheus/common's text parser reads them), and in number (at most
// Config.Concurrency at once, one per engine). A body too large,
// too slow, malformed, or with values no engine reports (NaN, negative,
// infinite, a usage above 1, absurd counts) is refused, counted in
// prefixd_engine_load_scrape_failures_total{reason} and logged at most
// once a minute per engine; it never reaches selection. A rank without a
// good figure for Config.StaleAfter, or whose engine cannot be reached,
// has its figure forgotten: selection counts its bookings alone, and
// says so (prefixd_engine_load_ranks{state="bookings_only"} and a log
// line).
package engineload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// Defaults of Config.
const (
	// DefaultInterval is how often each engine is scraped when a
	// Config leaves it 0 (prefixd serve scrapes only when asked). The bookings
	// made since a figure cover the time between scrapes, so the
	// interval only bounds how long selection's picture can drift from
	// the engine's (requests that ended early, bookings other replicas
	// made): a few engine steps' worth of arrivals at 0.5 s, a handful
	// of decode steps, while a scrape costs the engine one /metrics
	// render per interval per replica (docs/operations.md).
	DefaultInterval = 500 * time.Millisecond
	// DefaultStaleIntervals: a figure older than this many intervals
	// stops counting.
	DefaultStaleIntervals = 4
	// DefaultTimeout bounds one scrape, the body read included.
	DefaultTimeout = 2 * time.Second
	// DefaultMaxBodyBytes bounds a /metrics body: vLLM's, histograms
	// included, is tens of kilobytes per dp rank. The body is filtered
	// as it arrives: a scrape holds only the lines of the load gauges.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxSeries bounds the lines of the load gauges kept from one
	// body (samples, HELP and TYPE): three series per dp rank, for up to
	// catalog.MaxDataParallelSize ranks, and their comments.
	DefaultMaxSeries = 3*4096 + 12
	// DefaultConcurrency bounds the scrapes running at once.
	DefaultConcurrency = 8
)

// logEvery is how often an engine's failures are logged at most.
const logEvery = time.Minute

// Target is an engine to scrape: its HTTP base URL and its dp ranks.
type Target struct {
	Key      coordinator.EngineKey
	Endpoint string
	Ranks    []uint32
}

// Sink takes the figures; *coordinator.Service is one.
type Sink interface {
	SetEngineLoad(k coordinator.EngineKey, dpRank uint32, l coordinator.EngineLoad) error
}

var _ Sink = (*coordinator.Service)(nil)

// Config configures a Scraper. Zero fields take the defaults.
type Config struct {
	Interval time.Duration
	// StaleAfter: a rank without a good figure for this long has its
	// figure forgotten (default DefaultStaleIntervals × Interval).
	StaleAfter   time.Duration
	Timeout      time.Duration
	MaxBodyBytes int64
	MaxSeries    int
	Concurrency  int
	// Client does the GETs (default: one with its own transport, no
	// redirects followed).
	Client   *http.Client
	Logger   *slog.Logger
	Registry prometheus.Registerer // nil: metrics are not registered
	Now      func() time.Time      // default time.Now
}

// rankKey names a rank.
type rankKey struct {
	engine coordinator.EngineKey
	rank   uint32
}

// rankState is what the scraper last knew of a rank.
type rankState struct {
	fig   coordinator.EngineLoad // the last figure given to the sink
	has   bool                   // fig counts in selection
	lastT time.Time              // when the rank was first listed, or last had a good figure
}

// Scraper scrapes every target's /metrics every interval. Safe for
// concurrent use; Run drives it.
type Scraper struct {
	cfg     Config
	targets func() []Target
	sink    Sink
	log     *slog.Logger
	m       *metrics
	slots   chan struct{}

	mu       sync.Mutex // guards ranks, inFlight and logged
	ranks    map[rankKey]*rankState
	inFlight map[coordinator.EngineKey]bool
	logged   map[coordinator.EngineKey]*logState
}

type logState struct {
	last       time.Time
	suppressed int
}

// New returns a scraper of the targets the function lists (called once
// per interval; the caller owns nothing it returns afterwards).
func New(cfg Config, targets func() []Target, sink Sink) *Scraper {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleIntervals * cfg.Interval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxSeries <= 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 2
		cfg.Client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Scraper{cfg: cfg, targets: targets, sink: sink, log: cfg.Logger, slots: make(chan struct{}, cfg.Concurrency),
		ranks: map[rankKey]*rankState{}, inFlight: map[coordinator.EngineKey]bool{}, logged: map[coordinator.EngineKey]*logState{}}
	s.m = newMetrics(s)
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(s.m.collectors()...)
	}
	return s
}

// Config returns the configuration with defaults filled in.
func (s *Scraper) Config() Config { return s.cfg }

// Run scrapes every target each interval until ctx ends, and returns nil
// once every scrape it started has returned. An engine whose scrape is
// still running when its next turn comes is skipped that turn.
func (s *Scraper) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.round(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// round starts a scrape of every target not in flight and forgets the
// ranks no target lists.
func (s *Scraper) round(ctx context.Context, wg *sync.WaitGroup) {
	ts := s.targets()
	now := s.cfg.Now()
	listed := map[rankKey]bool{}
	engines := map[coordinator.EngineKey]bool{}
	s.mu.Lock()
	var start []Target
	for _, t := range ts {
		for _, r := range t.Ranks {
			k := rankKey{t.Key, r}
			listed[k] = true
			if s.ranks[k] == nil {
				s.ranks[k] = &rankState{lastT: now}
			}
		}
		engines[t.Key] = true
		if !s.inFlight[t.Key] {
			s.inFlight[t.Key] = true
			start = append(start, t)
		}
	}
	for k := range s.ranks {
		if !listed[k] {
			delete(s.ranks, k) // the engine left: the coordinator dropped its ranks
		}
	}
	for k := range s.logged {
		if !engines[k] {
			delete(s.logged, k)
		}
	}
	s.mu.Unlock()
	for _, t := range start {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.inFlight, t.Key)
				s.mu.Unlock()
			}()
			select {
			case s.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-s.slots }()
			s.scrape(ctx, t)
		}()
	}
}

// failure is a failed scrape or rank: its reason label and what to log.
type failure struct {
	reason string
	err    error
}

// scrape reads t's /metrics and gives each rank's figure to the sink.
func (s *Scraper) scrape(ctx context.Context, t Target) {
	at := s.cfg.Now()
	body, f := s.get(ctx, t)
	s.m.duration.Observe(s.cfg.Now().Sub(at).Seconds())
	if ctx.Err() != nil {
		return // shutting down: not the engine's fault
	}
	var figures map[uint32]coordinator.EngineLoad
	var errs map[uint32]error
	if f == nil {
		var problems []error
		var fatal error
		figures, errs, problems, fatal = parseKept(body, t.Ranks)
		if fatal != nil {
			f = &failure{reasonFor(fatal), fatal}
		}
		for _, p := range problems {
			s.fail(t, failure{reasonFor(p), p}) // counted; no rank loses its figure
		}
	}
	if f != nil {
		s.fail(t, *f)
	}
	now := s.cfg.Now()
	for _, r := range t.Ranks {
		k := rankKey{t.Key, r}
		if l, ok := figures[r]; ok {
			l.At = at
			if err := s.sink.SetEngineLoad(t.Key, r, l); err != nil {
				s.fail(t, failure{"refused", err})
				continue
			}
			s.fresh(k, l)
			continue
		}
		if f == nil {
			if err := errs[r]; err != nil {
				s.fail(t, failure{reasonFor(err), fmt.Errorf("dp rank %d: %w", r, err)})
			}
		}
		// Unreachable: the engine's figure is already wrong. Otherwise
		// it stands until it is StaleAfter old.
		s.maybeStale(t, k, now, f != nil && f.reason == "unreachable")
	}
}

// get fetches t's /metrics within the bounds, and returns the lines of
// the load gauges (filter).
func (s *Scraper) get(ctx context.Context, t Target) ([]byte, *failure) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(t.Endpoint, "/")+"/metrics", nil)
	if err != nil {
		return nil, &failure{"bad_endpoint", err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return nil, transportFailure(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, &failure{"status", fmt.Errorf("GET /metrics: %s", resp.Status)}
	}
	if resp.ContentLength > s.cfg.MaxBodyBytes {
		return nil, &failure{"too_large", fmt.Errorf("GET /metrics: Content-Length %d, at most %d", resp.ContentLength, s.cfg.MaxBodyBytes)}
	}
	kept, err := filter(resp.Body, s.cfg.MaxBodyBytes, s.cfg.MaxSeries)
	switch {
	case err == nil:
		return kept, nil
	case errors.Is(err, errTooLarge), errors.Is(err, errParse), errors.Is(err, errTooMany):
		return nil, &failure{reasonFor(err), fmt.Errorf("GET /metrics: %w", err)}
	}
	return nil, transportFailure(ctx, err)
}

// transportFailure names a failed GET: timeout, or unreachable.
func transportFailure(ctx context.Context, err error) *failure {
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &failure{"timeout", fmt.Errorf("GET /metrics: %w", context.DeadlineExceeded)}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return &failure{"unreachable", fmt.Errorf("GET /metrics: %s", clip.N(err.Error(), 200))}
	}
	return &failure{"transport", fmt.Errorf("GET /metrics: %s", clip.N(err.Error(), 200))}
}

func reasonFor(err error) string {
	for e, r := range reasonOf {
		if errors.Is(err, e) {
			return r
		}
	}
	return "other"
}

// fresh records that rank k has figure l.
func (s *Scraper) fresh(k rankKey, l coordinator.EngineLoad) {
	s.mu.Lock()
	st := s.ranks[k]
	if st == nil { // the engine left while it was scraped
		s.mu.Unlock()
		return
	}
	back := !st.has && !st.fig.At.IsZero()
	st.fig, st.has, st.lastT = l, true, l.At
	s.mu.Unlock()
	if back {
		s.log.Info("engine load counts again", "worker", k.engine.WorkerID, "dp_rank", k.rank, "model", k.engine.Model, "group", k.engine.Group)
	}
}

// maybeStale forgets rank k's figure if it is too old (or now, if the
// engine is unreachable), telling the sink.
func (s *Scraper) maybeStale(t Target, k rankKey, now time.Time, unreachable bool) {
	s.mu.Lock()
	st := s.ranks[k]
	if st == nil || !st.has || (!unreachable && now.Sub(st.lastT) < s.cfg.StaleAfter) {
		s.mu.Unlock()
		return
	}
	st.has = false
	age := now.Sub(st.fig.At)
	s.mu.Unlock()
	if err := s.sink.SetEngineLoad(k.engine, k.rank, coordinator.EngineLoad{}); err != nil && !errors.Is(err, coordinator.ErrUnknownRank) {
		s.fail(t, failure{"refused", err})
	}
	s.log.Warn("engine load stale: selection counts the rank's bookings alone", "worker", k.engine.WorkerID, "dp_rank", k.rank,
		"model", k.engine.Model, "group", k.engine.Group, "endpoint", clip.String(t.Endpoint), "age", age.Round(time.Millisecond), "unreachable", unreachable)
}

// fail counts a failure and logs it, at most once per logEvery per
// engine (the lines suppressed are counted on the next).
func (s *Scraper) fail(t Target, f failure) {
	s.m.failures.WithLabelValues(f.reason).Inc()
	now := s.cfg.Now()
	s.mu.Lock()
	ls := s.logged[t.Key]
	if ls == nil {
		ls = &logState{}
		s.logged[t.Key] = ls
	}
	if !ls.last.IsZero() && now.Sub(ls.last) < logEvery {
		ls.suppressed++
		s.mu.Unlock()
		return
	}
	suppressed := ls.suppressed
	ls.last, ls.suppressed = now, 0
	s.mu.Unlock()
	s.log.Warn("engine load scrape failed", "worker", t.Key.WorkerID, "model", t.Key.Model, "group", t.Key.Group,
		"endpoint", clip.String(t.Endpoint), "reason", f.reason, "err", f.err, "suppressed", suppressed)
}

// RankFigure is what the scraper knows of a rank.
type RankFigure struct {
	Engine coordinator.EngineKey
	Rank   uint32
	// Load is the last figure given to the coordinator; Counts says
	// whether it still counts in selection (false: bookings alone).
	Load   coordinator.EngineLoad
	Counts bool
}

// Ranks returns every listed rank's state.
func (s *Scraper) Ranks() []RankFigure {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RankFigure, 0, len(s.ranks))
	for k, st := range s.ranks {
		out = append(out, RankFigure{Engine: k.engine, Rank: k.rank, Load: st.fig, Counts: st.has})
	}
	return out
}

func rankLabel(r uint32) string              { return strconv.FormatUint(uint64(r), 10) }
func workerLabel(id uint64) string           { return strconv.FormatUint(id, 10) }
func sinceSeconds(now, at time.Time) float64 { return now.Sub(at).Seconds() }
