package apiserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Workers is what the API needs from the worker catalog and the stream
// manager. Implementations must be safe for concurrent use.
type Workers interface {
	// Register writes a registration into the catalog
	// (catalog.RegisterRanks). Errors: the catalog's
	// (*catalog.ValidationError → 400 naming the field,
	// *catalog.ConflictError and *catalog.IDInUseError → 409), or one
	// wrapping this package's sentinels; a store error is a 503 with
	// Retry-After (catalog.ErrUnavailable: the store did not answer in
	// time, which is not logged per request). The error text is sent to
	// the client, so it should read "<field>: <problem>". The
	// implementation bounds how long it waits for the store: the
	// request's context lasts as long as its client waits.
	Register(ctx context.Context, r catalog.Registration) error
	// Unregister removes worker id of model from group, from every group
	// of the model (group ""), or only rank (catalog.UnregisterRanks);
	// catalog.ErrNotFound → 404, other errors as for Register.
	Unregister(ctx context.Context, model, group string, id uint64, rank *uint32) error
	// List returns the workers of model and group ("" matches any), in
	// any order. The caller owns the slice and may modify it.
	List(modelName, routingGroup string) []WorkerState
}

// WorkerState is a worker as a Workers implementation knows it: its
// catalog record and the state of its ranks' event streams.
type WorkerState struct {
	Record catalog.Worker
	// Streams are the ranks' streams by dp rank; a rank without one
	// (not started yet) is pending.
	Streams map[uint32]stream.Rank
	// Loads are the ranks' loads by dp rank, for those in a pool.
	Loads map[uint32]coordinator.RankLoad
}

// Errors a Workers implementation wraps so that the API picks the status.
var (
	ErrInvalid     = errors.New("invalid request")         // 400
	ErrConflict    = errors.New("conflict")                // 409
	ErrNotFound    = errors.New("not found")               // 404
	ErrUnavailable = errors.New("temporarily unavailable") // 503
)

// FieldError is an ErrInvalid that names the request field at fault. Its
// text is "<field>: <problem>".
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string        { return e.Field + ": " + e.Problem }
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// Invalid returns a *FieldError for field.
func Invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// statusOrder lists listener statuses best first.
var statusOrder = []string{api.StatusPaused, api.StatusActive, api.StatusPending, api.StatusFailed}

func (h *handler) register(w http.ResponseWriter, r *http.Request) {
	catalogChange(h, w, r, "register", decodeRegister, func(ws Workers, ctx context.Context, req api.RegisterRequest) error {
		return ws.Register(ctx, req.Registration())
	}, http.StatusCreated)
}

func (h *handler) unregister(w http.ResponseWriter, r *http.Request) {
	catalogChange(h, w, r, "unregister", decodeUnregister, func(ws Workers, ctx context.Context, req api.UnregisterRequest) error {
		return ws.Unregister(ctx, req.ModelName, req.RoutingGroup, req.InstanceID, req.DPRank)
	}, http.StatusOK)
}

// catalogChange reads a /register or /unregister body, decodes it and
// hands it to the catalog, answering status on success.
func catalogChange[T any](h *handler, w http.ResponseWriter, r *http.Request, op string,
	decode func([]byte) (T, error), apply func(Workers, context.Context, T) error, status int) {
	s := h.getScratch()
	defer h.putScratch(s)
	body, herr := h.readBody(w, r, s)
	if herr != nil {
		writeError(w, herr)
		return
	}
	req, err := decode(body)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if h.cfg.Workers == nil {
		writeError(w, &httpError{http.StatusServiceUnavailable, op + ": no worker catalog in this process"})
		return
	}
	if err := apply(h.cfg.Workers, r.Context(), req); err != nil {
		herr := workersError(err)
		var he *httpError
		if errors.As(herr, &he) && he.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", catalogRetryAfter)
		}
		if errors.Is(err, catalog.ErrUnavailable) {
			// Not logged per request: while etcd does not answer, every
			// write fails so; the catalog watch logs the outage, and
			// prefixd_catalog_up and the 503s' count show it.
			writeError(w, he)
			return
		}
		h.fail(w, r, herr)
		return
	}
	writeRaw(w, status, statusOK)
}

