package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/httpbody"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
	"github.com/prefixd/prefixd/internal/leaf/oaierror"
	"github.com/prefixd/prefixd/internal/tokenize"
)

// The names of GIE's Endpoint Picker Protocol
// (docs/proposals/004-endpoint-picker-protocol) and llm-d's P/D header.
const (
	// DestinationHeader and DestinationKey (in namespace LBNamespace of
	// the dynamic metadata) carry the picked endpoints: ip:port, then the
	// fallbacks, comma-separated.
	DestinationHeader = "x-gateway-destination-endpoint"
	DestinationKey    = DestinationHeader
	LBNamespace       = "envoy.lb"
	// SubsetNamespace / SubsetKey in the request's filter metadata list the
	// endpoints the pick is restricted to.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey in LBNamespace of the response's filter metadata names the
	// endpoint that served.
	ServedKey = "x-gateway-destination-endpoint-served"
	// PrefillerHeader names a disaggregated plan's prefill engine (ip:port)
	// to the decode engine's sidecar (llm-d's routing sidecar).
	PrefillerHeader = "x-prefiller-host-port"
	// RequestIDHeader is the request's id, the booking's.
	RequestIDHeader = "x-request-id"
	// PriorityHeader is the request's router-queue priority (an integer,
	// -MaxPriority to MaxPriority, higher first); ObjectiveHeader names
	// the request's InferenceObjective (GIE), whose priority
	// Config.Priorities gives when PriorityHeader is absent.
	PriorityHeader  = api.PriorityHeader
	ObjectiveHeader = "x-gateway-inference-objective"
)

// MaxPriority bounds a request's priority either way: PriorityHeader's
// and Config.Priorities'.
const MaxPriority = 1000

// Config configures a Server. Zero fields take the defaults noted.
type Config struct {
	// Service books the requests (required); Endpoints names the engines
	// (required; the daemon feeds it from the catalog).
	Service   *coordinator.Service
	Endpoints *Endpoints
	// Group is the routing group picked in (default "default"); a
	// disaggregated plan's decode and prefill pools are both in it.
	Group string
	// Disagg books decode-first plans (the coordinator's configuration
	// decides order and policy); the destination is the decode engine.
	Disagg bool
	// Fallbacks is how many next-best endpoints follow the primary in an
	// aggregated answer (default 2; negative: none; at most MaxFallbacks).
	Fallbacks int
	// BodyMode is the body mode assumed for both directions when the
	// gateway's first message has no protocol_config:
	// FULL_DUPLEX_STREAMED (the default, GIE's) or BUFFERED. A gateway
	// that buffers and does not say so would otherwise wait for the
	// headers' answer while the picker waits for the body.
	BodyMode filterv3.ProcessingMode_BodySendMode
	// MaxBodyBytes bounds one request body (default 8 MiB, as serve's
	// API: 413 beyond); BodyBudget the bytes of every body the streams
	// hold together (default 256 MiB: 503 beyond); BodyTimeout the time
	// from the request headers to the body's end (default 30 s: 408).
	MaxBodyBytes int64
	BodyBudget   int64
	BodyTimeout  time.Duration
	// TokenizeTimeout bounds asking an engine's tokenizer (default 5 s);
	// TokenizeCache and TokenizeCacheBytes bound its cache (default 4096
	// answers, 64 MiB).
	TokenizeTimeout    time.Duration
	TokenizeCache      int
	TokenizeCacheBytes int64
	// Engines makes the tokenize requests (default: a pooled client).
	Engines *http.Client
	// Ready says whether the daemon is ready (readiness); nil is always.
	Ready func() bool
	// Priorities maps an InferenceObjective's name (ObjectiveHeader) to
	// the router-queue priority of its requests, -MaxPriority to
	// MaxPriority; an objective not listed, or none, is priority 0.
	// PriorityHeader wins over it. The priorities order the requests
	// that wait (Service's ServiceConfig.Queue) and decide which are
	// shed first; without a queue they do nothing.
	Priorities map[string]int
	// HealthInterval is how often readiness is read for the health
	// service (default 1 s).
	HealthInterval time.Duration
	Logger         *slog.Logger
	// Registerer receives the metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
}

