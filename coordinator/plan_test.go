package coordinator

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

var (
	decKey = PoolKey{Model: "m", Group: "d", Role: RoleDecode}
	preKey = PoolKey{Model: "m", Group: "p", Role: RolePrefill}
)

// overlapFunc adapts a function to OverlapSource.
type overlapFunc func(model, group string) []indexer.Overlap

func (f overlapFunc) Overlaps(model, group string, _ []uint32, _, _ string) ([]indexer.Overlap, int, error) {
	return f(model, group), bs, nil
}

// decodeW is a decode worker in rack with a required rack KV-transfer domain.
func decodeW(id uint64, rack string) Worker {
	w := worker(decKey, id)
	w.TopologyDomains = map[string]string{"rack": rack}
	w.KVTransferDomain, w.KVTransferEnforcement = "rack", EnforcementRequired
	return w
}

func prefillW(id uint64, rack string) Worker {
	w := worker(preKey, id)
	w.TopologyDomains = map[string]string{"rack": rack}
	w.KVTransferDomain, w.KVTransferEnforcement = "rack", EnforcementRequired
	return w
}

func coord(t *testing.T, cfg CoordinatorConfig, src OverlapSource, ws ...Worker) *Coordinator {
	t.Helper()
	c := NewCoordinator(NewPools(DefaultPoolConfig(), seeded(1)), src, cfg)
	for _, w := range ws {
		if _, err := c.SetWorker(w, t0); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func req(id string, blocks int) Request {
	toks := make([]uint32, blocks*bs)
	for i := range toks {
		toks[i] = uint32(i)
	}
	return Request{ID: id, Model: "m", PrefillGroup: "p", DecodeGroup: "d", Tokens: toks}
}

// active returns the live reservations of the decode and prefill pools.
func active(c *Coordinator) [2]int {
	var n [2]int
	for i, k := range []PoolKey{decKey, preKey} {
		if p := c.Pools().Pool(k); p != nil {
			n[i] = p.Reservations()
			if p.Total().Requests != n[i] {
				panic("requests and reservations disagree")
			}
		}
	}
	return n
}

func wantTrace(t *testing.T, p Plan, want ...State) {
	t.Helper()
	if got := p.Trace(); !slices.Equal(got, want) {
		t.Fatalf("trace %v, want %v (transitions %+v)", got, want, p.Transitions)
	}
}

func wantActive(t *testing.T, c *Coordinator, dec, pre int) {
	t.Helper()
	if got := active(c); got != [2]int{dec, pre} {
		t.Fatalf("active (decode, prefill) = %v, want [%d %d]", got, dec, pre)
	}
}

func TestLinkedPlanBooksBothPoolsAndReleasesInOrder(t *testing.T) {
	c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
	wantActive(t, c, 0, 0)
	p, err := c.Plan(req("a", 4), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked)
	wantActive(t, c, 1, 1)
	if p.Decode.ID != "a/decode" || p.Prefill.ID != "a/prefill" || p.Decode.Rank != rk(1) || p.Prefill.Rank != rk(11) {
		t.Fatalf("bookings %+v %+v", p.Decode, p.Prefill)
	}
	// The decode booking is load-only: no prefill tokens on decode.
	if l, _ := c.Pools().Pool(decKey).Load(rk(1)); l != (Load{Blocks: 4, Requests: 1}) {
		t.Fatalf("decode load %+v", l)
	}
	p, _ = c.PrefillComplete("a", t0)
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked, PrefillReleased)
	wantActive(t, c, 1, 0)
	if p.PrefillWorker == nil || *p.PrefillWorker != rk(11) {
		t.Fatalf("prefill worker not remembered: %v", p.PrefillWorker)
	}
	p, _ = c.PrefillComplete("a", t0) // idempotent
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked, PrefillReleased)
	p, err = c.Release("a", t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked, PrefillReleased, Released)
	wantActive(t, c, 0, 0)
	if _, err := c.Release("a", t0); !errors.Is(err, ErrPlanNotFound) {
		t.Fatalf("second release: %v", err)
	}
	if c.Len() != 0 {
		t.Fatal("released plan kept")
	}
	for _, tr := range p.Transitions {
		if tr.Reason == "" || !tr.At.Equal(t0) {
			t.Fatalf("transition without reason or time: %+v", tr)
		}
	}
}

