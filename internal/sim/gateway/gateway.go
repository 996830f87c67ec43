package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The protocol's names (GIE's endpoint picker protocol).
const (
	// DestinationHeader and DestinationKey (in DestinationNamespace) carry
	// the endpoints the picker chose: ip:port, or ip:port,ip:port,… (the
	// primary, then fallbacks).
	DestinationHeader    = "x-gateway-destination-endpoint"
	DestinationNamespace = "envoy.lb"
	DestinationKey       = "x-gateway-destination-endpoint"
	// SubsetNamespace / SubsetKey restrict the pick to a list of ip:port.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey (in DestinationNamespace) names the endpoint that served.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// BodyMode is how a body goes through the picker (Envoy's
// ProcessingMode.BodySendMode).
type BodyMode int

const (
	// FullDuplexStreamed streams the body to the picker as it arrives and
	// takes the body back as StreamedBodyResponse chunks (GIE's default).
	FullDuplexStreamed BodyMode = iota
	// Buffered sends the whole body in one message, once the headers are
	// answered, and takes one BodyResponse.
	Buffered
)

func (m BodyMode) String() string {
	switch m {
	case FullDuplexStreamed:
		return "FULL_DUPLEX_STREAMED"
	case Buffered:
		return "BUFFERED"
	}
	return "BodyMode(" + strconv.Itoa(int(m)) + ")"
}

// FailureMode is what the gateway does when the picker cannot decide
// (InferencePool's failureMode).
type FailureMode int

const (
	// FailClose answers 503.
	FailClose FailureMode = iota
	// FailOpen forwards the request to Config.FailOpenEndpoints.
	FailOpen
)

// Limits.
const (
	// MaxEndpoints bounds the destination list.
	MaxEndpoints = 32
	// maxDestination bounds the destination's value in bytes.
	maxDestination = 4096
	// maxHeaderValue and maxMutations bound a header mutation.
	maxHeaderValue = 16 << 10
	maxMutations   = 128
	// bodyChunk is the most the gateway reads (and sends the picker) at
	// once.
	bodyChunk = 32 << 10
	// closeWait bounds the wait for the picker to end a finished stream.
	closeWait = time.Second
	// logEvery spaces the protocol-error log lines.
	logEvery = 10 * time.Second
)

// Config configures a Gateway.
type Config struct {
	// EPP is the picker's gRPC address, host:port (required).
	EPP string
	// TLS, when not nil, secures the connection to the picker: RootCAs
	// to verify it, or InsecureSkipVerify for a self-signed picker. Nil
	// is plaintext.
	TLS *tls.Config
	// RequestBodyMode and ResponseBodyMode: FullDuplexStreamed (the zero
	// value) or Buffered.
	RequestBodyMode, ResponseBodyMode BodyMode
	// FailureMode applies when the picker is unreachable or its stream
	// fails before the destination is known; FailOpen forwards to
	// FailOpenEndpoints (ip:port, tried in order; required with FailOpen).
	FailureMode       FailureMode
	FailOpenEndpoints []string
	// Subset, when not nil, gives a request's endpoint subset: ok true
	// sends the list (an empty one too) as the subset hint.
	Subset func(r *http.Request) (endpoints []string, ok bool)
	// MaxRequestBody and MaxResponseBody bound the bodies the gateway
	// holds (Envoy's buffer limit): a request body beyond it is a 413, a
	// buffered response beyond it a 500. Defaults 8 MiB and 64 MiB.
	MaxRequestBody, MaxResponseBody int64
	// ConnectTimeout bounds a connection to an endpoint; default 2 s.
	ConnectTimeout time.Duration
	// Log receives the state changes; nil discards them.
	Log *slog.Logger
}

// Stats are the gateway's counters.
type Stats struct {
	Requests uint64
	// Immediate counts the picker's ImmediateResponses relayed, by
	// status.
	Immediate map[int]uint64
	// Fallbacks counts requests served by an endpoint after the first of
	// the list.
	Fallbacks uint64
	// ProtocolErrors counts picker answers the gateway could not follow:
	// out of order, a destination missing, malformed or different in the
	// header and the metadata, a body in the wrong form, a mutation too
	// large.
	ProtocolErrors uint64
	// EPPFailures counts streams that could not be opened or failed
	// before the picker decided (or during the response); FailOpen counts
	// the requests then forwarded to FailOpenEndpoints.
	EPPFailures, FailOpen uint64
}

// Gateway is the HTTP handler. Close releases its connections.
type Gateway struct {
	cfg       Config
	conn      *grpc.ClientConn
	epp       extprocv3.ExternalProcessorClient
	transport *http.Transport
	failOpen  []string
	log       *slog.Logger

	requests, fallbacks, protocolErrors, eppFailures, failOpened atomic.Uint64
	eppDown                                                      atomic.Bool

	// mu guards immediate and the protocol-error log's state.
	mu         sync.Mutex
	immediate  map[int]uint64
	lastLog    time.Time
	suppressed int
}

// New validates cfg and returns a Gateway; it connects to the picker
// lazily, on the first request.
func New(cfg Config) (*Gateway, error) {
	if cfg.EPP == "" {
		return nil, errors.New("gateway: EPP: required (the picker's host:port)")
	}
	for name, m := range map[string]BodyMode{"RequestBodyMode": cfg.RequestBodyMode, "ResponseBodyMode": cfg.ResponseBodyMode} {
		if m != FullDuplexStreamed && m != Buffered {
			return nil, fmt.Errorf("gateway: %s: %v: want FullDuplexStreamed or Buffered", name, m)
		}
	}
	var failOpen []string
	switch cfg.FailureMode {
	case FailClose:
	case FailOpen:
		if len(cfg.FailOpenEndpoints) == 0 {
			return nil, errors.New("gateway: FailOpenEndpoints: required with FailOpen")
		}
		var err error
		if failOpen, err = parseEndpoints(strings.Join(cfg.FailOpenEndpoints, ",")); err != nil {
			return nil, fmt.Errorf("gateway: FailOpenEndpoints: %w", err)
		}
	default:
		return nil, fmt.Errorf("gateway: FailureMode %d: want FailClose or FailOpen", cfg.FailureMode)
	}
	switch {
	case cfg.MaxRequestBody < 0 || cfg.MaxResponseBody < 0:
		return nil, errors.New("gateway: MaxRequestBody, MaxResponseBody: must not be negative")
	case cfg.ConnectTimeout < 0:
		return nil, errors.New("gateway: ConnectTimeout: must not be negative")
	}
	if cfg.MaxRequestBody == 0 {
		cfg.MaxRequestBody = 8 << 20
	}
	if cfg.MaxResponseBody == 0 {
		cfg.MaxResponseBody = 64 << 20
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	conn, err := grpc.NewClient(cfg.EPP, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("gateway: EPP %q: %w", cfg.EPP, err)
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &connectError{err: err}
			}
			return c, nil
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	return &Gateway{cfg: cfg, conn: conn, epp: extprocv3.NewExternalProcessorClient(conn), transport: transport,
		failOpen: failOpen, log: cfg.Log, immediate: map[int]uint64{}}, nil
}

// Close closes the connection to the picker.
func (g *Gateway) Close() error {
	g.transport.CloseIdleConnections()
	return g.conn.Close()
}

// Stats returns the counters.
func (g *Gateway) Stats() Stats {
	g.mu.Lock()
	imm := make(map[int]uint64, len(g.immediate))
	for k, v := range g.immediate {
		imm[k] = v
	}
	g.mu.Unlock()
	return Stats{Requests: g.requests.Load(), Immediate: imm, Fallbacks: g.fallbacks.Load(),
		ProtocolErrors: g.protocolErrors.Load(), EPPFailures: g.eppFailures.Load(), FailOpen: g.failOpened.Load()}
}

// connectError marks an error of the dial: the connection to an endpoint
// was not established, so the next endpoint is tried.
type connectError struct{ err error }

func (e *connectError) Error() string { return "connect: " + e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// protocolError counts a picker answer the gateway cannot follow, logging
// at most one line per logEvery.
func (g *Gateway) protocolError(err error) {
	g.protocolErrors.Add(1)
	g.mu.Lock()
	now := time.Now()
	if now.Sub(g.lastLog) < logEvery {
		g.suppressed++
		g.mu.Unlock()
		return
	}
	suppressed := g.suppressed
	g.lastLog, g.suppressed = now, 0
	g.mu.Unlock()
	g.log.Warn("gateway: endpoint picker protocol error", "epp", g.cfg.EPP, "err", err, "suppressed_since_last", suppressed)
}

// eppFailed counts a stream that failed, logging when the picker was
// reachable until now.
func (g *Gateway) eppFailed(err error) {
	g.eppFailures.Add(1)
	if !g.eppDown.Swap(true) {
		g.log.Warn("gateway: endpoint picker unreachable", "epp", g.cfg.EPP, "failure_mode", g.failureModeName(), "err", err)
	}
}

// eppAnswered notes a picker that answered, logging when it had failed.
func (g *Gateway) eppAnswered() {
	if g.eppDown.Load() && g.eppDown.Swap(false) {
		g.log.Info("gateway: endpoint picker reachable again", "epp", g.cfg.EPP)
	}
}

func (g *Gateway) failureModeName() string {
	if g.cfg.FailureMode == FailOpen {
		return "FailOpen"
	}
	return "FailClose"
}

func (g *Gateway) countImmediate(status int) {
	g.mu.Lock()
	g.immediate[status]++
	g.mu.Unlock()
}

// parseEndpoints reads a destination: ip:port entries separated by
// commas, at most MaxEndpoints.
func parseEndpoints(v string) ([]string, error) {
	if len(v) > maxDestination {
		return nil, fmt.Errorf("%d bytes, more than %d", len(v), maxDestination)
	}
	if strings.TrimSpace(v) == "" {
		return nil, errors.New("empty")
	}
	parts := strings.Split(v, ",")
	if len(parts) > MaxEndpoints {
		return nil, fmt.Errorf("%d endpoints, more than %d", len(parts), MaxEndpoints)
	}
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		host, port, err := net.SplitHostPort(p)
		if err != nil || net.ParseIP(host) == nil {
			return nil, fmt.Errorf("entry %d %q: want ip:port", i, clip(p))
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("entry %d %q: want a port from 1 to 65535", i, clip(p))
		}
		out = append(out, p)
	}
	return out, nil
}

// clip is at most 64 bytes of s, for an error that repeats it.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
