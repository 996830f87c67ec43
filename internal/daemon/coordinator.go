package daemon

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/api"
)

// ExpireInterval is how often Run expires stale reservations and plans.
const ExpireInterval = 10 * time.Second

// maxFinished bounds the finished plans selector remembers for GET.
const maxFinished = 4096

// selector is api.Selector over a coordinator.Coordinator and its Pools.
// The coordinator is single-threaded: one mutex guards it and every map
// here. now is time.Now() at each call; Run calls expire every
// ExpireInterval. Catalog changes arrive through setWorker/removeWorker.
//
// Reservation ids are global: byID remembers the pool of each reservation
// booked through the API (entries whose reservation a pool dropped, by
// worker removal or expiry, are swept by expire and on lookup).
type selector struct {
	mu    sync.Mutex
	ix    *indexer.Index
	pools *coordinator.Pools
	c     *coordinator.Coordinator
	// catalog facts the coordinator does not keep
	endpoints  map[indexer.Rank]string
	blockSizes map[indexer.PartitionKey]int // every partition that has had a selectable worker
	ranks      map[catalog.Key][]indexer.Rank
	byID       map[string]coordinator.PoolKey
	// unschedulable: workers registered without an engine endpoint, by
	// the pool they would join. They are indexed, but a selection could
	// not say where to send the request, so they join no pool.
	unschedulable map[catalog.Key]coordinator.PoolKey
	// finished plans (compensated, released by expiry or worker removal),
	// for GET /disagg/plans/{id}.
	finished *finishedPlans
	log      *slog.Logger
	metrics  *planMetrics
}

var _ api.Selector = (*selector)(nil)

func newSelector(ix *indexer.Index, pcfg coordinator.PoolConfig, ccfg coordinator.CoordinatorConfig, log *slog.Logger, reg prometheus.Registerer) *selector {
	s := &selector{ix: ix, endpoints: map[indexer.Rank]string{}, blockSizes: map[indexer.PartitionKey]int{},
		ranks: map[catalog.Key][]indexer.Rank{}, byID: map[string]coordinator.PoolKey{}, unschedulable: map[catalog.Key]coordinator.PoolKey{},
		finished: newFinishedPlans(maxFinished), log: log, metrics: newPlanMetrics(reg)}
	s.pools = coordinator.NewPools(pcfg, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	s.c = coordinator.NewCoordinator(s.pools, s, ccfg)
	return s
}

// promptLen is a request's prompt length in tokens, -1 if only the plan's
// signals know it (block hashes without isl_tokens).
func promptLen(p *api.Prompt) int {
	if len(p.BlockHashes) > 0 {
		return cmp.Or(p.ISLTokens, -1)
	}
	return len(p.TokenIDs)
}

// prompt builds a selection prompt from token ids or block hashes.
func (s *selector) prompt(k coordinator.PoolKey, p *api.Prompt) (coordinator.Prompt, error) {
	if len(p.BlockHashes) > 0 {
		ov, bs, err := s.OverlapsByHash(k.Model, k.Group, p.BlockHashes)
		if err != nil {
			return coordinator.Prompt{}, err
		}
		tokens := p.ISLTokens
		if tokens == 0 {
			tokens = len(p.BlockHashes) * bs
		}
		return coordinator.Prompt{Tokens: tokens, BlockSize: bs, Hashes: p.BlockHashes, Overlaps: ov}, nil
	}
	ov, bs, err := s.Overlaps(k.Model, k.Group, p.TokenIDs, p.LoraName, p.CacheSalt)
	if err != nil {
		return coordinator.Prompt{}, err
	}
	return coordinator.NewPrompt(p.TokenIDs, bs, p.LoraName, p.CacheSalt, ov), nil
}

// OverlapsByHash implements coordinator.HashOverlapSource over the index.
func (s *selector) OverlapsByHash(model, group string, hashes []uint64) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.partitionBlockSize(k)
	if err != nil || bs == 0 {
		return nil, bs, err
	}
	ov, err := s.ix.Match(k, hashes, nil)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, bs, nil
	}
	return ov, bs, err
}

