package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/httpbody"
	"github.com/prefixd/prefixd/internal/leaf/httpserve"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
	"github.com/prefixd/prefixd/internal/tokenize"
)

// Policy is how the proxy chooses an engine for an aggregated request.
type Policy int

const (
	// KVAware asks prefixd (select and reserve): the default.
	KVAware Policy = iota
	// Random picks a healthy engine of the model at random and books
	// nothing (a baseline to compare against).
	Random
)

var policyNames = []string{KVAware: "kv", Random: "random"}

func (p Policy) String() string { return policyNames[p] }

// MarshalText implements encoding.TextMarshaler.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: "kv" or "random".
func (p *Policy) UnmarshalText(b []byte) error {
	for i, n := range policyNames {
		if string(b) == n {
			*p = Policy(i)
			return nil
		}
	}
	return fmt.Errorf("unknown policy %q (want kv or random)", b)
}

// Config configures a Proxy.
type Config struct {
	// Prefixd is the client of prefixd serve (required).
	Prefixd *client.Client
	// Engines makes the requests to engines; nil is EngineHTTPClient().
	Engines *http.Client
	// Policy chooses aggregated engines (default KVAware).
	Policy Policy
	// Disagg runs requests as disaggregated plans over prefill and decode
	// pools; Order is the plans' order (default decode-first), PlanPolicy
	// and PrefillFailure override prefixd serve's for every plan when set.
	Disagg         bool
	Order          coordinator.Order
	PlanPolicy     *api.PlanPolicy
	PrefillFailure string
	// RoutingGroup is the (decode) routing group, PrefillRoutingGroup the
	// prefill pool's (default RoutingGroup); "" is the default group.
	RoutingGroup, PrefillRoutingGroup string
	// RequestTimeout bounds each request from its arrival to its last
	// byte (default 10 minutes).
	RequestTimeout time.Duration
	// QueueWait bounds how long an aggregated request waits in prefixd
	// serve's router queue while every engine is busy (0: serve's
	// --queue-max-wait and the request's deadline alone). Every
	// aggregated request asks to wait, at the priority of its
	// x-prefixd-priority header; a serve without a queue never holds it.
	QueueWait time.Duration
	// ReadTimeout bounds reading a request, headers and body, from its
	// first byte (default DefaultReadTimeout): a body still arriving then
	// is cut off with a 408 and its connection closed.
	ReadTimeout time.Duration
	// MaxBodyBytes bounds a request body (default 32 MiB; 413 beyond).
	// BodyBudget bounds the bytes the bodies of the requests in flight
	// hold together, counted as they arrive and held until each request
	// ends: a body that does not fit is a 503 with Retry-After (default
	// DefaultBodyBudget, raised to MaxBodyBytes + 1 if below). BodyReserve,
	// the last part of it, is lent only to bodies that keep arriving: a
	// body whose buffer grows while the bodies hold more than BodyBudget −
	// BodyReserve must fill that buffer, or end, within BodyHold, or it is
	// cut off with a 408 (defaults: a quarter of BodyBudget, and 2 s). So
	// bodies that stall never hold the reserve for longer than BodyHold
	// (httpbody.Budget).
	MaxBodyBytes int64
	BodyBudget   int64
	BodyReserve  int64
	BodyHold     time.Duration
	// TokenizeCache is how many tokenize answers are kept (default 4096),
	// TokenizeCacheBytes how many bytes they may take together (default
	// DefaultTokenizeCacheBytes); an answer larger than a sixteenth of
	// TokenizeCacheBytes is not kept.
	TokenizeCache      int
	TokenizeCacheBytes int64
	// PassThrough are the paths of the engines' own routes that the proxy
	// passes to a healthy engine, exactly as given (nil:
	// DefaultPassThrough; empty: none). Any other path the proxy does not
	// serve itself is a 404: an engine's other routes (vLLM's admin and
	// debug routes) are not for the proxy's clients, who need no token.
	PassThrough []string
	// Refresh is how often the fleet view is listed (default 2 s).
	Refresh time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Rand seeds the random policy; nil seeds at random.
	Rand *rand.Rand
}