// catalogRetryAfter is the Retry-After, in seconds, of a catalog change
// answered 503: etcd did not answer in time (the request already waited
// for the write's deadline), or the write lost to concurrent changes.
const catalogRetryAfter = "1"

// workersError maps a Workers error to its status: the catalog's errors
// (catalogError), then this package's sentinels.
func workersError(err error) error {
	if he := catalogError(err); he != nil {
		return he
	}
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		status = http.StatusServiceUnavailable
	}
	if status == http.StatusInternalServerError {
		return err // logged by fail
	}
	return &httpError{status, err.Error()}
}

// catalogError maps the catalog's errors (catalog.RegisterRanks,
// catalog.UnregisterRanks, a store's) to statuses, or returns nil for an
// error that is none of them.
func catalogError(err error) *httpError {
	var ve *catalog.ValidationError
	var inUse *catalog.IDInUseError
	switch {
	case errors.As(err, &inUse):
		return &httpError{http.StatusConflict, fmt.Sprintf("instance_id: %d is registered for model=%s routing_group=%s; a worker id names one engine, so unregister it there first",
			inUse.ID, clip.String(inUse.Holder.Model), clip.String(inUse.Holder.Group))}
	case errors.Is(err, catalog.ErrConflict):
		return &httpError{http.StatusConflict, err.Error()}
	case errors.As(err, &ve) && len(ve.Fields) > 0:
		return badRequest(ve.Fields[0].Field, "%s", ve.Fields[0].Reason)
	case errors.As(err, &ve):
		return badRequest("body", "%v", err)
	case errors.Is(err, catalog.ErrNotFound):
		return &httpError{http.StatusNotFound, err.Error()}
	case errors.Is(err, catalog.ErrContended), errors.Is(err, catalog.ErrStoreClosed), errors.Is(err, catalog.ErrUnavailable):
		return &httpError{http.StatusServiceUnavailable, err.Error()}
	}
	return nil
}

func (h *handler) workers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	list := []api.WorkerInfo{}
	if h.cfg.Workers != nil {
		for _, ws := range h.cfg.Workers.List(q.Get("model_name"), q.Get("routing_group")) {
			wi := workerInfo(ws, time.Now())
			h.fillWorker(&wi)
			list = append(list, wi)
		}
	}
	slices.SortFunc(list, func(a, b api.WorkerInfo) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup), cmp.Compare(a.InstanceID, b.InstanceID))
	})
	writeJSON(w, http.StatusOK, list)
}

// workerInfo is ws as /workers shows it, at now.
func workerInfo(ws WorkerState, now time.Time) api.WorkerInfo {
	w := ws.Record
	info := api.WorkerInfo{InstanceID: w.WorkerID, ModelName: w.ModelName, RoutingGroup: w.RoutingGroup,
		BlockSize: w.BlockSize, Lifecycle: string(w.Lifecycle), Listeners: map[uint32]api.Listener{},
		Extensions: api.Extensions{DataParallelSize: w.DataParallelSize, EngineEndpoint: w.Endpoint, Attributes: w.Attributes}}
	for _, r := range w.Ranks() {
		ep, _ := w.EventsEndpointFor(r)
		rp, _ := w.ReplayEndpointFor(r)
		l := api.Listener{Endpoint: ep, ReplayEndpoint: rp, Status: api.StatusPending}
		if info.ReplayEndpoint == "" {
			info.ReplayEndpoint = rp
		}
		st, ok := ws.Streams[r]
		if ok {
			// The flag is the index's word (stream.Rank), whether the
			// stream runs, has yet to connect or does not run at all: a
			// rank restored degraded from a peer is degraded here too.
			l.Degraded = st.Degraded || st.Truncated
			switch {
			case !l.Degraded:
			case st.DegradedReason != "":
				l.DegradedReason = st.DegradedReason
			case st.Truncated:
				l.DegradedReason = indexer.TruncatedReason
			}
		}
		switch {
		case ok && st.Running:
			if st.HasLive {
				seen := st.LastLive
				l.LastSeenSeq = &seen
			}
			l.Replay = st.Replay.String()
			if st.Replay == stream.ReplayQueued {
				l.ReplayQueuedSeconds = now.Sub(st.ReplayQueuedSince).Round(time.Millisecond).Seconds()
			}
			if st.Connected && st.Synced && st.Replay != stream.ReplayQueued {
				l.Status = api.StatusActive
			}
		case ok && st.Err != "":
			l.Status, l.LastError = api.StatusFailed, st.Err
		}
		if rl, ok := ws.Loads[r]; ok {
			l.Load = rankLoad(rl, now)
		}
		info.Listeners[r] = l
	}
	return info
}