// MaxFallbacks bounds Config.Fallbacks.
const MaxFallbacks = 16

// Server is the ext_proc service. Create with New.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg    Config
	log    *slog.Logger
	m      *metrics
	tok    *tokenize.Client
	cache  *tokenize.Cache
	bodies httpbody.Budget // what the request bodies hold over every stream
	rr     atomic.Uint64   // round-robin over the engines that tokenize
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Service == nil || cfg.Endpoints == nil {
		return nil, errors.New("epp: Config.Service and Config.Endpoints are required")
	}
	if cfg.Group == "" {
		cfg.Group = catalog.DefaultRoutingGroup
	}
	if cfg.Fallbacks == 0 {
		cfg.Fallbacks = 2
	}
	if cfg.Fallbacks > MaxFallbacks {
		return nil, fmt.Errorf("epp: Config.Fallbacks %d: at most %d", cfg.Fallbacks, MaxFallbacks)
	}
	cfg.Fallbacks = max(cfg.Fallbacks, 0)
	prios := make(map[string]int, len(cfg.Priorities))
	for name, p := range cfg.Priorities {
		if name == "" || p < -MaxPriority || p > MaxPriority {
			return nil, fmt.Errorf("epp: Config.Priorities[%q] = %d: want a name and a priority from %d to %d", clip.String(name), p, -MaxPriority, MaxPriority)
		}
		prios[name] = p
	}
	cfg.Priorities = prios // a copy: the caller's map may change
	switch cfg.BodyMode {
	case filterv3.ProcessingMode_NONE:
		cfg.BodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED:
	default:
		return nil, fmt.Errorf("epp: Config.BodyMode %v: want FULL_DUPLEX_STREAMED or BUFFERED", cfg.BodyMode)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.BodyBudget <= 0 {
		cfg.BodyBudget = 256 << 20
	}
	cfg.BodyBudget = max(cfg.BodyBudget, cfg.MaxBodyBytes)
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 30 * time.Second
	}
	if cfg.TokenizeTimeout <= 0 {
		cfg.TokenizeTimeout = 5 * time.Second
	}
	if cfg.TokenizeCache <= 0 {
		cfg.TokenizeCache = 4096
	}
	if cfg.TokenizeCacheBytes <= 0 {
		cfg.TokenizeCacheBytes = 64 << 20
	}
	if cfg.Engines == nil {
		cfg.Engines = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return true }
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, m: newMetrics()}
	s.bodies.Limit = cfg.BodyBudget
	s.cache = tokenize.NewCache(cfg.TokenizeCache, cfg.TokenizeCacheBytes, s.m.cacheEvictions, s.m.cacheRefusals)
	s.tok = tokenize.New(cfg.Engines, s.cache)
	if cfg.Registerer != nil {
		if err := s.m.register(cfg.Registerer, s); err != nil {
			return nil, fmt.Errorf("epp metrics: %w", err)
		}
	}
	return s, nil
}

// Bookings returns how many reservations and plans the streams hold:
// zero when no request is in flight, whatever became of the requests.
func (s *Server) Bookings() int { return int(s.m.open.Load()) }

// BodyBytes returns the bytes the request bodies in flight hold.
func (s *Server) BodyBytes() int64 { return s.bodies.Used() }

// picked is what the picker booked for one request.
type picked struct {
	dest      string   // the primary endpoint
	fallbacks []string // the fallback endpoints, in order
	ranks     map[string]indexer.Rank
	prefiller string // a plan's prefill engine, "" if none
	plan      bool
}