// partitionBlockSize is the index partition's block size, or the
// catalog's while the partition has no events yet.
func (s *selector) partitionBlockSize(k indexer.PartitionKey) (int, error) {
	bs, err := s.ix.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		if bs, ok := s.blockSizes[k]; ok {
			return bs, nil
		}
		return 0, fmt.Errorf("%w: model_name=%s routing_group=%s has no workers", api.ErrUnavailable, api.Clip(k.Model), api.Clip(k.Group))
	}
	return bs, err
}

// Overlaps implements coordinator.OverlapSource over the index. It runs
// inside coordinator calls, with s.mu held. A partition the index does
// not have yet (no events) has no overlaps and the catalog's block size.
func (s *selector) Overlaps(model, group string, tokens []uint32, lora, salt string) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.ix.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		if bs, ok := s.blockSizes[k]; ok {
			return nil, bs, nil
		}
		return nil, 0, fmt.Errorf("%w: model_name=%s routing_group=%s has no workers", api.ErrUnavailable, api.Clip(model), api.Clip(group))
	}
	if err != nil {
		return nil, 0, err
	}
	ov, err := s.ix.MatchTokens(k, tokens, indexer.Seed(lora, salt), nil)
	return ov, bs, err
}

// coordinatorRole maps a catalog role; encoder workers are not selectable.
func coordinatorRole(r catalog.Role) (coordinator.Role, bool) {
	switch r {
	case catalog.RoleAggregated, "":
		return coordinator.RoleAggregated, true
	case catalog.RolePrefill:
		return coordinator.RolePrefill, true
	case catalog.RoleDecode:
		return coordinator.RoleDecode, true
	}
	return 0, false
}

// setWorker brings the pools in step with a worker record: one
// coordinator worker per dp rank; ranks it no longer has leave. A worker
// without an engine endpoint joins no pool (it is only remembered, to
// explain why a pool is empty).
func (s *selector) setWorker(w catalog.Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	key := catalog.Key{Model: w.ModelName, Group: w.RoutingGroup, WorkerID: w.WorkerID}
	role, selectable := coordinatorRole(w.Role)
	delete(s.unschedulable, key)
	if selectable {
		s.blockSizes[indexer.PartitionKey{Model: w.ModelName, Group: w.RoutingGroup}] = int(w.BlockSize)
		if w.Endpoint == "" {
			s.unschedulable[key] = coordinator.PoolKey{Model: w.ModelName, Group: w.RoutingGroup, Role: role}
			selectable = false
		}
	}
	var ranks []indexer.Rank
	if selectable {
		for _, dp := range w.Ranks() {
			cw := coordinator.Worker{Rank: indexer.Rank{WorkerID: w.WorkerID, DPRank: dp}, Model: w.ModelName, Group: w.RoutingGroup, Role: role,
				TotalKVBlocks: int(min(w.TotalKVBlocks, 1<<40)), MaxNumBatchedTokens: int(min(w.MaxNumBatchedTokens, 1<<40)),
				Taints: slices.Clone(w.Taints), TopologyDomains: w.TopologyDomains, KVTransferDomain: w.KVTransferDomain,
				KVTransferPreferredWeight: w.KVTransferPreferredWeight}
			switch w.KVTransferEnforcement {
			case catalog.EnforcementRequired:
				cw.KVTransferEnforcement = coordinator.EnforcementRequired
			case catalog.EnforcementPreferred:
				cw.KVTransferEnforcement = coordinator.EnforcementPreferred
			}
			plans, err := s.c.SetWorker(cw, now)
			s.record(plans)
			if err != nil {
				s.log.Error("worker not selectable", "worker", cw.Rank, "err", err)
				continue
			}
			s.endpoints[cw.Rank] = w.Endpoint
			ranks = append(ranks, cw.Rank)
		}
	}
	for _, r := range s.ranks[key] {
		if !slices.Contains(ranks, r) {
			s.removeRank(r, now)
		}
	}
	if len(ranks) == 0 {
		delete(s.ranks, key)
	} else {
		s.ranks[key] = ranks
	}
}

// removeWorker removes every rank of a worker record.
func (s *selector) removeWorker(key catalog.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, r := range s.ranks[key] {
		s.removeRank(r, now)
	}
	delete(s.ranks, key)
	delete(s.unschedulable, key)
}

