// Package client is the Go client of the prefixd HTTP API (package api
// has the request and response types; docs/api.md the routes): worker
// registration, prefix-cache scores, selections and reservations, and
// decode-first disaggregated plans. A router calls it as in the
// examples; docs/integration.md gives the whole request lifecycle and
// what to do on each failure.
//
// A Client is safe for concurrent use. Every method takes a context,
// which bounds the call; an answer other than 2xx is an *Error with the
// status and the server's message, and errors.Is(err, ErrNotFound) (and
// the other sentinels) tells the cases apart. The package links neither
// etcd nor ZMQ.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prefixd/prefixd/api"
)

// MaxAnswerBytes bounds what the client reads of an answer (a /dump is
// streamed to the caller instead).
const MaxAnswerBytes = 64 << 20

// Client talks to one prefixd server (or a load balancer in front of its
// replicas).
type Client struct {
	// BaseURL is the server, e.g. http://127.0.0.1:8090.
	BaseURL string
	// Token is sent as "Authorization: Bearer <Token>" when not empty: the
	// server's --api-token for writes, bookings and /dump, or its
	// --read-token for the other reads.
	Token string
	// HTTP makes the requests; nil is a client with pooled keep-alive
	// connections (DefaultHTTPClient).
	HTTP *http.Client
}

// New returns a client of the server at baseURL (trailing slashes
// ignored) with DefaultHTTPClient.
func New(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: DefaultHTTPClient()}
}

// DefaultHTTPClient returns an HTTP client for a router's calls to
// prefixd: keep-alive connections pooled per host (64 idle), a 2 s dial
// and TLS handshake timeout, and no overall timeout (each call's context
// bounds it).
func DefaultHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 2 * time.Second,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}}
}

// The statuses an *Error wraps, for errors.Is.
var (
	ErrInvalid      = errors.New("invalid request")         // 400, 413
	ErrUnauthorized = errors.New("unauthorized")            // 401, 403
	ErrNotFound     = errors.New("not found")               // 404
	ErrConflict     = errors.New("conflict")                // 409
	ErrOverloaded   = errors.New("overloaded")              // 429
	ErrUnavailable  = errors.New("temporarily unavailable") // 503
)

// Error is an answer other than 2xx.
type Error struct {
	Method, Path string
	Status       int
	Msg          string // the answer's "error", if any
	// Plan is the failed plan a /disagg/plans route returned with its
	// error (what happened to its bookings), or nil.
	Plan *api.PlanInfo
	// RetryAfter is the answer's Retry-After (a 429 or 503), or 0.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Msg != "" {
		return fmt.Sprintf("%s %s: %s (%d)", e.Method, e.Path, e.Msg, e.Status)
	}
	return fmt.Sprintf("%s %s: HTTP %d", e.Method, e.Path, e.Status)
}

