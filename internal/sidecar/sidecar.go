// Package sidecar registers one engine in the worker catalog and keeps it
// there while the engine is healthy: `prefixd sidecar` runs next to each
// vLLM or SGLang engine. It asks the engine what it is (Describe: model,
// block size, capacity, event endpoints, dp ranks, from the routes vLLM
// and SGLang serve) and completes the operator's flags with it, refusing
// flags that contradict the engine (Resolve). The record is held by a
// lease (a crashed sidecar's worker disappears when the lease expires); it
// advertises routable addresses for endpoints the engine binds on a
// wildcard host.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// Options configure a sidecar. Worker is the record to register; its
// endpoints may use a wildcard host (tcp://*:5557, as vLLM binds), which
// Run replaces with AdvertiseHost.
type Options struct {
	Etcd          etcdstore.Config
	Worker        catalog.Worker
	AdvertiseHost string        // default: the first non-loopback IPv4 address of this host
	TTL           time.Duration // lease TTL (default 10 s)
	// HealthURL, when set, is polled every HealthInterval (default 5 s):
	// the worker is registered only while it answers 2xx, and
	// deregistered after HealthFailures (default 3) failures in a row.
	HealthURL      string
	HealthInterval time.Duration
	HealthFailures int
	// AskEngine makes Run ask the engine at Worker.Endpoint to describe
	// itself (Describe) before it registers, retrying with backoff while
	// the engine does not answer, and register Resolve's record: the
	// fields named in Given (JSON field name → the flag that set it) as
	// given, the others from the engine. A given value that contradicts
	// the engine, or an engine with prefix caching off, ends Run with an
	// error naming both values.
	AskEngine bool
	Given     map[string]string
	// DescribeRetryMax caps the delay between attempts (default 30 s).
	DescribeRetryMax time.Duration
	Client           *http.Client
	Logger           *slog.Logger
}

// Advertise replaces a wildcard host (*, 0.0.0.0, [::], ::) in a ZMQ
// endpoint with host; other endpoints are returned unchanged.
func Advertise(endpoint, host string) string {
	for _, wild := range []string{"tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:", "tcp://:::"} {
		if strings.HasPrefix(endpoint, wild) {
			if strings.Contains(host, ":") {
				host = "[" + host + "]"
			}
			return "tcp://" + host + ":" + strings.TrimPrefix(endpoint, wild)
		}
	}
	return endpoint
}

// DefaultHost returns the first non-loopback IPv4 address of this host.
func DefaultHost() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("no non-loopback IPv4 address; set --advertise-host")
}

// Record returns the worker record Run registers: defaults applied and
// wildcard endpoints advertised. It is validated.
func (o Options) Record() (catalog.Worker, error) {
	w := o.Worker
	for _, ep := range append([]string{w.EventsEndpoint, w.ReplayEndpoint}, mapValues(w.EventsEndpoints, w.ReplayEndpoints)...) {
		if err := notPortZero(ep); err != nil {
			return w, err
		}
	}
	host := o.AdvertiseHost
	wild := false
	for _, ep := range append([]string{w.EventsEndpoint, w.ReplayEndpoint}, mapValues(w.EventsEndpoints, w.ReplayEndpoints)...) {
		wild = wild || Advertise(ep, "h") != ep
	}
	if wild && host == "" {
		var err error
		if host, err = DefaultHost(); err != nil {
			return w, err
		}
	}
	w.EventsEndpoint, w.ReplayEndpoint = Advertise(w.EventsEndpoint, host), Advertise(w.ReplayEndpoint, host)
	for _, m := range []map[uint32]string{w.EventsEndpoints, w.ReplayEndpoints} {
		for r, ep := range m {
			m[r] = Advertise(ep, host)
		}
	}
	w = w.WithDefaults()
	return w, w.Validate()
}

// notPortZero refuses an endpoint on port 0. vLLM binds each rank's
// publisher to a port it picks at start when given tcp://*:0 (vLLM PR
// #55844), and none of the engine interfaces the sidecar reads say which:
// vLLM's HTTP server does not (only its Rust gRPC frontend reports the
// bound sources, Control.GetKvEventSources from vLLM PR #50033, which the
// sidecar does not speak). Registering the configured :0 would point
// every replica at a port nothing listens on.
func notPortZero(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return nil
	}
	if _, port, err := net.SplitHostPort(rest); err == nil && port == "0" {
		return fmt.Errorf("%s: port 0 makes the engine pick its port at start, and no engine interface the sidecar reads reports the port it picked; give the engine fixed ports (e.g. tcp://*:5557 and tcp://*:5600)", ep)
	}
	return nil
}

func mapValues(ms ...map[uint32]string) []string {
	var out []string
	for _, m := range ms {
		for _, v := range m {
			out = append(out, v)
		}
	}
	return out
}