// DefaultPassThrough are the engine routes passed through by default:
// vLLM's tokenizer, which a client needs beside the routes the proxy
// serves itself.
var DefaultPassThrough = []string{"/tokenize", "/detokenize"}

// ownRoutes are the paths the proxy serves itself.
var ownRoutes = []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}

// Proxy is the OpenAI-compatible frontend. Create with New, serve
// Handler, and run Run for the fleet view.
type Proxy struct {
	cfg   Config
	log   *slog.Logger
	fleet *fleet
	tok   *tokenizer
	m     *metrics
	reg   *prometheus.Registry

	pass map[string]bool // Config.PassThrough

	randMu sync.Mutex
	rand   *rand.Rand
	bodies httpbody.Budget
	full   logEvery // the line of a body refused for the budget
	access *access  // whether prefixd accepts the proxy's token
	// The lines of requests routed by load, at most one each per
	// fallbackLogEvery: no tokenizer answered, prefixd did not choose.
	noTokenizer, noPrefixd logEvery
}

// fallbackLogEvery bounds the lines of requests routed by load: at most
// one a reason per interval, with the count of those held back.
const fallbackLogEvery = 10 * time.Second

// Defaults of Config.
const (
	DefaultReadTimeout = 30 * time.Second
	DefaultBodyBudget  = 256 << 20
	// DefaultTokenizeCacheBytes keeps 16 answers of the largest prompt
	// (a million ids) or thousands of a chat's.
	DefaultTokenizeCacheBytes = 64 << 20
)

// EngineHTTPClient returns the client for engine requests: keep-alive
// connections pooled per engine (256 idle), 2 s dial timeout, no overall
// timeout (a request's deadline bounds it: a long generation is not an
// error).
func EngineHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// New returns a Proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if cfg.Prefixd == nil {
		return nil, errors.New("proxy: Config.Prefixd is required")
	}
	if cfg.Engines == nil {
		cfg.Engines = EngineHTTPClient()
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	if cfg.BodyBudget <= 0 {
		cfg.BodyBudget = DefaultBodyBudget
	}
	cfg.BodyBudget = max(cfg.BodyBudget, cfg.MaxBodyBytes+1)
	if cfg.BodyReserve <= 0 {
		cfg.BodyReserve = cfg.BodyBudget / 4
	}
	cfg.BodyReserve = min(cfg.BodyReserve, cfg.BodyBudget)
	if cfg.BodyHold <= 0 {
		cfg.BodyHold = 2 * time.Second
	}
	if cfg.TokenizeCache <= 0 {
		cfg.TokenizeCache = 4096
	}
	if cfg.TokenizeCacheBytes <= 0 {
		cfg.TokenizeCacheBytes = DefaultTokenizeCacheBytes
	}
	if cfg.PassThrough == nil {
		cfg.PassThrough = DefaultPassThrough
	}
	pass := map[string]bool{}
	for _, path := range cfg.PassThrough {
		switch {
		case !strings.HasPrefix(path, "/"):
			return nil, fmt.Errorf("proxy: pass-through path %q does not start with /", path)
		case slices.Contains(ownRoutes, path):
			return nil, fmt.Errorf("proxy: pass-through path %q is served by the proxy itself", path)
		}
		pass[path] = true
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RoutingGroup == "" {
		cfg.RoutingGroup = catalog.DefaultRoutingGroup
	}
	if cfg.PrefillRoutingGroup == "" {
		cfg.PrefillRoutingGroup = cfg.RoutingGroup
	}
	if cfg.PrefillFailure != "" {
		var f coordinator.FailurePolicy
		if err := f.UnmarshalText([]byte(cfg.PrefillFailure)); err != nil {
			return nil, fmt.Errorf("proxy: prefill failure: %w", err)
		}
	}
	r := cfg.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, fleet: newFleet(cfg.Prefixd, cfg.Logger), reg: prometheus.NewRegistry(), pass: pass, rand: r,
		full: logEvery{every: time.Minute}, noTokenizer: logEvery{every: fallbackLogEvery}, noPrefixd: logEvery{every: fallbackLogEvery}}
	p.access = newAccess(cfg.Prefixd, cfg.Logger, cfg.Disagg || cfg.Policy == KVAware)
	p.bodies = httpbody.Budget{Limit: cfg.BodyBudget, Reserve: cfg.BodyReserve, Hold: cfg.BodyHold, ReadTimeout: cfg.ReadTimeout}
	p.m = newMetrics(p.bodies.Used)
	cache := newTokenCache(cfg.TokenizeCache, cfg.TokenizeCacheBytes, p.m.cacheEvictions, p.m.cacheRefusals)
	p.m.watchCache(cache)
	p.tok = newTokenizer(cfg.Engines, cache)
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := p.m.register(p.reg); err != nil {
		return nil, err
	}
	if err := p.reg.Register(p.access.gauge); err != nil {
		return nil, err
	}
	return p, nil
}

