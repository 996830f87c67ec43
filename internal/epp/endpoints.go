package epp

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// engineAddr is what the picker knows of one engine's address.
type engineAddr struct {
	model, group string
	base         string // the record's endpoint (engine_url), the tokenizer's base URL
	host, port   string
	addr         string // ip:port, "" while not known
	bad          string // why the record cannot be given as ip:port ("" if it can, or may)
}

// Endpoints are the engines' addresses as a gateway names them (ip:port),
// from their catalog records: an IP literal at once, a name resolved by
// Run. A record whose endpoint cannot be given as ip:port (none, not a
// URL, a name that does not resolve) is logged once when it becomes so,
// counted by Unroutable, and never picked. Safe for concurrent use.
type Endpoints struct {
	log      *slog.Logger
	resolver *net.Resolver
	every    time.Duration
	wake     chan struct{} // a name to resolve

	mu      sync.Mutex // guards engines
	engines map[uint64]*engineAddr
}

// NewEndpoints returns an empty table whose names are resolved again
// every interval (0: 30 s).
func NewEndpoints(log *slog.Logger, every time.Duration) *Endpoints {
	if log == nil {
		log = slog.Default()
	}
	if every <= 0 {
		every = 30 * time.Second
	}
	return &Endpoints{log: log, resolver: net.DefaultResolver, every: every, wake: make(chan struct{}, 1), engines: map[uint64]*engineAddr{}}
}

// Set records w's address. It does no I/O: a name waits for Run.
func (t *Endpoints) Set(w catalog.Worker) {
	e := &engineAddr{model: w.ModelName, group: w.RoutingGroup, base: w.Endpoint}
	u, err := url.Parse(w.Endpoint)
	switch {
	case w.Endpoint == "":
		e.bad = "no endpoint"
	case err != nil || u.Hostname() == "":
		e.bad = "endpoint is not a URL with a host"
	default:
		e.host, e.port = u.Hostname(), u.Port()
		if e.port == "" {
			e.port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if e.port == "" {
			e.bad = "endpoint has no port"
		} else if ip, err := netip.ParseAddr(e.host); err == nil {
			e.addr = net.JoinHostPort(ip.Unmap().String(), e.port)
		}
	}
	t.mu.Lock()
	old := t.engines[w.WorkerID]
	t.engines[w.WorkerID] = e
	if old != nil && old.host == e.host && old.port == e.port && e.addr == "" && e.bad == "" {
		e.addr, e.bad = old.addr, old.bad // keep the name's last answer
	}
	name := e.addr == "" && e.bad == ""
	t.mu.Unlock()
	if e.bad != "" && (old == nil || old.bad != e.bad) {
		t.log.Warn("epp: engine not routable: its endpoint cannot be given as ip:port", "worker", w.WorkerID, "model", w.ModelName,
			"endpoint", clip.String(w.Endpoint), "reason", e.bad)
	}
	if name {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Remove forgets worker id.
func (t *Endpoints) Remove(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.engines, id)
}

// Run resolves the names of the records until ctx ends: at once when a
// record names one, and every interval again. It returns nil.
func (t *Endpoints) Run(ctx context.Context) error {
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		t.resolve(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-t.wake:
		}
	}
}

func (t *Endpoints) resolve(ctx context.Context) {
	type job struct {
		id         uint64
		host, port string
	}
	var jobs []job
	t.mu.Lock()
	for id, e := range t.engines {
		if e.host != "" && e.port != "" {
			if _, err := netip.ParseAddr(e.host); err != nil {
				jobs = append(jobs, job{id, e.host, e.port})
			}
		}
	}
	t.mu.Unlock()
	for _, j := range jobs {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ips, err := t.resolver.LookupNetIP(rctx, "ip", j.host)
		cancel()
		if ctx.Err() != nil {
			return
		}
		addr, bad := "", ""
		if err != nil || len(ips) == 0 {
			bad = "its name does not resolve"
		} else {
			slices.SortStableFunc(ips, func(a, b netip.Addr) int { // IPv4 first
				return btoi(!a.Unmap().Is4()) - btoi(!b.Unmap().Is4())
			})
			addr = net.JoinHostPort(ips[0].Unmap().String(), j.port)
		}
		t.mu.Lock()
		e, ok := t.engines[j.id]
		changed := ok && e.host == j.host && e.port == j.port && (e.bad != bad || e.addr != addr)
		wasBad := ok && e.bad != ""
		if changed {
			e.addr, e.bad = addr, bad
		}
		t.mu.Unlock()
		switch {
		case changed && bad != "":
			t.log.Warn("epp: engine not routable: its endpoint cannot be given as ip:port", "worker", j.id, "host", j.host, "reason", bad, "err", err)
		case changed && wasBad:
			t.log.Info("epp: engine routable again", "worker", j.id, "host", j.host, "addr", addr)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Unroutable counts the records that cannot be given as ip:port.
func (t *Endpoints) Unroutable() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.engines {
		if e.bad != "" {
			n++
		}
	}
	return n
}

// Addr returns worker id's ip:port, if known.
func (t *Endpoints) Addr(id uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.engines[id]
	if !ok || e.addr == "" {
		return "", false
	}
	return e.addr, true
}

// candidates returns the routable engines of (model, group) whose
// address is in subset (every one when !hasSubset), with their base
// URLs in the same order, and whether the model has any engine in the
// group at all.
func (t *Endpoints) candidates(model, group string, subset []string, hasSubset bool) (ids []uint64, bases []string, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.engines {
		if e.model != model || e.group != group {
			continue
		}
		known = true
		if e.addr == "" || (hasSubset && !slices.Contains(subset, e.addr)) {
			continue
		}
		ids = append(ids, id)
		bases = append(bases, e.base)
	}
	return ids, bases, known
}

// workerAt returns an engine of (model, group) at addr.
func (t *Endpoints) workerAt(model, group, addr string) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.engines {
		if e.addr == addr && e.model == model && e.group == group {
			return id, true
		}
	}
	return 0, false
}