// cachedOnDecode reports 3 of 4 blocks cached on decode worker 1.
var cachedOnDecode = overlapFunc(func(_, group string) []indexer.Overlap {
	if group == "d" {
		return []indexer.Overlap{{Rank: rk(1), Device: 3, Host: 3, Disk: 3}}
	}
	return nil
})

func TestPolicyBypassBooksDecodeOnly(t *testing.T) {
	c := coord(t, CoordinatorConfig{Policy: DefaultPolicy()}, cachedOnDecode, decodeW(1, "r1"), prefillW(11, "r1"))
	p, err := c.Plan(req("a", 4), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Bypass)
	wantActive(t, c, 1, 0)
	if !p.IsBypass() || p.Prefill != nil || !p.Decision.Bypass || p.Signals.CachedTokens != 48 {
		t.Fatalf("plan %+v decision %+v signals %+v", p, p.Decision, p.Signals)
	}
	// A bypass booking keeps the overlap credit and tracks nothing on prefill pools.
	p, _ = c.PrefillComplete("a", t0)
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Bypass)
	p, _ = c.Release("a", t0)
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Bypass, Released)
	wantActive(t, c, 0, 0)
}

func TestDecodeBusyGateVetoesAPolicyBypass(t *testing.T) {
	pol := DefaultPolicy()
	pol.DecodeBusyThreshold = 0.5
	small := decodeW(1, "r1")
	small.TotalKVBlocks = 6 // 4 potential blocks > 0.5·6
	c := coord(t, CoordinatorConfig{Policy: pol}, cachedOnDecode, small, prefillW(11, "r1"))
	p, err := c.Plan(req("a", 4), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked)
	if d := p.Decision; !d.PolicySaysBypass || d.DecodeBusy != IsBusy || d.Bypass {
		t.Fatalf("decision %+v", d)
	}
	wantActive(t, c, 1, 1)

	// Unknown capacity never allows a bypass.
	unknown := decodeW(1, "r1")
	unknown.TotalKVBlocks = 0
	c = coord(t, CoordinatorConfig{Policy: pol}, cachedOnDecode, unknown, prefillW(11, "r1"))
	p, _ = c.Plan(req("a", 4), t0)
	if p.Decision.DecodeBusy != BusyUnknown || p.IsBypass() {
		t.Fatalf("unknown decode signal bypassed: %+v", p.Decision)
	}
}

func TestPrefillFailureFreesDecodeByDefault(t *testing.T) {
	c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(12, "r2"))
	p, err := c.Plan(req("a", 4), t0)
	if !errors.Is(err, ErrPrefillCommit) || !errors.Is(err, ErrAllFiltered) {
		t.Fatalf("err %v", err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Compensated)
	wantActive(t, c, 0, 0)
	if c.Len() != 0 || p.Decode != nil {
		t.Fatal("compensated plan still holds something")
	}
}

func TestPrefillFailureCanBypassOnTheDecodeWorker(t *testing.T) {
	c := coord(t, CoordinatorConfig{PrefillFailure: BypassOnDecode}, nil, decodeW(1, "r1"), prefillW(12, "r2"))
	p, err := c.Plan(req("a", 4), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, BypassAfterPrefillFailure)
	wantActive(t, c, 1, 0)
	if !p.IsBypass() {
		t.Fatal("not a bypass")
	}
	p, _ = c.Release("a", t0)
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, BypassAfterPrefillFailure, Released)
	wantActive(t, c, 0, 0)
}

func TestDecodeFailureBooksNothing(t *testing.T) {
	t.Run("preview", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, prefillW(11, "r1"))
		p, err := c.Plan(req("a", 4), t0)
		if !errors.Is(err, ErrDecodePreview) || !errors.Is(err, ErrNoWorkers) {
			t.Fatalf("err %v", err)
		}
		wantTrace(t, p, Idle)
		wantActive(t, c, 0, 0)
	})
	t.Run("commit", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
		// A stray reservation under the plan's decode id makes the commit conflict.
		if _, err := c.Pools().Pool(decKey).SelectAndReserve("a/decode", Query{Prompt: promptOf(hashes(0, 1))}, t0); err != nil {
			t.Fatal(err)
		}
		p, err := c.Plan(req("a", 4), t0)
		if !errors.Is(err, ErrDecodeCommit) || !errors.Is(err, ErrDuplicateReservation) {
			t.Fatalf("err %v", err)
		}
		wantTrace(t, p, Idle, DecodePreviewed)
		wantActive(t, c, 1, 0) // only the stray one
		if c.Len() != 0 {
			t.Fatal("failed plan kept")
		}
	})
}

