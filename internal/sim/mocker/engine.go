package mocker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/wire"
)

// Config configures an Engine.
type Config struct {
	// TotalBlocks and BlockSize size the KV pool (required).
	TotalBlocks int
	BlockSize   int
	// DPRank is stamped on every batch (data_parallel_rank), as vLLM does.
	DPRank uint32
	// Groups is an optional hybrid KV-cache layout (see Pool and
	// NewHybridPool), in group_idx order, e.g. Gemma 3's sliding-window
	// groups before its full-attention one; nil is one full-attention
	// group whose events name no group. A hybrid engine's array-era
	// encoder writes the 12-field layout (Encoder.Wide), which carries
	// group_idx.
	Groups []Group

	// Publisher configures the event sockets. Endpoint defaults to
	// "tcp://127.0.0.1:0"; ReplayEndpoint "" gets "tcp://127.0.0.1:0" too
	// unless NoReplay. Layout, Topic and the fault knobs pass through.
	Publisher PublisherConfig
	NoReplay  bool
	// Encoder selects the wire era and hash type; the zero value is vLLM's
	// current default (map era, int hashes).
	Encoder wire.Encoder

	// PrefillPerToken is the simulated prefill time per uncached prompt
	// token, DecodePerToken per output token. 0 (the default) means no
	// waiting.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Sleep waits d or until ctx is done; nil uses a timer. Tests may
	// substitute a fake clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now stamps batches (ts); nil is time.Now.
	Now func() time.Time

	// Store, when not nil, is where Run registers Worker (with the bound
	// event endpoints, BlockSize and TotalKVBlocks filled in) under a lease
	// of LeaseTTL (0: catalog.DefaultSessionTTL).
	Store    catalog.Registrar
	Worker   catalog.Worker
	LeaseTTL time.Duration
}

// Request is one simulated generation request.
type Request struct {
	TokenIDs  []uint32 `json:"token_ids"`
	MaxTokens int      `json:"max_tokens"`
}

// Result describes how a request was served.
type Result struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"` // prompt tokens served from the prefix cache
	OutputTokens int `json:"output_tokens"`
}

// ErrNotRunning is returned by Serve before Run has bound the sockets or
// after it returned.
var ErrNotRunning = errors.New("mocker: engine not running")

// Engine is one simulated engine rank. Serve, Restart, ResetPrefixCache,
// Holds and the getters are safe for concurrent use; Run is called once.
type Engine struct {
	cfg Config
	pub *Publisher

	mu        sync.Mutex // guards pool, inflight and freed, and orders pool steps with their Publish
	pool      *Pool
	inflight  int           // requests holding blocks
	queued    int           // requests waiting for blocks
	freed     chan struct{} // closed (and replaced) whenever a request frees its blocks
	buf       []byte
	running   bool
	ready     chan struct{} // closed once Run accepts requests (and registered)
	readyOnce sync.Once
	crashed   chan struct{} // closed by Crash
	crashOnce sync.Once

	sessMu sync.Mutex
	sess   *catalog.Session
}

