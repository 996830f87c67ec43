// Package client is a small HTTP client of the prefixd API for the
// operator commands (prefixd workers, prefixd query, prefixd status),
// with plain-text table rendering.
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/prefixd/prefixd/internal/api"
)

// Client talks to one prefixd server.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8090
	Token   string // bearer token, for writes
	HTTP    *http.Client
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	raw, err := c.send(ctx, method, path, body)
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// send makes one request (body, if not nil, as JSON) and returns the
// answer's body; a non-2xx answer is an error naming the route.
func (c *Client) send(ctx context.Context, method, path string, body any) ([]byte, error) {
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
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		he := &HTTPError{Method: method, Path: path, Status: resp.StatusCode}
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil {
			he.Msg = e.Error
		}
		return nil, he
	}
	return raw, nil
}

// HTTPError is a non-2xx answer: its status and the server's error text.
type HTTPError struct {
	Method, Path string
	Status       int
	Msg          string // the answer's "error", if any
}

func (e *HTTPError) Error() string {
	if e.Msg != "" {
		return fmt.Sprintf("%s %s: %s (%d)", e.Method, e.Path, e.Msg, e.Status)
	}
	return fmt.Sprintf("%s %s: HTTP %d", e.Method, e.Path, e.Status)
}

// Workers lists the workers (filters optional).
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

// Metrics returns the server's GET /metrics page (Prometheus text
// format).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	return c.send(ctx, http.MethodGet, "/metrics", nil)
}

// Query scores a prompt.
func (c *Client) Query(ctx context.Context, q api.QueryRequest) (api.ScoreResponse, error) {
	var out api.ScoreResponse
	err := c.do(ctx, http.MethodPost, "/query", q, &out)
	return out, err
}

// RenderWorkers writes one line per worker rank.
func RenderWorkers(w io.Writer, ws []api.WorkerInfo) error {
	slices.SortFunc(ws, func(a, b api.WorkerInfo) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup), cmp.Compare(a.InstanceID, b.InstanceID))
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tMODEL\tGROUP\tROLE\tRANK\tSTATUS\tLAST SEQ\tBLOCKS\tDEGRADED\tENDPOINT")
	for _, wi := range ws {
		ranks := make([]uint32, 0, len(wi.Listeners))
		for r := range wi.Listeners {
			ranks = append(ranks, r)
		}
		slices.Sort(ranks)
		for _, r := range ranks {
			l := wi.Listeners[r]
			seq := "-"
			if l.LastSeq != nil {
				seq = strconv.FormatUint(*l.LastSeq, 10)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%v\t%s\n", wi.InstanceID, wi.ModelName, wi.RoutingGroup,
				cmp.Or(wi.Role, "aggregated"), r, l.Status, seq, l.Blocks, l.Degraded, l.Endpoint)
		}
	}
	return tw.Flush()
}

// RenderScores writes one line per matching worker rank, in tokens,
// longest device match first.
func RenderScores(w io.Writer, s api.ScoreResponse) error {
	type row struct {
		id                   uint64
		rank                 uint32
		gpu, cpu, disk, best uint64
	}
	var rows []row
	for id, inst := range s.Instances {
		for r, tok := range inst.DP {
			rows = append(rows, row{id, r, tok, inst.CPU, inst.Disk, inst.LongestMatched})
		}
		if len(inst.DP) == 0 {
			rows = append(rows, row{id, 0, 0, inst.CPU, inst.Disk, inst.LongestMatched})
		}
	}
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(b.gpu, a.gpu), cmp.Compare(a.id, b.id), cmp.Compare(a.rank, b.rank))
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tRANK\tGPU TOKENS\tWORKER CPU\tWORKER DISK\tLONGEST")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\n", r.id, r.rank, r.gpu, r.cpu, r.disk, r.best)
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no worker holds the first block)")
	}
	return tw.Flush()
}

// SelectAndReserve picks a worker for the prompt and books it under
// req.SelectionID.
func (c *Client) SelectAndReserve(ctx context.Context, req api.SelectRequest) (api.Selection, error) {
	var s api.Selection
	return s, c.do(ctx, http.MethodPost, "/select_and_reserve", req, &s)
}

// FreeReservation releases a booking.
func (c *Client) FreeReservation(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/reservations/"+url.PathEscape(id), nil, nil)
}

// CreatePlan runs decode-first coordination for one request.
func (c *Client) CreatePlan(ctx context.Context, req api.PlanRequest) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, "/disagg/plans", req, &p)
}

// PlanPrefillComplete reports that the plan's remote prefill finished.
func (c *Client) PlanPrefillComplete(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodPost, "/disagg/plans/"+url.PathEscape(id)+"/prefill_complete", nil, &p)
}

// ReleasePlan releases every booking of a finished plan.
func (c *Client) ReleasePlan(ctx context.Context, id string) (api.PlanInfo, error) {
	var p api.PlanInfo
	return p, c.do(ctx, http.MethodDelete, "/disagg/plans/"+url.PathEscape(id), nil, &p)
}
