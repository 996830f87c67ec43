package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/prefixd/prefixd/indexer"
)

// maxFinished bounds the finished plans a Service remembers for Get.
const maxFinished = 4096

// An Engine is one registered engine of a pool: worker id Rank.WorkerID
// with the dp ranks DPRanks, each of which the Service adds as a Worker
// with the engine's metadata (Rank.DPRank is ignored). An engine without
// an Endpoint is remembered but joins no pool: a selection could not say
// where to send the request, and errors say why the pool is empty.
type Engine struct {
	Worker
	DPRanks []uint32
	// BlockSize is the KV block size the engine registered. The Service
	// hashes the partition's prompts with it while the overlap source
	// knows no block size for the partition.
	BlockSize int
}

// EngineKey names an engine: a worker id in a (model, routing group).
type EngineKey struct {
	Model, Group string
	WorkerID     uint64
}

// Key is the engine's key.
func (e *Engine) Key() EngineKey {
	return EngineKey{Model: e.Model, Group: e.Group, WorkerID: e.Rank.WorkerID}
}

// SelectOp names the Service method behind a selection (Observer.Selected).
type SelectOp uint8

const (
	OpSelect           SelectOp = iota // Select: nothing booked
	OpSelectAndReserve                 // SelectAndReserve: booked where the Service chose
	OpReserve                          // Reserve: booked on the caller's worker
)

// Observer is told what a Service does. Its methods run under the
// Service's lock, in the order of the operations, and must not call the
// Service. The daemon's metrics implement it.
type Observer interface {
	// PlanChanged reports a plan an operation returned or changed: live
	// says whether the Service still holds it, plans how many it holds.
	PlanChanged(p Plan, live bool, plans int)
	// Planned reports a plan that Plan booked without error.
	Planned(p Plan)
	// Selected reports a selection.
	Selected(op SelectOp, c Choice)
	// RankRemoved reports a worker rank that left its pool.
	RankRemoved(rank indexer.Rank)
}

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// Pool configures every pool; start from DefaultPoolConfig.
	Pool        PoolConfig
	Coordinator CoordinatorConfig
	// Source reports overlaps (the daemon's adapter of the index). A
	// source without a block size for a partition (no events yet) returns
	// 0: the Service then uses the block size the partition's engines
	// registered, with no overlaps. Nil is such a source for every
	// partition.
	Source OverlapSource
	// Observer, if set, is told of selections, plan changes and departed ranks.
	Observer Observer
	// Predicted, if set, is the side index of the blocks bookings are
	// about to hold: every booking (a reservation, a plan's decode and
	// prefill bookings) predicts its prompt's blocks on its rank until
	// its prefill completes or it ends, and for the predictions' TTL
	// after (indexer.Predictions.Book, Settle); selection scores each
	// rank by the larger of the source's overlap and the prediction
	// (indexer.Predictions.Merge). A prefill-first plan's deferred decode
	// booking (PlanDecode) is not predicted.
	Predicted *indexer.Predictions
	// Rand is the random source of selection; nil seeds a PCG at random.
	Rand Rand
	// Now is the clock of the operations; nil is time.Now.
	Now func() time.Time
	// Origin names this replica in the deltas OnBooking reports, and
	// ApplyPeer drops deltas that carry it (peers.go).
	Origin string
	// OnBooking, if set, is told of every change to a local booking, in
	// order (peers.go). It runs under the Service's lock and must not
	// block or call the Service.
	OnBooking func(BookingDelta)
	// Queue, if set, gives every pool a router queue (waiting.go): a
	// request with a Wait that finds every eligible worker over
	// QueueBusy (or the pool's own Thresholds) waits there instead of
	// failing. Nil: no request waits, and QueueBusy is ignored.
	Queue *QueueConfig
	// QueueBusy are the busy thresholds of the router queue: they filter
	// the workers of a request with a Wait only, so requests without
	// one are selected as before.
	QueueBusy Thresholds
	// QueueObserver, if set, is told what the queues do.
	QueueObserver QueueObserver
	// SessionTTL turns session affinity on (session.go): a request
	// naming a session goes back to the rank its session's last booking
	// was on, within this long, while that rank may take it. 0: off.
	SessionTTL time.Duration
	// MaxSessions bounds the sessions remembered, least recently booked
	// forgotten first; 0 is DefaultMaxSessions.
	MaxSessions int
}