func TestPrefillIsConstrainedToTheDecodeKVTransferDomain(t *testing.T) {
	t.Run("required", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), decodeW(2, "r2"), prefillW(11, "r1"), prefillW(12, "r2"), prefillW(13, "r2"))
		for i := range 30 {
			p, err := c.Plan(req(string(rune('a'+i)), 2), t0)
			if err != nil {
				t.Fatal(err)
			}
			dw, _ := c.Pools().Pool(decKey).Worker(p.Decode.Rank)
			pw, _ := c.Pools().Pool(preKey).Worker(p.Prefill.Rank)
			if dw.TopologyDomains["rack"] != pw.TopologyDomains["rack"] {
				t.Fatalf("decode %v in %v, prefill %v in %v", dw.Rank, dw.TopologyDomains, pw.Rank, pw.TopologyDomains)
			}
		}
	})
	t.Run("preferred", func(t *testing.T) {
		d := decodeW(1, "r1")
		d.KVTransferEnforcement, d.KVTransferPreferredWeight = EnforcementPreferred, fptr(1)
		c := coord(t, CoordinatorConfig{}, nil, d, prefillW(11, "r1"), prefillW(12, "r2"))
		p, err := c.Plan(req("a", 2), t0)
		if err != nil || p.Prefill.Rank != rk(11) {
			t.Fatalf("prefill %+v, %v; want the preferred r1 worker", p.Prefill, err)
		}
		// Preferred is soft: with the r1 worker gone, r2 is used.
		c.WorkerRemoved(rk(11), t0)
		p, err = c.Plan(req("b", 2), t0)
		if err != nil || p.Prefill.Rank != rk(12) {
			t.Fatalf("prefill %+v, %v", p.Prefill, err)
		}
	})
}

func TestIncompleteKVTransferMetadataIsAnErrorAndFreesDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Worker)
		err  error
	}{
		{"missing_topology_domain", func(w *Worker) { w.TopologyDomains = nil }, ErrMissingTopologyDomain},
		{"missing_enforcement", func(w *Worker) { w.KVTransferEnforcement = EnforcementUnset }, ErrMissingEnforcement},
		{"missing_preferred_weight", func(w *Worker) { w.KVTransferEnforcement = EnforcementPreferred }, ErrMissingPreferredWeight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decodeW(1, "r1")
			tc.mod(&d)
			c := coord(t, CoordinatorConfig{}, nil, d, prefillW(11, "r1"))
			p, err := c.Plan(req("a", 2), t0)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Compensated)
			wantActive(t, c, 0, 0)
		})
	}
}

func TestPrefillAnchoredBooksDecodeInThePrefillDomainAfterHandoff(t *testing.T) {
	c := coord(t, CoordinatorConfig{Order: PrefillFirst}, nil, decodeW(1, "r1"), decodeW(2, "r2"), prefillW(12, "r2"))
	p, err := c.PlanPrefill(req("a", 2), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, PrefillCommitted)
	wantActive(t, c, 0, 1)
	p, err = c.PrefillComplete("a", t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, PrefillCommitted, PrefillReleased)
	wantActive(t, c, 0, 0)
	p, err = c.PlanDecode("a", t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, PrefillCommitted, PrefillReleased)
	if p.Decode.Rank != rk(2) {
		t.Fatalf("decode on %v, want 2 (rack r2)", p.Decode.Rank)
	}
	wantActive(t, c, 1, 0)
	if _, err := c.PlanDecode("a", t0); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("second plan_decode: %v", err)
	}
	p, _ = c.Release("a", t0)
	wantTrace(t, p, Idle, PrefillCommitted, PrefillReleased, Released)
	wantActive(t, c, 0, 0)

	// Plan() in prefill-first order books both back to back.
	p, err = c.Plan(req("b", 2), t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, PrefillCommitted, Linked)
	wantActive(t, c, 1, 1)
}

