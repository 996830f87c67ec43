package apiserver

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/httpbody"
)

// Defaults for the zero values of Config's limits.
const (
	DefaultMaxBodyBytes         = 8 << 20   // as Dynamo's selection service
	DefaultMaxInflightBodyBytes = 256 << 20 // request bodies held at once, over all requests
)

// Config configures the handler. Index is required; the rest may be zero.
type Config struct {
	// Index answers /query, /query_by_hash and /dump, and supplies the
	// per-rank block counts and watermarks of /workers.
	Index *indexer.Index
	// Predicted, if set, are the bookings' predictions (the Selector's
	// side index): /query and /query_by_hash show them apart, under
	// "predicted". Now is their clock (nil: time.Now).
	Predicted *indexer.Predictions
	Now       func() time.Time
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
	// on every route that changes the catalog or bookings (POST /register,
	// POST /unregister, and every selection route but POST /select and
	// GET /disagg/plans/{id}) and on GET /dump, which shows which prompts
	// are cached; without it they answer 401, with the read token 403. It
	// is accepted wherever the read token is.
	APIToken string
	// ReadToken, when set, is required (or the API token) on every other
	// route — the queries, /select, /workers, GET /disagg/plans/{id} and
	// /metrics — except the probes /health and /ready; without it they
	// answer 401. Unset, those routes are open. With a ReadToken but no
	// APIToken, the routes of the API token need the read token.
	ReadToken string
	// MaxBodyBytes limits request bodies (413 beyond); 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxTokens limits token_ids per request (413 beyond) and the
	// isl_tokens a prompt of block hashes may claim (400 beyond); 0 means
	// DefaultMaxTokens. On the selection routes token_ids never go beyond
	// DefaultMaxTokens (TokenIDs.UnmarshalJSON stops there, before it
	// allocates more); a larger MaxTokens raises only /query's bound.
	MaxTokens int
	// MaxBlockHashes limits block_hashes per request, /query_by_hash
	// and the selection routes alike (413 beyond); 0 means
	// DefaultMaxBlockHashes. As for MaxTokens, the selection routes never
	// go beyond DefaultMaxBlockHashes.
	MaxBlockHashes int
	// MaxInflightBodyBytes bounds the bytes of request bodies that all
	// requests in flight hold together, counted as they arrive: a body
	// that would go beyond it is refused with a 503 (and Retry-After), so
	// no number of slow or large uploads can make the process hold more.
	// 0 means DefaultMaxInflightBodyBytes; it is raised to MaxBodyBytes if
	// below (one body of the maximum size must fit).
	MaxInflightBodyBytes int64
	// MaxConcurrentDumps limits the GET /dump responses streaming at once
	// (503 with Retry-After beyond); 0 means DefaultMaxConcurrentDumps.
	MaxConcurrentDumps int
	// PeerDumpSlots are more GET /dump slots, only for replicas
	// restoring their index (PeerDumpHeader); 0 means
	// DefaultPeerDumpSlots.
	PeerDumpSlots int
	// DumpProgressTimeout bounds each write of a GET /dump (64 KiB at
	// most): a client that takes nothing for that long is cut off and
	// its slot freed; 0 means DefaultDumpProgressTimeout.
	DumpProgressTimeout time.Duration
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
// immutable after NewHandler except the scratch pool and the body budget.
type handler struct {
	cfg     Config
	log     *slog.Logger
	scratch sync.Pool // *scratch
	bodies  httpbody.Budget
}

// NewHandler returns the HTTP API on its own mux (never
// http.DefaultServeMux). Every response is JSON except /metrics: errors are
// {"error": "<field>: <problem>"} with a 4xx naming the field, or a 5xx;
// an unknown path is a 404 and a known path with the wrong method a 405
// with an Allow header. NewHandler panics if cfg.Index is nil.
func NewHandler(cfg Config) http.Handler {
	_, mux := newHandler(cfg)
	return mux
}

// newHandler is NewHandler, also returning the handler behind the mux.
func newHandler(cfg Config) (*handler, http.Handler) {
	if cfg.Index == nil {
		panic("api.NewHandler: Config.Index is nil")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = api.DefaultMaxTokens
	}
	if cfg.MaxBlockHashes <= 0 {
		cfg.MaxBlockHashes = api.DefaultMaxBlockHashes
	}
	if cfg.MaxInflightBodyBytes <= 0 {
		cfg.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	cfg.MaxInflightBodyBytes = max(cfg.MaxInflightBodyBytes, int64(cfg.MaxBodyBytes))
	h := &handler{cfg: cfg, log: cfg.Logger}
	h.bodies.Limit = cfg.MaxInflightBodyBytes
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
		for method, f := range m {
			m[method] = h.guard(accessOf(method, path), path, f)
		}
		if duration == nil {
			mux.Handle(path, m)
			return
		}
		mux.Handle(path, timed(duration.MustCurryWith(prometheus.Labels{"handler": path}), m, m))
	}
	route("/register", methods{http.MethodPost: h.register})
	route("/unregister", methods{http.MethodPost: h.unregister})
	route("/workers", methods{http.MethodGet: h.workers})
	route("/query", methods{http.MethodPost: h.query})
	route("/query_by_hash", methods{http.MethodPost: h.queryByHash})
	route("/dump", methods{http.MethodGet: newDumper(cfg, h.log).ServeHTTP})
	route("/health", methods{http.MethodGet: h.health})
	route("/ready", methods{http.MethodGet: h.ready})
	route("/metrics", methods{http.MethodGet: h.metrics})
	h.registerSelection(route)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &httpError{http.StatusNotFound, "path: no endpoint " + clip.N(r.URL.Path, maxEcho)})
	})
	return h, mux
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
		fmt.Sprintf("method: %s not allowed on %s (allowed: %s)", clip.N(r.Method, maxEcho), clip.N(r.URL.Path, maxEcho), strings.Join(allow, ", "))})
}

