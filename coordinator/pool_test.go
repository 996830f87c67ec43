package coordinator

import (
	"errors"
	"math"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

func TestDefaultSelectorRandomizesZeroTemperatureTies(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 7, worker(aggKey, 1), worker(aggKey, 2), worker(aggKey, 3))
	seen := map[indexer.Rank]int{}
	for range 300 {
		s, err := p.Select(Query{Prompt: promptOf(hashes(0, 4))})
		if err != nil {
			t.Fatal(err)
		}
		seen[s.Rank]++
	}
	if len(seen) != 3 {
		t.Fatalf("ties not randomised: %v", seen)
	}
}

func TestSeededSelectorIsStableForTiesAndTemperatureSampling(t *testing.T) {
	for _, temp := range []float64{0, 0.5, 2} {
		run := func() []indexer.Rank {
			p := newPool(t, DefaultPoolConfig(), 42, worker(aggKey, 1), worker(aggKey, 2), worker(aggKey, 3))
			o := DefaultOptions()
			o.Temperature = temp
			var out []indexer.Rank
			for i := range 50 {
				s, err := p.Select(Query{Prompt: promptOf(hashes(0, 4), indexer.Overlap{Rank: rk(uint64(1 + i%3)), Device: 2, Host: 2, Disk: 2}), Options: &o})
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, s.Rank)
			}
			return out
		}
		a, b := run(), run()
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("T=%v: draw %d differs: %v vs %v", temp, i, a[i], b[i])
			}
		}
	}
}

func TestSoftmaxSampleOrdersExtremeFiniteCosts(t *testing.T) {
	sc := []scored{{cost: math.MaxFloat64}, {cost: 0}, {cost: math.MaxFloat64 / 2}}
	rng := seeded(3)
	counts := make([]int, 3)
	for range 3000 {
		counts[sample(sc, 1, rng)]++
	}
	if !(counts[1] > counts[2] && counts[2] > counts[0]) {
		t.Fatalf("softmax does not order costs: %v", counts)
	}
	// Equal costs sample uniformly (every index drawn).
	eq := []scored{{cost: 5}, {cost: 5}, {cost: 5}}
	seen := map[int]bool{}
	for range 200 {
		seen[sample(eq, 1, rng)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("equal costs not uniform: %v", seen)
	}
}

func TestPerRequestOverridesChangeSelection(t *testing.T) {
	// Worker 1 caches the whole prompt but carries load; worker 2 is cold and idle.
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1), worker(aggKey, 2))
	mustReserve(t, p, "load", Query{Prompt: promptOf(hashes(100, 3)), Pin: pin(1)})
	q := Query{Prompt: promptOf(hashes(0, 8), indexer.Overlap{Rank: rk(1), Device: 8, Host: 8, Disk: 8})}
	if s, _ := p.Select(q); s.Rank != rk(1) {
		t.Fatalf("default: chose %v, want the cached worker 1", s.Rank)
	}
	o := DefaultOptions()
	o.OverlapCredit = 0
	q.Options = &o
	if s, _ := p.Select(q); s.Rank != rk(2) {
		t.Fatalf("credit 0: chose %v, want the idle worker 2", s.Rank)
	}
}

