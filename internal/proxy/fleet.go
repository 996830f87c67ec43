package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
)

// engine is one worker as the fleet view knows it.
type engine struct {
	id       uint64
	model    string
	group    string
	role     catalog.Role
	endpoint string // the engine's HTTP base URL
	indexed  bool   // at least one rank streams its KV events to prefixd
	active   bool   // every rank's stream is active (a healthy engine)
}

// fleet is the view of the workers prefixd serve lists, refreshed by run.
type fleet struct {
	c   *client.Client
	log *slog.Logger

	mu       sync.Mutex
	engines  []engine
	synced   chan struct{}
	once     sync.Once
	rr       atomic.Uint64 // round-robin cursor for tokenization and pass-through
	inflight sync.Map      // endpoint → *atomic.Int64: requests this proxy has there
}

func newFleet(c *client.Client, log *slog.Logger) *fleet {
	return &fleet{c: c, log: log, synced: make(chan struct{})}
}

// run refreshes the view every interval until ctx ends.
func (f *fleet) run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		if err := f.refresh(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				f.log.Warn("proxy: cannot list workers; keeping the last view", "err", err)
			}
			failing = true
		} else if failing {
			f.log.Info("proxy: workers listed again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (f *fleet) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ws, err := f.c.Workers(ctx, "", "")
	if err != nil {
		return err
	}
	f.set(ws)
	return nil
}

// set replaces the view with ws, logging engines that come and go.
func (f *fleet) set(ws []api.WorkerInfo) {
	es := make([]engine, 0, len(ws))
	for _, w := range ws {
		if w.EngineEndpoint == "" {
			continue // indexed, but requests cannot be sent to it
		}
		e := engine{id: w.InstanceID, model: w.ModelName, group: w.RoutingGroup, role: w.Role, endpoint: w.EngineEndpoint, active: true}
		if e.role == "" {
			e.role = catalog.RoleAggregated
		}
		for _, l := range w.Listeners {
			if l.Endpoint == "" {
				continue // a rank without an events endpoint: no stream, no index
			}
			e.indexed = true
			if l.Status != api.StatusActive {
				e.active = false
			}
		}
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b engine) int { return cmp.Compare(a.id, b.id) })
	f.mu.Lock()
	old := f.engines
	f.engines = es
	// Listed as the view appears, in one step: a request that finds the
	// engines (or /v1/models that names them) never meets "not listed yet".
	f.once.Do(func() { close(f.synced) })
	f.mu.Unlock()
	if len(old) != len(es) {
		f.log.Info("proxy: fleet view changed", "engines", len(es), "before", len(old))
	}
}

// pick returns the engines of model, group and role ("" matches any
// group; a zero role any role).
func (f *fleet) pick(model, group string, role catalog.Role) []engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []engine
	for _, e := range f.engines {
		if e.model == model && (group == "" || e.group == group) && (role == "" || e.role == role) {
			out = append(out, e)
		}
	}
	return out
}

// models returns the model names of the fleet, sorted.
func (f *fleet) models() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.engines {
		if !slices.Contains(out, e.model) {
			out = append(out, e.model)
		}
	}
	slices.Sort(out)
	return out
}

// serves reports whether any engine of the view serves model, in any
// routing group and role.
func (f *fleet) serves(model string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.engines, func(e engine) bool { return e.model == model })
}

// listed reports whether the view was listed at least once.
func (f *fleet) listed() bool {
	select {
	case <-f.synced:
		return true
	default:
		return false
	}
}

// all returns every engine.
func (f *fleet) all() []engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.engines)
}

// healthyFirst returns the healthy engines of es, or es when none is.
func healthyFirst(es []engine) []engine {
	if healthy := slices.DeleteFunc(slices.Clone(es), func(e engine) bool { return !e.active }); len(healthy) > 0 {
		return healthy
	}
	return es
}

// next returns one of es in turn, healthy ones first.
func (f *fleet) next(es []engine) (engine, bool) {
	es = healthyFirst(es)
	if len(es) == 0 {
		return engine{}, false
	}
	return es[f.rr.Add(1)%uint64(len(es))], true
}

// random returns one of es at random, healthy ones first.
func (f *fleet) random(es []engine, r *rand.Rand, mu *sync.Mutex) (engine, bool) {
	es = healthyFirst(es)
	if len(es) == 0 {
		return engine{}, false
	}
	mu.Lock()
	defer mu.Unlock()
	return es[r.IntN(len(es))], true
}

// leastLoaded returns the engine of es with the fewest requests this
// proxy has in flight there (ties in turn), healthy ones first: routing
// by load when prefixd or the tokenizer cannot be asked.
func (f *fleet) leastLoaded(es []engine) (engine, bool) {
	es = healthyFirst(es)
	if len(es) == 0 {
		return engine{}, false
	}
	start := int(f.rr.Add(1) % uint64(len(es)))
	best, bestLoad := es[start], f.load(es[start].endpoint).Load()
	for i := 1; i < len(es); i++ {
		e := es[(start+i)%len(es)]
		if l := f.load(e.endpoint).Load(); l < bestLoad {
			best, bestLoad = e, l
		}
	}
	return best, true
}

func (f *fleet) load(endpoint string) *atomic.Int64 {
	v, _ := f.inflight.LoadOrStore(endpoint, new(atomic.Int64))
	return v.(*atomic.Int64)
}
