package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
)

var testKey = indexer.PartitionKey{Model: "m", Group: "default"}

const testBS = 4

func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Ready(t, "engine", func(ctx context.Context, ready func(string)) error {
		go func() {
			select {
			case <-e.Ready():
				ready(e.Publisher().Endpoint())
			case <-ctx.Done():
			}
		}()
		return e.Run(ctx)
	})
	// Run sets running just after Ready; wait for it.
	testsupport.Eventually(t, 30*time.Second, "engine running", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.running
	})
	return e
}

func startSubscriber(t *testing.T, e *Engine, rank indexer.Rank) (*stream.Subscriber, *indexer.Index) {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(testKey, testBS); err != nil {
		t.Fatal(err)
	}
	s, err := stream.NewSubscriber(stream.Source{
		Worker: rank.WorkerID, Rank: rank.DPRank,
		Endpoint: e.Publisher().Endpoint(), ReplayEndpoint: e.Publisher().ReplayEndpoint(),
	}, &stream.IndexApplier{Index: ix, Partition: testKey}, stream.SubscriberConfig{ProbeInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	testsupport.Go(t, "subscriber", s.Run)
	return s, ix
}

// caughtUp waits until the subscriber applied the engine's last seq.
func caughtUp(t *testing.T, s *stream.Subscriber, e *Engine) {
	t.Helper()
	last, ok := e.LastSeq()
	if !ok {
		t.Fatal("engine published nothing")
	}
	testsupport.CaughtUp(t, s.State, last, func() string { return fmt.Sprintf("publisher %+v", e.Publisher().Stats()) })
}

// checkEqual asserts the index holds exactly the engine's cache for rank.
func checkEqual(t *testing.T, ix *indexer.Index, e *Engine, rank indexer.Rank) {
	t.Helper()
	holds := e.Holds()
	err := ix.ReadRank(testKey, rank, func(tr *indexer.Tree) {
		if got := tr.RankBlocks(rank); got != len(holds) {
			t.Errorf("index holds %d blocks, engine %d", got, len(holds))
		}
		for h, n := range holds {
			c, ok := tr.Holds(rank, h)
			if !ok || int(c[indexer.TierDevice]) != n {
				t.Errorf("hash %#x: index %v (ok %v), engine %d copies", h, c, ok, n)
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// workload returns request n of a deterministic workload with shared
// prefixes: 6 system prompts of 3 blocks, 10 conversations of growing
// length, and a unique suffix.
func workload(n int) Request {
	sys := toks(10_000*(n%6), 3*testBS)
	conv := toks(100_000+1_000*(n%10), testBS*(n%4))
	tail := toks(1_000_000+n*37, 1+n%(2*testBS+1))
	return Request{TokenIDs: cat(sys, conv, tail), MaxTokens: n % 7}
}

func runWorkload(t *testing.T, e *Engine, from, to int) {
	t.Helper()
	ctx := context.Background()
	for n := from; n < to; n++ {
		if _, err := e.Serve(ctx, workload(n)); err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
	}
}

func TestEngineIndexMatchesCache(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"map-int-topic", Config{}},
		{"array-signed-legacy", Config{Encoder: wire.Encoder{Era: wire.EraArray, Hash: wire.HashSigned},
			Publisher: PublisherConfig{Layout: ReplayLegacy}}},
		{"bytes-droplive", Config{Encoder: wire.Encoder{Hash: wire.HashBytes},
			Publisher: PublisherConfig{DropLive: 0.2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.TotalBlocks, cfg.BlockSize = 24, testBS
			e := startEngine(t, cfg)
			rank := indexer.Rank{WorkerID: 7}
			s, ix := startSubscriber(t, e, rank)
			runWorkload(t, e, 0, 200)
			caughtUp(t, s, e)
			checkEqual(t, ix, e, rank)
			st := s.State()
			if st.Degraded {
				t.Fatalf("degraded: %+v", st)
			}
			ps := e.Publisher().Stats()
			t.Logf("published %d batches (%d live-dropped), cache %d blocks, stats %+v", ps.Published, ps.LiveDropped, len(e.Holds()), st.Stats)
		})
	}
}

// Evictions must actually happen in the workload for the test to mean
// anything.
func TestWorkloadEvicts(t *testing.T) {
	t.Parallel()
	p := mustPool(t, 24, testBS)
	removed := 0
	for n := range 200 {
		a, err := p.Alloc(workload(n).TokenIDs)
		if err != nil {
			t.Fatal(err)
		}
		p.Free(a)
		for _, ev := range p.Events() {
			if ev.Kind == wire.KindBlockRemoved {
				removed++
			}
		}
	}
	if removed < 100 {
		t.Fatalf("only %d evictions", removed)
	}
}

func TestEngineRestart(t *testing.T) {
	t.Parallel()
	e := startEngine(t, Config{TotalBlocks: 24, BlockSize: testBS})
	rank := indexer.Rank{WorkerID: 3}
	s, ix := startSubscriber(t, e, rank)
	runWorkload(t, e, 0, 100)
	caughtUp(t, s, e)
	checkEqual(t, ix, e, rank)

	e.Restart()
	if len(e.Holds()) != 0 {
		t.Fatal("cache not empty after restart")
	}
	if _, ok := e.LastSeq(); ok {
		t.Fatal("seq not reset")
	}
	runWorkload(t, e, 1000, 1040)
	caughtUp(t, s, e)
	checkEqual(t, ix, e, rank)
	if s.State().Stats.Restarts == 0 {
		t.Fatalf("subscriber did not see a restart: %+v", s.State())
	}

	// reset_prefix_cache: AllBlocksCleared empties the index too.
	if err := e.ResetPrefixCache(context.Background()); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, s, e)
	checkEqual(t, ix, e, rank)
	runWorkload(t, e, 2000, 2020)
	caughtUp(t, s, e)
	checkEqual(t, ix, e, rank)
}

func TestEngineHTTPAndRegistration(t *testing.T) {
	t.Parallel()
	store := storetest.NewMemoryStore("/prefixd")
	e := startEngine(t, Config{TotalBlocks: 16, BlockSize: testBS, Store: store,
		Worker: catalog.Worker{WorkerID: 9, ModelName: "m"}, LeaseTTL: time.Second})
	testsupport.Eventually(t, 30*time.Second, "registration", func() bool { return e.Session() != nil })
	w := e.Session().Worker()
	if w.EventsEndpoint != e.Publisher().Endpoint() || w.ReplayEndpoint != e.Publisher().ReplayEndpoint() ||
		w.BlockSize != testBS || w.TotalKVBlocks != 16 {
		t.Fatalf("registered %+v", w)
	}

	srv := httptest.NewServer(e)
	defer srv.Close()
	post := func(req Request) Result {
		body, _ := json.Marshal(req)
		resp, err := http.Post(srv.URL+"/generate", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %s", resp.Status)
		}
		var res Result
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := post(Request{TokenIDs: toks(0, 10), MaxTokens: 3}); r.CachedTokens != 0 || r.PromptTokens != 10 || r.OutputTokens != 3 {
		t.Fatalf("first %+v", r)
	}
	if r := post(Request{TokenIDs: toks(0, 10)}); r.CachedTokens != 8 {
		t.Fatalf("second %+v", r)
	}
	resp, err := http.Post(srv.URL+"/generate", "application/json", bytes.NewReader([]byte(`{"token_ids":`+string(mustJSON(toks(0, 100)))+`}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("oversized prompt: %s", resp.Status)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// autoAdvance drives clk for the test's life: whenever the engine waits
// on it, time jumps to the timer's deadline, so every step takes exactly
// its modelled time and none passes for real.
func autoAdvance(t *testing.T, clk *VirtualClock) {
	t.Helper()
	autoAdvanceUntil(t, clk)
}

// autoAdvanceUntil is autoAdvance until stop is called.
func autoAdvanceUntil(t *testing.T, clk *VirtualClock) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := clk.Changed()
			if _, ok := clk.AdvanceToNext(); ok {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// advance waits until the engine waits on clk and moves the clock to that
// timer's deadline; it returns how far the clock moved.
func advance(t *testing.T, clk *VirtualClock) time.Duration {
	t.Helper()
	testsupport.Eventually(t, 30*time.Second, "the engine to wait on the clock", func() bool { return clk.Waiters() > 0 })
	d, _ := clk.AdvanceToNext()
	return d
}

// TestEngineTiming: a step costs its overhead plus prefill per uncached
// token plus decode per running sequence, measured on the engine's
// (virtual) clock.
func TestEngineTiming(t *testing.T) {
	t.Parallel()
	clk := NewVirtualClock(epoch)
	e := startEngine(t, Config{TotalBlocks: 16, BlockSize: testBS, Clock: clk,
		Timing: Timing{StepOverhead: 100 * time.Microsecond, PrefillPerToken: time.Millisecond, DecodePerSeq: 10 * time.Millisecond}})
	autoAdvance(t, clk)
	ctx := context.Background()
	first, err := e.Serve(ctx, Request{TokenIDs: toks(0, 10), MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Step 1 prefills 10 tokens (the first token), step 2 decodes one.
	if want := (Result{PromptTokens: 10, OutputTokens: 2, TTFT: 10100 * time.Microsecond, Latency: 20200 * time.Microsecond}); first != want {
		t.Fatalf("first %+v, want %+v", first, want)
	}
	second, err := e.Serve(ctx, Request{TokenIDs: toks(0, 10), MaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	// 8 of 10 tokens cached: 2 to prefill.
	if want := (Result{PromptTokens: 10, CachedTokens: 8, OutputTokens: 1, TTFT: 2100 * time.Microsecond, Latency: 2100 * time.Microsecond}); second != want {
		t.Fatalf("second %+v, want %+v", second, want)
	}
	if got := clk.Now().Sub(epoch); got != 22300*time.Microsecond {
		t.Fatalf("the clock moved %v, want 22.3ms", got)
	}
}

// TestEngineFaultEndpoints: the HTTP fault injections act on the engine.
func TestEngineFaultEndpoints(t *testing.T) {
	t.Parallel()
	e := startEngine(t, Config{TotalBlocks: 16, BlockSize: testBS})
	srv := httptest.NewServer(e)
	defer srv.Close()
	call := func(method, path string) int {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	serveSome := func() {
		if _, err := e.Serve(context.Background(), Request{TokenIDs: toks(0, 3*testBS)}); err != nil {
			t.Fatal(err)
		}
	}
	serveSome()
	if len(e.Holds()) != 3 {
		t.Fatalf("cache %d blocks, want 3", len(e.Holds()))
	}
	if c := call(http.MethodPost, "/faults/reset_prefix_cache"); c != http.StatusNoContent || len(e.Holds()) != 0 {
		t.Fatalf("reset: %d, cache %d blocks", c, len(e.Holds()))
	}
	serveSome()
	before := e.Publisher().Seq()
	if c := call(http.MethodPost, "/faults/restart"); c != http.StatusNoContent || len(e.Holds()) != 0 || e.Publisher().Seq() >= before {
		t.Fatalf("restart: %d, cache %d blocks, seq %d (was %d)", c, len(e.Holds()), e.Publisher().Seq(), before)
	}
	for path, want := range map[string]int{
		"/faults/stall_replay?for=50ms": http.StatusNoContent,
		"/faults/stall_replay?for=soon": http.StatusBadRequest,
		"/faults/stall_replay?for=-1s":  http.StatusBadRequest,
		"/faults/unplug":                http.StatusNotFound,
	} {
		if c := call(http.MethodPost, path); c != want {
			t.Errorf("POST %s: %d, want %d", path, c, want)
		}
	}
	if c := call(http.MethodGet, "/faults/restart"); c != http.StatusMethodNotAllowed {
		t.Errorf("GET /faults/restart: %d, want 405", c)
	}
	if c := call(http.MethodGet, "/health"); c != http.StatusOK {
		t.Fatalf("health of a running engine: %d", c)
	}
	if c := call(http.MethodPost, "/faults/crash"); c != http.StatusNoContent {
		t.Fatalf("crash: %d", c)
	}
	testsupport.Eventually(t, 30*time.Second, "the crashed engine to stop serving", func() bool {
		_, err := e.Serve(context.Background(), Request{TokenIDs: toks(0, testBS)})
		return errors.Is(err, ErrNotRunning)
	})
	if c := call(http.MethodGet, "/health"); c != http.StatusServiceUnavailable {
		t.Fatalf("health of a crashed engine: %d", c)
	}
}

// TestEngineCrash: a crashed engine stops serving and publishing but
// leaves its lease to expire, where a stopped engine revokes it at once.
func TestEngineCrash(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	ctx := context.Background()
	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	run := func(id uint64) (*Engine, context.CancelFunc, chan error) {
		e, err := New(Config{TotalBlocks: 16, BlockSize: testBS, Store: store,
			Worker: catalog.Worker{WorkerID: id, ModelName: "m"}, LeaseTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- e.Run(rctx) }()
		select {
		case <-e.Ready():
		case err := <-done:
			t.Fatalf("engine %d: %v", id, err)
		}
		return e, cancel, done
	}
	present := func(e *Engine) bool {
		_, err := store.Get(ctx, e.Session().Worker().Key())
		if err != nil && !errors.Is(err, catalog.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	stopped, stop, stopDone := run(1)
	stop()
	if err := <-stopDone; err != nil {
		t.Fatalf("stopped engine: %v", err)
	}
	if present(stopped) {
		t.Fatal("a stopped engine's record outlived Run: the lease was not revoked")
	}

	crashed, cancel, done := run(2)
	defer cancel()
	crashed.Crash()
	if err := <-done; err != nil {
		t.Fatalf("crashed engine: %v", err)
	}
	if !present(crashed) {
		t.Fatal("a crashed engine revoked its lease")
	}
	if _, err := crashed.Serve(ctx, Request{TokenIDs: toks(0, 8)}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("serve after crash: %v, want ErrNotRunning", err)
	}
	testsupport.Eventually(t, 10*time.Second, "the crashed engine's lease to expire", func() bool { return !present(crashed) })
}

// TestEngineQueuesWhenFull: a request that needs blocks held by a running
// request waits in the queue until they are freed, as vLLM's scheduler
// does; one larger than the whole pool is refused at once.
func TestEngineQueuesWhenFull(t *testing.T) {
	t.Parallel()
	clk := NewVirtualClock(epoch)
	e := startEngine(t, Config{TotalBlocks: 16, BlockSize: testBS, Clock: clk,
		Timing: Timing{PrefillPerToken: time.Microsecond, DecodePerSeq: time.Millisecond}})
	ctx := context.Background()
	type served struct {
		res Result
		err error
	}
	first := make(chan served, 1)
	go func() {
		r, err := e.Serve(ctx, Request{TokenIDs: toks(0, 12*testBS), MaxTokens: 3})
		first <- served{r, err}
	}()
	testsupport.Eventually(t, 30*time.Second, "the first request's step", func() bool { return clk.Waiters() == 1 })
	second := make(chan served, 1)
	go func() {
		r, err := e.Serve(ctx, Request{TokenIDs: toks(1000, 12*testBS), MaxTokens: 1})
		second <- served{r, err}
	}()
	testsupport.Eventually(t, 30*time.Second, "the second request to queue", func() bool { return e.Queued() == 1 })
	if _, err := e.Serve(ctx, Request{TokenIDs: toks(5000, 17*testBS)}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a prompt larger than the pool: %v, want ErrNoSpace", err)
	}
	autoAdvance(t, clk)
	f := <-first
	if f.err != nil {
		t.Fatal(f.err)
	}
	s := <-second
	if s.err != nil {
		t.Fatalf("queued request: %v", s.err)
	}
	// The first prefills 48 tokens and decodes twice (2.048 ms); the
	// second is admitted at the step after it freed its blocks.
	if f.res.Latency != 2048*time.Microsecond || s.res.QueueTime != f.res.Latency {
		t.Fatalf("first %+v, second %+v: want the second queued for the first's 2.048ms", f.res, s.res)
	}
	if l := e.Load(); l.Waiting != 0 || l.Running != 0 || l.KVUsage != 0 {
		t.Fatalf("load after both: %+v", l)
	}
}

// TestEngineCancelAfterScheduling: a request abandoned after it was
// scheduled still publishes its step (the engine's cache changed) and
// frees its blocks at the next step; one abandoned before, or while it
// waited in the queue, changes nothing.
func TestEngineCancelAfterScheduling(t *testing.T) {
	t.Parallel()
	clk := NewVirtualClock(epoch)
	e := startEngine(t, Config{TotalBlocks: 16, BlockSize: testBS, Clock: clk,
		Timing: Timing{PrefillPerToken: time.Millisecond, DecodePerSeq: time.Millisecond}})
	before := e.Publisher().Seq()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := e.Serve(ctx, Request{TokenIDs: toks(0, 3*testBS), MaxTokens: 5}); done <- err }()
	testsupport.Eventually(t, 30*time.Second, "the request's first step", func() bool { return clk.Waiters() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned request: %v", err)
	}
	advance(t, clk) // the step it was in completes
	testsupport.Eventually(t, 30*time.Second, "the step published and the blocks freed", func() bool {
		l := e.Load()
		return e.Publisher().Seq() == before+1 && l.Running == 0 && l.KVUsage == 0
	})
	if len(e.Holds()) != 3 {
		t.Fatalf("cache %d blocks after the abandoned request's step, want its 3", len(e.Holds()))
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := e.Serve(ctx, Request{TokenIDs: toks(100, 3*testBS)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}

	// One that fills the pool, and one abandoned while it waits for it.
	big := make(chan error, 1)
	go func() {
		_, err := e.Serve(context.Background(), Request{TokenIDs: toks(200, 16*testBS), MaxTokens: 2})
		big <- err
	}()
	testsupport.Eventually(t, 30*time.Second, "the big request's step", func() bool { return e.Load().Running == 1 })
	ctx, cancel = context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() { _, err := e.Serve(ctx, Request{TokenIDs: toks(300, 3*testBS)}); queued <- err }()
	testsupport.Eventually(t, 30*time.Second, "the small request to queue", func() bool { return e.Queued() == 1 })
	cancel()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued request: %v", err)
	}
	autoAdvance(t, clk)
	if err := <-big; err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 30*time.Second, "the engine idle", func() bool {
		l := e.Load()
		l.PrefixQueries, l.PrefixHits = 0, 0 // cumulative counts
		return l == Load{FreeBlocks: 16, TotalBlocks: 16}
	})
	if e.Hit(toks(100, 3*testBS)) != 0 || e.Hit(toks(300, 3*testBS)) != 0 || len(e.Holds()) != 16 {
		t.Fatalf("abandoned requests changed the cache: %d blocks", len(e.Holds()))
	}
}

// gemmaLike is a hybrid layout numbered as vLLM numbers Gemma 3's groups:
// sliding-window groups first (windows of 6 and 9 tokens: a hit needs the
// 2 blocks before its end), then the full-attention group.
var gemmaLike = []Group{{Kind: "sliding_window", Window: 6}, {Kind: "sliding_window", Window: 9}, {Kind: "full_attention"}}

// TestEngineHybridIndexMatchesCache: a subscriber following a hybrid
// engine over ZMQ indexes the full-attention group 2 as the main group and
// tracks the sliding-window groups exactly, and Match's granted hit for
// random prompts is what the engine would serve from its cache.
func TestEngineHybridIndexMatchesCache(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"map-int", Config{}},
		{"array-wide-droplive", Config{Encoder: wire.Encoder{Era: wire.EraArray},
			Publisher: PublisherConfig{DropLive: 0.2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.TotalBlocks, cfg.BlockSize, cfg.Groups = 60, testBS, gemmaLike
			e := startEngine(t, cfg)
			if e.MainGroup() != 2 {
				t.Fatalf("main group %d, want 2", e.MainGroup())
			}
			rank := indexer.Rank{WorkerID: 5}
			s, ix := startSubscriber(t, e, rank)
			rng := rand.New(rand.NewPCG(1, 2))
			cut := 0
			for round := range 4 {
				runWorkload(t, e, round*50, round*50+50)
				caughtUp(t, s, e)
				checkEqual(t, ix, e, rank)
				checkGroups(t, ix, e, rank)
				for range 100 {
					p := workload(rng.IntN(round*50 + 50)).TokenIDs
					p = p[:rng.IntN(len(p)+1)]
					want := e.Hit(p)
					q := indexer.HashBlocks(nil, p, testBS, indexer.BaseSeed)
					ov, err := ix.Match(testKey, q, nil)
					if err != nil {
						t.Fatal(err)
					}
					var got indexer.Overlap
					for _, o := range ov {
						if o.Rank == rank {
							got = o
						}
					}
					if int(got.Device) != want {
						t.Fatalf("round %d: prompt of %d blocks: index grants %+v, the engine %d blocks", round, len(q), got, want)
					}
					if got.Upper > got.Device {
						cut++
					}
				}
			}
			if cut == 0 {
				t.Fatal("no prompt had a main-group run longer than its hit: the sliding windows never mattered")
			}
			if st := s.State(); st.Degraded {
				t.Fatalf("degraded: %+v", st)
			}
			t.Logf("%d of 400 prompts granted less than the main group's run; publisher %+v", cut, e.Publisher().Stats())
		})
	}
}

// checkGroups asserts the index tracks every non-main group of the
// engine exactly.
func checkGroups(t *testing.T, ix *indexer.Index, e *Engine, rank indexer.Rank) {
	t.Helper()
	states, err := ix.Groups(testKey, rank)
	if err != nil {
		t.Fatal(err)
	}
	byIdx := map[int]indexer.GroupState{}
	for _, st := range states {
		byIdx[st.Idx] = st
	}
	if m := byIdx[e.MainGroup()]; !m.Main {
		t.Fatalf("group %d is not the index's main group: %+v", e.MainGroup(), states)
	}
	err = ix.ReadRank(testKey, rank, func(tr *indexer.Tree) {
		for g := range gemmaLike {
			if g == e.MainGroup() {
				continue
			}
			holds := e.GroupHolds(g)
			if st := byIdx[g]; !st.Tracked || st.Main || st.Blocks != len(holds) || st.Window != gemmaLike[g].Window {
				t.Errorf("group %d: index %+v, engine %d blocks", g, st, len(holds))
			}
			for h, n := range holds {
				if c, ok := tr.GroupHolds(rank, g, h); !ok || int(c[indexer.TierDevice]) != n {
					t.Errorf("group %d hash %#x: index %v (%v), engine %d copies", g, h, c, ok, n)
					return
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkEngineServe measures one request served by a zero-cost engine
// (the workload's prompts, up to 6 tokens out) and its step published on
// the wire: the engine's own overhead per request.
func BenchmarkEngineServe(b *testing.B) {
	e, err := New(Config{TotalBlocks: 1024, BlockSize: testBS})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-e.Ready()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if _, err := e.Serve(ctx, workload(n)); err != nil {
			b.Fatal(err)
		}
		n++
	}
}