// Run keeps the fleet view fresh until ctx ends; then it closes the idle
// connections to the engines and, through Prefixd's own HTTP client, to
// prefixd (a connection dialed for a request that was cancelled meanwhile
// is pooled unused, and would hold up an engine's or prefixd's graceful
// shutdown for 5 s; a nil client.HTTP is the process's shared one, left
// alone).
//
// It also checks, at start and then periodically, that prefixd accepts
// the proxy's token on its booking routes, and logs when that changes
// (a refused token as an ERROR: every request is then routed by load).
func (p *Proxy) Run(ctx context.Context) error {
	defer p.cfg.Engines.CloseIdleConnections()
	if hc := p.cfg.Prefixd.HTTP; hc != nil {
		defer hc.CloseIdleConnections()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.fleet.run(gctx, p.cfg.Refresh) })
	g.Go(func() error { return p.access.run(gctx, p.cfg.Refresh) })
	return g.Wait()
}

// Synced is closed once the fleet view was listed.
func (p *Proxy) Synced() <-chan struct{} { return p.fleet.synced }

// Bookings returns how many reservations and plans the proxy holds for
// requests in flight: zero when it is idle, whatever became of its
// requests.
func (p *Proxy) Bookings() int { return int(p.m.open.Load()) }

// BodyBytes returns the bytes the bodies of the requests in flight hold
// (of Config.BodyBudget): zero when the proxy is idle.
func (p *Proxy) BodyBytes() int64 { return p.bodies.Used() }

// Serve serves Handler on ln and keeps the fleet view fresh until ctx
// ends, then drains requests in flight for at most drain.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener, drain time.Duration) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Run(gctx) })
	g.Go(func() error { return httpserve.Serve(gctx, p.Server(), ln, drain) })
	err := g.Wait()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Server returns the http.Server that Serve runs: Handler, with
// Config.ReadTimeout for a whole request, 10 s for its headers, 64 KiB of
// them, and keep-alive connections closed after 2 minutes idle. It sets
// no WriteTimeout: a streamed answer lasts as long as its generation
// (Config.RequestTimeout bounds it).
func (p *Proxy) Server() *http.Server {
	return &http.Server{Handler: httpbody.CloseChunked(p.Handler()), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: p.cfg.ReadTimeout,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

// Handler serves the OpenAI routes, /v1/models, /health, /metrics and
// the engines' routes of Config.PassThrough (passed to a healthy engine);
// any other path is a 404, a known path with another method a 405, in
// OpenAI's error shape.
func (p *Proxy) Handler() http.Handler {
	metrics := promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, completions) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, chat) })
	mux.HandleFunc("GET /v1/models", p.models)
	mux.HandleFunc("GET /health", p.health)
	mux.Handle("GET /metrics", metrics)
	for _, path := range ownRoutes {
		allow := http.MethodGet
		if strings.HasPrefix(path, "/v1/") && path != "/v1/models" {
			allow = http.MethodPost
		}
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			openAIError(w, http.StatusMethodNotAllowed, "", fmt.Sprintf("%s %s: method not allowed (%s only)", r.Method, path, allow))
		})
	}
	mux.HandleFunc("/", p.passThrough)
	return mux
}

