package coordinator

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// State is a plan's LinkedBookingState (the states of ishandhanani/dynamo
// lib/kv-router/src/services/selection/coordinator.rs).
type State uint8

const (
	// Idle: nothing booked; terminal if the first step failed.
	Idle State = iota
	// DecodePreviewed: a decode worker was chosen advisorily; nothing booked.
	DecodePreviewed
	// DecodeCommitted: decode booked; prefill not attempted yet.
	DecodeCommitted
	// PrefillCommitted: prefill booked; decode not attempted yet (prefill-first).
	PrefillCommitted
	// Bypass: decode booked and the policy chose to prefill on it.
	Bypass
	// Linked: decode and prefill both booked.
	Linked
	// PrefillReleased: prefill freed (completed, or its worker left); decode booked or not yet attempted.
	PrefillReleased
	// BypassAfterPrefillFailure: prefill failed after decode was booked; decode kept, prefill runs on it.
	BypassAfterPrefillFailure
	// Compensated: a booking failed or was lost, and the others were freed.
	Compensated
	// Released: every booking released by Release.
	Released
	// Expired: never released, the plan outlived PlanTTL and Expire freed
	// every booking (prefixd's; Dynamo's plans do not expire).
	Expired
)

var stateNames = [...]string{"Idle", "DecodePreviewed", "DecodeCommitted", "PrefillCommitted", "Bypass", "Linked", "PrefillReleased", "BypassAfterPrefillFailure", "Compensated", "Released", "Expired"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Order is the coordination order.
type Order uint8

const (
	// DecodeFirst anchors on decode: preview, decide, book decode, then prefill in its domain.
	DecodeFirst Order = iota
	// PrefillFirst anchors on prefill: book prefill KV-aware, then decode in its domain.
	PrefillFirst
)

// FailurePolicy is what a decode-first plan does when prefill cannot be
// booked after decode was.
type FailurePolicy uint8

const (
	// FreeDecode frees the decode booking (plan Compensated) and returns the error.
	FreeDecode FailurePolicy = iota
	// BypassOnDecode keeps decode and prefills there (BypassAfterPrefillFailure).
	BypassOnDecode
)

// Defaults of CoordinatorConfig.
const (
	DefaultPlanTTL   = 300 * time.Second
	DefaultMaxPlans  = 1 << 16
	DefaultBlockSize = 16
)

// CoordinatorConfig configures a Coordinator. The zero value is decode-first,
// FreeDecode, conditional disaggregation disabled, and default TTL, cap and block size.
type CoordinatorConfig struct {
	Order          Order
	PrefillFailure FailurePolicy
	Policy         Policy
	// PlanTTL: a plan not released within it is expired by Expire.
	PlanTTL  time.Duration
	MaxPlans int
	// BlockSize hashes prompts when there is no OverlapSource.
	BlockSize int
}

// OverlapSource reports how far each rank of (model, group) caches tokens,
// and the block size it hashed with. The indexer's adapter implements it.
type OverlapSource interface {
	Overlaps(model, group string, tokens []uint32, lora, salt string) ([]indexer.Overlap, int, error)
}

// HashOverlapSource is implemented by overlap sources that also answer for
// prompts given as local block hashes (already salted by the caller).
type HashOverlapSource interface {
	OverlapsByHash(model, group string, hashes []uint64) ([]indexer.Overlap, int, error)
}

// Request is one disaggregated request to plan.
type Request struct {
	ID           string
	Model        string
	PrefillGroup string
	DecodeGroup  string
	Tokens       []uint32
	Lora, Salt   string
	// Hashes, instead of Tokens, give the prompt as local block hashes
	// (indexer.HashBlocks, salted by the caller); PromptTokens is then its
	// length in tokens (0 = len(Hashes) · block size).
	Hashes       []uint64
	PromptTokens int
	// PinnedPrefill pins the prefill booking; Allowed restricts both pools'
	// worker ids; Constraints apply to both pools (the KV-transfer
	// constraint is added to the second booking).
	PinnedPrefill *indexer.Rank
	Allowed       []uint64
	Constraints   Constraints
	// DecodeOptions and PrefillOptions override the pools' defaults; the
	// coordinator still forces its decode overrides (no prefill-token
	// tracking, no assumed KV reuse, zero overlap credit unless bypass).
	DecodeOptions  *Options
	PrefillOptions *Options
	// Policy and PrefillFailure, when set, override the coordinator's
	// conditional-disaggregation policy and prefill-failure policy for
	// this request.
	Policy         *Policy
	PrefillFailure *FailurePolicy
	// Order, when set, overrides the coordinator's order for this request.
	// DeferDecode, in the prefill-first order, books only prefill: decode
	// is booked after the prefill hand-off with PlanDecode, as a frontend
	// does (a decode worker may have become free by then).
	Order       *Order
	DeferDecode bool
}

// Booking is one reservation a plan holds.
type Booking struct {
	Pool PoolKey
	ID   string // "<plan id>/decode" or "<plan id>/prefill"
	Rank indexer.Rank
	// Endpoint is the rank's Worker.Endpoint when the snapshot was taken.
	Endpoint string
}

// DecodeSignals are what the decode preview saw.
type DecodeSignals struct {
	PromptTokens          int
	CachedTokens          float64
	PotentialDecodeBlocks int
	DecodeBusy            Busy
}

// Transition is one recorded state change.
type Transition struct {
	From, To State
	Reason   string
	At       time.Time
}

// Plan is a snapshot of a linked booking. Snapshots are the caller's: they
// share nothing with the coordinator.
type Plan struct {
	ID      string
	Order   Order
	Decode  *Booking // held decode booking, nil if none
	Prefill *Booking // held prefill booking, nil if none
	// PrefillWorker is the rank prefill was booked on, kept after release.
	PrefillWorker *indexer.Rank
	Decision      *Decision
	Signals       *DecodeSignals
	State         State
	Transitions   []Transition
	Created       time.Time
}

// IsBypass reports whether prefill runs on the decode worker.
func (p Plan) IsBypass() bool { return p.State == Bypass || p.State == BypassAfterPrefillFailure }

// Trace is the sequence of states, starting at Idle.
func (p Plan) Trace() []State {
	out := []State{Idle}
	for _, t := range p.Transitions {
		out = append(out, t.To)
	}
	return out
}

// snapshot is a copy of l for the caller, its bookings naming their
// workers' current endpoints.
func (c *Coordinator) snapshot(l *live) Plan {
	s := l.clone()
	for _, b := range []*Booking{s.Decode, s.Prefill} {
		if b == nil {
			continue
		}
		if p := c.pools.Pool(b.Pool); p != nil {
			if ws, ok := p.workers[b.Rank]; ok {
				b.Endpoint = ws.w.Endpoint
			}
		}
	}
	return s
}

func (p *Plan) clone() Plan {
	c := *p
	c.Decode, c.Prefill, c.PrefillWorker = ptrClone(p.Decode), ptrClone(p.Prefill), ptrClone(p.PrefillWorker)
	c.Decision, c.Signals = ptrClone(p.Decision), ptrClone(p.Signals)
	c.Transitions = slices.Clone(p.Transitions)
	return c
}

func ptrClone[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func (p *Plan) to(s State, now time.Time, format string, args ...any) {
	p.Transitions = append(p.Transitions, Transition{From: p.State, To: s, Reason: fmt.Sprintf(format, args...), At: now})
	p.State = s
}

type live struct {
	Plan
	req Request
}

// Coordinator books disaggregated requests across a decode pool and a
// prefill pool as linked plans (docs/coordinator.md), decode-first by
// default. There is no cross-pool lock: every partial state is recorded on
// the plan and compensated explicitly. It is a driven state machine: no
// goroutines, no clock (every method takes now), no I/O. Not safe for
// concurrent use.
//
// Only live plans (holding a booking, or PrefillReleased awaiting decode)
// are kept; a plan that is released,
// compensated or expired is returned one last time and then forgotten, so
// a second Release answers ErrPlanNotFound and changes nothing.
//
// The reservation ids "<id>/decode" and "<id>/prefill" belong to the
// coordinator: freeing them directly on a pool desynchronises the plan.
type Coordinator struct {
	cfg   CoordinatorConfig
	pools *Pools
	src   OverlapSource
	plans map[string]*live
}

// NewCoordinator returns a coordinator over pools. src may be nil: prompts
// are then hashed with cfg.BlockSize and have no overlaps.
func NewCoordinator(pools *Pools, src OverlapSource, cfg CoordinatorConfig) *Coordinator {
	if cfg.PlanTTL <= 0 {
		cfg.PlanTTL = DefaultPlanTTL
	}
	if cfg.MaxPlans <= 0 {
		cfg.MaxPlans = DefaultMaxPlans
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	return &Coordinator{cfg: cfg, pools: pools, src: src, plans: map[string]*live{}}
}

// Pools returns the pools the coordinator books in.
func (c *Coordinator) Pools() *Pools { return c.pools }

// Len is the number of live plans.
func (c *Coordinator) Len() int { return len(c.plans) }

// Get returns a snapshot of live plan id.
func (c *Coordinator) Get(id string) (Plan, bool) {
	l, ok := c.plans[id]
	if !ok {
		return Plan{}, false
	}
	return c.snapshot(l), true
}

// IDs returns the live plan ids, sorted.
func (c *Coordinator) IDs() []string {
	ids := make([]string, 0, len(c.plans))
	for id := range c.plans {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (c *Coordinator) prompt(k PoolKey, req *Request) (Prompt, error) {
	return buildPrompt(c.src, c.cfg.BlockSize, k, req.Tokens, req.Lora, req.Salt, req.Hashes, req.PromptTokens)
}

// buildPrompt makes the prompt of pool k from token ids or, when hashes
// are given, from local block hashes (promptTokens long, 0 = one block
// size per hash), with src's overlaps and block size; without a source it
// hashes with bs and has no overlaps.
func buildPrompt(src OverlapSource, bs int, k PoolKey, tokens []uint32, lora, salt string, hashes []uint64, promptTokens int) (Prompt, error) {
	p, err := sourcePrompt(src, bs, k, tokens, lora, salt, hashes, promptTokens)
	if m, ok := src.(promptMerger); ok && err == nil {
		m.mergePrompt(k, &p)
	}
	return p, err
}

// promptMerger is a source that rescores a prompt once it is hashed (the
// Service's predictions).
type promptMerger interface {
	mergePrompt(k PoolKey, p *Prompt)
}

func sourcePrompt(src OverlapSource, bs int, k PoolKey, tokens []uint32, lora, salt string, hashes []uint64, promptTokens int) (Prompt, error) {
	if len(hashes) > 0 {
		var ov []indexer.Overlap
		if src != nil {
			hs, ok := src.(HashOverlapSource)
			if !ok {
				return Prompt{}, fmt.Errorf("%w: the overlap source cannot score block hashes", ErrInvalidPrompt)
			}
			var err error
			if ov, bs, err = hs.OverlapsByHash(k.Model, k.Group, hashes); err != nil {
				return Prompt{}, fmt.Errorf("overlaps of %v: %w", k, err)
			}
		}
		if promptTokens == 0 {
			promptTokens = len(hashes) * bs
		}
		return Prompt{Tokens: promptTokens, BlockSize: bs, Hashes: hashes, Overlaps: ov}, nil
	}
	if src == nil {
		return NewPrompt(tokens, bs, lora, salt, nil), nil
	}
	ov, bs, err := src.Overlaps(k.Model, k.Group, tokens, lora, salt)
	if err != nil {
		return Prompt{}, fmt.Errorf("overlaps of %v: %w", k, err)
	}
	return NewPrompt(tokens, bs, lora, salt, ov), nil
}

func (c *Coordinator) pool(k PoolKey) (*Pool, error) {
	if p := c.pools.Pool(k); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("pool %v: %w", k, ErrNoWorkers)
}

func (c *Coordinator) keys(req *Request) (dec, pre PoolKey) {
	return PoolKey{Model: req.Model, Group: req.DecodeGroup, Role: RoleDecode},
		PoolKey{Model: req.Model, Group: req.PrefillGroup, Role: RolePrefill}
}

func opts(o *Options, p *Pool) Options {
	if o != nil {
		return *o
	}
	return p.Config().Options
}

func (c *Coordinator) admit(req *Request, now time.Time) (*live, error) {
	if _, dup := c.plans[req.ID]; dup {
		return nil, fmt.Errorf("plan %q: %w", req.ID, ErrDuplicatePlan)
	}
	if len(c.plans) >= c.cfg.MaxPlans {
		return nil, fmt.Errorf("plan %q: %d live: %w", req.ID, len(c.plans), ErrTooManyPlans)
	}
	r := *req
	r.Tokens = slices.Clone(req.Tokens)
	r.Hashes = slices.Clone(req.Hashes)
	r.Allowed = slices.Clone(req.Allowed)
	r.Constraints = req.Constraints.clone()
	r.PinnedPrefill, r.DecodeOptions, r.PrefillOptions = ptrClone(req.PinnedPrefill), ptrClone(req.DecodeOptions), ptrClone(req.PrefillOptions)
	return &live{Plan: Plan{ID: req.ID, Order: c.cfg.Order, Created: now}, req: r}, nil
}

// keep stores l if it holds a booking or awaits its decode booking after a
// prefill hand-off (PrefillReleased), else forgets it; it returns the snapshot.
func (c *Coordinator) keep(l *live) Plan {
	if l.Decode != nil || l.Prefill != nil || l.State == PrefillReleased {
		c.plans[l.ID] = l
	} else {
		delete(c.plans, l.ID)
	}
	return c.snapshot(l)
}

// Plan books req in the configured order (or req.Order), both halves
// back to back unless req.DeferDecode defers a prefill-first plan's
// decode to PlanDecode. The returned plan is meaningful
// even with an error: its transitions say what happened. An error wraps
// ErrDecodePreview, ErrDecodeCommit, ErrPrefillCommit, a KV-transfer
// metadata error, ErrDuplicatePlan or ErrTooManyPlans; after an error
// nothing stays booked.
func (c *Coordinator) Plan(req Request, now time.Time) (Plan, error) {
	order := c.cfg.Order
	if req.Order != nil {
		order = *req.Order
	}
	if order == PrefillFirst {
		p, err := c.PlanPrefill(req, now)
		if err != nil || req.DeferDecode {
			return p, err
		}
		return c.PlanDecode(req.ID, now)
	}
	return c.planDecodeFirst(req, now)
}

// planDecodeFirst is the decode-first flow: preview decode, probe prefill
// if the policy reads it, decide, book decode pinned to the preview, then
// (unless bypass) book prefill inside the decode worker's KV-transfer
// domain.
func (c *Coordinator) planDecodeFirst(req Request, now time.Time) (Plan, error) {
	l, err := c.admit(&req, now)
	if err != nil {
		return Plan{ID: req.ID, Order: DecodeFirst, Created: now}, err
	}
	dk, pk := c.keys(&l.req)
	fail := func(sentinel, err error) (Plan, error) {
		return c.keep(l), fmt.Errorf("plan %q: %w: %w", l.ID, sentinel, err)
	}
	dpool, err := c.pool(dk)
	if err != nil {
		return fail(ErrDecodePreview, err)
	}
	dprompt, err := c.prompt(dk, &l.req)
	if err != nil {
		return fail(ErrDecodePreview, err)
	}
	// 1. Advisory decode preview: load-only, base overlap credit.
	dopt := opts(l.req.DecodeOptions, dpool)
	dopt.TrackPrefillTokens, dopt.AssumeKVReuse = false, false
	policy := c.policyFor(&l.req)
	dopt.DecodeCostRule = policy.Enabled()
	dq := Query{Prompt: dprompt, Options: &dopt, Allowed: l.req.Allowed, Constraints: l.req.Constraints}
	prev, err := dpool.Select(dq)
	if err != nil {
		return fail(ErrDecodePreview, err)
	}
	l.to(DecodePreviewed, now, "decode preview chose %v", prev.Rank)
	promptTokens := dprompt.Tokens
	cached := max(0, float64(promptTokens)-prev.EffectivePrefillTokens)
	dw, _ := dpool.Worker(prev.Rank)
	decodeBusy := BusyUnknown
	if pol := policy; pol.DecodeBusyThreshold > 0 && dw.TotalKVBlocks > 0 {
		decodeBusy = busyIf(float64(prev.PotentialDecodeBlocks) > pol.DecodeBusyThreshold*float64(dw.TotalKVBlocks))
	}
	l.Signals = &DecodeSignals{PromptTokens: promptTokens, CachedTokens: cached, PotentialDecodeBlocks: prev.PotentialDecodeBlocks, DecodeBusy: decodeBusy}
	// 2-3. Prefill busy probe (only when the policy reads it), policy, gate.
	in := DecisionInput{PromptTokens: promptTokens, CachedTokens: cached, PrefillBusy: c.probePrefill(pk, &l.req)}
	d := policy.Decide(in, decodeBusy)
	l.Decision = &d
	// 4. Decode commit pinned to the previewed worker.
	copt := dopt
	if !d.Bypass {
		copt.OverlapCredit = 0
	}
	rank := prev.Rank
	cq := Query{Prompt: dprompt, Options: &copt, Pin: &rank, Allowed: l.req.Allowed, Constraints: l.req.Constraints}
	did := l.ID + "/decode"
	if _, err := dpool.SelectAndReserve(did, cq, now); err != nil {
		return fail(ErrDecodeCommit, err)
	}
	l.Decode = &Booking{Pool: dk, ID: did, Rank: rank}
	l.to(DecodeCommitted, now, "decode booked on %v", rank)
	if d.Bypass {
		l.to(Bypass, now, "policy %v bypasses remote prefill (eff_isl %.0f of %d)", policy.Kind, in.EffISL(), promptTokens)
		return c.keep(l), nil
	}
	// 5. Prefill commit in the decode worker's KV-transfer domain.
	if err := c.bookPrefill(l, pk, dw, now); err != nil {
		if c.failureFor(&l.req) == BypassOnDecode {
			l.to(BypassAfterPrefillFailure, now, "prefill failed, prefilling on decode %v: %v", rank, err)
			return c.keep(l), nil
		}
		c.free(l, now)
		l.to(Compensated, now, "prefill failed, decode %v freed: %v", rank, err)
		return c.keep(l), fmt.Errorf("plan %q: %w", l.ID, err)
	}
	l.to(Linked, now, "prefill booked on %v", l.Prefill.Rank)
	return c.keep(l), nil
}

// probePrefill is the advisory prefill busy read; unknown unless the
// policy is enabled, consumes it and has a threshold, and the probe works.
func (c *Coordinator) probePrefill(pk PoolKey, req *Request) Busy {
	pol := c.policyFor(req)
	if !pol.Enabled() || !pol.Kind.ConsumesPrefillLoad() || pol.PrefillBusyThreshold <= 0 {
		return BusyUnknown
	}
	ppool := c.pools.Pool(pk)
	if ppool == nil {
		return BusyUnknown
	}
	prompt, err := c.prompt(pk, req)
	if err != nil {
		return BusyUnknown
	}
	s, err := ppool.Select(Query{Prompt: prompt, Options: req.PrefillOptions, Pin: req.PinnedPrefill, Allowed: req.Allowed, Constraints: req.Constraints})
	if err != nil {
		return BusyUnknown
	}
	w, _ := ppool.Worker(s.Rank)
	ld, _ := ppool.Load(s.Rank)
	if w.MaxNumBatchedTokens <= 0 {
		return BusyUnknown
	}
	return busyIf(float64(ld.PrefillTokens) > pol.PrefillBusyThreshold*float64(w.MaxNumBatchedTokens))
}

// bookPrefill books prefill constrained by anchor's KV-transfer domain
// (anchor may be the zero Worker: no constraint). It returns a metadata
// error as is and a booking error wrapped in ErrPrefillCommit.
func (c *Coordinator) bookPrefill(l *live, pk PoolKey, anchor Worker, now time.Time) error {
	cons, err := TransferConstraint(anchor, l.req.Constraints)
	if err != nil {
		return err
	}
	ppool, err := c.pool(pk)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPrefillCommit, err)
	}
	prompt, err := c.prompt(pk, &l.req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPrefillCommit, err)
	}
	o := opts(l.req.PrefillOptions, ppool)
	pid := l.ID + "/prefill"
	s, err := ppool.SelectAndReserve(pid, Query{Prompt: prompt, Options: &o, Pin: l.req.PinnedPrefill, Allowed: l.req.Allowed, Constraints: cons}, now)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPrefillCommit, err)
	}
	l.Prefill = &Booking{Pool: pk, ID: pid, Rank: s.Rank}
	r := s.Rank
	l.PrefillWorker = &r
	return nil
}

