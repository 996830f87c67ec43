package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// scrapeOnly are metrics the queries may use that the daemon does not
// export: Prometheus makes `up` for every target.
var scrapeOnly = map[string]bool{"up": true}

// targetLabels are attached by Prometheus (or the ServiceMonitor), not by
// the daemon; matchers on them are not checked against a scrape.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true, "service": true, "endpoint": true, "container": true}

// series is one sample's labels in a scrape, __name__ included;
// histograms and summaries are expanded to their _bucket, _sum and
// _count series.
func seriesOf(fams map[string]*dto.MetricFamily) []labels.Labels {
	var out []labels.Labels
	for name, f := range fams {
		for _, m := range f.Metric {
			b := labels.NewBuilder(labels.EmptyLabels())
			for _, lp := range m.Label {
				b.Set(lp.GetName(), lp.GetValue())
			}
			with := func(n string, extra ...string) {
				bb := labels.NewBuilder(b.Labels())
				bb.Set(model.MetricNameLabel, n)
				for i := 0; i+1 < len(extra); i += 2 {
					bb.Set(extra[i], extra[i+1])
				}
				out = append(out, bb.Labels())
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, bk := range m.Histogram.Bucket {
					with(name+"_bucket", "le", fmt.Sprint(bk.GetUpperBound()))
				}
				with(name+"_bucket", "le", "+Inf")
				with(name + "_sum")
				with(name + "_count")
			case dto.MetricType_SUMMARY:
				for _, q := range m.Summary.Quantile {
					with(name, "quantile", fmt.Sprint(q.GetQuantile()))
				}
				with(name + "_sum")
				with(name + "_count")
			default:
				with(name)
			}
		}
	}
	return out
}

var literalAlternation = regexp.MustCompile(`^[A-Za-z0-9_/.:-]+(\|[A-Za-z0-9_/.:-]+)*$`)

// unmatched returns a description of the selectors no scraped series
// satisfies. Matchers on target labels and on Grafana variables are
// ignored; a regexp that is an alternation of literals needs each of them.
func unmatched(sels []selector, ss []labels.Labels) []string {
	var missing []string
	for _, s := range sels {
		if scrapeOnly[s.name()] {
			continue
		}
		var ms []*labels.Matcher
		var alts []*labels.Matcher
		for _, m := range s.matchers {
			switch {
			case targetLabels[m.Name] || strings.Contains(m.Value, "$"):
			case m.Type == labels.MatchRegexp && literalAlternation.MatchString(m.Value):
				for _, v := range strings.Split(m.Value, "|") {
					alts = append(alts, labels.MustNewMatcher(labels.MatchEqual, m.Name, v))
				}
			default:
				ms = append(ms, m)
			}
		}
		sets := [][]*labels.Matcher{ms}
		if len(alts) > 0 {
			sets = nil
			for _, a := range alts {
				sets = append(sets, append(slices.Clone(ms), a))
			}
		}
		for _, set := range sets {
			if !slices.ContainsFunc(ss, func(l labels.Labels) bool {
				for _, m := range set {
					if !m.Matches(l.Get(m.Name)) {
						return false
					}
				}
				return true
			}) {
				missing = append(missing, fmt.Sprintf("%s: %v", s.where, set))
			}
		}
	}
	slices.Sort(missing)
	return slices.Compact(missing)
}

type apiClient struct {
	t    *testing.T
	ctx  context.Context
	base string
}