func TestCostFunctionTerms(t *testing.T) {
	tests := []struct {
		name string
		ov   indexer.Overlap
		opt  func(*Options)
		pre  int // prefill tokens already active (booked on a prior reservation of 2 blocks)
		want float64
	}{
		// 8 blocks, no load: raw prefill 8, decode 8.
		{name: "cold", want: 8 + 8},
		// tier credit: device 2, host extends by 2, disk by 4 → 2 + 1.5 + 1 = 4.5.
		{name: "tier_weights", ov: indexer.Overlap{Device: 2, Host: 4, Disk: 8}, want: (8 - 4.5) + 8},
		// test_prefill_load_scale_applies_after_overlap_credits: 2·(8 − 6) + 8.
		{name: "prefill_load_scale_applies_after_overlap_credits", ov: indexer.Overlap{Device: 6, Host: 6, Disk: 6},
			opt: func(o *Options) { o.PrefillLoadScale = 2 }, want: 2*(8-6) + 8},
		{name: "credit_never_negative", ov: indexer.Overlap{Device: 8, Host: 8, Disk: 8},
			opt: func(o *Options) { o.OverlapCredit = 3 }, want: 0 + 8},
		{name: "active_request_weight", opt: func(o *Options) { o.DecodeActiveRequestWeight = 10 }, pre: 32,
			// prior booking: 2 blocks, 32 prefill tokens, 1 request.
			want: (32+128)/16.0 + (2 + 8) + 10},
		{name: "decode_cost_rule", ov: indexer.Overlap{Device: 3, Host: 3, Disk: 3},
			opt:  func(o *Options) { o.TrackPrefillTokens, o.DecodeCostRule = false, true },
			want: 8 - 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
			if tc.pre > 0 {
				mustReserve(t, p, "prior", Query{Prompt: promptOf(hashes(500, 2))})
			}
			o := DefaultOptions()
			if tc.opt != nil {
				tc.opt(&o)
			}
			tc.ov.Rank = rk(1)
			s, err := p.Select(Query{Prompt: promptOf(hashes(0, 8), tc.ov), Options: &o})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(s.Cost-tc.want) > 1e-9 {
				t.Fatalf("cost %v, want %v", s.Cost, tc.want)
			}
		})
	}
}

func TestOverlapCreditAboveOneCanPreferColocatedWorker(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1), worker(aggKey, 2))
	mustReserve(t, p, "load", Query{Prompt: promptOf(hashes(100, 4)), Pin: pin(1)})
	q := Query{Prompt: promptOf(hashes(0, 8), indexer.Overlap{Rank: rk(1), Device: 2, Host: 2, Disk: 2})}
	if s, _ := p.Select(q); s.Rank != rk(2) {
		t.Fatalf("credit 1: chose %v, want 2", s.Rank)
	}
	o := DefaultOptions()
	o.OverlapCredit = 4
	q.Options = &o
	if s, _ := p.Select(q); s.Rank != rk(1) {
		t.Fatalf("credit 4: chose %v, want colocated 1", s.Rank)
	}
}

func TestOverlapCreditDecayCanPreferLessLoadedColdWorker(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1), worker(aggKey, 2))
	// Worker 1: cached but 4 blocks of prefill pending (and 4 blocks booked).
	mustReserve(t, p, "load", Query{Prompt: promptOf(hashes(100, 4)), Pin: pin(1)})
	q := Query{Prompt: promptOf(hashes(0, 8), indexer.Overlap{Rank: rk(1), Device: 8, Host: 8, Disk: 8})}
	if s, _ := p.Select(q); s.Rank != rk(1) {
		t.Fatalf("no decay: chose %v, want cached 1", s.Rank)
	}
	o := DefaultOptions()
	o.OverlapCreditDecay = 100
	q.Options = &o
	if s, _ := p.Select(q); s.Rank != rk(2) {
		t.Fatalf("decay: chose %v, want the less loaded cold 2", s.Rank)
	}
}

