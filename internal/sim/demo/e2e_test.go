package demo

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestEndToEndFailures drives mock engines and the daemon through the
// failures a fleet sees, with a real etcd, real ZMQ and real HTTP, and
// checks after each that the index equals every engine's cache: the
// daemon starting after the engines (late-subscribe replay), live-batch
// loss, lossy replay, an engine restart (seq back to 0, cache empty), the
// daemon restarting while the engines keep publishing, and etcd
// restarting under both.
func TestEndToEndFailures(t *testing.T) {
	t.Parallel()
	ctx, emb, store := e2eEtcd(t)

	var cfgs []mocker.Config
	for _, pc := range []mocker.PublisherConfig{{}, {DropLive: 0.05}, {DropLive: 0.05, DropReplay: 0.1}} {
		cfgs = append(cfgs, mocker.Config{Publisher: pc, LeaseTTL: 5 * time.Second})
	}
	engines := startE2EEngines(t, ctx, store, cfgs)
	traffic := trafficOn(t, ctx, engines)
	check := func(stage string, ix *indexer.Index) {
		t.Helper()
		checkExact(t, ctx, stage, ix, engines)
	}

	// The engines serve traffic before any daemon exists.
	traffic(90)
	d := startDaemon(t, ctx, emb.Endpoints())
	check("late subscribe", d.ix)
	traffic(90)
	check("live traffic with loss", d.ix)

	engines[0].Restart()
	traffic(60)
	check("engine restart", d.ix)

	d.stop(t)
	traffic(60) // published while no daemon listens
	d = startDaemon(t, ctx, emb.Endpoints())
	check("daemon restart", d.ix)

	emb.Close()
	emb2, err := etcdstore.StartEmbedded(ctx, emb.Config())
	if err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	defer emb2.Close()
	traffic(60)
	check("etcd restart", d.ix)
	testsupport.Eventually(t, 30*time.Second, "every engine registered after the etcd restart", func() bool {
		ws, err := store.List(ctx, 0)
		return err == nil && len(ws.Records) == len(engines)
	})
	d.stop(t)
	var dropped uint64
	for _, e := range engines {
		dropped += e.Publisher().Stats().LiveDropped + e.Publisher().Stats().ReplayDropped
	}
	if dropped == 0 {
		t.Error("no live batch or replay message was dropped: the loss paths were not exercised")
	}
}