// A Service is the coordinator for concurrent callers: one mutex over the
// pure core (Pools and Coordinator), as etcd's raft Node sits over
// RawNode. It reads the clock for every operation and owns what the core
// leaves to its caller:
//
//   - the engines: their dp ranks in the pools, those without an
//     endpoint, and every partition that has had one (unknown partitions
//     are a *PartitionError);
//   - reservation ids, which are global: a live id in any pool is a
//     conflict, and ReservePrefillComplete and Free find the id's pool;
//   - the last 4,096 plans it finished itself (expiry, a departed
//     worker), which Get still returns; a plan id reused by Plan is
//     forgotten there, and remembered again, as the newest, when it
//     finishes again;
//   - expiry: Expire, driven by Run.
//
// Errors wrap the package's sentinels; the typed ones (*PartitionError,
// *NoEndpointError, *EmptyPoolError, *UnschedulableError) carry what an
// HTTP layer needs to say more.
type Service struct {
	mu    sync.Mutex
	now   func() time.Time
	src   OverlapSource
	obs   Observer
	pred  *indexer.Predictions // nil: no predictions
	pools *Pools
	c     *Coordinator

	blockSizes map[indexer.PartitionKey]int // every partition that has had an engine
	engines    map[EngineKey][]indexer.Rank // the ranks each engine has in the pools
	noEndpoint map[EngineKey]PoolKey        // engines without an endpoint, by the pool they would join
	byID       map[string]PoolKey           // the pool of each reservation booked here
	finished   *simplelru.LRU[string, Plan]
	sync       peerSync // bookings shared with other replicas (peers.go)
	wait       waiting  // the router queues (waiting.go)
	sess       sessions // session affinity (session.go)
}