func TestSelectionFiltersAndErrors(t *testing.T) {
	tainted := worker(aggKey, 2)
	tainted.Taints = []string{"gpu=h100"}
	tainted.TopologyDomains = map[string]string{"rack": "r1"}
	busyCfg := DefaultPoolConfig()
	busyCfg.Thresholds.DecodeBlocksFrac = 0.05 // 5 of 100 blocks
	tests := []struct {
		name    string
		cfg     PoolConfig
		workers []Worker
		load    map[uint64]int // blocks booked per worker before the query
		q       Query
		want    uint64
		err     error
	}{
		{name: "no_workers", err: ErrNoWorkers},
		{name: "required_taints_filter", workers: []Worker{worker(aggKey, 1), tainted},
			q: Query{Constraints: Constraints{Required: []string{"gpu=h100"}}}, want: 2},
		{name: "required_topology_taint", workers: []Worker{worker(aggKey, 1), tainted},
			q: Query{Constraints: Constraints{Required: []string{"dynamo.topology/rack=r1"}}}, want: 2},
		{name: "required_taints_none_match", workers: []Worker{worker(aggKey, 1), tainted},
			q: Query{Constraints: Constraints{Required: []string{"gpu=b200"}}}, err: ErrAllFiltered},
		{name: "allowed_ids", workers: []Worker{worker(aggKey, 1), worker(aggKey, 2)}, q: Query{Allowed: []uint64{2}}, want: 2},
		{name: "allowed_ids_none", workers: []Worker{worker(aggKey, 1)}, q: Query{Allowed: []uint64{9}}, err: ErrAllFiltered},
		{name: "pinned", workers: []Worker{worker(aggKey, 1), worker(aggKey, 2)}, q: Query{Pin: pin(2)}, want: 2},
		{name: "pinned_expansion_rejects_bad_rank", workers: []Worker{worker(aggKey, 1)},
			q: Query{Pin: &indexer.Rank{WorkerID: 1, DPRank: 3}}, err: ErrBadPinnedRank},
		{name: "rejects_unknown_pinned_worker", workers: []Worker{worker(aggKey, 1)}, q: Query{Pin: pin(5)}, err: ErrBadPinnedRank},
		{name: "pinned_not_allowed", workers: []Worker{worker(aggKey, 1), tainted},
			q: Query{Pin: pin(1), Constraints: Constraints{Required: []string{"gpu=h100"}}}, err: ErrPinnedNotAllowed},
		{name: "overloaded_high_overlap_worker_is_skipped", cfg: busyCfg, workers: []Worker{worker(aggKey, 1), worker(aggKey, 2)},
			load: map[uint64]int{1: 6},
			q:    Query{Prompt: promptOf(hashes(0, 4), indexer.Overlap{Rank: rk(1), Device: 4, Host: 4, Disk: 4})}, want: 2},
		{name: "all_eligible_workers_overloaded_returns_overload_error", cfg: busyCfg, workers: []Worker{worker(aggKey, 1), worker(aggKey, 2)},
			load: map[uint64]int{1: 6, 2: 6}, err: ErrAllOverloaded},
		{name: "overloaded_pinned_worker_is_not_rerouted", cfg: busyCfg, workers: []Worker{worker(aggKey, 1), worker(aggKey, 2)},
			load: map[uint64]int{1: 6}, q: Query{Pin: pin(1)}, err: ErrPinnedOverloaded},
		{name: "unknown_capacity_is_never_decode_busy", cfg: busyCfg, workers: []Worker{{Rank: rk(1), Model: "m", Group: "g"}},
			load: map[uint64]int{1: 60}, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.ReservationTTL == 0 {
				cfg = DefaultPoolConfig()
			}
			p := newPool(t, cfg, 1, tc.workers...)
			for id, n := range tc.load {
				o := DefaultOptions()
				o.TrackPrefillTokens = false
				mustReserve(t, p, "load"+rk(id).String(), Query{Prompt: promptOf(hashes(1000*id, n)), Pin: pin(id), Options: &o})
			}
			if tc.q.Prompt.BlockSize == 0 {
				tc.q.Prompt = promptOf(hashes(0, 2))
			}
			s, err := p.Select(tc.q)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || s.Rank != rk(tc.want) {
				t.Fatalf("chose %v (%v), want %d", s.Rank, err, tc.want)
			}
		})
	}
}

func TestPrefillTokenThresholds(t *testing.T) {
	for _, tc := range []struct {
		name string
		th   Thresholds
		busy bool
	}{
		{"absolute_over", Thresholds{PrefillTokens: 60}, true},
		{"absolute_at", Thresholds{PrefillTokens: 64}, false},
		{"fraction_over", Thresholds{PrefillTokensFrac: 0.05}, true}, // 64 > 50
		{"fraction_under", Thresholds{PrefillTokensFrac: 0.1}, false},
		{"either_trips", Thresholds{PrefillTokens: 1000, PrefillTokensFrac: 0.05}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultPoolConfig()
			cfg.Thresholds = tc.th
			p := newPool(t, cfg, 1, worker(aggKey, 1))
			mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))}) // 64 prefill tokens
			if got := p.Overloaded(rk(1)); got != tc.busy {
				t.Fatalf("overloaded %v, want %v", got, tc.busy)
			}
			p.PrefillComplete("a")
			if p.Overloaded(rk(1)) {
				t.Fatal("still overloaded after prefill complete")
			}
		})
	}
}