// exchange is one stream's request: driven by the messages of the
// stream, on the stream's goroutine but for the body timer, which
// only sends its 408 (under sendMu) and sets timedOut.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	sendMu sync.Mutex // one sender at a time: the stream and the body timer

	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	id                string
	route             tokenize.Route
	subset            []string
	hasSubset         bool
	body              []byte
	held              int64 // what body holds of the budget: its capacity
	length            int64 // the body's content-length, 0 if not given
	timer             *time.Timer
	timedOut          atomic.Bool
	answered          atomic.Bool // the request's destination was sent (read by the timer)
	immediate         atomic.Bool // an immediate response ended the request (read by the timer)
	trailers          bool        // the request had trailers
	model             string
	priority          int           // the request's router-queue priority
	session           string        // its x-session-id (serve --session-ttl)
	retryAfter        time.Duration // a shed request's Retry-After, 0 if none

	pick        *picked
	booked      bool // a reservation or plan is held
	prefillDone bool
}

// Process serves one ext_proc stream: one HTTP request and its response.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{s: s, stream: stream, reqMode: s.cfg.BodyMode, respMode: s.cfg.BodyMode}
	defer x.end()
	first := true
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil // the gateway closed the stream (EOF) or it broke: end frees
		}
		if first {
			first = false
			if pc := req.GetProtocolConfig(); pc != nil {
				x.reqMode, x.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
			}
		}
		if x.timedOut.Load() || x.immediate.Load() {
			continue // answered with an immediate response: the gateway ends the stream
		}
		if err := x.handle(req); err != nil {
			return err
		}
	}
}

// end gives back what the stream holds: the body's budget, and the
// booking if the response did not end it (the client went away, the
// gateway reset the stream).
func (x *exchange) end() {
	if x.timer != nil {
		x.timer.Stop()
	}
	x.dropBody()
	x.release()
}

func (x *exchange) send(r *extprocv3.ProcessingResponse) error {
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	if x.timedOut.Load() {
		return nil
	}
	return x.stream.Send(r)
}

func (x *exchange) handle(req *extprocv3.ProcessingRequest) error {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(req, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		x.trailers = true
		if !x.answered.Load() {
			if err := x.decide(false); err != nil || x.immediate.Load() {
				return err
			}
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.responseHeaders(req, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.release()
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

func (x *exchange) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	switch x.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
	default:
		return x.fail(http.StatusInternalServerError, "",
			fmt.Sprintf("the gateway sends request bodies in mode %v: the picker reads FULL_DUPLEX_STREAMED or BUFFERED bodies", x.reqMode))
	}
	path, prio, objective := "", "", ""
	hasPrio := false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":path":
			path = headerValue(hv)
		case RequestIDHeader:
			x.id = headerValue(hv)
		case "content-length":
			x.length, _ = strconv.ParseInt(headerValue(hv), 10, 64)
		case PriorityHeader:
			prio, hasPrio = headerValue(hv), true
		case ObjectiveHeader:
			objective = headerValue(hv)
		case api.SessionHeader:
			x.session = headerValue(hv)
		}
	}
	switch p, err := strconv.Atoi(prio); {
	case hasPrio && (err != nil || p < -MaxPriority || p > MaxPriority):
		return x.fail(http.StatusBadRequest, PriorityHeader,
			fmt.Sprintf("header %s %q: want an integer from %d to %d", PriorityHeader, clip.String(prio), -MaxPriority, MaxPriority))
	case hasPrio:
		x.priority = p
	default:
		x.priority = x.s.cfg.Priorities[objective] // 0 when not listed
	}
	if len(x.id) > 128 {
		x.id = x.id[:128]
	}
	if x.id == "" {
		x.id = newID()
	}
	p, _, _ := strings.Cut(path, "?")
	x.route = tokenize.Completions
	if strings.HasSuffix(p, "/chat/completions") {
		x.route = tokenize.Chat
	}
	x.subset, x.hasSubset = subsetHint(req.GetMetadataContext())
	if h.GetEndOfStream() {
		return x.fail(http.StatusBadRequest, "", "body: required (an OpenAI completions or chat request names its model in the body)")
	}
	x.timer = time.AfterFunc(x.s.cfg.BodyTimeout, x.bodyTimeout)
	if x.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Buffered: the gateway waits for this answer before it sends
		// the body; the destination goes with the body's answer.
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	}
	return nil
}