// access is who may call a route.
type access uint8

const (
	public access = iota // anyone: the probes
	reader               // the read token or the API token, when a read token is set
	writer               // the API token, when one is set
)

// accessOf classifies every route of NewHandler, by method and mux
// pattern, in this one place: the probes are public; GET /dump, which
// shows which prompts are cached, and everything that changes the catalog
// or bookings need the API token; the other reads (GETs, the queries and
// POST /select, which books nothing) need the read token.
func accessOf(method, pattern string) access {
	switch {
	case pattern == "/health" || pattern == "/ready":
		return public
	case pattern == "/dump":
		return writer
	case method == http.MethodGet || pattern == "/query" || pattern == "/query_by_hash" || pattern == "/select":
		return reader
	}
	return writer
}

// guard wraps f, the method handler of the route pattern, with the token
// check its access needs under the configured tokens.
func (h *handler) guard(a access, pattern string, f http.HandlerFunc) http.HandlerFunc {
	apiToken, readToken := []byte(h.cfg.APIToken), []byte(h.cfg.ReadToken)
	if a == writer && len(apiToken) == 0 {
		a = reader // never less guarded than the reads
	}
	if a == public || (a == reader && len(readToken) == 0) {
		return f
	}
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			unauthorized(w, http.StatusUnauthorized, "", "authorization: missing bearer token")
			return
		}
		isAPI := len(apiToken) > 0 && subtle.ConstantTimeCompare([]byte(got), apiToken) == 1
		isRead := len(readToken) > 0 && subtle.ConstantTimeCompare([]byte(got), readToken) == 1
		switch {
		case isAPI, isRead && a == reader:
			f(w, r)
		case isRead:
			unauthorized(w, http.StatusForbidden, `, error="insufficient_scope"`,
				fmt.Sprintf("authorization: the read token does not allow %s %s; it needs the API token", r.Method, pattern))
		default:
			unauthorized(w, http.StatusUnauthorized, "", "authorization: invalid bearer token")
		}
	}
}

// unauthorized answers a request the token check refused: 401 for no or
// an unknown token, 403 for the read token on an API-token route (RFC 6750).
func unauthorized(w http.ResponseWriter, status int, param, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="prefixd"`+param)
	writeError(w, &httpError{status, msg})
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
	}{clip.N(e.msg, maxErrorBytes)})
}

// Error messages repeat at most maxEcho bytes of any one value a client
// sent, and are at most maxErrorBytes long in all (a Workers or Selector
// error quoting a client's value included).
const (
	maxEcho       = clip.Echo
	maxErrorBytes = 1024
)

// fail writes err: an *httpError as is, anything else as a 500 that is
// logged (its text still goes to the client).
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = &httpError{http.StatusInternalServerError, err.Error()}
	}
	if he.status >= 500 {
		h.log.Error("http request failed", "method", r.Method, "path", clip.N(r.URL.Path, maxEcho), "status", he.status, "err", clip.N(err.Error(), maxErrorBytes))
	}
	writeError(w, he)
}

// scratch is per-request memory reused through handler.scratch.
type scratch struct {
	body   []byte
	held   int64 // body bytes taken from handler.bodies
	tokens []uint32
	hashes []uint64
	ov     []indexer.Overlap
	pred   []indexer.Overlap
	out    []byte
}

// Buffers grown past these by a large request are dropped rather than
// pooled, so one big request does not pin memory.
const (
	maxPooledBytes  = 1 << 20
	maxPooledTokens = 1 << 18
)

func (h *handler) getScratch() *scratch { return h.scratch.Get().(*scratch) }

// putScratch ends a request's use of s: it gives back the body bytes s
// holds and pools s unless it grew too large.
func (h *handler) putScratch(s *scratch) {
	h.bodies.Give(s.held)
	s.held = 0
	if cap(s.body) > maxPooledBytes || cap(s.out) > maxPooledBytes ||
		cap(s.tokens) > maxPooledTokens || cap(s.hashes) > maxPooledTokens {
		return
	}
	h.scratch.Put(s)
}