func (s *selector) removeRank(r indexer.Rank, now time.Time) {
	s.record(s.c.WorkerRemoved(r, now))
	delete(s.endpoints, r)
	s.metrics.forget(r)
}

// record remembers the plans that finished (no longer live) for GetPlan.
func (s *selector) record(plans []coordinator.Plan) {
	for _, p := range plans {
		_, live := s.c.Get(p.ID)
		s.metrics.observe(p, live, s.c.Len())
		if !live {
			s.finished.add(p)
		}
	}
}

// expire drops stale plans and reservations and sweeps byID.
func (s *selector) expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record(s.c.Expire(now))
	for id, k := range s.byID {
		if p := s.pools.Pool(k); p == nil {
			delete(s.byID, id)
		} else if _, ok := p.Reserved(id); !ok {
			delete(s.byID, id)
		}
	}
}

// runExpiry calls expire every interval until ctx ends.
func (s *selector) runExpiry(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.expire(now)
		}
	}
}

// selError maps coordinator errors onto the API's sentinels; the text
// keeps the coordinator's detail.
func selError(err error) error {
	var sentinel error
	switch {
	case errors.Is(err, api.ErrInvalid), errors.Is(err, api.ErrNotFound), errors.Is(err, api.ErrConflict),
		errors.Is(err, api.ErrUnavailable), errors.Is(err, api.ErrOverloaded):
		return err
	case errors.Is(err, coordinator.ErrAllOverloaded), errors.Is(err, coordinator.ErrPinnedOverloaded):
		sentinel = api.ErrOverloaded
	case errors.Is(err, coordinator.ErrPinnedNotAllowed), errors.Is(err, coordinator.ErrInvalidPrompt):
		sentinel = api.ErrInvalid
	case errors.Is(err, coordinator.ErrBadPinnedRank), errors.Is(err, coordinator.ErrPlanNotFound):
		sentinel = api.ErrNotFound
	case errors.Is(err, coordinator.ErrNoWorkers), errors.Is(err, coordinator.ErrAllFiltered),
		errors.Is(err, coordinator.ErrTooManyReservations), errors.Is(err, coordinator.ErrTooManyPlans):
		sentinel = api.ErrUnavailable
	case errors.Is(err, coordinator.ErrDuplicateReservation), errors.Is(err, coordinator.ErrDuplicatePlan),
		errors.Is(err, coordinator.ErrInvalidState), errors.Is(err, coordinator.ErrMissingTopologyDomain),
		errors.Is(err, coordinator.ErrMissingEnforcement), errors.Is(err, coordinator.ErrMissingPreferredWeight):
		sentinel = api.ErrConflict
	default:
		return err
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

func poolKey(model, group, role string) coordinator.PoolKey {
	k := coordinator.PoolKey{Model: model, Group: group, Role: coordinator.RoleAggregated}
	switch role {
	case api.RolePrefill:
		k.Role = coordinator.RolePrefill
	case api.RoleDecode:
		k.Role = coordinator.RoleDecode
	}
	return k
}

func constraints(rc *api.RoutingConstraints) coordinator.Constraints {
	if rc == nil {
		return coordinator.Constraints{}
	}
	return coordinator.Constraints{Required: rc.RequiredTaints, Preferred: rc.PreferredTaints}
}

// query builds the pool query of a selection request; s.mu is held.
func (s *selector) query(k coordinator.PoolKey, r *api.SelectRequest) (*coordinator.Pool, coordinator.Query, error) {
	if err := s.knownPartition(k.Model, k.Group); err != nil {
		return nil, coordinator.Query{}, err
	}
	if pin := r.PinnedWorker; pin != nil {
		if pk, ok := s.unschedulable[catalog.Key{Model: k.Model, Group: k.Group, WorkerID: pin.WorkerID}]; ok && pk == k {
			return nil, coordinator.Query{}, fmt.Errorf("%w: worker %d of pool %s is registered without an engine_endpoint: indexed, but not schedulable",
				api.ErrNotFound, pin.WorkerID, poolName(k))
		}
	}
	p := s.pools.Pool(k)
	if p == nil {
		return nil, coordinator.Query{}, s.noWorkers(k)
	}
	prompt, err := s.prompt(k, &r.Prompt)
	if err != nil {
		return nil, coordinator.Query{}, err
	}
	q := coordinator.Query{Prompt: prompt, Allowed: r.AllowedWorkerIDs, Constraints: constraints(r.RoutingConstraints)}
	if r.PinnedWorker != nil {
		q.Pin = &indexer.Rank{WorkerID: r.PinnedWorker.WorkerID, DPRank: r.PinnedWorker.DPRank}
	}
	if r.Temperature != nil {
		o := p.Config().Options
		o.Temperature = *r.Temperature
		q.Options = &o
	}
	return p, q, nil
}

func (s *selector) selection(r *api.SelectRequest, q *coordinator.Query, sel coordinator.Selection) api.Selection {
	bs := q.Prompt.BlockSize
	s.metrics.overlap.WithLabelValues("selection").Observe(float64(int(sel.Overlap.Device) * bs))
	return api.Selection{SelectionID: r.SelectionID, ModelName: r.ModelName, RoutingGroup: r.RoutingGroup,
		WorkerID: sel.Rank.WorkerID, DPRank: sel.Rank.DPRank, Endpoint: s.endpoints[sel.Rank], BlockSize: bs,
		Overlap: api.OverlapInfo{LongestMatched: int(sel.Overlap.Disk) * bs, GPU: int(sel.Overlap.Device) * bs,
			CPU: int(sel.Overlap.Host) * bs, Disk: int(sel.Overlap.Disk) * bs},
		EffectivePrefillTokens: sel.EffectivePrefillTokens, PotentialDecodeBlocks: sel.PotentialDecodeBlocks}
}

func (s *selector) Select(_ context.Context, r api.SelectRequest) (api.Selection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := poolKey(r.ModelName, r.RoutingGroup, r.Role)
	p, q, err := s.query(k, &r)
	if err != nil {
		return api.Selection{}, selError(err)
	}
	sel, err := p.Select(q)
	if err != nil {
		return api.Selection{}, s.poolError(k, err)
	}
	return s.selection(&r, &q, sel), nil
}

func (s *selector) SelectAndReserve(_ context.Context, r api.SelectRequest) (api.Selection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewID(r.SelectionID); err != nil {
		return api.Selection{}, err
	}
	k := poolKey(r.ModelName, r.RoutingGroup, r.Role)
	p, q, err := s.query(k, &r)
	if err != nil {
		return api.Selection{}, selError(err)
	}
	sel, err := p.SelectAndReserve(r.SelectionID, q, time.Now())
	if err != nil {
		return api.Selection{}, s.poolError(k, err)
	}
	s.byID[r.SelectionID] = k
	s.metrics.route(sel.Rank, "reservation")
	out := s.selection(&r, &q, sel)
	out.ISLTokens = q.Prompt.Tokens
	track := p.Config().Options.TrackPrefillTokens
	if q.Options != nil {
		track = q.Options.TrackPrefillTokens
	}
	out.TrackPrefillTokens = &track
	return out, nil
}

// checkNewID rejects a reservation id that is live in any pool.
func (s *selector) checkNewID(id string) error {
	if k, ok := s.byID[id]; ok {
		if p := s.pools.Pool(k); p != nil {
			if _, live := p.Reserved(id); live {
				return fmt.Errorf("%w: selection_id: reservation %s already exists", api.ErrConflict, id)
			}
		}
		delete(s.byID, id)
	}
	return nil
}

func (s *selector) Reserve(_ context.Context, r api.ReserveRequest) (api.Reservation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewID(r.SelectionID); err != nil {
		return api.Reservation{}, err
	}
	k := poolKey(r.ModelName, r.RoutingGroup, r.Role)
	sr := api.SelectRequest{Prompt: r.Prompt, ModelName: r.ModelName, RoutingGroup: r.RoutingGroup, Role: r.Role,
		PinnedWorker: &api.WorkerRef{WorkerID: *r.WorkerID, DPRank: r.DPRank}}
	p, q, err := s.query(k, &sr)
	if err != nil {
		return api.Reservation{}, selError(err)
	}
	sel, err := p.SelectAndReserve(r.SelectionID, q, time.Now())
	if err != nil {
		return api.Reservation{}, s.poolError(k, err)
	}
	s.byID[r.SelectionID] = k
	return api.Reservation{SelectionID: r.SelectionID, ModelName: r.ModelName, RoutingGroup: r.RoutingGroup,
		WorkerID: sel.Rank.WorkerID, DPRank: sel.Rank.DPRank, Endpoint: s.endpoints[sel.Rank]}, nil
}

// reservation returns the pool holding id, or ErrNotFound.
func (s *selector) reservation(id string) (*coordinator.Pool, error) {
	if k, ok := s.byID[id]; ok {
		if p := s.pools.Pool(k); p != nil {
			if _, live := p.Reserved(id); live {
				return p, nil
			}
		}
		delete(s.byID, id)
	}
	return nil, fmt.Errorf("%w: reservation %s not found", api.ErrNotFound, id)
}

func (s *selector) ReservePrefillComplete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.reservation(id)
	if err != nil {
		return err
	}
	p.PrefillComplete(id)
	return nil
}

func (s *selector) Free(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.reservation(id)
	if err != nil {
		return err
	}
	p.Free(id)
	delete(s.byID, id)
	return nil
}

func (s *selector) CreatePlan(_ context.Context, r api.PlanRequest) (api.PlanInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := coordinator.Request{ID: r.ID, Model: r.ModelName, PrefillGroup: cmp.Or(r.PrefillRoutingGroup, r.RoutingGroup), DecodeGroup: r.RoutingGroup,
		Tokens: r.TokenIDs, Lora: r.LoraName, Salt: r.CacheSalt, Hashes: r.BlockHashes, PromptTokens: r.ISLTokens,
		Allowed: r.AllowedWorkerIDs, Constraints: constraints(r.RoutingConstraints)}
	if r.Policy != nil {
		pol := planPolicy(r.Policy)
		req.Policy = &pol
	}
	if r.PrefillFailure != "" {
		var f coordinator.FailurePolicy
		_ = f.UnmarshalText([]byte(r.PrefillFailure)) // validated by the API
		req.PrefillFailure = &f
	}
	if r.PinnedPrefillWorker != nil {
		req.PinnedPrefill = &indexer.Rank{WorkerID: r.PinnedPrefillWorker.WorkerID, DPRank: r.PinnedPrefillWorker.DPRank}
	}
	dk := coordinator.PoolKey{Model: req.Model, Group: req.DecodeGroup, Role: coordinator.RoleDecode}
	pk := coordinator.PoolKey{Model: req.Model, Group: req.PrefillGroup, Role: coordinator.RolePrefill}
	for _, k := range []coordinator.PoolKey{dk, pk} {
		if err := s.knownPartition(k.Model, k.Group); err != nil {
			return api.PlanInfo{}, err
		}
	}
	if _, ok := s.c.Get(r.ID); !ok {
		s.finished.remove(r.ID) // a new plan reuses a finished id
	}
	p, err := s.c.Plan(req, time.Now())
	_, live := s.c.Get(p.ID)
	s.metrics.observe(p, live, s.c.Len())
	if err != nil {
		if errors.Is(err, coordinator.ErrNoWorkers) {
			for _, k := range []coordinator.PoolKey{dk, pk} {
				if n := s.unschedulableIn(k); n > 0 && s.emptyPool(k) {
					err = fmt.Errorf("%w (pool %s: %s registered without an engine_endpoint, not schedulable)", err, poolName(k), workers(n))
				}
			}
		}
		return s.planInfo(p, promptLen(&r.Prompt)), selError(err)
	}
	if p.Decode != nil && p.Signals != nil {
		s.metrics.overlap.WithLabelValues("plan_decode").Observe(float64(p.Signals.CachedTokens))
	}
	if p.Decode != nil {
		s.metrics.route(p.Decode.Rank, "plan_decode")
	}
	if p.Prefill != nil {
		s.metrics.route(p.Prefill.Rank, "plan_prefill")
	}
	return s.planInfo(p, promptLen(&r.Prompt)), nil
}

func (s *selector) planOp(id string, op func(string, time.Time) (coordinator.Plan, error)) (api.PlanInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := op(id, time.Now())
	if p.ID != "" {
		_, live := s.c.Get(p.ID)
		s.metrics.observe(p, live, s.c.Len())
	}
	if err != nil {
		if errors.Is(err, coordinator.ErrPlanNotFound) {
			return api.PlanInfo{}, fmt.Errorf("%w: plan %s not found", api.ErrNotFound, id)
		}
		return s.planInfo(p, -1), selError(err)
	}
	return s.planInfo(p, -1), nil
}

func (s *selector) PlanPrefillComplete(_ context.Context, id string) (api.PlanInfo, error) {
	return s.planOp(id, s.c.PrefillComplete)
}

func (s *selector) PlanPrefillFailed(_ context.Context, id string) (api.PlanInfo, error) {
	return s.planOp(id, s.c.PrefillFailed)
}

func (s *selector) ReleasePlan(_ context.Context, id string) (api.PlanInfo, error) {
	return s.planOp(id, s.c.Release)
}

// GetPlan reads a live or recently finished plan (it changes nothing, so
// it counts no transitions).
func (s *selector) GetPlan(_ context.Context, id string) (api.PlanInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.c.Get(id)
	if !ok {
		p, ok = s.finished.get(id)
	}
	if !ok {
		return api.PlanInfo{}, fmt.Errorf("%w: plan %s not found", api.ErrNotFound, id)
	}
	return s.planInfo(p, -1), nil
}

// planPolicy maps a validated API policy onto the coordinator's.
func planPolicy(p *api.PlanPolicy) coordinator.Policy {
	pol := coordinator.DefaultPolicy()
	_ = pol.Kind.UnmarshalText([]byte(p.Kind)) // validated by the API
	if p.EffISLThreshold > 0 {
		pol.EffISLThreshold = p.EffISLThreshold
	}
	if p.EffISLRatioThreshold > 0 {
		pol.EffISLRatioThreshold = p.EffISLRatioThreshold
	}
	pol.DecodeBusyThreshold, pol.PrefillBusyThreshold = p.DecodeBusyThreshold, p.PrefillBusyThreshold
	return pol
}

// planInfo renders a plan; tokens < 0 means unknown (taken from the
// decode signals when present).
func (s *selector) planInfo(p coordinator.Plan, tokens int) api.PlanInfo {
	if tokens < 0 && p.Signals != nil {
		tokens = p.Signals.PromptTokens
	}
	tokens = max(tokens, 0)
	out := api.PlanInfo{ID: p.ID, Order: p.Order.String(), State: p.State.String(), Transitions: []api.PlanTransition{}}
	booking := func(b *coordinator.Booking) *api.PlanBooking {
		if b == nil {
			return nil
		}
		return &api.PlanBooking{WorkerID: b.Rank.WorkerID, DPRank: b.Rank.DPRank, Endpoint: s.endpoints[b.Rank], Tokens: tokens}
	}
	out.Decode, out.Prefill = booking(p.Decode), booking(p.Prefill)
	if p.PrefillWorker != nil {
		out.PrefillWorker = &api.WorkerRef{WorkerID: p.PrefillWorker.WorkerID, DPRank: p.PrefillWorker.DPRank}
	}
	if d := p.Decision; d != nil {
		kind := "remote_prefill"
		if d.Bypass || p.IsBypass() {
			kind = "bypass"
		}
		out.Decision = &api.PlanDecision{Kind: kind, PolicySaysBypass: d.PolicySaysBypass, PrefillBusy: d.PrefillBusy.String(), DecodeBusy: d.DecodeBusy.String()}
	}
	for _, t := range p.Transitions {
		out.Transitions = append(out.Transitions, api.PlanTransition{From: t.From.String(), To: t.To.String(), Reason: t.Reason})
	}
	return out
}

// knownPartition is nil if (model, group) has had a worker that could be
// selected, else an ErrNotFound (404) naming the partition and what is
// known: the model's routing groups, or the models.
func (s *selector) knownPartition(model, group string) error {
	if _, ok := s.blockSizes[indexer.PartitionKey{Model: model, Group: group}]; ok {
		return nil
	}
	groups, models := map[string]bool{}, map[string]bool{}
	for k := range s.blockSizes {
		models[k.Model] = true
		if k.Model == model {
			groups[k.Group] = true
		}
	}
	what := "no such model (known models: " + listed(models) + ")"
	switch {
	case len(groups) > 0:
		what = "no such routing group (routing groups of the model: " + listed(groups) + ")"
	case len(models) == 0:
		what = "no such model (no model has workers)"
	}
	return fmt.Errorf("%w: model_name=%s routing_group=%s: %s", api.ErrNotFound, api.Clip(model), api.Clip(group), what)
}

// maxListed bounds the names an error lists.
const maxListed = 8

// listed renders names sorted, at most maxListed of them, each clipped.
func listed(names map[string]bool) string {
	sorted := slices.Sorted(maps.Keys(names))
	out := make([]string, 0, min(len(sorted), maxListed)+1)
	for _, n := range sorted[:min(len(sorted), maxListed)] {
		out = append(out, api.Clip(n))
	}
	if len(sorted) > maxListed {
		out = append(out, fmt.Sprintf("… %d more", len(sorted)-maxListed))
	}
	return strings.Join(out, ", ")
}

// poolName renders a pool for an error, its names clipped.
func poolName(k coordinator.PoolKey) string {
	return api.Clip(k.Model) + "/" + api.Clip(k.Group) + "/" + k.Role.String()
}

// unschedulableIn counts the workers of pool k registered without an
// engine endpoint.
func (s *selector) unschedulableIn(k coordinator.PoolKey) int {
	n := 0
	for _, pk := range s.unschedulable {
		if pk == k {
			n++
		}
	}
	return n
}

// workers renders "1 worker", "2 workers".
func workers(n int) string {
	if n == 1 {
		return "1 worker"
	}
	return fmt.Sprintf("%d workers", n)
}

// emptyPool reports whether pool k has no workers (or does not exist).
func (s *selector) emptyPool(k coordinator.PoolKey) bool {
	p := s.pools.Pool(k)
	return p == nil || len(p.Ranks()) == 0
}

// poolError maps an error of selecting in pool k: a pool left without
// workers says whether workers without an engine endpoint are why.
func (s *selector) poolError(k coordinator.PoolKey, err error) error {
	if errors.Is(err, coordinator.ErrNoWorkers) && s.unschedulableIn(k) > 0 {
		return s.noWorkers(k)
	}
	return selError(err)
}

// noWorkers is the error for a pool that has no workers, saying how many
// would be there but for a missing engine endpoint.
func (s *selector) noWorkers(k coordinator.PoolKey) error {
	if n := s.unschedulableIn(k); n > 0 {
		return fmt.Errorf("%w: pool %s has no schedulable workers: %s registered without an engine_endpoint (indexed, but requests cannot be sent to them)",
			api.ErrUnavailable, poolName(k), workers(n))
	}
	return fmt.Errorf("%w: pool %s has no workers", api.ErrUnavailable, poolName(k))
}

// finishedPlans remembers the last max plans the selector finished, for
// GetPlan, oldest first: recording an id again (a reused id that finished
// again) moves it to the back, so eviction always drops the oldest entry
// that is still remembered. Not safe for concurrent use; the selector's
// mutex guards it.
type finishedPlans struct {
	max   int
	order *list.List // of coordinator.Plan, oldest first
	byID  map[string]*list.Element
}

func newFinishedPlans(max int) *finishedPlans {
	return &finishedPlans{max: max, order: list.New(), byID: map[string]*list.Element{}}
}

// add records p as the newest finished plan, evicting the oldest beyond max.
func (f *finishedPlans) add(p coordinator.Plan) {
	f.remove(p.ID)
	f.byID[p.ID] = f.order.PushBack(p)
	if f.order.Len() > f.max {
		oldest := f.order.Remove(f.order.Front()).(coordinator.Plan)
		delete(f.byID, oldest.ID)
	}
}

// get returns finished plan id, changing nothing.
func (f *finishedPlans) get(id string) (coordinator.Plan, bool) {
	if e, ok := f.byID[id]; ok {
		return e.Value.(coordinator.Plan), true
	}
	return coordinator.Plan{}, false
}

// remove forgets plan id, if it is remembered.
func (f *finishedPlans) remove(id string) {
	if e, ok := f.byID[id]; ok {
		f.order.Remove(e)
		delete(f.byID, id)
	}
}

// len is the number of plans remembered.
func (f *finishedPlans) len() int { return f.order.Len() }
