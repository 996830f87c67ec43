package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prefixd/prefixd/indexer"
)

// Defaults for the zero values of Config's limits.
const (
	DefaultMaxBodyBytes = 8 << 20   // as Dynamo's selection service
	DefaultMaxTokens    = 1_000_000 // per /query (and block hashes per /query_by_hash)
)

// Config configures the handler. Index is required; the rest may be zero.
type Config struct {
	// Index answers /query, /query_by_hash and /dump, and supplies the
	// per-rank block counts and watermarks of /workers.
	Index *indexer.Index
	// Workers is the catalog and stream view. Nil (in tests, or a
	// query-only daemon): /workers returns [] and /register and
	// /unregister answer 503.
	Workers Workers
	// Ready reports readiness for /ready: (true, "") or (false, reason).
	// Nil means always ready.
	Ready func() (ready bool, reason string)
	// Metrics serves /metrics (the caller's promhttp.HandlerFor(reg, …));
	// nil → /metrics is a 404.
	Metrics http.Handler
	// APIToken, when set, is required as "Authorization: Bearer <token>"
	// on every endpoint that changes the catalog or bookings (POST
	// /register, POST /unregister, and every selection route but POST
	// /select); otherwise they answer 401. Reads stay open.
	APIToken string
	// MaxBodyBytes limits request bodies (413 beyond); 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxTokens limits token_ids per /query and block_hashes per
	// /query_by_hash (413 beyond); 0 means DefaultMaxTokens.
	MaxTokens int
	// MaxConcurrentDumps limits the GET /dump responses streaming at once
	// (503 with Retry-After beyond); 0 means DefaultMaxConcurrentDumps.
	MaxConcurrentDumps int
	// Registerer, when set, receives prefixd_http_request_duration_seconds
	// {handler, method, code} for every route.
	Registerer prometheus.Registerer
	// Logger receives one line per 5xx response (client errors are the
	// client's to log); nil discards.
	Logger *slog.Logger
	// Selector serves /select, /select_and_reserve, /reservations and
	// /disagg/plans (see selection.go); nil → those answer 503.
	Selector Selector
}

// handler serves the API. It is safe for concurrent use; all its state is
// immutable after NewHandler except the scratch pool.
type handler struct {
	cfg     Config
	log     *slog.Logger
	scratch sync.Pool // *scratch
}

// NewHandler returns the HTTP API on its own mux (never
// http.DefaultServeMux). Every response is JSON except /metrics: errors are
// {"error": "<field>: <problem>"} with a 4xx naming the field, or a 5xx;
// an unknown path is a 404 and a known path with the wrong method a 405
// with an Allow header. NewHandler panics if cfg.Index is nil.
func NewHandler(cfg Config) http.Handler {
	if cfg.Index == nil {
		panic("api.NewHandler: Config.Index is nil")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	h := &handler{cfg: cfg, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.scratch.New = func() any { return new(scratch) }

	mux := http.NewServeMux()
	var duration *prometheus.HistogramVec
	if cfg.Registerer != nil {
		duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixd_http_request_duration_seconds",
			Help:    "HTTP API request latency by route, method and status code.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}},
			[]string{"handler", "method", "code"})
		cfg.Registerer.MustRegister(duration)
	}
	route := func(path string, m methods) {
		if duration == nil {
			mux.Handle(path, m)
			return
		}
		mux.Handle(path, promhttp.InstrumentHandlerDuration(duration.MustCurryWith(prometheus.Labels{"handler": path}), m))
	}
	route("/register", methods{http.MethodPost: h.auth(h.register)})
	route("/unregister", methods{http.MethodPost: h.auth(h.unregister)})
	route("/workers", methods{http.MethodGet: h.workers})
	route("/query", methods{http.MethodPost: h.query})
	route("/query_by_hash", methods{http.MethodPost: h.queryByHash})
	route("/dump", methods{http.MethodGet: newDumper(cfg.Index, cfg.MaxConcurrentDumps, h.log).ServeHTTP})
	route("/health", methods{http.MethodGet: h.health})
	route("/ready", methods{http.MethodGet: h.ready})
	route("/metrics", methods{http.MethodGet: h.metrics})
	h.registerSelection(route)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &httpError{http.StatusNotFound, "path: no endpoint " + r.URL.Path})
	})
	return mux
}

