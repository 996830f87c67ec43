package routing

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// slice is the CI slice: the trace's first requests, shared by the tests.
var slice = sync.OnceValues(func() ([]trace.Request, error) {
	reqs, err := trace.Mooncake()
	if err != nil {
		return nil, err
	}
	return reqs[:300], nil
})

func sliceOf(t *testing.T) ([]trace.Request, [][]uint32) {
	t.Helper()
	reqs, err := slice()
	if err != nil {
		t.Fatal(err)
	}
	return reqs, Prompts(reqs, DefaultVocab)
}

// TestCISlice runs every policy on the slice at the trace's load and at
// four times it, and checks the relations that must hold: every request
// completes, the oracle's hit rate is at least that of every policy that
// credits no more than the engines' truth, prefixd's beats random's and
// least-loaded's, its bookings all return, and the index applied every
// batch. The router queue's policies have their own tests
// (TestQueuedPastSaturation, TestSessionSlice): below saturation they
// route as prefixd.
func TestCISlice(t *testing.T) {
	reqs, prompts := sliceOf(t)
	policies := slices.DeleteFunc(slices.Clone(Policies), func(p Policy) bool { return p == PrefixdQueued || p == PrefixdSession })
	results, err := Sweep(context.Background(), DefaultConfig(), reqs, prompts, policies, []float64{1, 4}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2*len(policies) {
		t.Fatalf("%d results, want %d", len(results), 2*len(policies))
	}
	for _, sp := range []float64{1, 4} {
		by := map[Policy]Result{}
		for _, r := range results {
			if r.Speedup == sp {
				by[r.Policy] = r
			}
		}
		for p, r := range by {
			if r.Completed != len(reqs) || r.Failed != 0 {
				t.Errorf("×%g %s: %d completed, %d failed of %d", sp, p, r.Completed, r.Failed, len(reqs))
			}
			if r.Bookings != 0 {
				t.Errorf("×%g %s: %d bookings left", sp, p, r.Bookings)
			}
			if r.Index != nil && (r.Index.ApplyErrors != 0 || r.Index.Events == 0) {
				t.Errorf("×%g %s: index %+v", sp, p, *r.Index)
			}
			// The oracle is the cost function over the engines' true
			// caches: no policy that knows less, or routes without it,
			// beats its hit rate. Approx and PrefixdPredicted credit
			// blocks beyond the truth (routed, or booked and still
			// pending): they can, and do here at ×4 and on the whole
			// trace at ×16 (docs/benchmarks.md).
			if p != Approx && p != PrefixdPredicted && r.HitRate > by[Oracle].HitRate {
				t.Errorf("×%g: %s's hit rate %.4f beats the oracle's %.4f", sp, p, r.HitRate, by[Oracle].HitRate)
			}
			if r.TTFT.P50 <= 0 || r.TTFT.P99 < r.TTFT.P50 || r.E2E.P50 < r.TTFT.P50 {
				t.Errorf("×%g %s: TTFT %+v, E2E %+v", sp, p, r.TTFT, r.E2E)
			}
		}
		px := by[Prefixd]
		for _, p := range []Policy{Random, LeastLoaded} {
			if px.HitRate <= by[p].HitRate {
				t.Errorf("×%g: prefixd's hit rate %.4f, %s's %.4f: want prefixd's higher", sp, px.HitRate, p, by[p].HitRate)
			}
		}
		t.Logf("×%g: hit rate oracle %.1f %%, prefixd %.1f %%, random %.1f %%, least-loaded %.1f %%", sp,
			100*by[Oracle].HitRate, 100*px.HitRate, 100*by[Random].HitRate, 100*by[LeastLoaded].HitRate)
	}
}

// TestQueuedPastSaturation: past saturation (×16 on the slice) the
// router queue holds requests and places every one, nothing is left
// booked, and holding requests in the router instead of engine queues
// lowers TTFT p50 against prefixd without the queue. (The hit rate gain
// needs the whole trace's warm caches: make bench-routing.) Below
// saturation (×1) nothing waits, and prefixd-queued routes as prefixd.
func TestQueuedPastSaturation(t *testing.T) {
	t.Parallel()
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:200], prompts[:200] // saturated at ×16 from the start
	run := func(p Policy, speedup float64) Result {
		cfg := DefaultConfig()
		cfg.Speedup = speedup
		r, err := Run(cfg, reqs, prompts, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	q, px := run(PrefixdQueued, 16), run(Prefixd, 16)
	if q.Queued == 0 || q.Completed != len(reqs) || q.Failed != 0 || q.Bookings != 0 {
		t.Fatalf("×16: %d queued, %d completed, %d failed of %d, %d bookings left", q.Queued, q.Completed, q.Failed, len(reqs), q.Bookings)
	}
	if q.TTFT.P50 >= px.TTFT.P50 {
		t.Errorf("×16: queued TTFT p50 %.0f ms, prefixd %.0f ms: want it lower", q.TTFT.P50, px.TTFT.P50)
	}
	t.Logf("×16: %d of %d waited; hit %.1f %% against %.1f %%, TTFT p50 %.0f against %.0f ms", q.Queued, len(reqs), 100*q.HitRate, 100*px.HitRate, q.TTFT.P50, px.TTFT.P50)
	q1, px1 := run(PrefixdQueued, 1), run(Prefixd, 1)
	q1.Policy, q1.TTFTs, px1.TTFTs, q1.Wall, px1.Wall = Prefixd, nil, nil, 0, 0
	if q1.Queued != 0 || !reflect.DeepEqual(q1, px1) {
		t.Errorf("×1: queued %+v\nwant prefixd's %+v", q1, px1)
	}
}

// TestRunDeterministic: the same trace, configuration and seed give the
// same result; another seed changes random's choices.
func TestRunDeterministic(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:100], prompts[:100]
	run := func(p Policy, seed uint64) Result {
		cfg := DefaultConfig()
		cfg.Seed = seed
		r, err := Run(cfg, reqs, prompts, p)
		if err != nil {
			t.Fatal(err)
		}
		r.Wall, r.TTFTs = 0, nil
		return r
	}
	first := map[Policy]Result{}
	for _, p := range []Policy{Random, Prefixd} {
		a, b := run(p, 1), run(p, 1)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs differ:\n%+v\n%+v", p, a, b)
		}
		first[p] = a
	}
	if a, b := first[Random], run(Random, 2); a.TTFT == b.TTFT {
		t.Errorf("random: seeds 1 and 2 gave the same TTFTs %+v", a.TTFT)
	}
}

