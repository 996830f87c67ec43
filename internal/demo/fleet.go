package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/mocker"
)

// engineSpec describes one mock engine of a pool.
type engineSpec struct {
	id     uint64
	group  string
	role   catalog.Role
	domain string // KV-transfer domain value (rack), "" for none
}

// fleet runs mock engines registered in the catalog, adding and removing
// them while it runs. Safe for concurrent use.
type fleet struct {
	cfg    Config
	store  *catalog.EtcdStore
	ctx    context.Context // engines run until it ends (stop)
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per engine Run

	mu      sync.Mutex // guards engines and errs
	engines []*engine
	errs    []error // of engines whose Run failed
}

func newFleet(ctx context.Context, cfg Config, store *catalog.EtcdStore) *fleet {
	fctx, cancel := context.WithCancel(ctx)
	return &fleet{cfg: cfg, store: store, ctx: fctx, cancel: cancel}
}

// start runs an engine for s and returns once it is registered.
func (f *fleet) start(ctx context.Context, s engineSpec) (*engine, error) {
	w := catalog.Worker{WorkerID: s.id, ModelName: model, RoutingGroup: s.group, Role: s.role, Endpoint: "http://127.0.0.1:" + strconv.FormatUint(18000+s.id, 10)}
	if s.domain != "" {
		w.TopologyDomains = map[string]string{"rack": s.domain}
		w.KVTransferDomain = "rack"
		w.KVTransferEnforcement = catalog.EnforcementRequired
	}
	return f.run(ctx, mocker.Config{TotalBlocks: f.cfg.TotalBlocks, BlockSize: f.cfg.BlockSize,
		Publisher: mocker.PublisherConfig{DropLive: f.cfg.DropLive}, Worker: w, LeaseTTL: f.cfg.leaseTTL()})
}

// run runs an engine configured by mc, registered in the fleet's store,
// and returns once it is registered.
func (f *fleet) run(ctx context.Context, mc mocker.Config) (*engine, error) {
	mc.Store = f.store
	m, err := mocker.New(mc)
	if err != nil {
		return nil, err
	}
	e := &engine{Engine: m, worker: mc.Worker}
	done := make(chan error, 1)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := m.Run(f.ctx)
		if err != nil {
			f.cfg.Log.Error("mock engine stopped", "worker", mc.Worker.WorkerID, "err", err)
			f.mu.Lock()
			f.errs = append(f.errs, fmt.Errorf("mock engine %d: %w", mc.Worker.WorkerID, err))
			f.mu.Unlock()
		}
		done <- err
	}()
	select {
	case <-m.Ready():
	case err := <-done:
		return nil, fmt.Errorf("mock engine %d: %w", mc.Worker.WorkerID, err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	f.engines = append(f.engines, e)
	f.mu.Unlock()
	return e, nil
}

// list returns the running engines.
func (f *fleet) list() []*engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.engines)
}

// crash crashes e (its lease is left to expire) and forgets it.
func (f *fleet) crash(e *engine) {
	e.Crash()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.engines = slices.DeleteFunc(f.engines, func(x *engine) bool { return x == e })
}

// stop stops every engine (revoking their leases), waits for them, and
// returns the errors of those whose Run failed.
func (f *fleet) stop() error {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

func (c Config) leaseTTL() time.Duration {
	if c.LeaseTTL > 0 {
		return c.LeaseTTL
	}
	return 5 * time.Second
}