// bodyTimeout runs on the timer's goroutine: a body still arriving is
// answered with a 408.
func (x *exchange) bodyTimeout() {
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	if x.timedOut.Load() || x.answered.Load() || x.immediate.Load() {
		return
	}
	x.s.m.bodiesRefused.WithLabelValues("timeout").Inc()
	x.s.m.errors.WithLabelValues("408").Inc()
	x.stream.Send(immediate(http.StatusRequestTimeout, "", fmt.Sprintf("body: not complete within %v", x.s.cfg.BodyTimeout)))
	x.timedOut.Store(true)
}

func (x *exchange) requestBody(b *extprocv3.HttpBody) error {
	if x.answered.Load() {
		return nil
	}
	chunk := b.GetBody()
	if int64(len(x.body))+int64(len(chunk)) > x.s.cfg.MaxBodyBytes {
		x.s.m.bodiesRefused.WithLabelValues("too_large").Inc()
		return x.fail(http.StatusRequestEntityTooLarge, "", fmt.Sprintf("body: more than the limit of %d bytes", x.s.cfg.MaxBodyBytes))
	}
	if need := int64(len(x.body) + len(chunk)); need > int64(cap(x.body)) {
		// A buffer for the whole body when the gateway said its length,
		// else the next size up, within the cap: charged as taken.
		size := min(max(need, x.length, int64(cap(x.body))*2), x.s.cfg.MaxBodyBytes)
		size = bufSize(size)
		if _, ok := x.s.bodies.Take(size - x.held); !ok {
			x.s.m.bodiesRefused.WithLabelValues("budget").Inc()
			return x.fail(http.StatusServiceUnavailable, "", "the picker's body budget is full: retry")
		}
		nb := getBuf(size)
		nb = append(nb, x.body...)
		putBuf(x.body)
		x.body, x.held = nb, size
	}
	x.body = append(x.body, chunk...)
	if b.GetEndOfStream() || x.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return x.decide(b.GetEndOfStream())
	}
	return nil
}

// decide picks and answers: the destination, then the body back as the
// mode wants it. eos says the body ended the request (no trailers).
func (x *exchange) decide(eos bool) error {
	if x.timer != nil {
		x.timer.Stop()
	}
	start := time.Now()
	pk, status, param, msg := x.pickFor()
	if pk == nil && status == 0 {
		return nil // the stream ended while the request waited: nobody to answer
	}
	if pk == nil {
		return x.fail(status, param, msg)
	}
	x.s.m.decision.Observe(time.Since(start).Seconds())
	dest := pk.dest
	if len(pk.fallbacks) > 0 {
		dest += "," + strings.Join(pk.fallbacks, ",")
	}
	x.s.m.picks.WithLabelValues(pk.dest).Inc()
	x.s.m.fallbacksOffered.Add(float64(len(pk.fallbacks)))
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(dest)}}}
	if pk.prefiller != "" {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: PrefillerHeader, RawValue: []byte(pk.prefiller)}})
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{LBNamespace: structpb.NewStructValue(&structpb.Struct{
		Fields: map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(dest)}})}}
	x.answered.Store(true)
	if x.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Buffered: the body's answer carries the header mutation; the
		// body passes unchanged.
		err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}, DynamicMetadata: meta})
		x.dropBody()
		return err
	}
	// Full duplex: the headers' answer first, then the body back in
	// chunks of at most 32,000 bytes (Envoy recommends under 64 KiB; a
	// message under 32 KiB takes a buffer of grpc-go's 32 KiB tier, the
	// next is 1 MiB, zeroed on each use), the last marked end of stream
	// unless trailers follow.
	if err := x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}, DynamicMetadata: meta}); err != nil {
		return err
	}
	const chunk = 32000
	body := x.body
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), chunk)
		last := n == len(body)
		r := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: last && eos}}}}}}}
		if err := x.send(r); err != nil {
			return err
		}
		body = body[n:]
	}
	x.dropBody()
	return nil
}

