package mocker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/wire"
)

// DefaultMaxBodyBytes bounds an HTTP request body when
// Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 8 << 20

// DefaultKVPort is vLLM's NIXL side-channel port
// (VLLM_NIXL_SIDE_CHANNEL_PORT), offset by the DP rank as vLLM offsets
// it, when the worker record names no HTTP endpoint to announce.
const DefaultKVPort = 5600

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

	// Timing prices the scheduler's steps and KV transfers (see
	// Scheduler); the zero value prices nothing, so requests are served as
	// fast as the engine runs. H100Llama8B is a calibrated model.
	Timing Timing
	// Clock is what the scheduler waits on and what stamps batches (ts)
	// and requests; nil is RealClock. A VirtualClock runs the same model
	// without real waiting.
	Clock Clock

	// MaxModelLen is the longest prompt plus completion the OpenAI routes
	// accept (vLLM's max_model_len); 0 is what the pool holds,
	// TotalBlocks × BlockSize.
	MaxModelLen int
	// MaxBodyBytes bounds an HTTP request body; 0 is DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// KVEngineID, KVHost and KVPort are what a prefill answers as
	// kv_transfer_params' remote_engine_id, remote_host and remote_port.
	// Defaults: "mocker-<worker id>-dp<rank>", and the host and port of
	// Worker.Endpoint (127.0.0.1 and DefaultKVPort + DPRank without one).
	KVEngineID string
	KVHost     string
	KVPort     int
	// Flavor is the engine the HTTP API describes itself as (describe.go):
	// "" or FlavorVLLM (vllm:cache_config_info on GET /metrics, and GET
	// /server_info?config_format=json with ServerInfo) or FlavorSGLang
	// (GET /server_info and GET /get_server_info). It changes nothing
	// else: the events are the Encoder's.
	Flavor string
	// ServerInfo serves vLLM's GET /server_info, as vLLM does with
	// VLLM_SERVER_DEV_MODE=1.
	ServerInfo bool
	// PrefixCachingOff makes the engine say that its prefix caching is off
	// (vLLM's enable_prefix_caching, SGLang's disable_radix_cache), for
	// tests of a sidecar that must refuse it; the pool still caches.
	PrefixCachingOff bool
	// Log receives the engine's state changes (requests aborted, KV
	// transfers, injected faults); nil discards them.
	Log *slog.Logger

	// Store, when not nil, is where Run registers Worker (with the bound
	// event endpoints, BlockSize and TotalKVBlocks filled in) under a lease
	// of LeaseTTL (0: catalog.DefaultSessionTTL). Worker.ModelName is the
	// model the OpenAI routes serve.
	Store    catalog.Registrar
	Worker   catalog.Worker
	LeaseTTL time.Duration
}

// Request is one simulated generation request.
type Request struct {
	TokenIDs  []uint32 `json:"token_ids"`
	MaxTokens int      `json:"max_tokens"`
}

// Result describes how a request was served. The durations are on the
// engine's clock.
type Result struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"` // prompt tokens served from the prefix cache
	OutputTokens int `json:"output_tokens"`
	// QueueTime is from arrival to being scheduled, TTFT to the first
	// output token, Latency to the last.
	QueueTime time.Duration `json:"queue_time_ns"`
	TTFT      time.Duration `json:"ttft_ns"`
	Latency   time.Duration `json:"latency_ns"`
}

// ErrNotRunning is returned by Serve before Run has bound the sockets or
// after it returned.
var ErrNotRunning = errors.New("mocker: engine not running")

