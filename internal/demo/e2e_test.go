package demo

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/mocker"
)

// TestEndToEndFailures drives mock engines and the daemon through the
// failures a fleet sees, with a real etcd, real ZMQ and real HTTP, and
// checks after each that the index equals every engine's cache: the
// daemon starting after the engines (late-subscribe replay), live-batch
// loss, lossy replay, an engine restart (seq back to 0, cache empty), the
// daemon restarting while the engines keep publishing, and etcd
// restarting under both.
func TestEndToEndFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	emb := storetest.StartEtcd(t)
	store, err := catalog.NewEtcdStore(ctx, catalog.EtcdConfig{Endpoints: emb.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	pubs := []events.PublisherConfig{{}, {DropLive: 0.05}, {DropLive: 0.05, DropReplay: 0.1}}
	var engines []*engine
	ectx, stopEngines := context.WithCancel(ctx)
	done := make(chan error, len(pubs))
	defer func() {
		stopEngines()
		for range engines {
			if err := <-done; err != nil {
				t.Errorf("engine: %v", err)
			}
		}
	}()
	for i, pc := range pubs {
		w := catalog.Worker{WorkerID: uint64(i + 1), ModelName: model, RoutingGroup: "e2e", Endpoint: fmt.Sprintf("http://127.0.0.1:%d", 19000+i)}
		e, err := mocker.New(mocker.Config{TotalBlocks: 256, BlockSize: 16, Publisher: pc, Store: store, Worker: w, LeaseTTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, &engine{Engine: e, worker: w})
		go func() { done <- e.Run(ectx) }()
		select {
		case <-e.Ready():
		case err := <-done:
			engines = engines[:len(engines)-1]
			t.Fatalf("engine %d: %v", w.WorkerID, err)
		}
	}
	prompts := Workload(Config{Requests: 600, Conversations: 12, Seed: 5})
	next := 0
	traffic := func(n int) {
		t.Helper()
		for range n {
			e := engines[next%len(engines)]
			if _, err := e.Serve(ctx, prompts[next%len(prompts)]); err != nil {
				t.Fatalf("request %d on worker %d: %v", next, e.worker.WorkerID, err)
			}
			next++
		}
	}
	check := func(stage string, ix *indexer.Index) {
		t.Helper()
		if err := caughtUp(ctx, ix, engines); err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
		if diffs := compare(ix, engines); len(diffs) > 0 {
			t.Fatalf("%s: index differs from the engines' caches: %v", stage, diffs[:min(5, len(diffs))])
		}
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
	emb2, err := catalog.StartEmbedded(ctx, emb.Config())
	if err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	defer emb2.Close()
	traffic(60)
	check("etcd restart", d.ix)
	storetest.Eventually(t, 30*time.Second, "every engine registered after the etcd restart", func() bool {
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

type runningDaemon struct {
	ix     *indexer.Index
	cancel context.CancelFunc
	done   chan error
}

func startDaemon(t *testing.T, ctx context.Context, etcd []string) *runningDaemon {
	t.Helper()
	d := &runningDaemon{ix: indexer.New(indexer.Options{}), done: make(chan error, 1)}
	dctx, cancel := context.WithCancel(ctx)
	d.cancel = cancel
	ready := make(chan string, 1)
	go func() {
		d.done <- daemon.Run(dctx, daemon.Config{Etcd: catalog.EtcdConfig{Endpoints: etcd}, Listen: "127.0.0.1:0", Index: d.ix,
			OnReady: func(a string) { ready <- a }, Subscriber: events.SubscriberConfig{ProbeInterval: 200 * time.Millisecond}})
	}()
	select {
	case <-ready:
	case err := <-d.done:
		t.Fatalf("daemon: %v", err)
	}
	t.Cleanup(func() { d.stop(t) })
	return d
}

func (d *runningDaemon) stop(t *testing.T) {
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	if err := <-d.done; err != nil {
		t.Errorf("daemon: %v", err)
	}
}