// NewService returns a Service with no engines.
func NewService(cfg ServiceConfig) *Service {
	rng := cfg.Rand
	if rng == nil {
		rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	obs := cfg.Observer
	if obs == nil {
		obs = nopObserver{}
	}
	finished, err := simplelru.NewLRU[string, Plan](maxFinished, nil)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	s := &Service{now: now, src: cfg.Source, obs: obs, pred: cfg.Predicted, pools: NewPools(cfg.Pool, rng),
		blockSizes: map[indexer.PartitionKey]int{}, engines: map[EngineKey][]indexer.Rank{},
		noEndpoint: map[EngineKey]PoolKey{}, byID: map[string]PoolKey{}, finished: finished}
	s.c = NewCoordinator(s.pools, serviceSource{s}, cfg.Coordinator)
	s.sync = newPeerSync(cfg.Origin, cfg.OnBooking, cfg.Pool.PeerSpread)
	s.wait = newWaiting(cfg.Queue, cfg.QueueBusy, cfg.QueueObserver)
	s.sess = newSessions(cfg.SessionTTL, cfg.MaxSessions)
	if cfg.OnBooking != nil {
		s.pools.onBook = s.booked
	}
	return s
}

type nopObserver struct{}

func (nopObserver) PlanChanged(Plan, bool, int) {}
func (nopObserver) Planned(Plan)                {}
func (nopObserver) Selected(SelectOp, Choice)   {}
func (nopObserver) RankRemoved(indexer.Rank)    {}

// serviceSource is the Service's source with the registered block size
// for partitions the source has none for. It runs with s.mu held.
type serviceSource struct{ s *Service }

func (ss serviceSource) Overlaps(model, group string, tokens []uint32, lora, salt string) ([]indexer.Overlap, int, error) {
	var ov []indexer.Overlap
	bs := 0
	if src := ss.s.src; src != nil {
		var err error
		if ov, bs, err = src.Overlaps(model, group, tokens, lora, salt); err != nil {
			return nil, 0, err
		}
	}
	return ss.s.registered(model, group, ov, bs)
}

// mergePrompt scores p's ranks with the predictions too.
func (ss serviceSource) mergePrompt(k PoolKey, p *Prompt) {
	if ss.s.pred != nil {
		p.Overlaps = ss.s.pred.Merge(indexer.PartitionKey{Model: k.Model, Group: k.Group}, p.Hashes, p.Overlaps, ss.s.now(), nil)
	}
}

func (ss serviceSource) OverlapsByHash(model, group string, hashes []uint64) ([]indexer.Overlap, int, error) {
	var ov []indexer.Overlap
	bs := 0
	if src := ss.s.src; src != nil {
		hs, ok := src.(HashOverlapSource)
		if !ok {
			return nil, 0, fmt.Errorf("%w: the overlap source cannot score block hashes", ErrInvalidPrompt)
		}
		var err error
		if ov, bs, err = hs.OverlapsByHash(model, group, hashes); err != nil {
			return nil, 0, err
		}
	}
	return ss.s.registered(model, group, ov, bs)
}

// registered passes a source's answer on, or, without a block size, the
// one the partition's engines registered.
func (s *Service) registered(model, group string, ov []indexer.Overlap, bs int) ([]indexer.Overlap, int, error) {
	if bs > 0 {
		return ov, bs, nil
	}
	if bs, ok := s.blockSizes[indexer.PartitionKey{Model: model, Group: group}]; ok {
		return nil, bs, nil
	}
	return nil, 0, fmt.Errorf("model %q routing group %q has no block size: %w", model, group, ErrNoWorkers)
}

// SetEngine brings the pools in step with e: one worker per dp rank, and
// the ranks e no longer has leave (as RemoveEngine removes them). A rank
// whose worker the pool refuses (ErrInvalidWorker, ErrWrongPool) is left
// out; the returned error joins those refusals.
func (s *Service) SetEngine(e Engine) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	now := s.now()
	key := e.Key()
	delete(s.noEndpoint, key)
	s.blockSizes[indexer.PartitionKey{Model: e.Model, Group: e.Group}] = e.BlockSize
	var ranks []indexer.Rank
	var errs []error
	if e.Endpoint == "" {
		s.noEndpoint[key] = e.Worker.Key()
	} else {
		for _, dp := range e.DPRanks {
			w := e.Worker
			w.Rank = indexer.Rank{WorkerID: e.Rank.WorkerID, DPRank: dp}
			plans, err := s.c.SetWorker(w, now)
			s.record(plans)
			if err != nil {
				errs = append(errs, fmt.Errorf("worker %v: %w", w.Rank, err))
				continue
			}
			ranks = append(ranks, w.Rank)
		}
	}
	for _, r := range s.engines[key] {
		if !slices.Contains(ranks, r) {
			s.removeRank(e.Model, e.Group, r, now)
		}
	}
	if len(ranks) == 0 {
		delete(s.engines, key)
	} else {
		s.engines[key] = ranks
	}
	return errors.Join(errs...)
}

// RemoveEngine removes every rank of engine k from its pool; plans that
// lose a booking change as Coordinator.WorkerRemoved says. The partition
// stays known.
func (s *Service) RemoveEngine(k EngineKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	now := s.now()
	for _, r := range s.engines[k] {
		s.removeRank(k.Model, k.Group, r, now)
	}
	delete(s.engines, k)
	delete(s.noEndpoint, k)
}