// methods routes one path by method; HEAD is served by GET. Other methods
// get a 405 with the Allow header.
type methods map[string]http.HandlerFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, ok := m[r.Method]
	if !ok && r.Method == http.MethodHead {
		f, ok = m[http.MethodGet]
	}
	if ok {
		f(w, r)
		return
	}
	allow := make([]string, 0, len(m)+1)
	for k := range m {
		allow = append(allow, k)
		if k == http.MethodGet {
			allow = append(allow, http.MethodHead)
		}
	}
	slices.Sort(allow)
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, &httpError{http.StatusMethodNotAllowed,
		fmt.Sprintf("method: %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))})
}

// auth requires the API token, if one is configured.
func (h *handler) auth(f http.HandlerFunc) http.HandlerFunc {
	if h.cfg.APIToken == "" {
		return f
	}
	want := []byte(h.cfg.APIToken)
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			msg := "authorization: missing bearer token"
			if ok {
				msg = "authorization: invalid bearer token"
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="prefixd"`)
			writeError(w, &httpError{http.StatusUnauthorized, msg})
			return
		}
		f(w, r)
	}
}

// bearer extracts the token of an "Authorization: Bearer <token>" header
// (scheme case-insensitive, as RFC 6750 allows).
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (h *handler) health(w http.ResponseWriter, _ *http.Request) {
	writeRaw(w, http.StatusOK, statusOK)
}

func (h *handler) ready(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Ready != nil {
		if ok, reason := h.cfg.Ready(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, struct {
				Status string `json:"status"`
				Reason string `json:"reason"`
			}{"not ready", reason})
			return
		}
	}
	writeRaw(w, http.StatusOK, statusOK)
}

func (h *handler) metrics(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Metrics == nil {
		writeError(w, &httpError{http.StatusNotFound, "metrics: not enabled"})
		return
	}
	h.cfg.Metrics.ServeHTTP(w, r)
}

var statusOK = []byte(`{"status":"ok"}` + "\n")

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body) // a failed write is the client's loss; nothing to do
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only for values that cannot be marshalled: a bug
		b, status = []byte(`{"error":"internal: encode response"}`), http.StatusInternalServerError
	}
	writeRaw(w, status, append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *httpError) {
	writeJSON(w, e.status, struct {
		Error string `json:"error"`
	}{e.msg})
}

// fail writes err: an *httpError as is, anything else as a 500 that is
// logged (its text still goes to the client).
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = &httpError{http.StatusInternalServerError, err.Error()}
	}
	if he.status >= 500 {
		h.log.Error("http request failed", "method", r.Method, "path", r.URL.Path, "status", he.status, "err", err)
	}
	writeError(w, he)
}

// scratch is per-request memory reused through handler.scratch.
type scratch struct {
	body   []byte
	tokens []uint32
	hashes []uint64
	ov     []indexer.Overlap
	out    []byte
}

// Buffers grown past these by a large request are dropped rather than
// pooled, so one big request does not pin memory.
const (
	maxPooledBytes  = 1 << 20
	maxPooledTokens = 1 << 18
)

func (h *handler) getScratch() *scratch { return h.scratch.Get().(*scratch) }

func (h *handler) putScratch(s *scratch) {
	if cap(s.body) > maxPooledBytes || cap(s.out) > maxPooledBytes ||
		cap(s.tokens) > maxPooledTokens || cap(s.hashes) > maxPooledTokens {
		return
	}
	h.scratch.Put(s)
}

// Serve serves srv on ln until ctx ends, then shuts it down, letting
// requests in flight finish for at most drain. It returns when the server
// has stopped: Serve's error, or Shutdown's.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, drain time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err // never ErrServerClosed: only Shutdown below closes it
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