// free frees every booking l holds.
func (c *Coordinator) free(l *live, now time.Time) {
	for _, b := range []**Booking{&l.Prefill, &l.Decode} {
		if *b == nil {
			continue
		}
		if p := c.pools.Pool((*b).Pool); p != nil {
			p.Free((*b).ID)
		}
		*b = nil
	}
}

// PlanPrefill is the first half of prefill-first: book prefill
// KV-aware (pin, allow-set and constraints honoured). Success →
// PrefillCommitted; failure → an Idle plan and ErrPrefillCommit.
func (c *Coordinator) PlanPrefill(req Request, now time.Time) (Plan, error) {
	l, err := c.admit(&req, now)
	if err != nil {
		return Plan{ID: req.ID, Order: PrefillFirst, Created: now}, err
	}
	l.Order = PrefillFirst
	_, pk := c.keys(&l.req)
	if err := c.bookPrefill(l, pk, Worker{}, now); err != nil {
		return c.keep(l), fmt.Errorf("plan %q: %w", l.ID, err)
	}
	l.to(PrefillCommitted, now, "prefill booked on %v", l.Prefill.Rank)
	return c.keep(l), nil
}

// PlanDecode is the second half of prefill-first: book decode load-only
// inside the prefill worker's KV-transfer domain (the remembered worker after
// a hand-off). Valid in PrefillCommitted or PrefillReleased without a decode
// booking, else ErrInvalidState. Success → Linked if prefill is still held;
// after a hand-off the state stays PrefillReleased (no transition, as in
// the prefill-anchored trace of ishandhanani/dynamo's coordinator: Idle →
// PrefillCommitted → PrefillReleased → Released). Failure frees prefill →
// Compensated, error.
func (c *Coordinator) PlanDecode(id string, now time.Time) (Plan, error) {
	l, ok := c.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("plan decode %q: %w", id, ErrPlanNotFound)
	}
	if (l.State != PrefillCommitted && l.State != PrefillReleased) || l.Decode != nil || l.PrefillWorker == nil {
		return c.snapshot(l), fmt.Errorf("plan decode %q: expected a prefill booking and no decode booking, state %v: %w", id, l.State, ErrInvalidState)
	}
	dk, pk := c.keys(&l.req)
	compensate := func(err error) (Plan, error) {
		c.free(l, now)
		l.to(Compensated, now, "decode failed, prefill freed: %v", err)
		return c.keep(l), fmt.Errorf("plan %q: %w", id, err)
	}
	var anchor Worker
	if pp := c.pools.Pool(pk); pp != nil {
		anchor, ok = pp.Worker(*l.PrefillWorker)
	} else {
		ok = false
	}
	if !ok {
		return compensate(fmt.Errorf("%w: prefill worker %v left: %w", ErrDecodeCommit, *l.PrefillWorker, ErrNoWorkers))
	}
	cons, err := TransferConstraint(anchor, l.req.Constraints)
	if err != nil {
		return compensate(err)
	}
	dpool, err := c.pool(dk)
	if err != nil {
		return compensate(fmt.Errorf("%w: %w", ErrDecodeCommit, err))
	}
	prompt, err := c.prompt(dk, &l.req)
	if err != nil {
		return compensate(fmt.Errorf("%w: %w", ErrDecodeCommit, err))
	}
	o := opts(l.req.DecodeOptions, dpool)
	o.TrackPrefillTokens, o.AssumeKVReuse, o.OverlapCredit = false, false, 0
	did := id + "/decode"
	s, err := dpool.SelectAndReserve(did, Query{Prompt: prompt, Options: &o, Allowed: l.req.Allowed, Constraints: cons}, now)
	if err != nil {
		return compensate(fmt.Errorf("%w: %w", ErrDecodeCommit, err))
	}
	l.Decode = &Booking{Pool: dk, ID: did, Rank: s.Rank}
	if l.State == PrefillCommitted {
		l.to(Linked, now, "decode booked on %v", s.Rank)
	}
	return c.keep(l), nil
}