// TestEndToEndPeerBootstrapAndLeaseExpiry: engines whose replay buffers
// hold only the last 8 batches; a second daemon replica bootstrapped from
// the first is exact and not degraded, where a replica without a peer can
// only be degraded; then an engine crashes without revoking its lease and
// both replicas drop it and its blocks when the lease expires, while the
// other engines stay exact.
func TestEndToEndPeerBootstrapAndLeaseExpiry(t *testing.T) {
	t.Parallel()
	ctx, emb, store := e2eEtcd(t)
	const ttl = 2 * time.Second
	cfg := mocker.Config{Publisher: mocker.PublisherConfig{BufferSteps: 8}, LeaseTTL: ttl}
	engines := startE2EEngines(t, ctx, store, []mocker.Config{cfg, cfg, cfg})

	a := startDaemon(t, ctx, emb.Endpoints())
	if err := poll(ctx, "the first replica to be ready", func() error { return ready(ctx, a.url) }); err != nil {
		t.Fatal(err)
	}
	// In steps of at most 4 batches per engine, each applied before the
	// next, so that whatever live batch the first replica misses is still
	// in the 8-batch replay buffer when it asks.
	traffic := trafficOn(t, ctx, engines)
	for range 10 {
		traffic(12)
		checkExact(t, ctx, "first replica", a.ix, engines)
	}
	if d := degradedRanks(t, ctx, a.url); d != 0 {
		t.Fatalf("first replica: %d degraded ranks", d)
	}
	for _, e := range engines {
		if seq, _ := e.LastSeq(); seq < 8 {
			t.Fatalf("worker %d published %d batches: its replay buffer still reaches seq 0", e.Worker().WorkerID, seq+1)
		}
	}

	b := startDaemon(t, ctx, emb.Endpoints(), a.url)
	c := startDaemon(t, ctx, emb.Endpoints())
	checkExact(t, ctx, "bootstrapped replica", b.ix, engines)
	if d := degradedRanks(t, ctx, b.url); d != 0 {
		t.Fatalf("bootstrapped replica: %d degraded ranks", d)
	}
	if err := poll(ctx, "the replica without a peer to give up on the rolled-over history", func() error {
		if d := degradedRanks(t, ctx, c.url); d != len(engines) {
			return fmt.Errorf("%d of %d ranks degraded", d, len(engines))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Degraded, but never wrong: every block c indexes is in the engine's
	// cache with at most the engine's copies (zero false positives).
	if err := caughtUp(ctx, c.ix, engines); err != nil {
		t.Fatal(err)
	}
	if extra := notSubset(c.ix, engines); len(extra) > 0 {
		t.Fatalf("the degraded replica indexes blocks the engines lack: %v", extra[:min(5, len(extra))])
	}
	held := 0
	for _, st := range c.ix.Stats() {
		held += st.Entries
	}
	if held == 0 {
		t.Fatal("the degraded replica indexes nothing: the subset check proved nothing")
	}
	t.Logf("degraded replica: %d entries, all in the engines' caches", held)
	c.stop(t)

	crashed, live := engines[0], engines[1:]
	crashed.Crash()
	start := time.Now()
	for _, d := range []*runningDaemon{a, b} {
		if err := poll(ctx, "the crashed worker to leave", func() error {
			ws, err := (&client.Client{BaseURL: d.url}).Workers(ctx, "", "")
			if err != nil {
				return err
			}
			for _, w := range ws {
				if w.InstanceID == crashed.Worker().WorkerID {
					return fmt.Errorf("worker %d still listed", w.InstanceID)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		st, err := d.ix.Rank(indexer.PartitionKey{Model: model, Group: crashed.Worker().RoutingGroup}, indexer.Rank{WorkerID: crashed.Worker().WorkerID})
		if err != nil || st.Blocks != 0 {
			t.Fatalf("crashed worker: %d blocks still indexed (%v)", st.Blocks, err)
		}
	}
	if el := time.Since(start); el > ttl+3*time.Second {
		t.Errorf("the crashed worker left %v after the crash; want within its lease TTL %v + 3 s", el, ttl)
	}
	// Paced again (4 batches per engine a step): a burst could outrun the
	// 8-batch replay buffers on a loaded machine and leave a rank
	// degraded, which is correct but not what this stage checks.
	traffic = trafficOn(t, ctx, live)
	for range 8 {
		traffic(8)
		checkExact(t, ctx, "after the crash, first replica", a.ix, live)
		checkExact(t, ctx, "after the crash, bootstrapped replica", b.ix, live)
	}
}

// e2eEtcd starts an embedded etcd and a store on it, and a context that
// bounds the test.
func e2eEtcd(t *testing.T) (context.Context, *etcdstore.Embedded, *etcdstore.Store) {
	t.Helper()
	ctx, cancel := testsupport.Context(t)
	t.Cleanup(cancel)
	emb := storetest.StartEtcd(t)
	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() }) // after the engines' cleanup revoked their leases
	return ctx, emb, store
}

// startE2EEngines starts one registered mock engine per config (ids 1, 2,
// …, 256 blocks of 16 tokens unless set) and stops them at cleanup.
func startE2EEngines(t *testing.T, ctx context.Context, store *etcdstore.Store, cfgs []mocker.Config) []*mocker.Engine {
	t.Helper()
	fl := newFleet(ctx, Config{}.Defaults(), store)
	t.Cleanup(func() {
		if err := fl.Stop(); err != nil {
			t.Errorf("engines: %v", err)
		}
	})
	for i, cfg := range cfgs {
		cfg.TotalBlocks = cmp.Or(cfg.TotalBlocks, 256)
		cfg.BlockSize = cmp.Or(cfg.BlockSize, 16)
		cfg.Worker = catalog.Worker{WorkerID: uint64(i + 1), ModelName: model, RoutingGroup: "e2e", Endpoint: fmt.Sprintf("http://127.0.0.1:%d", 19000+i)}
		if _, err := fl.Start(ctx, cfg, nil); err != nil {
			t.Fatal(err)
		}
	}
	return fl.Engines()
}

// trafficOn returns a function serving the next n requests of a
// deterministic workload round-robin on engines.
func trafficOn(t *testing.T, ctx context.Context, engines []*mocker.Engine) func(n int) {
	prompts := Workload(Config{Requests: 600, Conversations: 12, Seed: 5})
	next := 0
	return func(n int) {
		t.Helper()
		for range n {
			e := engines[next%len(engines)]
			if _, err := e.Serve(ctx, prompts[next%len(prompts)]); err != nil {
				t.Fatalf("request %d on worker %d: %v", next, e.Worker().WorkerID, err)
			}
			next++
		}
	}
}

// checkExact waits until ix has applied every engine's last batch, then
// fails the test unless ix equals every engine's cache.
func checkExact(t *testing.T, ctx context.Context, stage string, ix *indexer.Index, engines []*mocker.Engine) {
	t.Helper()
	if err := caughtUp(ctx, ix, engines); err != nil {
		t.Fatalf("%s: %v", stage, err)
	}
	if diffs := compare(ix, engines); len(diffs) > 0 {
		t.Fatalf("%s: index differs from the engines' caches: %v", stage, diffs[:min(5, len(diffs))])
	}
}

// notSubset lists every block ix holds for an engine's rank that the
// engine does not cache (or with more copies than it has).
func notSubset(ix *indexer.Index, engines []*mocker.Engine) []string {
	var out []string
	for _, e := range engines {
		holds := e.Holds()
		_ = ix.Read(indexer.PartitionKey{Model: model, Group: e.Worker().RoutingGroup}, func(t *indexer.Tree) {
			for _, ev := range t.Dump().Events {
				if ev.Rank.WorkerID != e.Worker().WorkerID {
					continue
				}
				for _, b := range ev.Blocks {
					if n := int(b.Counts[indexer.TierDevice]); n > holds[b.Hash] {
						out = append(out, fmt.Sprintf("worker %d block %#x: index %d copies, engine %d", e.Worker().WorkerID, b.Hash, n, holds[b.Hash]))
					}
				}
			}
		})
	}
	return out
}

// degradedRanks counts the ranks a daemon reports degraded in /workers.
func degradedRanks(t *testing.T, ctx context.Context, url string) int {
	t.Helper()
	ws, err := (&client.Client{BaseURL: url}).Workers(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, w := range ws {
		for _, l := range w.Listeners {
			if l.Degraded {
				n++
			}
		}
	}
	return n
}

type runningDaemon struct {
	url  string
	ix   *indexer.Index
	halt func() error
}

// startDaemon starts a daemon on etcd, stopped when ctx ends or the test
// does.
func startDaemon(t *testing.T, ctx context.Context, etcd []string, peers ...string) *runningDaemon {
	t.Helper()
	d := &runningDaemon{ix: indexer.New(indexer.Options{})}
	addr, stop := testsupport.Ready(t, "daemon", func(dctx context.Context, ready func(string)) error {
		dctx, cancel := context.WithCancel(dctx)
		defer cancel()
		context.AfterFunc(ctx, cancel)
		return daemon.Run(dctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd}, Listen: "127.0.0.1:0", Index: d.ix, Peers: peers,
			OnReady: ready, Subscriber: stream.SubscriberConfig{ProbeInterval: 200 * time.Millisecond}})
	})
	d.url, d.halt = "http://"+addr, stop
	return d
}

// stop stops the daemon (testsupport.Ready reports its error).
func (d *runningDaemon) stop(*testing.T) { d.halt() }