// Engine is one simulated engine rank: a Scheduler over a Pool, stepped by
// one goroutine that Run starts, whose cache changes are published as
// vLLM's KV events. Serve, the HTTP handler, Restart, ResetPrefixCache,
// Holds, Load and the getters are safe for concurrent use; Run is called
// once.
type Engine struct {
	cfg   Config
	pub   *Publisher
	clock Clock
	log   *slog.Logger

	// mu guards pool, sched, the Seqs in it, waiters, faults and running,
	// and orders pool steps with their Publish.
	mu        sync.Mutex
	pool      *Pool
	sched     *Scheduler
	waiters   map[uint64]chan struct{} // per live sequence: signalled (cap 1) when it progresses or ends
	faults    faultPlan
	buf       []byte
	running   bool
	wake      chan struct{} // cap 1: a request arrived or was aborted
	ready     chan struct{} // closed once Run accepts requests (and registered)
	readyOnce sync.Once
	crashed   chan struct{} // closed by Crash
	crashOnce sync.Once

	sessMu sync.Mutex
	sess   *catalog.Session

	// The routing sidecar (sidecar.go): its client and counters.
	prefillClient                    *http.Client
	sidecarPrefills, sidecarFailures atomic.Uint64
}

// New validates cfg and returns an Engine; Run starts it.
func New(cfg Config) (*Engine, error) {
	pool, err := NewHybridPool(cfg.TotalBlocks, cfg.BlockSize, cfg.Groups)
	if err != nil {
		return nil, err
	}
	sched, err := NewScheduler(pool, cfg.Timing)
	if err != nil {
		return nil, err
	}
	cfg.Timing = sched.Timing()
	switch {
	case cfg.MaxModelLen < 0:
		return nil, fmt.Errorf("mocker: max model len %d: must not be negative", cfg.MaxModelLen)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("mocker: max body bytes %d: must not be negative", cfg.MaxBodyBytes)
	case cfg.Flavor != "" && cfg.Flavor != FlavorVLLM && cfg.Flavor != FlavorSGLang:
		return nil, fmt.Errorf("mocker: flavor %q: want %s or %s", cfg.Flavor, FlavorVLLM, FlavorSGLang)
	case cfg.KVPort < 0 || cfg.KVPort > 65535:
		return nil, fmt.Errorf("mocker: kv port %d: want 0 (default) to 65535", cfg.KVPort)
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = cfg.TotalBlocks * cfg.BlockSize
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.KVEngineID == "" {
		cfg.KVEngineID = fmt.Sprintf("mocker-%d-dp%d", cfg.Worker.WorkerID, cfg.DPRank)
	}
	if cfg.KVHost == "" || cfg.KVPort == 0 {
		host, port := endpointHostPort(cfg.Worker.Endpoint)
		if port == 0 {
			host, port = "127.0.0.1", DefaultKVPort+int(cfg.DPRank)
		}
		if cfg.KVHost == "" {
			cfg.KVHost = host
		}
		if cfg.KVPort == 0 {
			cfg.KVPort = port
		}
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
	if cfg.Clock == nil {
		cfg.Clock = RealClock
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	pub, err := NewPublisher(cfg.Publisher)
	if err != nil {
		return nil, err
	}
	log := cfg.Log.With("worker", cfg.Worker.WorkerID, "dp_rank", cfg.DPRank)
	return &Engine{cfg: cfg, pub: pub, clock: cfg.Clock, log: log, pool: pool, sched: sched,
		waiters: map[uint64]chan struct{}{}, faults: faultPlan{afterTokens: -1},
		wake: make(chan struct{}, 1), ready: make(chan struct{}), crashed: make(chan struct{}),
		prefillClient: newPrefillClient()}, nil
}

// endpointHostPort returns the host and port of an http(s) base URL (port
// 0 if it has none or does not parse).
func endpointHostPort(endpoint string) (string, int) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", 0
	}
	host, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", 0
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0
	}
	return host, port
}

// Publisher returns the engine's publisher (endpoints, Seq, Stats, Stall).
func (e *Engine) Publisher() *Publisher { return e.pub }

// Worker returns the worker record the engine was configured with.
func (e *Engine) Worker() catalog.Worker { return e.cfg.Worker }

// Timing returns the engine's timing, defaults applied.
func (e *Engine) Timing() Timing { return e.cfg.Timing }

