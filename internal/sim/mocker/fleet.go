package mocker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/leaf/httpserve"
)

// Fleet runs mock engines registered in one catalog store, starting and
// crashing them while it runs (the mocker command, the demo, the soak and
// the end-to-end tests). Safe for concurrent use.
type Fleet struct {
	store  catalog.Registrar
	log    *slog.Logger
	ctx    context.Context // engines run until it ends (Stop)
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per engine Run and HTTP server
	failed chan struct{}  // closed when the first engine fails

	mu      sync.Mutex // guards engines and errs
	engines []*Engine
	errs    []error // of engines whose Run or HTTP server failed
}

// NewFleet returns a fleet whose engines register in store (nil: none
// registers) and run until ctx ends or Stop.
func NewFleet(ctx context.Context, store catalog.Registrar, log *slog.Logger) *Fleet {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fctx, cancel := context.WithCancel(ctx)
	return &Fleet{store: store, log: log, ctx: fctx, cancel: cancel, failed: make(chan struct{})}
}

// Start runs an engine configured by cfg (its Store is the fleet's),
// serving its HTTP API on ln unless ln is nil, and returns once the engine
// is registered. The fleet owns ln from the call on.
func (f *Fleet) Start(ctx context.Context, cfg Config, ln net.Listener) (*Engine, error) {
	cfg.Store = f.store
	id := cfg.Worker.WorkerID
	e, err := New(cfg)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	done := make(chan error, 1)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := e.Run(f.ctx)
		if err != nil {
			f.fail(fmt.Errorf("mock engine %d: %w", id, err))
		}
		done <- err
	}()
	if ln != nil {
		srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(f.log.Handler(), slog.LevelWarn)}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := httpserve.Serve(f.ctx, srv, ln, 5*time.Second); err != nil {
				f.fail(fmt.Errorf("mock engine %d: http: %w", id, err))
			}
		}()
	}
	select {
	case <-e.Ready():
	case err := <-done:
		if err == nil { // the fleet stopped before the engine was ready
			err = ErrNotRunning
		}
		return nil, fmt.Errorf("mock engine %d: %w", id, err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	f.engines = append(f.engines, e)
	f.mu.Unlock()
	return e, nil
}

func (f *Fleet) fail(err error) {
	f.log.Error("mock engine stopped", "err", err)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) == 0 {
		close(f.failed)
	}
	f.errs = append(f.errs, err)
}

// Engines returns the running engines, in the order they started.
func (f *Fleet) Engines() []*Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.engines)
}

// Crash crashes e (its lease is left to expire) and forgets it.
func (f *Fleet) Crash(e *Engine) {
	e.Crash()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.engines = slices.DeleteFunc(f.engines, func(x *Engine) bool { return x == e })
}

// Failed is closed when an engine's Run or HTTP server first fails.
func (f *Fleet) Failed() <-chan struct{} { return f.failed }

// Stop stops every engine (revoking their leases) and HTTP server, waits
// for them, and returns the errors of those that failed.
func (f *Fleet) Stop() error {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}