// PrefillComplete frees the prefill booking early (prefill done, KV handed
// off) and remembers its worker → PrefillReleased. With no prefill booking
// it is a no-op (no transition).
func (c *Coordinator) PrefillComplete(id string, now time.Time) (Plan, error) {
	l, ok := c.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("prefill complete %q: %w", id, ErrPlanNotFound)
	}
	if l.Prefill == nil {
		return c.snapshot(l), nil
	}
	b := l.Prefill
	c.pools.Pool(b.Pool).Free(b.ID)
	l.Prefill = nil
	l.to(PrefillReleased, now, "prefill on %v complete", b.Rank)
	return c.keep(l), nil
}

// PrefillFailed reports that a booked prefill failed at run time. The
// prefill booking is freed; then, with decode held, PrefillFailurePolicy
// applies (FreeDecode → Compensated, BypassOnDecode →
// BypassAfterPrefillFailure); without decode the plan is Compensated. It is
// ErrInvalidState when no prefill booking is held.
func (c *Coordinator) PrefillFailed(id string, now time.Time) (Plan, error) {
	l, ok := c.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("prefill failed %q: %w", id, ErrPlanNotFound)
	}
	if l.Prefill == nil {
		return c.snapshot(l), fmt.Errorf("prefill failed %q: expected a prefill booking, state %v: %w", id, l.State, ErrInvalidState)
	}
	b := l.Prefill
	c.pools.Pool(b.Pool).Free(b.ID)
	l.Prefill = nil
	if l.Decode != nil && c.failureFor(&l.req) == BypassOnDecode {
		l.to(BypassAfterPrefillFailure, now, "prefill on %v failed, prefilling on decode %v", b.Rank, l.Decode.Rank)
		return c.keep(l), nil
	}
	c.free(l, now)
	l.to(Compensated, now, "prefill on %v failed, plan freed", b.Rank)
	return c.keep(l), nil
}