// Run registers the worker (while the engine is healthy, if HealthURL is
// set) until ctx ends, then revokes the lease so the worker leaves at
// once. It re-registers after etcd outages and engine recoveries.
func Run(ctx context.Context, o Options) error {
	if o.TTL <= 0 {
		o.TTL = catalog.DefaultSessionTTL
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 5 * time.Second
	}
	if o.HealthFailures <= 0 {
		o.HealthFailures = 3
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 2 * time.Second}
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.AskEngine {
		d, err := o.describe(ctx, log)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting for the engine
			}
			return err
		}
		if o.Worker, err = Resolve(o.Worker, o.Given, d); err != nil {
			return fmt.Errorf("the engine at %s: %w", o.Worker.Endpoint, err)
		}
	}
	w, err := o.Record()
	if err != nil {
		return fmt.Errorf("worker record: %w", err)
	}
	store, err := etcdstore.New(ctx, o.Etcd)
	if err != nil {
		return err
	}
	defer store.Close()
	tick := time.NewTicker(o.HealthInterval)
	defer tick.Stop()
	var sess *catalog.Session
	var sessDone chan error
	stopSession := func(reason string) {
		if sess == nil {
			return
		}
		if err := sess.Close(); err != nil {
			log.Warn("revoke lease", "err", err)
		}
		<-sessDone
		sess = nil
		log.Info("worker deregistered", "worker", w.WorkerID, "reason", reason)
	}
	defer stopSession("sidecar stopping")
	failures := 0
	var waitLogged time.Time
	for {
		healthy, why := true, ""
		if o.HealthURL != "" {
			healthy, why = o.probe(ctx)
		}
		if healthy {
			failures = 0
		} else {
			failures++
		}
		switch {
		case healthy && sess == nil:
			s, err := catalog.Register(ctx, store, w, o.TTL, catalog.WithLogger(log))
			if err != nil {
				log.Warn("register worker", "worker", w.WorkerID, "err", err)
				break
			}
			sess, sessDone = s, make(chan error, 1)
			go func(s *catalog.Session, done chan error) { done <- s.Run(ctx) }(sess, sessDone)
			waitLogged = time.Time{}
			log.Info("worker registered", "worker", w.WorkerID, "model", w.ModelName, "group", w.RoutingGroup, "role", w.Role,
				"ranks", w.Ranks(), "events", streamEndpoints(w, false), "replay", streamEndpoints(w, true), "block_size", w.BlockSize,
				"total_kv_blocks", w.TotalKVBlocks, "lease", fmt.Sprintf("%x", s.Lease()), "ttl", o.TTL, "sources", sourceList(w.Sources))
		case !healthy && sess == nil && (waitLogged.IsZero() || time.Since(waitLogged) >= 30*time.Second):
			// Say what registration waits for, at once and then every 30 s.
			log.Info("waiting for the engine to be healthy before registering", "worker", w.WorkerID, "health_url", o.HealthURL, "probe", why)
			waitLogged = time.Now()
		case failures >= o.HealthFailures && sess != nil:
			log.Warn("engine health check failing; deregistering", "worker", w.WorkerID, "health_url", o.HealthURL, "probe", why, "failures", failures)
			stopSession("engine unhealthy")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// describe asks the engine to describe itself until it answers (or ctx
// ends), with backoff; it logs when it starts waiting, when what it sees
// changes, and every 30 s while nothing changes. A *PermanentError ends
// it at once.
func (o Options) describe(ctx context.Context, log *slog.Logger) (Description, error) {
	maxDelay := o.DescribeRetryMax
	if maxDelay <= 0 {
		maxDelay = 30 * time.Second
	}
	client := &http.Client{Transport: o.Client.Transport} // Describe bounds each request itself
	b := retry.Backoff(min(250*time.Millisecond, maxDelay), maxDelay)
	var last string
	var logged time.Time
	for attempt := 1; ; attempt++ {
		d, err := Describe(ctx, client, o.Worker.Endpoint)
		if err == nil {
			if attempt > 1 {
				log.Info("the engine answers: it described itself", "worker", o.Worker.WorkerID, "engine_url", o.Worker.Endpoint, "attempts", attempt)
			}
			log.Info("engine described itself", "worker", o.Worker.WorkerID, "engine_url", o.Worker.Endpoint, "flavor", d.Flavor,
				"model", d.Model.V, "models", d.Models, "block_size", d.BlockSize.V, "total_kv_blocks", d.TotalKVBlocks.V,
				"prefix_caching", d.PrefixCaching.V, "kv_events", d.KVEvents.V, "events", d.EventsEndpoint.V, "replay", d.ReplayEndpoint.V,
				"dp_start", d.DPStart.V, "dp_size", d.DPSize.V, "max_model_len", d.MaxModelLen.V, "max_num_batched_tokens", d.MaxNumBatchedTokens.V)
			return d, nil
		}
		var perm *PermanentError
		if errors.As(err, &perm) {
			return d, fmt.Errorf("the engine at %s: %w", o.Worker.Endpoint, err)
		}
		if ctx.Err() != nil {
			return d, ctx.Err()
		}
		delay := b.NextBackOff()
		if msg := err.Error(); msg != last || time.Since(logged) >= 30*time.Second {
			log.Info("waiting for the engine to describe itself", "worker", o.Worker.WorkerID, "engine_url", o.Worker.Endpoint,
				"err", msg, "attempts", attempt, "retry_in", delay.Round(time.Millisecond))
			last, logged = msg, time.Now()
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return d, ctx.Err()
		case <-t.C:
		}
	}
}

// sourceList lists a record's sources, "field=source" in field order,
// for the log.
func sourceList(src map[string]string) []string {
	out := make([]string, 0, len(src))
	for _, k := range slices.Sorted(maps.Keys(src)) {
		out = append(out, k+"="+src[k])
	}
	return out
}

// probe checks the engine's health URL; when it is not healthy, why says
// what the probe saw.
func (o Options) probe(ctx context.Context) (healthy bool, why string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.HealthURL, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return false, "HTTP " + resp.Status
	}
	return true, ""
}

// streamEndpoints lists the worker's live (or replay) endpoint per rank,
// "rank=endpoint" in rank order, for the log.
func streamEndpoints(w catalog.Worker, replay bool) []string {
	ss, _ := w.Streams() // the record is validated
	var out []string
	for _, st := range ss {
		ep := st.Endpoint
		if replay {
			ep = st.ReplayEndpoint
		}
		if ep != "" {
			out = append(out, fmt.Sprintf("%d=%s", st.Rank, ep))
		}
	}
	return out
}