func (s *Service) removeRank(model, group string, r indexer.Rank, now time.Time) {
	s.record(s.c.WorkerRemoved(r, now))
	if s.pred != nil {
		s.pred.RemoveRank(indexer.PartitionKey{Model: model, Group: group}, r)
	}
	s.obs.RankRemoved(r)
}

// observe reports p to the observer and whether it is still live.
func (s *Service) observe(p Plan) bool {
	_, live := s.c.Get(p.ID)
	s.obs.PlanChanged(p, live, s.c.Len())
	return live
}

// record observes plans the Service changed on its own (expiry, engine
// changes) and remembers those that finished.
func (s *Service) record(plans []Plan) {
	for _, p := range plans {
		if !s.observe(p) {
			s.finished.Add(p.ID, p)
		}
	}
}

// Expire expires the plans and reservations stale at now (see
// Coordinator.Expire) and forgets the ids of reservations that are gone.
func (s *Service) Expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	expired := s.c.Expire(now)
	s.record(expired)
	for _, p := range expired {
		s.settle(now, p.ID+"/decode", p.ID+"/prefill")
	}
	for id, k := range s.byID {
		if p := s.pools.Pool(k); p == nil {
			delete(s.byID, id)
			s.settle(now, id)
		} else if _, ok := p.Reserved(id); !ok {
			delete(s.byID, id)
			s.settle(now, id)
		}
	}
	s.forgetExpiredPeers()
	s.expireWaiters(now)
	s.expireSessions(now)
	s.drainLocked()
}

// Run calls Expire every interval, with the tick's time, until ctx ends;
// it returns nil.
func (s *Service) Run(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.Expire(now)
		}
	}
}

// SelectRequest is one selection through the Service.
type SelectRequest struct {
	// ID is the reservation id of SelectAndReserve and Reserve; Select
	// ignores it.
	ID   string
	Pool PoolKey
	// The prompt, as in Request: token ids with their LoRA and salt, or
	// local block hashes PromptTokens long (0 = a block size per hash).
	Tokens       []uint32
	Lora, Salt   string
	Hashes       []uint64
	PromptTokens int
	// Pin, Allowed and Constraints are the Query's.
	Pin         *indexer.Rank
	Allowed     []uint64
	Constraints Constraints
	// Temperature, when set, overrides the pool's selection temperature.
	Temperature *float64
	// Fallbacks asks for up to this many next-best ranks after the
	// chosen one, in Choice.Fallbacks (Query.Fallbacks).
	Fallbacks int
	// Wait, if set, lets Enqueue and SelectAndReserveWait queue the
	// request while every eligible worker is busy (waiting.go).
	Wait *Wait
	// Session, if set, names the conversation the request belongs to:
	// with ServiceConfig.SessionTTL, SelectAndReserve, Reserve and the
	// queue's bookings keep a session on one rank while it may take the
	// request (session.go). Select and plans ignore it. An id longer than
	// MaxSessionIDLen is remembered by its hash.
	Session string
	// waits marks Enqueue's immediate booking of a request with a Wait:
	// its session's rank must be under QueueBusy too.
	waits bool
}

// A Choice is a selection made through the Service: the pool's Selection
// and the prompt it was made for.
type Choice struct {
	Selection
	// BlockSize and PromptTokens are the prompt's.
	BlockSize, PromptTokens int
	// TrackPrefillTokens says whether a booking holds prefill load until
	// ReservePrefillComplete or Free.
	TrackPrefillTokens bool
	// Fallbacks are the next-best ranks SelectRequest.Fallbacks asked
	// for, cheapest first: eligible and under the busy thresholds when
	// chosen, none of them the chosen rank, none booked. Move books the
	// request on one that ran it instead.
	Fallbacks []Selection
}

// Select chooses a worker of r.Pool and books nothing.
func (s *Service) Select(r SelectRequest) (Choice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, q, err := s.query(&r)
	if err != nil {
		return Choice{}, err
	}
	sel, fb, err := p.SelectFallbacks(q)
	if err != nil {
		return Choice{}, s.poolError(r.Pool, err)
	}
	c := choice(p, &q, sel)
	c.Fallbacks = fb
	s.obs.Selected(OpSelect, c)
	return c, nil
}