// Clock returns the clock the engine runs on.
func (e *Engine) Clock() Clock { return e.clock }

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
// and runs the scheduler until ctx is done or Crash is called; requests
// still in the engine then fail with ErrNotRunning. It returns the
// publisher's or the registration's error, or nil. Ending with ctx
// revokes the lease, so the worker leaves the catalog at once (ending
// while the registration is in flight is a clean end too); ending
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
	schedDone := make(chan struct{})
	go func() {
		defer close(schedDone)
		e.schedule(ctx)
	}()
	defer func() {
		cancel()
		<-schedDone
		e.mu.Lock()
		e.running = false
		ended := e.sched.Close(ErrNotRunning, e.clock.Now())
		waiters := e.takeWaitersLocked(ended)
		e.mu.Unlock()
		signal(waiters)
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
		if w.MaxNumBatchedTokens == 0 {
			w.MaxNumBatchedTokens = uint64(e.cfg.Timing.MaxNumBatchedTokens)
		}
		s, err := catalog.Register(ctx, e.cfg.Store, w.WithDefaults(), e.cfg.LeaseTTL, catalog.WithLogger(e.cfg.Log))
		if err != nil {
			stopped := ctx.Err() != nil // shut down while registering: a clean end
			cancel()
			<-pubErr
			if stopped {
				return nil
			}
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

// schedule is the engine's scheduler loop: plan a step, wait its duration
// on the clock, finish it and publish its events as one batch; with
// nothing to run, wait for a request or the next transfer's end.
func (e *Engine) schedule(ctx context.Context) {
	for {
		e.mu.Lock()
		st := e.sched.Plan(e.clock.Now())
		var next time.Time
		var perr error
		idle := st.Empty()
		hasNext := false
		if idle {
			// Nothing to compute, but admissions (evictions) may have
			// changed the cache: say so now.
			perr = e.publishLocked(context.WithoutCancel(ctx))
			next, hasNext = e.sched.NextTransfer()
		}
		waiters := e.takeWaitersLocked(st.Ended)
		e.mu.Unlock()
		signal(waiters)
		e.logStep(perr, st.Ended)

		if idle {
			var timer *Timer
			var fired <-chan time.Time
			if hasNext {
				timer = e.clock.NewTimer(next.Sub(e.clock.Now()))
				fired = timer.C
			}
			select {
			case <-ctx.Done():
			case <-e.wake:
			case <-fired:
			}
			if timer != nil {
				timer.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if st.Duration > 0 {
			timer := e.clock.NewTimer(st.Duration)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		e.mu.Lock()
		changed := e.sched.Finish(e.clock.Now())
		perr = e.publishLocked(context.WithoutCancel(ctx))
		waiters = e.takeWaitersLocked(changed)
		e.mu.Unlock()
		signal(waiters)
		e.logStep(perr, nil)
	}
}

// takeWaitersLocked returns the waiter channels of seqs, forgetting those
// of the sequences that ended. e.mu held.
func (e *Engine) takeWaitersLocked(seqs []*Seq) []chan struct{} {
	var out []chan struct{}
	for _, q := range seqs {
		if ch, ok := e.waiters[q.ID]; ok {
			out = append(out, ch)
			if q.State == SeqDone {
				delete(e.waiters, q.ID)
			}
		}
	}
	return out
}

// signal wakes each waiter without blocking (each channel has room for
// one pending signal, which is all a waiter needs).
func signal(chs []chan struct{}) {
	for _, ch := range chs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// logStep logs a step's failed publish (the index is left behind the
// engine, as after a lost batch) and the requests it refused.
func (e *Engine) logStep(perr error, ended []*Seq) {
	if perr != nil {
		e.log.Warn("publish step", "err", perr)
	}
	for _, q := range ended {
		if errors.Is(q.Err, ErrNoSpace) {
			e.log.Info("request refused", "seq", q.ID, "prompt_tokens", len(q.Tokens), "err", q.Err)
		}
	}
}

// publishLocked publishes the pool's pending events as one batch, if any.
// e.mu held, so that batches leave in the order of the pool steps.
func (e *Engine) publishLocked(ctx context.Context) error {
	evs := e.pool.Events()
	if len(evs) == 0 {
		return nil
	}
	now := e.clock.Now()
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

// submit adds q to the scheduler and returns the channel signalled when it
// progresses. A cancelled ctx adds nothing.
func (e *Engine) submit(ctx context.Context, q *Seq) (chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.running {
		return nil, ErrNotRunning
	}
	if err := ctx.Err(); err != nil {
		return nil, err // abandoned before it was scheduled: no cache change
	}
	if err := e.sched.Add(q, e.clock.Now()); err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	e.waiters[q.ID] = ch
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return ch, nil
}

// abort ends q at the scheduler's next step (its blocks are freed then).
func (e *Engine) abort(q *Seq, why string) {
	e.mu.Lock()
	done := q.State == SeqDone
	if !done {
		e.sched.Abort(q)
		delete(e.waiters, q.ID)
	}
	e.mu.Unlock()
	if done {
		return
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
	e.log.Info("request aborted", "seq", q.ID, "why", why, "prompt_tokens", len(q.Tokens), "output_tokens", e.outputOf(q))
}

func (e *Engine) outputOf(q *Seq) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return q.Output
}

// seqView is a copy of a sequence's progress, taken under e.mu.
type seqView struct {
	state                           SeqState
	err                             error
	output, cached, transferred     int
	blockIDs                        []int
	arrived, scheduled, first, done time.Time
}

func (e *Engine) view(q *Seq) seqView {
	e.mu.Lock()
	defer e.mu.Unlock()
	return seqView{state: q.State, err: q.Err, output: q.Output, cached: q.CachedTokens, transferred: q.TransferredBlocks,
		blockIDs: q.BlockIDs, arrived: q.Arrived, scheduled: q.Scheduled, first: q.FirstToken, done: q.Finished}
}

// wait blocks until q has generated more than seen tokens or ended, or
// ctx is done (then q is aborted and ctx's error returned).
func (e *Engine) wait(ctx context.Context, q *Seq, ch chan struct{}, seen int) (seqView, error) {
	for {
		v := e.view(q)
		if v.state == SeqDone || v.output > seen {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			e.abort(q, "client gone")
			return v, ctx.Err()
		}
	}
}

// Serve simulates one request through the scheduler: it queues until a
// step admits it (the pool can allocate its blocks, reusing the cached
// prefix, and the step has budget), is prefilled in chunks, decodes
// MaxTokens tokens one step at a time, and frees its blocks (their
// eviction events appear with later allocations). A prompt larger than
// the whole pool is ErrNoSpace at once. A request abandoned (ctx done)
// after it was scheduled has its step published all the same (the cache
// changed) and its blocks freed at the next step; one abandoned before
// changes nothing.
func (e *Engine) Serve(ctx context.Context, req Request) (Result, error) {
	res := Result{PromptTokens: len(req.TokenIDs)}
	q := &Seq{Tokens: req.TokenIDs, MaxTokens: max(req.MaxTokens, 0)}
	ch, err := e.submit(ctx, q)
	if err != nil {
		return res, err
	}
	v, err := e.wait(ctx, q, ch, q.MaxTokens)
	res.CachedTokens, res.OutputTokens = v.cached, v.output
	if err != nil {
		return res, err
	}
	if v.err != nil {
		return res, v.err
	}
	res.QueueTime, res.Latency = v.scheduled.Sub(v.arrived), v.done.Sub(v.arrived)
	if !v.first.IsZero() {
		res.TTFT = v.first.Sub(v.arrived)
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

// Queued returns how many requests wait in the scheduler's queue (for the
// step budget, a sequence slot or KV blocks).
func (e *Engine) Queued() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sched.Load().Waiting
}

// Load returns the scheduler's occupancy: requests waiting, transferring
// KV and running, and KV usage.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sched.Load()
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