func (x *exchange) dropBody() {
	x.s.bodies.Give(x.held)
	putBuf(x.body)
	x.held, x.body = 0, nil
}

// bodyBufs pools request body buffers by size class: class c holds
// buffers of minBuf << c bytes, up to maxPooledBody; larger bodies are
// allocated and left to the collector.
var bodyBufs [bodyClasses]sync.Pool

const (
	minBuf      = 4 << 10
	bodyClasses = 9 // up to minBuf << 8, maxPooledBody
)

// bufSize is the capacity a buffer for n bytes is given: its class's
// size, or n beyond the pooled ones.
func bufSize(n int64) int64 {
	for c := range bodyClasses {
		if size := int64(minBuf) << c; n <= size {
			return size
		}
	}
	return n
}

// getBuf returns an empty buffer of capacity size (a bufSize).
func getBuf(size int64) []byte {
	for c := range bodyClasses {
		if int64(minBuf)<<c == size {
			if p, ok := bodyBufs[c].Get().(*[]byte); ok {
				return (*p)[:0]
			}
			break
		}
	}
	return make([]byte, 0, size)
}

// putBuf gives b, a getBuf buffer no longer used, back to its pool.
func putBuf(b []byte) {
	for c := range bodyClasses {
		if int64(minBuf)<<c == int64(cap(b)) {
			bodyBufs[c].Put(&b)
			return
		}
	}
}

// fail answers the request with an immediate response in OpenAI's error
// shape, and counts it.
func (x *exchange) fail(status int, param, msg string) error {
	if x.timer != nil {
		x.timer.Stop()
	}
	x.immediate.Store(true)
	x.s.m.errors.WithLabelValues(strconv.Itoa(status)).Inc()
	x.dropBody()
	r := immediate(status, param, msg)
	if x.retryAfter > 0 {
		h := r.GetImmediateResponse().Headers
		h.SetHeaders = append(h.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after",
			RawValue: strconv.AppendInt(nil, int64(x.retryAfter/time.Second), 10)}})
	}
	return x.send(r)
}

// immediate is the immediate response of status, with OpenAI's error
// object as vLLM answers it (oaierror).
func immediate(status int, param, msg string) *extprocv3.ProcessingResponse {
	body := oaierror.Body(status, param, msg)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}},
		Body:    body,
		Details: "prefixd_epp_" + strconv.Itoa(status),
	}}}
}