// New validates cfg and returns an Engine; Run starts it.
func New(cfg Config) (*Engine, error) {
	pool, err := NewHybridPool(cfg.TotalBlocks, cfg.BlockSize, cfg.Groups)
	if err != nil {
		return nil, err
	}
	if len(cfg.Groups) > 0 && cfg.Encoder.Era == wire.EraArray {
		cfg.Encoder.Wide = true
	}
	if cfg.Publisher.Endpoint == "" {
		cfg.Publisher.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.Publisher.ReplayEndpoint == "" && !cfg.NoReplay {
		cfg.Publisher.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	if cfg.NoReplay {
		cfg.Publisher.ReplayEndpoint = ""
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pub, err := NewPublisher(cfg.Publisher)
	if err != nil {
		return nil, err
	}
	return &Engine{cfg: cfg, pub: pub, pool: pool, ready: make(chan struct{}), crashed: make(chan struct{}), freed: make(chan struct{})}, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Publisher returns the engine's publisher (endpoints, Seq, Stats, Stall).
func (e *Engine) Publisher() *Publisher { return e.pub }

// Worker returns the worker record the engine was configured with.
func (e *Engine) Worker() catalog.Worker { return e.cfg.Worker }

// Ready is closed once the sockets are bound, the engine accepts requests
// and, with a Store, the worker is registered.
func (e *Engine) Ready() <-chan struct{} { return e.ready }

// Session returns the catalog session, nil without a Store or before Run
// registered.
func (e *Engine) Session() *catalog.Session {
	e.sessMu.Lock()
	defer e.sessMu.Unlock()
	return e.sess
}

// Run binds the publisher, registers the worker if a Store is configured,
// and serves until ctx is done or Crash is called. It returns the
// publisher's or the registration's error, or nil. Ending with ctx
// revokes the lease, so the worker leaves the catalog at once; ending
// with Crash does not.
func (e *Engine) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.pub.Run(ctx) }()
	select {
	case <-e.pub.Ready():
	case err := <-pubErr:
		return err
	}
	e.mu.Lock()
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()

	var sessDone chan error
	if e.cfg.Store != nil {
		w := e.cfg.Worker
		w.EventsEndpoint = e.pub.Endpoint()
		w.ReplayEndpoint = e.pub.ReplayEndpoint()
		w.Topic = e.cfg.Publisher.Topic
		w.BlockSize = uint32(e.cfg.BlockSize)
		w.TotalKVBlocks = uint64(e.cfg.TotalBlocks)
		w.DataParallelStartRank = e.cfg.DPRank
		w.DataParallelSize = 1
		s, err := catalog.Register(ctx, e.cfg.Store, w.WithDefaults(), e.cfg.LeaseTTL)
		if err != nil {
			cancel()
			<-pubErr
			return fmt.Errorf("mocker: %w", err)
		}
		e.sessMu.Lock()
		e.sess = s
		e.sessMu.Unlock()
		sessDone = make(chan error, 1)
		go func() { sessDone <- s.Run(ctx) }()
	}

	e.readyOnce.Do(func() { close(e.ready) })
	crashed := false
	select {
	case <-ctx.Done():
	case <-e.crashed:
		crashed = true
		cancel() // stops the publisher and the lease keep-alives, unrevoked
	}
	var err error
	if sessDone != nil && !crashed {
		e.sess.Close()
		if serr := <-sessDone; serr != nil && !errors.Is(serr, context.Canceled) {
			err = serr
		}
	}
	if sessDone != nil && crashed {
		<-sessDone
	}
	if perr := <-pubErr; perr != nil {
		err = perr
	}
	return err
}

// Crash simulates the engine process dying with its sidecar: the event
// sockets close, requests fail with ErrNotRunning and lease keep-alives
// stop without a revoke, so the worker stays in the catalog until its
// lease expires (LeaseTTL). Run returns; the engine cannot run again.
func (e *Engine) Crash() {
	e.crashOnce.Do(func() { close(e.crashed) })
}

// publishLocked publishes the pool's pending events as one batch, if any.
// e.mu held, so that batches leave in the order of the pool steps.
func (e *Engine) publishLocked(ctx context.Context) error {
	evs := e.pool.Events()
	if len(evs) == 0 {
		return nil
	}
	now := e.cfg.Now()
	b := wire.Batch{
		TS:        float64(now.UnixNano()) / 1e9,
		Events:    evs,
		DPRank:    int32(e.cfg.DPRank),
		HasDPRank: true,
	}
	var err error
	e.buf, err = e.cfg.Encoder.AppendBatch(e.buf[:0], &b)
	if err != nil {
		return fmt.Errorf("mocker: encode: %w", err)
	}
	if _, err := e.pub.Publish(ctx, e.buf); err != nil {
		return fmt.Errorf("mocker: %w", err)
	}
	return nil
}

// Serve simulates one request: the prefill step allocates the prompt's
// blocks (reusing the cached prefix) — waiting, as vLLM's scheduler
// queues a request, while running requests hold the blocks it needs; a
// prompt larger than the whole pool is ErrNoSpace — and publishes that
// step's events as one batch, then waits PrefillPerToken per uncached token and
// DecodePerToken per output token, then frees the blocks (their eviction
// events appear with later allocations).
func (e *Engine) Serve(ctx context.Context, req Request) (Result, error) {
	res := Result{PromptTokens: len(req.TokenIDs), OutputTokens: max(req.MaxTokens, 0)}
	var a *Alloc
	for {
		e.mu.Lock()
		if !e.running {
			e.mu.Unlock()
			return res, ErrNotRunning
		}
		if err := ctx.Err(); err != nil {
			e.mu.Unlock()
			return res, err // abandoned before it was scheduled: no cache change
		}
		var err error
		a, err = e.pool.Alloc(req.TokenIDs)
		if err == nil {
			break
		}
		blocks := (len(req.TokenIDs) + e.cfg.BlockSize - 1) / e.cfg.BlockSize
		if !errors.Is(err, ErrNoSpace) || e.inflight == 0 || blocks > e.pool.TotalBlocks() {
			e.mu.Unlock()
			return res, err // it would not fit even in an idle engine
		}
		// As vLLM's scheduler: wait in line until running requests free
		// their blocks.
		freed := e.freed
		e.queued++
		e.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
		}
		e.mu.Lock()
		e.queued--
		e.mu.Unlock()
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	e.inflight++
	// The cache changed, so its events go out whatever becomes of the
	// request (a client that hangs up now does not unpublish a step, in
	// vLLM either). A failed Publish leaves the index behind the engine,
	// as a lost batch would; the request itself still proceeds.
	perr := e.publishLocked(context.WithoutCancel(ctx))
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.pool.Free(a)
		e.inflight--
		close(e.freed) // wakes the requests waiting for blocks
		e.freed = make(chan struct{})
		e.mu.Unlock()
	}()
	if perr != nil {
		return res, perr
	}
	res.CachedTokens = a.CachedBlocks * e.cfg.BlockSize
	uncached := len(req.TokenIDs) - res.CachedTokens
	if err := e.cfg.Sleep(ctx, time.Duration(uncached)*e.cfg.PrefillPerToken); err != nil {
		return res, err
	}
	if err := e.cfg.Sleep(ctx, time.Duration(res.OutputTokens)*e.cfg.DecodePerToken); err != nil {
		return res, err
	}
	return res, nil
}

// Restart simulates an engine restart: the seq goes back to 0, the replay
// buffer and the cache are emptied. Like a fresh vLLM process it publishes
// nothing (no AllBlocksCleared): subscribers learn of the restart when the
// seq falls back. Requests in flight keep running but their blocks are
// gone.
func (e *Engine) Restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pub.Restart()
	e.pool.Reset()
	e.pool.Events() // discarded
}