// call sends body (JSON unless nil) with the test token and returns the
// status and the response body.
func (c apiClient) call(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(c.ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// must calls and fails the test unless the status is want.
func (c apiClient) must(want int, method, path string, body any) []byte {
	c.t.Helper()
	code, out := c.call(method, path, body)
	if code != want {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, code, out, want)
	}
	return out
}

// TestMetricsExported runs the daemon on a real etcd with mock engines
// (aggregated, decode and prefill in one KV-transfer domain, and one that
// publishes an undecodable batch), drives the API the way routers do, and
// requires every selector of the alert rules and the dashboard to match a
// series the daemon exports. It also runs the smoke Job's checks and the
// probes' paths against the daemon.
func TestMetricsExported(t *testing.T) {
	sels := append(ruleSelectors(t), dashboardSelectors(t)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	etcd := storetest.StartEtcd(t)
	store := storetest.NewEtcdStore(t, etcd.Endpoints(), catalog.DefaultPrefix)

	// Engines: 1 aggregated (the smoke Job's engine 1), 2 decode and 3
	// prefill in zone a.
	ectx, stopEngines := context.WithCancel(ctx)
	done := make(chan error, 4)
	started := 0
	t.Cleanup(func() {
		stopEngines()
		for range started {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("engine: %v", err)
			}
		}
	})
	engines := map[uint64]*mocker.Engine{}
	for id, role := range map[uint64]catalog.Role{1: catalog.RoleAggregated, 2: catalog.RoleDecode, 3: catalog.RolePrefill} {
		// max_num_batched_tokens 64: the router queue (threshold 0.5)
		// holds requests that may wait while 32 prefill tokens are booked.
		w := catalog.Worker{WorkerID: id, ModelName: "mock-model", Endpoint: fmt.Sprintf("http://127.0.0.1:%d", 18000+id),
			Attributes: catalog.Attributes{Role: role, MaxNumBatchedTokens: 64}}
		if role != catalog.RoleAggregated {
			w.TopologyDomains = map[string]string{"zone": "a"}
			w.KVTransferDomain, w.KVTransferEnforcement = "zone", catalog.EnforcementRequired
		}
		e, err := mocker.New(mocker.Config{TotalBlocks: 256, BlockSize: 16, Store: store, Worker: w, LeaseTTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		started++
		go func() { done <- e.Run(ectx) }()
		select {
		case <-e.Ready():
		case err := <-done:
			started--
			t.Fatalf("engine %d: %v", id, err)
		}
		engines[id] = e
	}
	// Worker 4 publishes one batch that is not msgpack.
	bad, err := mocker.NewPublisher(mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	started++
	go func() { done <- bad.Run(ectx) }()
	<-bad.Ready()
	if _, err := bad.Publish(ctx, []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	w4 := catalog.Worker{WorkerID: 4, ModelName: "mock-model", EventsEndpoint: bad.Endpoint(), ReplayEndpoint: bad.ReplayEndpoint(), BlockSize: 16}.WithDefaults()
	if _, err := store.Put(ctx, w4, catalog.NoLease); err != nil {
		t.Fatal(err)
	}

	dctx, stopDaemon := context.WithCancel(ctx)
	ready, ddone := make(chan string, 1), make(chan error, 1)
	go func() {
		ddone <- daemon.Run(dctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints()}, Listen: "127.0.0.1:0",
			APIToken: "tok", MaxEntries: 1 << 20, Logger: slog.New(slog.DiscardHandler), OnReady: func(a string) { ready <- a },
			Queue: daemon.QueueConfig{Threshold: 0.5}})
	}()
	t.Cleanup(func() {
		stopDaemon()
		if err := <-ddone; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	var api apiClient
	select {
	case addr := <-ready:
		api = apiClient{t: t, ctx: ctx, base: "http://" + addr}
	case err := <-ddone:
		t.Fatalf("daemon: %v", err)
	}

	// The probes' paths answer.
	for _, path := range probePaths(t) {
		if err := testsupport.Poll(ctx, 20*time.Second, func() error {
			if code, body := api.call(http.MethodGet, path, nil); code != http.StatusOK {
				return fmt.Errorf("probe GET %s: %d %s", path, code, body)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The smoke Job's checks: a request served by engine 1 is indexed, and
	// a KV-aware selection books engine 1.
	smoke := make([]uint32, 32)
	for i := range smoke {
		smoke[i] = uint32(i + 1)
	}
	if _, err := engines[1].Serve(ctx, mocker.Request{TokenIDs: smoke, MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	query := map[string]any{"model_name": "mock-model", "token_ids": smoke}
	if err := testsupport.Poll(ctx, 20*time.Second, func() error {
		if body := api.must(http.StatusOK, http.MethodPost, "/query", query); !bytes.Contains(body, []byte(smokeQueryCheck)) {
			return fmt.Errorf("/query: %s lacks %s", body, smokeQueryCheck)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sel := api.must(http.StatusOK, http.MethodPost, "/select_and_reserve", map[string]any{"selection_id": "smoke", "model_name": "mock-model", "token_ids": smoke})
	if !regexp.MustCompile(smokeSelectCheck).Match(sel) {
		t.Fatalf("/select_and_reserve: %s does not match %s", sel, smokeSelectCheck)
	}
	api.must(http.StatusOK, http.MethodDelete, "/reservations/smoke", nil)
	checkSmokeJob(t)

	// Traffic on every engine, and the API as routers use it.
	for i := range 12 {
		prompt := make([]uint32, 48+16*(i%3))
		for j := range prompt {
			prompt[j] = uint32(1000*(i%4) + j)
		}
		for _, id := range []uint64{1, 2, 3} {
			if _, err := engines[id].Serve(ctx, mocker.Request{TokenIDs: prompt, MaxTokens: 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	api.must(http.StatusOK, http.MethodPost, "/query_by_hash", map[string]any{"model_name": "mock-model",
		"block_hashes": indexer.HashBlocks(nil, smoke, 16, indexer.BaseSeed)})
	api.must(http.StatusOK, http.MethodPost, "/select", query)
	api.must(http.StatusOK, http.MethodGet, "/workers", nil)
	for _, id := range []string{"p1", "p2"} {
		api.must(http.StatusCreated, http.MethodPost, "/disagg/plans", map[string]any{"request_id": id, "model_name": "mock-model", "token_ids": smoke})
	}
	api.must(http.StatusOK, http.MethodDelete, "/disagg/plans/p1", nil)
	// The router queue: with engine 1 busy (64 uncached tokens booked), a
	// request that may wait 50 ms waits, then is answered 429.
	busy := make([]uint32, 64)
	for i := range busy {
		busy[i] = uint32(90_000 + i)
	}
	api.must(http.StatusCreated, http.MethodPost, "/reservations", map[string]any{"selection_id": "busy", "model_name": "mock-model", "worker_id": 1, "token_ids": busy})
	api.must(http.StatusTooManyRequests, http.MethodPost, "/select_and_reserve", map[string]any{"selection_id": "queued", "model_name": "mock-model",
		"token_ids": smoke, "wait": map[string]any{"timeout_ms": 50}})
	api.must(http.StatusOK, http.MethodDelete, "/reservations/busy", nil)
	api.must(http.StatusOK, http.MethodPost, "/disagg/plans/p2/prefill_failed", nil) // compensated

	var missing []string
	if err := testsupport.Poll(ctx, 30*time.Second, func() error {
		body := api.must(http.StatusOK, http.MethodGet, "/metrics", nil)
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		if missing = unmatched(sels, seriesOf(fams)); len(missing) > 0 {
			return errors.New("missing")
		}
		return nil
	}); err != nil {
		t.Errorf("no series of the daemon matches these selectors of the alert rules and the dashboard:\n  %s", strings.Join(missing, "\n  "))
	}
}

// The smoke Job greps for these in /query and /select_and_reserve answers.
const (
	smokeQueryCheck  = `"gpu":32`
	smokeSelectCheck = `"worker_id":1[,}]`
)

// checkSmokeJob: the Job's script uses the checks above and only routes
// the daemon has (the test's requests above went to each).
func checkSmokeJob(t *testing.T) {
	t.Helper()
	r := render(t, "kubernetes/overlays/smoke")
	w, ok := r.workload("Job", "prefixd-smoke")
	if !ok {
		t.Fatal("no Job prefixd-smoke")
	}
	script := strings.Join(w.pod.Containers[0].Command, "\n")
	for _, want := range []string{"grep -q '" + smokeQueryCheck + "'", "grep -q '" + smokeSelectCheck + "'", `"token_ids\":$tokens`} {
		if !strings.Contains(script, want) {
			t.Errorf("smoke Job script lacks %s", want)
		}
	}
	paths := regexp.MustCompile(`\$api(/[a-z_/]+)`).FindAllStringSubmatch(script, -1)
	for _, p := range paths {
		if !slices.Contains([]string{"/ready", "/workers", "/query", "/select_and_reserve", "/reservations/"}, p[1]) {
			t.Errorf("smoke Job calls %s, which this test does not exercise", p[1])
		}
	}
	if len(paths) < 5 {
		t.Errorf("smoke Job calls %d API paths", len(paths))
	}
}

// probePaths are the httpGet paths of every prefixd container's probes.
func probePaths(t *testing.T) []string {
	t.Helper()
	var out []string
	for dir := range kustomizations {
		for _, w := range render(t, dir).workloads {
			for _, c := range w.containers() {
				if !strings.HasPrefix(c.Image, prefixdImage+":") {
					continue
				}
				for _, p := range []*probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
					if p != nil && p.HTTPGet != nil {
						out = append(out, p.HTTPGet.Path)
					}
				}
			}
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) < 2 {
		t.Fatalf("probe paths %v", out)
	}
	return out
}