// Is reports whether the status is target's.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.Status == http.StatusBadRequest || e.Status == http.StatusRequestEntityTooLarge
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrOverloaded:
		return e.Status == http.StatusTooManyRequests
	case ErrUnavailable:
		return e.Status == http.StatusServiceUnavailable
	}
	return false
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.open(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if len(raw) > MaxAnswerBytes {
		return fmt.Errorf("%s %s: answer longer than %d bytes", method, path, MaxAnswerBytes)
	}
	if resp.StatusCode/100 != 2 {
		e := answerError(method, path, resp.StatusCode, raw)
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s <= 86400 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

// answerError is the *Error of an answer other than 2xx, with the
// server's message (and failed plan) from its body.
func answerError(method, path string, status int, raw []byte) *Error {
	e := &Error{Method: method, Path: path, Status: status}
	var b struct {
		Error string        `json:"error"`
		Plan  *api.PlanInfo `json:"plan"`
	}
	if json.Unmarshal(raw, &b) == nil {
		e.Msg, e.Plan = b.Error, b.Plan
	}
	return e
}

// open sends one request (body, if not nil, as JSON) and returns the
// answer, whatever its status.
func (c *Client) open(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	return hc.Do(req)
}

var defaultHTTP = DefaultHTTPClient()

func idPath(prefix, id, suffix string) string { return prefix + url.PathEscape(id) + suffix }

// Register registers an engine's event stream (POST /register): one rank,
// or data_parallel_size ranks at vLLM's per-rank endpoints.
func (c *Client) Register(ctx context.Context, r api.RegisterRequest) error {
	return c.do(ctx, http.MethodPost, "/register", r, nil)
}

// Unregister removes a worker, a worker from every group of its model
// (RoutingGroup empty), or one rank (POST /unregister).
func (c *Client) Unregister(ctx context.Context, r api.UnregisterRequest) error {
	return c.do(ctx, http.MethodPost, "/unregister", r, nil)
}

// Workers lists the workers with their ranks' stream state (GET
// /workers); model and group filter when not empty.
func (c *Client) Workers(ctx context.Context, model, group string) ([]api.WorkerInfo, error) {
	q := url.Values{}
	if model != "" {
		q.Set("model_name", model)
	}
	if group != "" {
		q.Set("routing_group", group)
	}
	path := "/workers"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []api.WorkerInfo
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// Query scores a prompt's token ids: the cached prefix of every worker
// rank (POST /query).
func (c *Client) Query(ctx context.Context, q api.QueryRequest) (api.ScoreResponse, error) {
	var out api.ScoreResponse
	err := c.do(ctx, http.MethodPost, "/query", q, &out)
	return out, err
}

// QueryByHash scores a prompt given as local block hashes (POST
// /query_by_hash).
func (c *Client) QueryByHash(ctx context.Context, q api.QueryByHashRequest) (api.ScoreResponse, error) {
	var out api.ScoreResponse
	err := c.do(ctx, http.MethodPost, "/query_by_hash", q, &out)
	return out, err
}

// Select chooses a worker for a prompt and books nothing (POST /select).
func (c *Client) Select(ctx context.Context, r api.SelectRequest) (api.Selection, error) {
	var s api.Selection
	return s, c.do(ctx, http.MethodPost, "/select", r, &s)
}

// SelectAndReserve chooses a worker and books the request on it under
// r.SelectionID (POST /select_and_reserve). Report the first token with
// ReservationPrefillComplete and the end with FreeReservation.
func (c *Client) SelectAndReserve(ctx context.Context, r api.SelectRequest) (api.Selection, error) {
	var s api.Selection
	return s, c.do(ctx, http.MethodPost, "/select_and_reserve", r, &s)
}

// Reserve books a request on a worker the caller chose (POST
// /reservations).
func (c *Client) Reserve(ctx context.Context, r api.ReserveRequest) (api.Reservation, error) {
	var out api.Reservation
	return out, c.do(ctx, http.MethodPost, "/reservations", r, &out)
}

// ReservationPrefillComplete reports a booked request's prefill done:
// its prompt no longer counts as prefill load (POST
// /reservations/{id}/prefill_complete).
func (c *Client) ReservationPrefillComplete(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, idPath("/reservations/", id, "/prefill_complete"), nil, nil)
}

// FreeReservation releases a booking (DELETE /reservations/{id}).
func (c *Client) FreeReservation(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, idPath("/reservations/", id, ""), nil, nil)
}

// CreatePlan books a disaggregated plan for one request (POST
// /disagg/plans): decode first by default. A failed plan comes back in
// the *Error's Plan when the server returned it.
func (c *Client) CreatePlan(ctx context.Context, r api.PlanRequest) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, "/disagg/plans", r, &p)
}

// PlanPrefillComplete reports the plan's prefill done; decode may start
// (POST /disagg/plans/{id}/prefill_complete).
func (c *Client) PlanPrefillComplete(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, idPath("/disagg/plans/", id, "/prefill_complete"), nil, &p)
}

// PlanDecode books the decode half of a plan created with DeferDecode
// (prefill first, decode after the prefill hand-off: POST
// /disagg/plans/{id}/decode).
func (c *Client) PlanDecode(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, idPath("/disagg/plans/", id, "/decode"), nil, &p)
}

// PlanPrefillFailed reports that the plan's prefill failed; the plan's
// prefill-failure policy says what follows (POST
// /disagg/plans/{id}/prefill_failed).
func (c *Client) PlanPrefillFailed(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, idPath("/disagg/plans/", id, "/prefill_failed"), nil, &p)
}

// Plan returns a live plan, or one recently finished (GET
// /disagg/plans/{id}).
func (c *Client) Plan(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodGet, idPath("/disagg/plans/", id, ""), nil, &p)
}

// ReleasePlan releases every booking of a plan at the end of its request
// (DELETE /disagg/plans/{id}).
func (c *Client) ReleasePlan(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodDelete, idPath("/disagg/plans/", id, ""), nil, &p)
}

// Health reports whether the server answers (GET /health).
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/health", nil, nil)
}

// Ready reports whether the server has synced its catalog and streams
// (GET /ready); ErrUnavailable while it has not.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/ready", nil, nil)
}

// Metrics returns the server's GET /metrics page (Prometheus text
// format).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.open(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes))
	if err == nil && resp.StatusCode/100 != 2 {
		return nil, answerError(http.MethodGet, "/metrics", resp.StatusCode, raw)
	}
	return raw, err
}

// Dump streams the server's index (GET /dump, per partition) to w and
// returns the bytes written.
func (c *Client) Dump(ctx context.Context, w io.Writer) (int64, error) {
	resp, err := c.open(ctx, http.MethodGet, "/dump", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return 0, answerError(http.MethodGet, "/dump", resp.StatusCode, raw)
	}
	return io.Copy(w, resp.Body)
}