func TestPreferredTaints(t *testing.T) {
	a, b := worker(aggKey, 1), worker(aggKey, 2)
	b.Taints = []string{"zone=x"}
	for _, tc := range []struct {
		name   string
		weight float64
		want   uint64
	}{
		{"preferred_taints_prefer_matching_worker", 0.5, 2},
		{"negative_preferred_taints_avoid_matching_worker", -0.5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t, DefaultPoolConfig(), 1, a, b)
			for range 20 { // ties would otherwise be random
				s, _ := p.Select(Query{Prompt: promptOf(hashes(0, 4)), Constraints: Constraints{Preferred: map[string]float64{"zone=x": tc.weight}}})
				if s.Rank != rk(tc.want) {
					t.Fatalf("chose %v, want %d", s.Rank, tc.want)
				}
			}
			s, _ := p.Select(Query{Prompt: promptOf(hashes(0, 4)), Pin: pin(2), Constraints: Constraints{Preferred: map[string]float64{"zone=x": tc.weight}}})
			if want := 8 * math.Exp(-math.Tanh(tc.weight)); math.Abs(s.Cost-want) > 1e-9 {
				t.Fatalf("cost %v, want %v", s.Cost, want)
			}
		})
	}
}

func TestScheduleBooksRequestIntoActiveSequences(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	q := Query{Prompt: promptOf(hashes(0, 4), indexer.Overlap{Rank: rk(1), Device: 1, Host: 1, Disk: 1})}
	if _, err := p.Select(q); err != nil { // query_only_without_id_never_books_state
		t.Fatal(err)
	}
	if got := p.Total(); got != (Load{}) || p.Reservations() != 0 {
		t.Fatalf("select booked %+v", got)
	}
	s := mustReserve(t, p, "a", q)
	if s.CachedTokens != 16 || s.EffectivePrefillTokens != 48 || s.PotentialDecodeBlocks != 4 || s.PotentialPrefillTokens != 48 {
		t.Fatalf("selection %+v", s)
	}
	if got, want := p.Total(), (Load{Blocks: 4, PrefillTokens: 48, Requests: 1}); got != want {
		t.Fatalf("load %+v, want %+v", got, want)
	}
}

func TestActiveSequencesSharedBlocks(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	// Same first 3 blocks, different 4th: 5 distinct blocks.
	mustReserve(t, p, "b", Query{Prompt: promptOf(append(hashes(0, 3), 99))})
	if l, _ := p.Load(rk(1)); l.Blocks != 5 || l.Requests != 2 {
		t.Fatalf("load %+v, want 5 blocks 2 requests", l)
	}
	p.Free("a")
	if l, _ := p.Load(rk(1)); l.Blocks != 4 {
		t.Fatalf("after free a: %+v, want 4 blocks", l)
	}
	p.Free("b")
	if l, _ := p.Load(rk(1)); l != (Load{}) {
		t.Fatalf("after free b: %+v", l)
	}
}

func TestNoKVReuseBooksEveryBlock(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	o := DefaultOptions()
	o.AssumeKVReuse = false
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4)), Options: &o})
	s := mustReserve(t, p, "b", Query{Prompt: promptOf(hashes(0, 4)), Options: &o})
	if s.PotentialDecodeBlocks != 8 {
		t.Fatalf("potential %d, want 8", s.PotentialDecodeBlocks)
	}
	if l, _ := p.Load(rk(1)); l.Blocks != 8 {
		t.Fatalf("load %+v, want 8 blocks", l)
	}
}

func TestPotentialBlocksUsePrefixMembershipNotSetMembership(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 3))})
	for _, tc := range []struct {
		name string
		h    []uint64
		want int
	}{
		{"same_prefix", hashes(0, 3), 3},
		{"shared_two_then_new", []uint64{0, 1, 77}, 4},
		// Blocks 1 and 2 are active but not as a prefix of this query:
		// their sequence hashes differ, so all three are new.
		{"suffix_only", []uint64{55, 1, 2}, 6},
	} {
		s, _ := p.Select(Query{Prompt: promptOf(tc.h), Pin: pin(1)})
		if s.PotentialDecodeBlocks != tc.want {
			t.Errorf("%s: potential %d, want %d", tc.name, s.PotentialDecodeBlocks, tc.want)
		}
	}
}