// Release frees whatever the plan still holds → Released, and forgets it.
// A second Release answers ErrPlanNotFound and changes nothing.
func (c *Coordinator) Release(id string, now time.Time) (Plan, error) {
	l, ok := c.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("release %q: %w", id, ErrPlanNotFound)
	}
	c.free(l, now)
	l.to(Released, now, "released")
	return c.keep(l), nil
}

// Expire frees every plan created at least PlanTTL before now (→ Expired,
// reason "expired after <TTL>"), then expires the pools' stale
// reservations; a plan whose booking a pool expired loses it as if its
// worker had left. It returns the affected plans, sorted by id.
func (c *Coordinator) Expire(now time.Time) []Plan {
	var out []Plan
	for _, id := range c.IDs() {
		l := c.plans[id]
		if now.Before(l.Created.Add(c.cfg.PlanTTL)) {
			continue
		}
		c.free(l, now)
		l.to(Expired, now, "expired after %v", c.cfg.PlanTTL)
		out = append(out, c.keep(l))
	}
	freed := c.pools.Expire(now)
	return append(out, c.lost(freed, now, "reservation expired")...)
}

// SetWorker adds or updates a worker. A rank that moves to another pool
// leaves its old one first, as WorkerRemoved does; the affected plans are returned.
func (c *Coordinator) SetWorker(w Worker, now time.Time) ([]Plan, error) {
	var out []Plan
	if k, ok := c.pools.Owner(w.Rank); ok && k != w.Key() {
		out = c.WorkerRemoved(w.Rank, now)
	}
	_, err := c.pools.SetWorker(w)
	return out, err
}