// pickFor reads the body, tokenizes and books, waiting in the router
// queue if the Service has one and every engine is busy: the pick, or
// the immediate response's status, param and message; neither (status
// 0) when the stream ended while the request waited.
func (x *exchange) pickFor() (pk *picked, status int, param, msg string) {
	s := x.s
	req, err := tokenize.Read(x.route, x.body)
	if err != nil {
		status := http.StatusBadRequest
		if le := (*jsonlex.Error)(nil); errors.As(err, &le) && le.Over {
			status = http.StatusRequestEntityTooLarge
		}
		return nil, status, "", err.Error()
	}
	x.model = req.Model
	ids, bases, known := s.cfg.Endpoints.candidates(req.Model, s.cfg.Group, x.subset, x.hasSubset)
	switch {
	case !known:
		return nil, http.StatusNotFound, "model", fmt.Sprintf("model %q: not served by this pool (routing group %q)", clip.String(req.Model), s.cfg.Group)
	case len(ids) == 0 && x.hasSubset:
		return nil, http.StatusServiceUnavailable, "", fmt.Sprintf("no engine of model %q in the gateway's endpoint subset (%d endpoints)", clip.String(req.Model), len(x.subset))
	case len(ids) == 0:
		return nil, http.StatusServiceUnavailable, "", fmt.Sprintf("no engine of model %q with an ip:port endpoint", clip.String(req.Model))
	}
	tokens, tooLong := x.tokens(req, bases)
	if tooLong != nil {
		return nil, http.StatusRequestEntityTooLarge, "prompt", tooLong.Error()
	}
	if s.cfg.Disagg {
		return x.plan(req.Model, tokens, ids)
	}
	// The request may wait in its pool's router queue (a Service
	// without one books or refuses at once): the stream answers when it
	// is placed, and a stream that ends meanwhile takes it out of the
	// queue, or frees what it was given.
	sr := coordinator.SelectRequest{ID: x.id, Pool: coordinator.PoolKey{Model: req.Model, Group: s.cfg.Group, Role: coordinator.RoleAggregated},
		Tokens: tokens, Allowed: ids, Fallbacks: s.cfg.Fallbacks, Wait: &coordinator.Wait{Priority: x.priority}, Session: x.session}
	ctx := x.stream.Context()
	c, err := s.cfg.Service.SelectAndReserveWait(ctx, sr)
	if errors.Is(err, coordinator.ErrDuplicateReservation) {
		x.id += "-" + newID() // a client's id reused while its first request runs
		sr.ID = x.id
		c, err = s.cfg.Service.SelectAndReserveWait(ctx, sr)
	}
	if shed := (*coordinator.ShedError)(nil); errors.As(err, &shed) {
		return x.shed(shed, req.Model)
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		s.m.waitsLeft.Inc()
		return nil, 0, "", ""
	}
	if err != nil {
		st, param, msg := statusOf(err, req.Model)
		return nil, st, param, msg
	}
	x.booked = true
	s.m.open.Add(1)
	pk = &picked{ranks: map[string]indexer.Rank{}}
	var ok bool
	if pk.dest, ok = s.cfg.Endpoints.Addr(c.Rank.WorkerID); !ok {
		x.release()
		return nil, http.StatusServiceUnavailable, "", "the picked engine's address is no longer known: retry"
	}
	pk.ranks[pk.dest] = c.Rank
	for _, f := range c.Fallbacks {
		a, ok := s.cfg.Endpoints.Addr(f.Rank.WorkerID)
		if _, dup := pk.ranks[a]; !ok || dup || len(pk.fallbacks) >= s.cfg.Fallbacks {
			continue // another dp rank of an engine listed already
		}
		pk.ranks[a] = f.Rank
		pk.fallbacks = append(pk.fallbacks, a)
	}
	x.pick = pk
	return pk, 0, "", ""
}

// shed is the 429 of a request the router queue would not hold: its
// Retry-After in whole seconds (at least 1), its reason counted.
func (x *exchange) shed(e *coordinator.ShedError, model string) (*picked, int, string, string) {
	why, reason := "the router queue is full", "queue_full"
	if errors.Is(e, coordinator.ErrWaitExpired) {
		why, reason = "the request waited past its deadline", "wait_expired"
	}
	x.s.m.shed.WithLabelValues(reason).Inc()
	x.retryAfter = max((e.RetryAfter + time.Second - 1).Truncate(time.Second), time.Second)
	return nil, http.StatusTooManyRequests, "", fmt.Sprintf("every engine of model %q in routing group %q is busy and %s (priority %d): retry after %d s",
		clip.String(model), e.Pool.Group, why, e.Priority, int64(x.retryAfter/time.Second))
}