// rankLoad is rl as /workers shows it, at now.
func rankLoad(rl coordinator.RankLoad, now time.Time) *api.RankLoad {
	terms := func(l coordinator.Load) api.LoadTerms {
		return api.LoadTerms{Blocks: l.Blocks, PrefillTokens: l.PrefillTokens, Requests: l.Requests}
	}
	out := &api.RankLoad{Booked: terms(rl.Booked), Since: terms(rl.Since), Effective: terms(rl.Effective)}
	if rl.HasEngine {
		e := rl.Engine
		out.Engine = &api.EngineLoad{Running: e.Running, Waiting: e.Waiting, KVUsage: e.KVUsage,
			AgeSeconds: max(0, now.Sub(e.At).Round(time.Millisecond).Seconds())}
	}
	return out
}

// fillWorker completes what the handler derives: source, aggregate status,
// endpoints, and each rank's block count, redundant-store count and
// watermark from the index.
func (h *handler) fillWorker(wi *api.WorkerInfo) {
	if wi.Source == "" {
		wi.Source = "zmq"
	}
	// The maps may be the implementation's: fill copies.
	listeners := make(map[uint32]api.Listener, len(wi.Listeners))
	if wi.Endpoints == nil {
		wi.Endpoints = make(map[uint32]string, len(wi.Listeners))
		for rank, l := range wi.Listeners {
			wi.Endpoints[rank] = l.Endpoint
		}
	}
	worst := -1
	key := indexer.PartitionKey{Model: wi.ModelName, Group: wi.RoutingGroup}
	for rank, l := range wi.Listeners {
		worst = max(worst, slices.Index(statusOrder, l.Status))
		if st, err := h.cfg.Index.Rank(key, indexer.Rank{WorkerID: wi.InstanceID, DPRank: rank}); err == nil {
			l.Blocks, l.RedundantStoreBlocks = st.Blocks, st.RedundantBlocks
			if st.HasSeq {
				seq := st.Watermark
				l.LastSeq = &seq
			}
		}
		if gs, err := h.cfg.Index.Groups(key, indexer.Rank{WorkerID: wi.InstanceID, DPRank: rank}); err == nil && len(gs) > 0 {
			l.KVCacheGroups = make([]api.KVCacheGroup, len(gs))
			for i, g := range gs {
				l.KVCacheGroups[i] = api.KVCacheGroup{GroupIdx: g.Idx, Attention: g.Attention.String(), Kind: g.Kind,
					SlidingWindow: g.Window, Main: g.Main, Tracked: g.Tracked, Blocks: g.Blocks}
			}
		}
		listeners[rank] = l
	}
	wi.Listeners = listeners
	if wi.Status == "" {
		wi.Status = api.StatusPending // no listener (with a known status) yet
		if worst >= 0 {
			wi.Status = statusOrder[worst]
		}
	}
}