// health answers GET /health: 200 while the proxy serves, with
// "booking" saying whether prefixd accepts its token (bookingNames); when
// it does not, the status is "degraded" and "detail" says why. A proxy
// that cannot book still serves every request (by load), so it stays
// live and ready: the detail is for people and monitors.
func (p *Proxy) health(w http.ResponseWriter, _ *http.Request) {
	s, detail := p.access.current()
	out := struct {
		Status  string `json:"status"`
		Booking string `json:"booking"`
		Detail  string `json:"detail,omitempty"`
	}{Status: "ok", Booking: s.String()}
	if s == bookingUnauthorized {
		out.Status = "degraded"
		out.Detail = "prefixd refuses the proxy's token (" + detail + "): nothing is booked, requests are routed by load; give the proxy prefixd serve's --api-token"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (p *Proxy) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range p.fleet.models() {
		out.Data = append(out.Data, model{ID: m, Object: "model", OwnedBy: "prefixd"})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// passThrough sends a route of Config.PassThrough to a healthy engine, in
// turn; any other path is a 404.
func (p *Proxy) passThrough(w http.ResponseWriter, r *http.Request) {
	if !p.pass[r.URL.Path] {
		passed := "no route"
		if len(p.cfg.PassThrough) > 0 {
			passed = "only " + strings.Join(p.cfg.PassThrough, ", ")
		}
		openAIError(w, http.StatusNotFound, "", fmt.Sprintf("%s: no such route (the proxy passes %s to the engines)", clip.String(r.URL.Path), passed))
		return
	}
	e, ok := p.fleet.next(p.fleet.all())
	if !ok {
		openAIError(w, http.StatusServiceUnavailable, "", "no engine to pass "+r.URL.Path+" to")
		return
	}
	u, err := url.Parse(e.endpoint)
	if err != nil {
		openAIError(w, http.StatusBadGateway, "", fmt.Sprintf("engine %d: bad endpoint: %v", e.id, err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport: p.cfg.Engines.Transport,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			openAIError(w, http.StatusBadGateway, "", fmt.Sprintf("engine %d: %v", e.id, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// serve runs one completions or chat request.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, k kind) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.RequestTimeout)
	defer cancel()
	// The body's bytes stay charged to the budget until the request ends:
	// the body is parsed, then sent to the engines.
	var held int64
	defer func() { p.bodies.Give(held) }()
	body, berr := httpbody.Read(w, r, nil, int(p.cfg.MaxBodyBytes), &p.bodies, &held)
	if berr != nil {
		p.bodyRefused(berr)
		openAIError(w, berr.Status, "", berr.Msg)
		return
	}
	req, err := parseRequest(k, body)
	if err != nil {
		p.m.requests.WithLabelValues(k.Label(), "invalid").Inc()
		status := http.StatusBadRequest
		if le := (*jsonlex.Error)(nil); errors.As(err, &le) && le.Over {
			status = http.StatusRequestEntityTooLarge
		}
		openAIError(w, status, fieldOf(err), err.Error())
		return
	}
	x := &exchange{p: p, w: w, r: r, ctx: ctx, req: req, id: newID(), start: start, hdr: forwardHeaders(r.Header)}
	outcome := "ok"
	switch {
	case !p.fleet.serves(req.Model):
		outcome = x.unknownModel()
	case p.cfg.Disagg:
		outcome = x.disaggregated()
	default:
		outcome = x.aggregated()
	}
	p.m.requests.WithLabelValues(k.Label(), outcome).Inc()
	p.m.duration.WithLabelValues(k.Label()).Observe(time.Since(start).Seconds())
}

// bodyRefused counts a body that was not read, and logs the budget being
// full (at most once a minute: a state of the proxy, not a client's
// mistake).
func (p *Proxy) bodyRefused(err *httpbody.Error) {
	p.m.bodiesRefused.WithLabelValues(err.Reason).Inc()
	if err.Reason != httpbody.OverBudget {
		return
	}
	if n, ok := p.full.allow(time.Now()); ok {
		p.log.Warn("proxy: request bodies refused: the body budget is full", "budget_bytes", p.cfg.BodyBudget, "held_bytes", p.bodies.Used(), "suppressed", n)
	}
}

// logEvery rate-limits a log line: allow says whether a line may be
// written now, at most one per every, and how many were held back since
// the last one. Safe for concurrent use.
type logEvery struct {
	every time.Duration
	mu    sync.Mutex // guards last and held
	last  time.Time
	held  int
}

func (l *logEvery) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.held++
		return 0, false
	}
	n := l.held
	l.last, l.held = now, 0
	return n, true
}

// newID returns a request id for bookings.
func newID() string {
	return "px-" + strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64()&0xffff, 36)
}

// forwardHeaders are the client's headers an engine is sent: its
// authorization (vLLM's --api-key) and any X- headers.
func forwardHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, vs := range h {
		if k == "Authorization" || strings.HasPrefix(k, "X-") {
			out[k] = vs
		}
	}
	return out
}

// tokens returns the request's token ids for selection: the client's, or
// the engine's tokenizer's. ok false means none could be had (counted,
// logged): the request is then routed by load. A prompt prefixd would
// refuse is refused here first (tooLong, a 413), before anything is
// booked.
func (x *exchange) tokens(es []engine) (ids []uint32, ok bool, tooLong error) {
	if x.req.Tokens != nil {
		x.p.m.tokenize.WithLabelValues("client").Inc()
		return x.req.Tokens, true, routable(x.req.Tokens)
	}
	body := x.req.AppendTokenizeBody(nil)
	var last error
	for range 2 {
		e, ok := x.p.fleet.next(es)
		if !ok {
			break
		}
		ids, hit, err := x.p.tok.tokens(x.ctx, e.endpoint, body)
		if err == nil {
			x.p.m.tokenize.WithLabelValues(map[bool]string{true: "cache", false: "engine"}[hit]).Inc()
			return ids, true, routable(ids)
		}
		if tl := (*promptTooLong)(nil); errors.As(err, &tl) {
			x.p.m.tokenize.WithLabelValues("engine").Inc()
			return nil, false, tl
		}
		last = err
	}
	x.p.m.tokenize.WithLabelValues("unavailable").Inc()
	if last == nil {
		return nil, false, nil // no engine to ask: the caller says so
	}
	if n, ok := x.p.noTokenizer.allow(time.Now()); ok {
		x.p.log.Warn("proxy: no tokenizer answered; routing by load", "request", x.id, "model", x.req.Model, "err", last, "suppressed", n)
	}
	return nil, false, nil
}

// prefixdMaxBody is prefixd serve's request body limit
// (apiserver.DefaultMaxBodyBytes; TestPrefixdLimits checks they agree):
// the selection or plan body that carries a prompt's token ids must fit
// in it.
const prefixdMaxBody = 8 << 20

// maxPromptJSON bounds a prompt's token ids written as JSON: prefixd's
// body limit, less room for the rest of a selection or plan body.
const maxPromptJSON = prefixdMaxBody - 64<<10

// promptTooLong is a prompt prefixd would refuse to route: a 413.
type promptTooLong = tokenize.PromptTooLong

// routable returns a *promptTooLong if ids, written as JSON, would not fit
// in a body prefixd accepts (their count is bounded where they are read).
func routable(ids []uint32) error {
	if len(ids)*11+2 <= maxPromptJSON { // 10 digits and a comma each
		return nil
	}
	n := 1 + len(ids)
	for _, id := range ids {
		for n++; id >= 10; id /= 10 {
			n++
		}
	}
	if n <= maxPromptJSON {
		return nil
	}
	return &promptTooLong{Msg: fmt.Sprintf("prompt: its %d token ids take %d bytes as JSON, more than the %d a prompt may take to be routed", len(ids), n, maxPromptJSON)}
}