// WorkerRemoved removes rank from its pool and frees its bookings. A plan
// that loses its decode booking is Compensated (its prefill freed too); one
// that loses only its prefill booking goes to PrefillReleased if decode is
// held, else Compensated. It returns the affected plans, sorted by id.
func (c *Coordinator) WorkerRemoved(rank indexer.Rank, now time.Time) []Plan {
	return c.lost(c.pools.RemoveWorker(rank), now, "worker "+rank.String()+" removed")
}

// lost updates the plans whose bookings a pool freed (listed in freed).
func (c *Coordinator) lost(freed []Freed, now time.Time, why string) []Plan {
	snaps := map[string]Plan{}
	for _, f := range freed {
		id, ok := strings.CutSuffix(f.ID, "/decode")
		if !ok {
			id, ok = strings.CutSuffix(f.ID, "/prefill")
		}
		l, live := c.plans[id]
		if !ok || !live {
			continue
		}
		switch {
		case l.Decode != nil && l.Decode.ID == f.ID && l.Decode.Pool == f.Pool:
			l.Decode = nil
			c.free(l, now)
			l.to(Compensated, now, "%s: decode booking on %v lost, plan freed", why, f.Rank)
		case l.Prefill != nil && l.Prefill.ID == f.ID && l.Prefill.Pool == f.Pool:
			l.Prefill = nil
			if l.Decode != nil {
				l.to(PrefillReleased, now, "%s: prefill booking on %v lost", why, f.Rank)
			} else {
				l.to(Compensated, now, "%s: prefill booking on %v lost, plan freed", why, f.Rank)
			}
		default:
			continue
		}
		snaps[id] = c.keep(l)
	}
	ids := make([]string, 0, len(snaps))
	for id := range snaps {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]Plan, 0, len(ids))
	for _, id := range ids {
		out = append(out, snaps[id])
	}
	return out
}

// policyFor is the request's policy override, or the coordinator's.
func (c *Coordinator) policyFor(r *Request) Policy {
	if r.Policy != nil {
		return *r.Policy
	}
	return c.cfg.Policy
}

// failureFor is the request's prefill-failure override, or the coordinator's.
func (c *Coordinator) failureFor(r *Request) FailurePolicy {
	if r.PrefillFailure != nil {
		return *r.PrefillFailure
	}
	return c.cfg.PrefillFailure
}