// plan books a decode-first plan: the decode engine is the destination,
// the prefill engine the prefiller; no fallbacks (the prefill was booked
// in the decode engine's KV-transfer domain).
func (x *exchange) plan(model string, tokens []uint32, ids []uint64) (*picked, int, string, string) {
	s := x.s
	r := coordinator.Request{ID: x.id, Model: model, DecodeGroup: s.cfg.Group, PrefillGroup: s.cfg.Group, Tokens: tokens, Allowed: ids}
	p, err := s.cfg.Service.Plan(r)
	if errors.Is(err, coordinator.ErrDuplicatePlan) {
		x.id += "-" + newID()
		r.ID = x.id
		p, err = s.cfg.Service.Plan(r)
	}
	x.transitions(p, 0)
	if err != nil {
		st, param, msg := statusOf(err, model)
		return nil, st, param, msg
	}
	x.booked = true
	s.m.open.Add(1)
	pk := &picked{plan: true}
	ok := p.Decode != nil
	if ok {
		pk.dest, ok = s.cfg.Endpoints.Addr(p.Decode.Rank.WorkerID)
	}
	if ok && p.Prefill != nil {
		pk.prefiller, ok = s.cfg.Endpoints.Addr(p.Prefill.Rank.WorkerID)
	}
	if !ok {
		x.release()
		return nil, http.StatusServiceUnavailable, "", "the planned engines' addresses are no longer known: retry"
	}
	x.pick = pk
	return pk, 0, "", ""
}

// transitions counts a plan's transitions from the from-th on.
func (x *exchange) transitions(p coordinator.Plan, from int) int {
	for _, t := range p.Transitions[min(from, len(p.Transitions)):] {
		x.s.m.transitions.WithLabelValues(t.From.String(), t.To.String()).Inc()
	}
	return len(p.Transitions)
}

// tokens returns the prompt's token ids: the client's, or an engine's
// tokenizer's (cached). None (nil) when no tokenizer answered: the pick
// is then by load. tooLong is a prompt prefixd would refuse.
func (x *exchange) tokens(req *tokenize.Request, bases []string) (ids []uint32, tooLong error) {
	s := x.s
	if req.Tokens != nil {
		s.m.tokenize.WithLabelValues("client").Inc()
		return req.Tokens, nil
	}
	bp := tokenizeBodies.Get().(*[]byte)
	body := req.AppendTokenizeBody((*bp)[:0])
	defer func() {
		if cap(body) <= maxPooledBody {
			*bp = body
			tokenizeBodies.Put(bp)
		}
	}()
	ctx, cancel := context.WithTimeout(x.stream.Context(), s.cfg.TokenizeTimeout)
	defer cancel()
	for range min(2, len(bases)) {
		base := bases[s.rr.Add(1)%uint64(len(bases))]
		ids, hit, err := s.tok.Tokens(ctx, base, body)
		if err == nil {
			s.m.tokenize.WithLabelValues(map[bool]string{true: "cache", false: "engine"}[hit]).Inc()
			return ids, nil
		}
		if tl := (*tokenize.PromptTooLong)(nil); errors.As(err, &tl) {
			s.m.tokenize.WithLabelValues("engine").Inc()
			return nil, tl
		}
	}
	s.m.tokenize.WithLabelValues("unavailable").Inc()
	return nil, nil
}

// tokenizeBodies pools the /tokenize bodies the streams build (Client.Tokens
// keeps none), those of at most maxPooledBody bytes.
var tokenizeBodies = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledBody = 1 << 20

// statusOf maps a booking error to the immediate response's status.
func statusOf(err error, model string) (int, string, string) {
	pe := (*coordinator.PartitionError)(nil)
	switch {
	case errors.As(err, &pe):
		return http.StatusNotFound, "model", fmt.Sprintf("model %q: not served by this pool", clip.String(model))
	case errors.Is(err, coordinator.ErrAllOverloaded):
		return http.StatusTooManyRequests, "", fmt.Sprintf("every engine of model %q is busy: retry", clip.String(model))
	case errors.Is(err, coordinator.ErrTooManyReservations), errors.Is(err, coordinator.ErrTooManyPlans):
		return http.StatusTooManyRequests, "", "too many requests in flight: retry"
	}
	return http.StatusServiceUnavailable, "", fmt.Sprintf("no ready engine of model %q: %v", clip.String(model), err)
}