func TestPrefillAnchoredDecodeFailureFreesPrefill(t *testing.T) {
	c := coord(t, CoordinatorConfig{Order: PrefillFirst}, nil, decodeW(1, "r1"), prefillW(12, "r2"))
	p, err := c.Plan(req("a", 2), t0)
	if !errors.Is(err, ErrDecodeCommit) {
		t.Fatalf("err %v", err)
	}
	wantTrace(t, p, Idle, PrefillCommitted, Compensated)
	wantActive(t, c, 0, 0)
}

func TestPrefillAnchoredPrefillFailureBooksNothing(t *testing.T) {
	c := coord(t, CoordinatorConfig{Order: PrefillFirst}, nil, decodeW(1, "r1"))
	p, err := c.Plan(req("a", 2), t0)
	if !errors.Is(err, ErrPrefillCommit) {
		t.Fatalf("err %v", err)
	}
	wantTrace(t, p, Idle)
	wantActive(t, c, 0, 0)
}

func TestPlanExpiry(t *testing.T) {
	c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
	c.Plan(req("a", 2), t0)
	c.Plan(req("b", 2), t0.Add(time.Minute))
	if got := c.Expire(t0.Add(DefaultPlanTTL - 1)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	got := c.Expire(t0.Add(DefaultPlanTTL))
	if len(got) != 1 || got[0].ID != "a" {
		t.Fatalf("expired %+v", got)
	}
	wantTrace(t, got[0], Idle, DecodePreviewed, DecodeCommitted, Linked, Expired)
	if r := got[0].Transitions[3].Reason; !strings.Contains(r, "expired") {
		t.Fatalf("reason %q", r)
	}
	wantActive(t, c, 1, 1)
	if _, err := c.Release("a", t0); !errors.Is(err, ErrPlanNotFound) {
		t.Fatal("expired plan can still be released")
	}
	c.Expire(t0.Add(time.Hour))
	wantActive(t, c, 0, 0)
}

func TestPoolExpiryOfAPlanBookingIsRecorded(t *testing.T) {
	pcfg := DefaultPoolConfig()
	pcfg.ReservationTTL = time.Minute
	c := NewCoordinator(NewPools(pcfg, seeded(1)), nil, CoordinatorConfig{})
	for _, w := range []Worker{decodeW(1, "r1"), prefillW(11, "r1")} {
		c.SetWorker(w, t0)
	}
	c.Plan(req("a", 2), t0)
	got := c.Expire(t0.Add(time.Minute))
	if len(got) != 1 {
		t.Fatalf("affected %+v", got)
	}
	wantTrace(t, got[0], Idle, DecodePreviewed, DecodeCommitted, Linked, Compensated)
	wantActive(t, c, 0, 0)
}

func TestWorkerRemovedFreesItsBookings(t *testing.T) {
	t.Run("decode_worker_compensates_the_plan", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
		c.Plan(req("a", 2), t0)
		got := c.WorkerRemoved(rk(1), t0)
		if len(got) != 1 {
			t.Fatalf("affected %+v", got)
		}
		wantTrace(t, got[0], Idle, DecodePreviewed, DecodeCommitted, Linked, Compensated)
		if r := got[0].Transitions[3].Reason; !strings.Contains(r, "worker 1/0 removed") {
			t.Fatalf("reason %q", r)
		}
		wantActive(t, c, 0, 0)
		if c.Len() != 0 {
			t.Fatal("plan kept")
		}
	})
	t.Run("prefill_worker_releases_prefill", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
		c.Plan(req("a", 2), t0)
		got := c.WorkerRemoved(rk(11), t0)
		wantTrace(t, got[0], Idle, DecodePreviewed, DecodeCommitted, Linked, PrefillReleased)
		wantActive(t, c, 1, 0)
		p, _ := c.Release("a", t0)
		wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked, PrefillReleased, Released)
		wantActive(t, c, 0, 0)
	})
	t.Run("unrelated_worker_changes_nothing", func(t *testing.T) {
		c := coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), decodeW(2, "r1"), prefillW(11, "r1"))
		c.Plan(req("a", 2), t0)
		p, _ := c.Get("a")
		other := rk(1)
		if p.Decode.Rank == other {
			other = rk(2)
		}
		if got := c.WorkerRemoved(other, t0); len(got) != 0 {
			t.Fatalf("affected %+v", got)
		}
		wantActive(t, c, 1, 1)
	})
}

func TestPrefillFailedAtRunTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy FailurePolicy
		want   State
		active [2]int
	}{
		{"free_decode", FreeDecode, Compensated, [2]int{0, 0}},
		{"bypass_on_decode", BypassOnDecode, BypassAfterPrefillFailure, [2]int{1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := coord(t, CoordinatorConfig{PrefillFailure: tc.policy}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
			c.Plan(req("a", 2), t0)
			p, err := c.PrefillFailed("a", t0)
			if err != nil {
				t.Fatal(err)
			}
			wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Linked, tc.want)
			if got := active(c); got != tc.active {
				t.Fatalf("active %v, want %v", got, tc.active)
			}
		})
	}
}

func TestDuplicateAndCappedPlans(t *testing.T) {
	c := coord(t, CoordinatorConfig{MaxPlans: 1}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
	if _, err := c.Plan(req("a", 2), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Plan(req("a", 2), t0); !errors.Is(err, ErrDuplicatePlan) {
		t.Fatalf("err %v", err)
	}
	if _, err := c.Plan(req("b", 2), t0); !errors.Is(err, ErrTooManyPlans) {
		t.Fatalf("err %v", err)
	}
	wantActive(t, c, 1, 1)
}

// TestPerRequestPolicyOverrides: a request's policy and prefill-failure
// overrides win over the coordinator's.
func TestPerRequestPolicyOverrides(t *testing.T) {
	// The coordinator never bypasses; the request's policy does.
	c := coord(t, CoordinatorConfig{}, cachedOnDecode, decodeW(1, "r1"), prefillW(11, "r1"))
	r := req("a", 4)
	pol := DefaultPolicy()
	r.Policy = &pol
	p, err := c.Plan(r, t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, Bypass)
	// The coordinator frees decode on prefill failure; this request
	// prefills on decode instead (no prefill worker in its rack).
	c = coord(t, CoordinatorConfig{}, nil, decodeW(1, "r1"), prefillW(11, "r2"))
	r = req("b", 4)
	bypass := BypassOnDecode
	r.PrefillFailure = &bypass
	p, err = c.Plan(r, t0)
	if err != nil {
		t.Fatal(err)
	}
	wantTrace(t, p, Idle, DecodePreviewed, DecodeCommitted, BypassAfterPrefillFailure)
	if _, err := c.Plan(req("c", 4), t0); err == nil {
		t.Fatal("without the override the prefill failure must free decode and fail")
	}
}

// TestPlanFromBlockHashes: a prompt given as local block hashes plans like
// the same prompt given as tokens; a source that cannot score hashes is an
// error.
func TestPlanFromBlockHashes(t *testing.T) {
	c := coord(t, CoordinatorConfig{BlockSize: bs}, nil, decodeW(1, "r1"), prefillW(11, "r1"))
	byTokens := req("t", 4)
	byHashes := Request{ID: "h", Model: "m", PrefillGroup: "p", DecodeGroup: "d",
		Hashes: indexer.HashBlocks(nil, byTokens.Tokens, bs, indexer.BaseSeed), PromptTokens: 4*bs + 3}
	pt, err := c.Plan(byTokens, t0)
	if err != nil {
		t.Fatal(err)
	}
	ph, err := c.Plan(byHashes, t0)
	if err != nil {
		t.Fatal(err)
	}
	if pt.State != ph.State || ph.Signals.PromptTokens != 4*bs+3 || pt.Signals.PromptTokens != 4*bs {
		t.Fatalf("tokens plan %v %+v, hashes plan %v %+v", pt.State, pt.Signals, ph.State, ph.Signals)
	}
	c = coord(t, CoordinatorConfig{}, cachedOnDecode, decodeW(1, "r1"), prefillW(11, "r1"))
	if _, err := c.Plan(byHashes, t0); !errors.Is(err, ErrInvalidPrompt) {
		t.Fatalf("hashes with a token-only source: %v", err)
	}
}