// decodeRegister reads and validates a /register body. additional_salt
// (alias additionalsalt) and tenant_id must be strings or null, and are
// ignored, as Dynamo does.
func decodeRegister(body []byte) (api.RegisterRequest, error) {
	var req api.RegisterRequest
	have, err := decodeJSON(body, &struct {
		*api.RegisterRequest
		AdditionalSalt      *string `json:"additional_salt"`
		AdditionalSaltAlias *string `json:"additionalsalt"`
		TenantID            *string `json:"tenant_id"`
	}{RegisterRequest: &req}, map[string]uint64{"data_parallel_size": api.MaxDataParallelSize},
		// At most MaxTaints each, counted before they are allocated (413
		// beyond).
		ownField{"taints", func(l *jsonlex.Lexer) (err error) {
			req.Taints, err = l.Strings("taints", api.MaxTaints, 0)
			return err
		}},
		ownField{"topology_domains", func(l *jsonlex.Lexer) (err error) {
			req.TopologyDomains, err = l.StringMap("topology_domains", api.MaxTaints)
			return err
		}})
	if err != nil {
		return req, err
	}
	switch {
	case !have["instance_id"]:
		return req, badRequest("instance_id", "required")
	case req.Endpoint == "":
		return req, badRequest("endpoint", "required")
	case req.ModelName == "":
		return req, badRequest("model_name", "required")
	case !have["block_size"]:
		return req, badRequest("block_size", "required")
	case req.BlockSize == 0:
		return req, badRequest("block_size", "must be positive")
	case req.DataParallelSize > api.MaxDataParallelSize:
		return req, badRequest("data_parallel_size", "%d is out of range [0, %d]", req.DataParallelSize, api.MaxDataParallelSize)
	}
	if last := uint64(req.DPRank) + uint64(max(req.DataParallelSize, 1)) - 1; last > math.MaxUint32 {
		return req, badRequest("data_parallel_size", "%d ranks from dp_rank %d run past the last dp rank, %d", max(req.DataParallelSize, 1), req.DPRank, uint32(math.MaxUint32))
	}
	if req.RoutingGroup == "" {
		req.RoutingGroup = api.DefaultRoutingGroup
	}
	if err := checkEndpoint("endpoint", req.Endpoint); err != nil {
		return req, err
	}
	if req.ReplayEndpoint != "" {
		if err := checkEndpoint("replay_endpoint", req.ReplayEndpoint); err != nil {
			return req, err
		}
	}
	return req, nil
}

// checkEndpoint accepts the ZMQ endpoints an indexer can connect to:
// tcp://host:port (host not a wildcard, port 1–65535), ipc://path and
// inproc://name.
func checkEndpoint(field, ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok {
		return badRequest(field, "%q is not a ZMQ endpoint (tcp://host:port, ipc://path or inproc://name)", clip.N(ep, maxEcho))
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			why := err.Error()
			if ae, ok := err.(*net.AddrError); ok {
				why = ae.Err // the rest repeats the address
			}
			return badRequest(field, "%q: %s", clip.N(ep, maxEcho), why)
		}
		if host == "" || host == "*" || host == "0.0.0.0" || host == "::" {
			return badRequest(field, "%q: host %q is not an address to connect to", clip.N(ep, maxEcho), clip.N(host, maxEcho))
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return badRequest(field, "%q: port %q is not in 1–65535", clip.N(ep, maxEcho), clip.N(port, maxEcho))
		}
	case "ipc", "inproc":
		if addr == "" {
			return badRequest(field, "%q: empty %s address", clip.N(ep, maxEcho), scheme)
		}
	default:
		return badRequest(field, "%q: transport %q is not tcp, ipc or inproc", clip.N(ep, maxEcho), clip.N(scheme, maxEcho))
	}
	return nil
}

// decodeUnregister reads and validates an /unregister body.
func decodeUnregister(body []byte) (api.UnregisterRequest, error) {
	var req api.UnregisterRequest
	have, err := decodeJSON(body, &req, nil)
	switch {
	case err != nil:
		return req, err
	case !have["instance_id"]:
		return req, badRequest("instance_id", "required")
	case req.ModelName == "":
		return req, badRequest("model_name", "required")
	}
	if req.RoutingGroup == "" {
		req.DPRank = nil
	}
	return req, nil
}