// SelectAndReserve chooses a worker of r.Pool and books r.ID on it. An id
// live in any pool is ErrDuplicateReservation.
func (s *Service) SelectAndReserve(r SelectRequest) (Choice, error) {
	return s.reserve(&r, OpSelectAndReserve)
}

// Reserve books r.ID on r.Pin, which must be set, as SelectAndReserve does.
func (s *Service) Reserve(r SelectRequest) (Choice, error) {
	if r.Pin == nil {
		return Choice{}, fmt.Errorf("reserve %q: no worker named: %w", r.ID, ErrBadPinnedRank)
	}
	return s.reserve(&r, OpReserve)
}

func (s *Service) reserve(r *SelectRequest, op SelectOp) (Choice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewID(r.ID); err != nil {
		return Choice{}, err
	}
	return s.reserveLocked(r, op)
}

// reserveLocked books r (its id checked) under s.mu.
func (s *Service) reserveLocked(r *SelectRequest, op SelectOp) (Choice, error) {
	p, q, err := s.query(r)
	if err != nil {
		return Choice{}, err
	}
	now := s.now()
	st := s.stick(r, p, &q, now)
	sel, fb, err := p.SelectAndReserveFallbacks(r.ID, q, now)
	if err != nil {
		return Choice{}, s.poolError(r.Pool, err)
	}
	s.sessionBooked(r, st, sel.Rank, now)
	if s.pred != nil {
		s.pred.Book(r.ID, indexer.PartitionKey{Model: r.Pool.Model, Group: r.Pool.Group}, sel.Rank, q.Prompt.Hashes, now)
	}
	s.byID[r.ID] = r.Pool
	c := choice(p, &q, sel)
	c.Fallbacks = fb
	s.obs.Selected(op, c)
	return c, nil
}

func choice(p *Pool, q *Query, sel Selection) Choice {
	track := p.Config().Options.TrackPrefillTokens
	if q.Options != nil {
		track = q.Options.TrackPrefillTokens
	}
	return Choice{Selection: sel, BlockSize: q.Prompt.BlockSize, PromptTokens: q.Prompt.Tokens, TrackPrefillTokens: track}
}

// query builds the pool query of r.
func (s *Service) query(r *SelectRequest) (*Pool, Query, error) {
	k := r.Pool
	if err := s.knownPartition(k.Model, k.Group); err != nil {
		return nil, Query{}, err
	}
	if pin := r.Pin; pin != nil {
		if pk, ok := s.noEndpoint[EngineKey{Model: k.Model, Group: k.Group, WorkerID: pin.WorkerID}]; ok && pk == k {
			return nil, Query{}, &NoEndpointError{Pool: k, WorkerID: pin.WorkerID}
		}
	}
	p := s.pools.Pool(k)
	if p == nil {
		return nil, Query{}, &EmptyPoolError{Pool: k, NoEndpoint: s.noEndpointIn(k)}
	}
	prompt, err := buildPrompt(serviceSource{s}, 0, k, r.Tokens, r.Lora, r.Salt, r.Hashes, r.PromptTokens)
	if err != nil {
		return nil, Query{}, err
	}
	q := Query{Prompt: prompt, Pin: ptrClone(r.Pin), Allowed: r.Allowed, Constraints: r.Constraints, Fallbacks: r.Fallbacks}
	if r.Wait != nil && s.wait.cfg != nil {
		q.busy = &s.wait.busy
	}
	if r.Temperature != nil {
		o := p.Config().Options
		o.Temperature = *r.Temperature
		q.Options = &o
	}
	return p, q, nil
}