func (x *exchange) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if pk := x.pick; pk != nil && x.booked {
		if served := servedEndpoint(req.GetMetadataContext()); served != "" && served != pk.dest {
			x.servedElsewhere(served)
		}
		status := 0
		for _, hv := range h.GetHeaders().GetHeaders() {
			if hv.GetKey() == ":status" {
				status, _ = strconv.Atoi(headerValue(hv))
			}
		}
		if pk.plan && status >= 500 && !x.prefillDone {
			// The decode engine failed before its first byte: count the
			// prefill as failed (the plan's failure policy applies).
			p, err := x.s.cfg.Service.PrefillFailed(x.id)
			if err == nil {
				x.transitions(p, len(p.Transitions)-1)
			}
			x.prefillDone = true
		}
		if h.GetEndOfStream() {
			x.release()
		} else if x.respMode == filterv3.ProcessingMode_NONE {
			x.prefillComplete() // no body will come: the headers are the first byte
		}
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
}

// servedElsewhere moves the booking to the engine that served, when it
// can: a reservation, and an engine of the pool.
func (x *exchange) servedElsewhere(served string) {
	pk := x.pick
	rank, listed := pk.ranks[served]
	if !listed && !pk.plan {
		if id, ok := x.s.cfg.Endpoints.workerAt(x.model, x.s.cfg.Group, served); ok {
			rank, listed = indexer.Rank{WorkerID: id}, true
		}
	}
	if pk.plan || !listed || x.s.cfg.Service.Move(x.id, rank) != nil {
		x.s.m.servedElsewhere.WithLabelValues("kept").Inc()
		return
	}
	x.s.m.servedElsewhere.WithLabelValues("moved").Inc()
	for _, f := range pk.fallbacks {
		if f == served {
			x.s.m.fallbacksUsed.Inc()
		}
	}
	pk.dest = served
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	x.prefillComplete()
	if b.GetEndOfStream() {
		x.release()
	}
	if x.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// The gateway forwards what comes back: the chunk, as it came.
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}}})
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
}

// prefillComplete tells the coordinator the prompt is prefilled: the
// first byte of the answer arrived.
func (x *exchange) prefillComplete() {
	if !x.booked || x.prefillDone {
		return
	}
	x.prefillDone = true
	if x.pick.plan {
		if p, err := x.s.cfg.Service.PrefillComplete(x.id); err == nil {
			x.transitions(p, len(p.Transitions)-1)
		}
		return
	}
	x.s.cfg.Service.ReservePrefillComplete(x.id)
}

// release frees the booking, once.
func (x *exchange) release() {
	if !x.booked {
		return
	}
	x.booked = false
	x.s.m.open.Add(-1)
	if x.pick != nil && x.pick.plan || x.pick == nil && x.s.cfg.Disagg {
		if p, err := x.s.cfg.Service.Release(x.id); err == nil {
			x.transitions(p, len(p.Transitions)-1)
		}
		return
	}
	x.s.cfg.Service.Free(x.id) // ErrReservationNotFound: expired or its engine left
}

func headerValue(h *corev3.HeaderValue) string {
	if v := h.GetRawValue(); len(v) > 0 {
		return string(v)
	}
	return h.GetValue()
}

// subsetHint reads the gateway's endpoint subset: a list of ip:port
// strings (each may itself be a comma-separated list, as a header copied
// into metadata is).
func subsetHint(md *corev3.Metadata) (subset []string, ok bool) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil, false
	}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" && len(subset) < 4096 {
				subset = append(subset, e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
	return subset, true
}

// servedEndpoint reads the endpoint the gateway says served.
func servedEndpoint(md *corev3.Metadata) string {
	s := md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
	if i := strings.IndexByte(s, ','); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

func newID() string {
	return "epp-" + strconv.FormatUint(rand.Uint64(), 36)
}