func TestMarkPrefillCompleted(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	if !p.PrefillComplete("a") || p.PrefillComplete("a") || p.PrefillComplete("nope") {
		t.Fatal("prefill complete: want true, then false (idempotent), false for unknown")
	}
	if l, _ := p.Load(rk(1)); l != (Load{Blocks: 4, Requests: 1}) {
		t.Fatalf("load %+v", l)
	}
}

func TestSameIDConflictsAcrossWorkers(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1), worker(aggKey, 2))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4)), Pin: pin(1)})
	if _, err := p.SelectAndReserve("a", Query{Prompt: promptOf(hashes(0, 4)), Pin: pin(2)}, t0); !errors.Is(err, ErrDuplicateReservation) {
		t.Fatalf("err %v, want duplicate", err)
	}
	if l, _ := p.Load(rk(2)); l != (Load{}) {
		t.Fatalf("conflict booked %+v", l)
	}
}

func TestFreeIsIdempotentAfterRequestIsRemoved(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	mustReserve(t, p, "b", Query{Prompt: promptOf(hashes(0, 4))})
	if !p.Free("a") || p.Free("a") || p.Free("zzz") {
		t.Fatal("free: want true then false")
	}
	if l, _ := p.Load(rk(1)); l.Blocks != 4 || l.Requests != 1 {
		t.Fatalf("second free disturbed b: %+v", l)
	}
}

func TestForceExpiry(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	if _, err := p.SelectAndReserve("b", Query{Prompt: promptOf(hashes(0, 4))}, t0.Add(100*1e9)); err != nil {
		t.Fatal(err)
	}
	if f := p.Expire(t0.Add(DefaultReservationTTL - 1)); len(f) != 0 {
		t.Fatalf("expired early: %v", f)
	}
	f := p.Expire(t0.Add(DefaultReservationTTL))
	if len(f) != 1 || f[0].ID != "a" || f[0].Rank != rk(1) {
		t.Fatalf("expired %v, want a", f)
	}
	if l, _ := p.Load(rk(1)); l.Requests != 1 || l.Blocks != 4 {
		t.Fatalf("load %+v", l)
	}
	// expiry_then_immediate_readd_preserves_block_membership
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	if l, _ := p.Load(rk(1)); l.Blocks != 4 || l.Requests != 2 {
		t.Fatalf("re-add: %+v", l)
	}
}

func TestWorkerRemovalThenReaddStartsWithEmptyState(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 4))})
	if f := p.RemoveWorker(rk(1)); len(f) != 1 || f[0].ID != "a" {
		t.Fatalf("freed %v", f)
	}
	if p.Reservations() != 0 || p.RemoveWorker(rk(1)) != nil {
		t.Fatal("reservation survived removal, or second removal did something")
	}
	if err := p.SetWorker(worker(aggKey, 1)); err != nil {
		t.Fatal(err)
	}
	if l, _ := p.Load(rk(1)); l != (Load{}) {
		t.Fatalf("re-added worker load %+v", l)
	}
}

func TestReservationCapIsBounded(t *testing.T) {
	cfg := DefaultPoolConfig()
	cfg.MaxReservations = 2
	p := newPool(t, cfg, 1, worker(aggKey, 1))
	mustReserve(t, p, "a", Query{Prompt: promptOf(hashes(0, 1))})
	mustReserve(t, p, "b", Query{Prompt: promptOf(hashes(0, 1))})
	if _, err := p.SelectAndReserve("c", Query{Prompt: promptOf(hashes(0, 1))}, t0); !errors.Is(err, ErrTooManyReservations) {
		t.Fatalf("err %v", err)
	}
	p.Free("a")
	mustReserve(t, p, "c", Query{Prompt: promptOf(hashes(0, 1))})
}

func TestSetWorkerValidation(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1)
	w := worker(PoolKey{Model: "other", Group: "g"}, 1)
	if err := p.SetWorker(w); !errors.Is(err, ErrWrongPool) {
		t.Fatalf("err %v", err)
	}
	w = worker(aggKey, 1)
	w.TotalKVBlocks = -1
	if err := p.SetWorker(w); !errors.Is(err, ErrInvalidWorker) {
		t.Fatalf("err %v", err)
	}
	if _, err := p.Select(Query{Prompt: Prompt{Tokens: 4}}); !errors.Is(err, ErrInvalidPrompt) {
		t.Fatalf("err %v", err)
	}
}