// poolError is err of selecting in pool k, an *EmptyPoolError if the pool
// has no workers because its engines registered without an endpoint.
func (s *Service) poolError(k PoolKey, err error) error {
	if errors.Is(err, ErrNoWorkers) {
		if n := s.noEndpointIn(k); n > 0 {
			return &EmptyPoolError{Pool: k, NoEndpoint: n}
		}
	}
	return err
}

// noEndpointIn counts the engines of pool k without an endpoint.
func (s *Service) noEndpointIn(k PoolKey) int {
	n := 0
	for _, pk := range s.noEndpoint {
		if pk == k {
			n++
		}
	}
	return n
}

// knownPartition is nil if (model, group) has had an engine, else a
// *PartitionError.
func (s *Service) knownPartition(model, group string) error {
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
	e := &PartitionError{Model: model, Group: group}
	if len(groups) > 0 {
		e.Groups = slices.Sorted(maps.Keys(groups))
	} else {
		e.Models = slices.Sorted(maps.Keys(models))
	}
	return e
}

// checkNewID rejects a reservation id live in any pool.
func (s *Service) checkNewID(id string) error {
	if _, err := s.reservation(id); err == nil {
		return &textError{fmt.Sprintf("reservation %s already exists", id), ErrDuplicateReservation}
	}
	if _, ok := s.wait.tickets[id]; ok {
		return &textError{fmt.Sprintf("reservation %s already waits", id), ErrDuplicateReservation}
	}
	return nil
}

// reservation returns the pool holding reservation id, forgetting an id
// whose reservation a pool dropped.
func (s *Service) reservation(id string) (*Pool, error) {
	if k, ok := s.byID[id]; ok {
		if p := s.pools.Pool(k); p != nil {
			if _, live := p.Reserved(id); live {
				return p, nil
			}
		}
		delete(s.byID, id)
	}
	return nil, &textError{fmt.Sprintf("reservation %s not found", id), ErrReservationNotFound}
}

// ReservePrefillComplete removes reservation id's prefill tokens from its
// worker's load; an unknown id is ErrReservationNotFound.
func (s *Service) ReservePrefillComplete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	p, err := s.reservation(id)
	if err != nil {
		return err
	}
	p.PrefillComplete(id)
	s.settle(s.now(), id)
	return nil
}

// Move books live reservation id on rank to instead, a rank of the same
// pool, whatever its load (Pool.Move): the request runs there. An
// unknown or freed id is ErrReservationNotFound, a rank not in the
// reservation's pool ErrBadPinnedRank. A plan's bookings are not
// reservations the Service booked: they cannot move. The booking's
// prediction (ServiceConfig.Predicted) is settled on the rank it leaves
// and not made on the new one, whose own events report its blocks.
func (s *Service) Move(id string, to indexer.Rank) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	p, err := s.reservation(id)
	if err != nil {
		return err
	}
	from, _ := p.Reserved(id)
	if !p.Move(id, to) {
		return fmt.Errorf("move %s to %v: not in pool %v: %w", id, to, p.Key(), ErrBadPinnedRank)
	}
	if from != to {
		s.settle(s.now(), id)
	}
	return nil
}

// Free releases reservation id; an unknown or freed id is
// ErrReservationNotFound.
func (s *Service) Free(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	p, err := s.reservation(id)
	if err != nil {
		return err
	}
	p.Free(id)
	delete(s.byID, id)
	s.settle(s.now(), id)
	return nil
}