// TestIndexMatchesEngines: after a replay, with every event delivered,
// the index holds exactly what the engines cache, rank by rank.
func TestIndexMatchesEngines(t *testing.T) {
	reqs, prompts := sliceOf(t)
	cfg := DefaultConfig()
	cfg.TotalBlocks = 4096 // evictions in the slice
	for _, p := range []Policy{Prefixd, Disagg} {
		s, err := newSim(cfg, reqs[:150], prompts[:150], p)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.run(); err != nil {
			t.Fatal(err)
		}
		k := indexer.PartitionKey{Model: model, Group: group}
		for _, e := range s.engines {
			want := e.pool.Holds()
			st, err := s.replicas[0].ix.Rank(k, e.rank)
			if err != nil {
				t.Fatal(err)
			}
			if st.Degraded || st.Truncated || st.Blocks != len(want) {
				t.Errorf("%s engine %d: index %+v, engine holds %d blocks", p, e.idx, st, len(want))
			}
			err = s.replicas[0].ix.ReadRank(k, e.rank, func(tr *indexer.Tree) {
				for h, n := range want {
					if c, ok := tr.Holds(e.rank, h); !ok || int(c[indexer.TierDevice]) != n {
						t.Errorf("%s engine %d block %x: index %v %v, engine %d copies", p, e.idx, h, c, ok, n)
						return
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if s.work.Removed == 0 {
			t.Errorf("%s: no block was evicted: the test does not cover removals", p)
		}
		if s.work.ApplyErrors != 0 {
			t.Errorf("%s: %d apply errors", p, s.work.ApplyErrors)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Engines = 1 }, "engines"},
		{func(c *Config) { c.PrefillEngines = c.Engines }, "prefill engines"},
		{func(c *Config) { c.TotalBlocks = 0 }, "total blocks"},
		{func(c *Config) { c.BlockSize = 0 }, "block size"},
		{func(c *Config) { c.EventDelay = -time.Second }, "event delay"},
		{func(c *Config) { c.Speedup = 0 }, "speedup"},
		{func(c *Config) { c.ApproxTTL = 0 }, "approx TTL"},
		{func(c *Config) { c.PredictedTTL = 0 }, "predicted TTL"},
		{func(c *Config) { c.Timing.MaxNumSeqs = -1 }, "max num seqs"},
		{func(c *Config) { c.Replicas = -1 }, "replicas"},
		{func(c *Config) { c.Replicas = MaxReplicas + 1 }, "replicas"},
		{func(c *Config) { c.ReplicaSpread = -time.Millisecond }, "replica spread"},
		{func(c *Config) { c.ScrapeInterval = -time.Second }, "scrape interval"},
		{func(c *Config) { c.ScrapeInterval = time.Microsecond }, "scrape interval"},
		{func(c *Config) { c.ScrapeInterval = 2 * time.Hour }, "scrape interval"},
		{func(c *Config) { c.SyncDelay = -time.Millisecond }, "sync delay"},
		{func(c *Config) { c.ArrivalJitter = -time.Millisecond }, "arrival jitter"},
		{func(c *Config) { c.SyncDelay = 2 * time.Minute }, "sync delay"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error naming %q", err, tc.want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePolicy("fastest"); err == nil {
		t.Error("ParsePolicy accepted an unknown policy")
	}
}

// TestBenchWritesReport: Bench prints the tables and writes the JSON
// report, the Markdown tables and the four charts.
func TestBenchWritesReport(t *testing.T) {
	dir := t.TempDir()
	o := NewBenchOptions()
	o.Requests, o.Policies, o.Speedups, o.Out = 60, []Policy{Random, Prefixd, Oracle}, []float64{1, 2}, dir
	var out strings.Builder
	if err := Bench(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| prefixd |", "×2 (offered", "prefixd against random", "Saturation", "wrote " + filepath.Join(dir, ChartTTFT)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var rep Report
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 60 || len(rep.Results) != 6 || len(rep.Knees) != 3 || rep.Fleet.Engines != DefaultEngines {
		t.Errorf("report %+v", rep)
	}
	for _, f := range []string{"report.md", ChartTTFT, ChartHitRate, ChartP50, ChartP99, ChartThrough} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(b) < 100 {
			t.Errorf("%s: %d bytes, %v", f, len(b), err)
		}
		if strings.HasSuffix(f, ".svg") && !strings.Contains(string(b), "<svg") {
			t.Errorf("%s is not SVG", f)
		}
	}
	// A trace file of the same format, with an error naming its line.
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n"+`{"timestamp": 1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o.Trace, o.Out = bad, ""
	if err := Bench(context.Background(), o, &out); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("Bench of a bad trace: %v, want an error naming line 2", err)
	}
}

// TestSessions: a request's session is its first hash id past the prefix
// every request shares; none without one.
func TestSessions(t *testing.T) {
	reqs := []trace.Request{{HashIDs: []uint64{0, 1, 5}}, {HashIDs: []uint64{0, 1, 6, 7}}, {HashIDs: []uint64{0, 1}}, {HashIDs: []uint64{0, 1, 5, 9}}}
	if got, want := Sessions(reqs), []string{"5", "6", "", "5"}; !slices.Equal(got, want) {
		t.Errorf("sessions %q, want %q", got, want)
	}
	if got := Sessions(reqs[:1]); !slices.Equal(got, []string{""}) {
		t.Errorf("one request: sessions %q, want none past its own prompt", got)
	}
	all, _ := sliceOf(t)
	sessions := Sessions(all)
	distinct := map[string]bool{}
	for _, s := range sessions {
		if s == "" {
			t.Fatal("a request of the slice without a session")
		}
		distinct[s] = true
	}
	if len(distinct) == len(all) || len(distinct) < 2 {
		t.Errorf("%d sessions for %d requests: want conversations of several turns", len(distinct), len(all))
	}
}

// TestSessionSlice: prefixd-session completes the slice with nothing
// left booked, and its sessions go back to their engine.
func TestSessionSlice(t *testing.T) {
	reqs, prompts := sliceOf(t)
	cfg := DefaultConfig()
	cfg.Speedup = 4
	r, err := Run(cfg, reqs, prompts, PrefixdSession)
	if err != nil {
		t.Fatal(err)
	}
	if r.Completed != len(reqs) || r.Failed != 0 || r.Bookings != 0 {
		t.Fatalf("%d completed, %d failed of %d, %d bookings left", r.Completed, r.Failed, len(reqs), r.Bookings)
	}
	if r.SessionHits == 0 {
		t.Errorf("no session went back to its engine (%d moved)", r.SessionMoves)
	}
	t.Logf("×4: %d sticky, %d moved; hit %.1f %%, TTFT p50 %.0f ms", r.SessionHits, r.SessionMoves, 100*r.HitRate, r.TTFT.P50)
}