// ResetPrefixCache empties the cache and publishes AllBlocksCleared, as
// vLLM's reset_prefix_cache.
func (e *Engine) ResetPrefixCache(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	e.pool.Reset()
	return e.publishLocked(context.WithoutCancel(ctx)) // the cache is gone: say so
}

// Queued returns how many requests wait for KV blocks.
func (e *Engine) Queued() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.queued
}

// Holds returns the engine's true cache in its main KV-cache group (the
// lowest-numbered full-attention one; the only one without Groups):
// engine hash → copies.
func (e *Engine) Holds() map[uint64]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.Holds()
}

// GroupHolds returns the engine's true cache in KV-cache group g.
func (e *Engine) GroupHolds(g int) map[uint64]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.GroupHolds(g)
}

// Hit returns how many leading full blocks of tokens the engine would
// serve from its prefix cache now, without changing it.
func (e *Engine) Hit(tokens []uint32) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.Hit(tokens)
}

// MainGroup returns the group_idx of the engine's main KV-cache group.
func (e *Engine) MainGroup() int { return e.pool.Main() }

// LastSeq returns the seq of the last published batch; ok is false if
// none was published since Run or the last Restart.
func (e *Engine) LastSeq() (seq uint64, ok bool) {
	n := e.pub.Seq()
	if n == 0 {
		return 0, false
	}
	return n - 1, true
}

// ServeHTTP handles POST /generate with a JSON Request and answers with a
// JSON Result, GET /health (200 while running, as vLLM's), and the fault
// injections POST /faults/restart,
// /faults/reset_prefix_cache, /faults/stall_replay?for=<duration> and
// /faults/crash.
// Other paths are 404, other methods 405.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/faults/") {
		e.serveFault(w, r)
		return
	}
	if r.URL.Path == "/health" {
		// As vLLM's /health: 200 while the engine serves. A sidecar probes it.
		e.mu.Lock()
		running := e.running
		e.mu.Unlock()
		if !running {
			http.Error(w, ErrNotRunning.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.URL.Path != "/generate" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var req Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20))
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	res, err := e.Serve(r.Context(), req)
	switch {
	case errors.Is(err, ErrNoSpace):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case errors.Is(err, ErrNotRunning):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func (e *Engine) serveFault(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/faults/restart":
		e.Restart()
	case "/faults/reset_prefix_cache":
		if err := e.ResetPrefixCache(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	case "/faults/stall_replay":
		d, err := time.ParseDuration(r.URL.Query().Get("for"))
		if err != nil || d < 0 {
			http.Error(w, "for: want a non-negative duration such as 5s", http.StatusBadRequest)
			return
		}
		e.pub.Stall(d)
	case "/faults/crash":
		e.Crash()
	default:
		http.NotFound(w, r)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