// Plan books r as Coordinator.Plan does, after checking that both of its
// partitions are known (else a *PartitionError and no plan). An
// ErrNoWorkers in a pool whose engines all lack an endpoint is an
// *UnschedulableError.
func (s *Service) Plan(r Request) (Plan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := []PoolKey{{Model: r.Model, Group: r.DecodeGroup, Role: RoleDecode}, {Model: r.Model, Group: r.PrefillGroup, Role: RolePrefill}}
	for _, k := range keys {
		if err := s.knownPartition(k.Model, k.Group); err != nil {
			return Plan{}, err
		}
	}
	if _, ok := s.c.Get(r.ID); !ok {
		s.finished.Remove(r.ID) // a new plan reuses a finished id
	}
	p, err := s.c.Plan(r, s.now())
	s.observe(p)
	if err != nil {
		if errors.Is(err, ErrNoWorkers) {
			var empty []EmptyPoolError
			for _, k := range keys {
				if n := s.noEndpointIn(k); n > 0 && s.emptyPool(k) {
					empty = append(empty, EmptyPoolError{Pool: k, NoEndpoint: n})
				}
			}
			if empty != nil {
				err = &UnschedulableError{Err: err, Pools: empty}
			}
		}
		return p, err
	}
	if s.pred != nil {
		s.predictPlan(&r, p)
	}
	s.obs.Planned(p)
	return p, nil
}

// predictPlan predicts r's prompt on the ranks plan p booked: the prefill
// worker computes its KV, the decode worker receives it.
func (s *Service) predictPlan(r *Request, p Plan) {
	now := s.now()
	for _, b := range []*Booking{p.Decode, p.Prefill} {
		if b == nil {
			continue
		}
		k := indexer.PartitionKey{Model: b.Pool.Model, Group: b.Pool.Group}
		hashes := r.Hashes
		if len(hashes) == 0 {
			bs, ok := s.blockSizes[k]
			if !ok {
				continue
			}
			hashes = indexer.HashBlocks(nil, r.Tokens, bs, indexer.Seed(r.Lora, r.Salt))
		}
		s.pred.Book(b.ID, k, b.Rank, hashes, now)
	}
}

// settle ends the pending time of the predictions of reservation ids.
func (s *Service) settle(now time.Time, ids ...string) {
	if s.pred == nil {
		return
	}
	for _, id := range ids {
		s.pred.Settle(id, now)
	}
}

// emptyPool reports whether pool k has no workers (or does not exist).
func (s *Service) emptyPool(k PoolKey) bool {
	p := s.pools.Pool(k)
	return p == nil || len(p.Ranks()) == 0
}

// PrefillComplete is Coordinator.PrefillComplete.
func (s *Service) PrefillComplete(id string) (Plan, error) {
	return s.planOp(id, s.c.PrefillComplete)
}

// PlanDecode is Coordinator.PlanDecode: a deferred prefill-first plan's
// decode booking.
func (s *Service) PlanDecode(id string) (Plan, error) { return s.planOp(id, s.c.PlanDecode) }

// PrefillFailed is Coordinator.PrefillFailed.
func (s *Service) PrefillFailed(id string) (Plan, error) { return s.planOp(id, s.c.PrefillFailed) }

// Release is Coordinator.Release: the plan is not remembered for Get.
func (s *Service) Release(id string) (Plan, error) { return s.planOp(id, s.c.Release) }

// planOp runs op on live plan id; an unknown id is ErrPlanNotFound,
// without a plan.
func (s *Service) planOp(id string, op func(string, time.Time) (Plan, error)) (Plan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	now := s.now()
	p, err := op(id, now)
	s.settle(now, id+"/decode", id+"/prefill")
	if p.ID != "" {
		s.observe(p)
	}
	if errors.Is(err, ErrPlanNotFound) {
		return Plan{}, &textError{fmt.Sprintf("plan %s not found", id), ErrPlanNotFound}
	}
	return p, err
}

// Reservations returns how many reservations every pool holds (plain
// ones and plans' bookings).
func (s *Service) Reservations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.c.Pools().Keys() {
		n += s.c.Pools().Pool(k).Reservations()
	}
	return n
}

// Get returns live plan id, or one the Service finished itself (expiry, a
// departed worker) among the last 4,096. It changes nothing.
func (s *Service) Get(id string) (Plan, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.c.Get(id); ok {
		return p, true
	}
	return s.finished.Peek(id)
}
