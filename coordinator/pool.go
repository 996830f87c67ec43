package coordinator

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// Defaults of PoolConfig and CoordinatorConfig.
const (
	// DefaultReservationTTL is how long a reservation lives without being
	// freed (Dynamo's DEFAULT_ACTIVE_REQUEST_EXPIRY_DURATION).
	DefaultReservationTTL = 300 * time.Second
	// DefaultMaxReservations bounds a pool's live reservations.
	DefaultMaxReservations = 1 << 16
)

// Rand is the random source of selection: tie-breaks at temperature 0 and
// softmax draws otherwise. *math/rand/v2.Rand satisfies it; a seeded source
// makes selection reproducible.
type Rand interface {
	Float64() float64
	IntN(n int) int
}

// Options are the per-request parameters of the cost function of Dynamo
// lib/kv-router/src/scheduling/selector/default.rs (which a request
// overrides with router_config_override). DefaultOptions returns Dynamo's defaults; the
// zero value is not useful.
type Options struct {
	// OverlapCredit weighs device-tier overlap blocks. 0 ignores prefix
	// matching entirely (no host or disk credit either); > 1 gives extra credit.
	OverlapCredit float64
	// OverlapCreditDecay shrinks the device credit on workers carrying more
	// prefill load than the least-loaded candidate (only when prefill tokens are tracked).
	OverlapCreditDecay float64
	// PrefillLoadScale multiplies the prefill term, after the credit.
	PrefillLoadScale float64
	// DecodeActiveRequestWeight is the cost of each active request.
	DecodeActiveRequestWeight float64
	// HostWeight and DiskWeight credit blocks that extend the device prefix
	// in host memory and on disk.
	HostWeight float64
	DiskWeight float64
	// Temperature 0 picks the cheapest worker (ties at random); T > 0
	// samples a softmax over range-normalised costs.
	Temperature float64
	// AssumeKVReuse books the prompt's blocks by sequence hash, so blocks
	// already active on the worker count once. Without it every block is
	// booked as new.
	AssumeKVReuse bool
	// TrackPrefillTokens adds the effective prefill tokens to the worker's
	// prefill load until PrefillComplete or Free.
	TrackPrefillTokens bool
	// DecodeCostRule applies the decode-worker cost of conditional
	// disaggregation when prefill tokens are not tracked and the credit is
	// positive: max(0, decode blocks − credit) + active-request cost.
	DecodeCostRule bool
}

// DefaultOverlapWeight is the OverlapCredit prefixd serves with
// (prefixd serve --overlap-weight): on the Mooncake production trace it
// raises the prefix-cache hit rate at every load level over Dynamo's 1,
// with the same TTFT (docs/benchmarks.md, make bench-routing).
const DefaultOverlapWeight = 2

// ServedOptions returns the options prefixd serves with: DefaultOptions
// with OverlapCredit DefaultOverlapWeight.
func ServedOptions() Options {
	o := DefaultOptions()
	o.OverlapCredit = DefaultOverlapWeight
	return o
}

// DefaultOptions returns Dynamo's defaults: credit 1, no decay, prefill
// scale 1, request weight 0, host 0.75, disk 0.25, temperature 0, KV reuse
// assumed and prefill tokens tracked.
func DefaultOptions() Options {
	return Options{
		OverlapCredit:      1,
		PrefillLoadScale:   1,
		HostWeight:         0.75,
		DiskWeight:         0.25,
		AssumeKVReuse:      true,
		TrackPrefillTokens: true,
	}
}

// Thresholds are the busy thresholds that filter workers before scoring.
// A value ≤ 0 disables its check. The prefill checks combine with OR.
type Thresholds struct {
	// DecodeBlocksFrac: busy when active blocks > frac · TotalKVBlocks
	// (skipped for a worker with unknown TotalKVBlocks).
	DecodeBlocksFrac float64
	// PrefillTokens: busy when active prefill tokens > this many.
	PrefillTokens int
	// PrefillTokensFrac: busy when active prefill tokens > frac · MaxNumBatchedTokens
	// (skipped for a worker with unknown MaxNumBatchedTokens).
	PrefillTokensFrac float64
}

// PoolConfig configures a pool. Start from DefaultPoolConfig.
type PoolConfig struct {
	// Options are the defaults of a Query with nil Options.
	Options    Options
	Thresholds Thresholds
	// ReservationTTL: a reservation not freed within it is dropped by
	// Expire. Zero means DefaultReservationTTL.
	ReservationTTL time.Duration
	// MaxReservations bounds live reservations. Zero means DefaultMaxReservations.
	MaxReservations int
	// PeerSpread spreads the choices of a replica that shares its
	// bookings with peers (Service.ApplyPeer): while a Service holds any
	// peer, a selection at temperature 0 samples
	// p_i ∝ exp(−(c_i − c_min) / (PeerSpread · blocks)), blocks being the
	// prompt's complete blocks (at least 1). Replicas that route requests
	// arriving together see the same fleet, and at temperature 0 each
	// would send its request to the same cheapest engine before any
	// peer's booking reaches it; spread in units of the request's own
	// size, they share out engines that cost about the same while an
	// engine ahead by a cached prefix keeps its request. 0 disables it; a
	// Pool outside a Service never spreads.
	PeerSpread float64
}

// DefaultPeerSpread is the PeerSpread prefixd serves with (serve
// --peer-spread): on the routing benchmark's second trace eight replicas
// sharing bookings 1 ms late then keep one router's hit rate and TTFT at
// every load, which they do not at 0 (docs/benchmarks.md, make
// bench-replicas).
const DefaultPeerSpread = 0.1

// DefaultPoolConfig returns DefaultOptions, no thresholds, no peer spread and the default TTL and cap.
func DefaultPoolConfig() PoolConfig {
	return PoolConfig{Options: DefaultOptions(), ReservationTTL: DefaultReservationTTL, MaxReservations: DefaultMaxReservations}
}

// Prompt is what selection knows of a request's prompt.
type Prompt struct {
	// Tokens is the input sequence length.
	Tokens int
	// BlockSize is the KV block size in tokens; it must be positive.
	BlockSize int
	// Hashes are the local block hashes of the prompt's complete blocks; the
	// pool books their sequence hashes (indexer.HashSequence).
	Hashes []uint64
	// Overlaps are the cached prefix lengths per rank, in blocks, tiers
	// cumulative (Device ≤ Host ≤ Disk). Ranks absent have no overlap.
	Overlaps []indexer.Overlap
}

// NewPrompt hashes tokens into a Prompt with the block size and the LoRA and
// cache-namespace salt of indexer.Seed. overlaps is kept, not copied.
func NewPrompt(tokens []uint32, blockSize int, lora, salt string, overlaps []indexer.Overlap) Prompt {
	return Prompt{
		Tokens:    len(tokens),
		BlockSize: blockSize,
		Hashes:    indexer.HashBlocks(nil, tokens, blockSize, indexer.Seed(lora, salt)),
		Overlaps:  overlaps,
	}
}

// Query is one selection request to a pool.
type Query struct {
	Prompt Prompt
	// Options nil means the pool's defaults.
	Options *Options
	// Pin, when set, is the only candidate; it is never rerouted.
	Pin *indexer.Rank
	// Allowed restricts candidates to these worker ids; empty allows all.
	Allowed     []uint64
	Constraints Constraints
	// busy, if set, are further busy thresholds for this query (the
	// Service's router queue, for a request that may wait).
	busy *Thresholds
	// prefer, if set and a candidate after every filter, is chosen
	// without sampling (the Service's session affinity, session.go).
	prefer *indexer.Rank
	// Fallbacks asks for up to this many next-best ranks after the
	// chosen one (SelectFallbacks, SelectAndReserveFallbacks): the
	// candidates that passed every filter, cheapest first, the chosen
	// rank never among them. 0 asks for none and costs nothing.
	Fallbacks int
}

// Selection is the outcome of a selection: the chosen rank and its view of
// the request, measured before any booking.
type Selection struct {
	Rank indexer.Rank
	// Endpoint is the chosen worker's Endpoint.
	Endpoint string
	Cost     float64
	// Overlap is the chosen rank's entry of Prompt.Overlaps (zero if absent).
	Overlap indexer.Overlap
	// CachedTokens is the tier-weighted credit in tokens (not rounded to a
	// block); EffectivePrefillTokens = max(0, Prompt.Tokens − CachedTokens).
	CachedTokens           float64
	EffectivePrefillTokens float64
	// The rank's load if the request were booked there.
	PotentialPrefillTokens int
	PotentialDecodeBlocks  int
	ActiveRequests         int
}

// Load is a rank's booked load.
type Load struct {
	// Blocks counts distinct booked blocks (shared prefixes once).
	Blocks        int
	PrefillTokens int
	Requests      int
}

// Freed names a reservation dropped by Expire or RemoveWorker.
type Freed struct {
	Pool PoolKey
	ID   string
	Rank indexer.Rank
}

type workerState struct {
	w       Worker
	taints  []string // sorted
	refs    map[uint64]int
	private int // blocks booked without KV reuse
	prefill int
	reqs    int
	eng     engineState // the engine's figure and bookings since (engineload.go)
}

func (ws *workerState) blocks() int { return len(ws.refs) + ws.private }

func (ws *workerState) load() Load {
	return Load{Blocks: ws.blocks(), PrefillTokens: ws.prefill, Requests: ws.reqs}
}

func (ws *workerState) hasTaint(t string) bool {
	_, ok := slices.BinarySearch(ws.taints, t)
	return ok
}

type reservation struct {
	id      string
	rank    indexer.Rank
	seq     []uint64
	private int
	prefill int
	created time.Time
	peer    bool // booked by another replica (ApplyPeer): never reported to onBook
	fresh   int  // blocks the booking added to its rank (engineload.go)
	since   bool // counted on top of its rank's engine figure
}

// Pool is the workers of one (model, group, role) and their bookings. It
// selects workers, books reservations refcounted by sequence hash and
// filters busy workers, as Dynamo's scheduling and sequences modules do
// (lib/kv-router/src/{scheduling,sequences}). It is not safe for
// concurrent use; it does no I/O and reads no clock: every time-dependent
// method takes now.
type Pool struct {
	key     PoolKey
	cfg     PoolConfig
	rng     Rand
	workers map[indexer.Rank]*workerState
	order   []indexer.Rank // sorted, for reproducible selection
	res     map[string]*reservation
	// onBook, if set, is told of every change to a local reservation
	// (peers.go); Pools sets it on the pools it creates.
	onBook func(PoolKey, BookingOp, *reservation)
	// spread, if set, is the PeerSpread in force (Pools.spread): nonzero
	// only while the Service holds peers.
	spread *float64
}

// NewPool returns an empty pool. rng must not be nil.
func NewPool(key PoolKey, cfg PoolConfig, rng Rand) *Pool {
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = DefaultReservationTTL
	}
	if cfg.MaxReservations <= 0 {
		cfg.MaxReservations = DefaultMaxReservations
	}
	return &Pool{key: key, cfg: cfg, rng: rng, workers: map[indexer.Rank]*workerState{}, res: map[string]*reservation{}}
}

// Key is the pool's (model, group, role).
func (p *Pool) Key() PoolKey { return p.key }

// Config returns the pool's configuration (with defaults filled in).
func (p *Pool) Config() PoolConfig { return p.cfg }

// SetWorker adds w or replaces its metadata, keeping its bookings. w is copied.
func (p *Pool) SetWorker(w Worker) error {
	if w.Key() != p.key {
		return fmt.Errorf("set worker %v of %v in pool %v: %w", w.Rank, w.Key(), p.key, ErrWrongPool)
	}
	if w.TotalKVBlocks < 0 || w.MaxNumBatchedTokens < 0 {
		return fmt.Errorf("set worker %v: negative capacity: %w", w.Rank, ErrInvalidWorker)
	}
	w = w.clone()
	if ws, ok := p.workers[w.Rank]; ok {
		ws.w, ws.taints = w, w.AllTaints()
		return nil
	}
	p.workers[w.Rank] = &workerState{w: w, taints: w.AllTaints(), refs: map[uint64]int{}}
	i, _ := slices.BinarySearchFunc(p.order, w.Rank, cmpRank)
	p.order = slices.Insert(p.order, i, w.Rank)
	return nil
}

// RemoveWorker removes rank and frees its reservations, returned sorted by
// id. Removing an unknown rank does nothing. A worker added again starts empty.
func (p *Pool) RemoveWorker(rank indexer.Rank) []Freed {
	if _, ok := p.workers[rank]; !ok {
		return nil
	}
	var freed []Freed
	for id, r := range p.res {
		if r.rank == rank {
			freed = append(freed, Freed{Pool: p.key, ID: id, Rank: rank})
		}
	}
	sortFreed(freed)
	for _, f := range freed {
		p.Free(f.ID)
	}
	delete(p.workers, rank)
	i, _ := slices.BinarySearchFunc(p.order, rank, cmpRank)
	p.order = slices.Delete(p.order, i, i+1)
	return freed
}

// Worker returns a copy of rank's metadata.
func (p *Pool) Worker(rank indexer.Rank) (Worker, bool) {
	ws, ok := p.workers[rank]
	if !ok {
		return Worker{}, false
	}
	return ws.w.clone(), true
}

// Ranks returns the pool's ranks in order; the slice is the caller's.
func (p *Pool) Ranks() []indexer.Rank { return slices.Clone(p.order) }

// Load returns rank's booked load.
func (p *Pool) Load(rank indexer.Rank) (Load, bool) {
	ws, ok := p.workers[rank]
	if !ok {
		return Load{}, false
	}
	return ws.load(), true
}

// Total sums the load of every rank.
func (p *Pool) Total() Load {
	var t Load
	for _, ws := range p.workers {
		l := ws.load()
		t.Blocks += l.Blocks
		t.PrefillTokens += l.PrefillTokens
		t.Requests += l.Requests
	}
	return t
}

// Reservations returns the number of live reservations.
func (p *Pool) Reservations() int { return len(p.res) }

// Reserved reports the rank holding reservation id.
func (p *Pool) Reserved(id string) (indexer.Rank, bool) {
	r, ok := p.res[id]
	if !ok {
		return indexer.Rank{}, false
	}
	return r.rank, true
}

// Overloaded reports whether rank is over a busy threshold.
func (p *Pool) Overloaded(rank indexer.Rank) bool {
	ws, ok := p.workers[rank]
	return ok && p.overloaded(ws)
}

func (p *Pool) overloaded(ws *workerState) bool { return over(ws, &p.cfg.Thresholds) }

// overloadedFor is overloaded with q's further thresholds.
func (p *Pool) overloadedFor(ws *workerState, q *Query) bool {
	return p.overloaded(ws) || q.busy != nil && over(ws, q.busy)
}

// over reports whether ws is over a threshold of t.
func over(ws *workerState, t *Thresholds) bool {
	if t.DecodeBlocksFrac > 0 && ws.w.TotalKVBlocks > 0 && float64(ws.effBlocks()) > t.DecodeBlocksFrac*float64(ws.w.TotalKVBlocks) {
		return true
	}
	if t.PrefillTokens > 0 && ws.prefill > t.PrefillTokens {
		return true
	}
	return t.PrefillTokensFrac > 0 && ws.w.MaxNumBatchedTokens > 0 && float64(ws.prefill) > t.PrefillTokensFrac*float64(ws.w.MaxNumBatchedTokens)
}

func (p *Pool) eligible(ws *workerState, q *Query) bool {
	if len(q.Allowed) > 0 && !slices.Contains(q.Allowed, ws.w.Rank.WorkerID) {
		return false
	}
	for _, t := range q.Constraints.Required {
		if !ws.hasTaint(t) {
			return false
		}
	}
	return true
}

// candidates applies the filters in Dynamo's order
// (lib/kv-router/src/scheduling/filter.rs): pin validation, the allow-set
// and required taints, then the busy thresholds.
func (p *Pool) candidates(q *Query) ([]*workerState, error) {
	if len(p.workers) == 0 {
		return nil, fmt.Errorf("pool %v: %w", p.key, ErrNoWorkers)
	}
	if q.Pin != nil {
		ws, ok := p.workers[*q.Pin]
		switch {
		case !ok:
			return nil, fmt.Errorf("pool %v pin %v: %w", p.key, *q.Pin, ErrBadPinnedRank)
		case !p.eligible(ws, q):
			return nil, fmt.Errorf("pool %v pin %v: %w", p.key, *q.Pin, ErrPinnedNotAllowed)
		case p.overloadedFor(ws, q):
			return nil, fmt.Errorf("pool %v pin %v: %w", p.key, *q.Pin, ErrPinnedOverloaded)
		}
		return []*workerState{ws}, nil
	}
	var out []*workerState
	filtered := 0
	for _, r := range p.order {
		ws := p.workers[r]
		if !p.eligible(ws, q) {
			filtered++
			continue
		}
		if !p.overloadedFor(ws, q) {
			out = append(out, ws)
		}
	}
	switch {
	case filtered == len(p.order):
		return nil, fmt.Errorf("pool %v: %w", p.key, ErrAllFiltered)
	case len(out) == 0:
		return nil, fmt.Errorf("pool %v: %w", p.key, ErrAllOverloaded)
	}
	return out, nil
}

// Select chooses a worker for q without booking anything (advisory).
func (p *Pool) Select(q Query) (Selection, error) {
	s, _, _, err := p.sel(&q)
	return s, err
}

// SelectFallbacks is Select with the next-best ranks q.Fallbacks asks
// for, cheapest first; the slice is the caller's.
func (p *Pool) SelectFallbacks(q Query) (Selection, []Selection, error) {
	s, fb, _, err := p.sel(&q)
	return s, fb, err
}

type scored struct {
	ws   *workerState
	sel  Selection
	cost float64
}

func (p *Pool) options(q *Query) Options {
	if q.Options != nil {
		return *q.Options
	}
	return p.cfg.Options
}

// sel scores q's candidates and samples one; with q.Fallbacks it also
// returns the next-best candidates by cost, from the same scores.
func (p *Pool) sel(q *Query) (Selection, []Selection, []uint64, error) {
	if q.Prompt.BlockSize <= 0 {
		return Selection{}, nil, nil, fmt.Errorf("pool %v: block size %d: %w", p.key, q.Prompt.BlockSize, ErrInvalidPrompt)
	}
	cands, err := p.candidates(q)
	if err != nil {
		return Selection{}, nil, nil, err
	}
	opt := p.options(q)
	seq := indexer.HashSequence(nil, q.Prompt.Hashes)
	minPrefill := math.MaxInt
	for _, ws := range cands {
		minPrefill = min(minPrefill, ws.prefill)
	}
	sc := make([]scored, len(cands))
	for i, ws := range cands {
		sc[i] = p.score(ws, q, &opt, seq, minPrefill)
	}
	i := preferred(sc, q.prefer)
	switch {
	case i >= 0:
	case p.spread != nil && *p.spread > 0 && opt.Temperature <= 0:
		i = spreadSample(sc, *p.spread*float64(max(1, len(seq))), p.rng)
	default:
		i = sample(sc, opt.Temperature, p.rng)
	}
	var fb []Selection
	if q.Fallbacks > 0 && len(sc) > 1 {
		fb = nextBest(sc, i, q.Fallbacks)
	}
	return sc[i].sel, fb, seq, nil
}

// preferred is the index of rank in sc, or -1 (also for a nil rank).
func preferred(sc []scored, rank *indexer.Rank) int {
	if rank != nil {
		for i := range sc {
			if sc[i].ws.w.Rank == *rank {
				return i
			}
		}
	}
	return -1
}

// nextBest returns up to n selections of sc other than chosen, cheapest
// first; equal costs keep the pool's rank order. It selects n times over
// sc (n is small: the gateway tries a handful of endpoints).
func nextBest(sc []scored, chosen, n int) []Selection {
	n = min(n, len(sc)-1)
	out := make([]Selection, 0, n)
	taken := make([]bool, len(sc))
	taken[chosen] = true
	for range n {
		best := -1
		for j := range sc {
			if !taken[j] && (best < 0 || sc[j].cost < sc[best].cost) {
				best = j
			}
		}
		taken[best] = true
		out = append(out, sc[best].sel)
	}
	return out
}

func (p *Pool) score(ws *workerState, q *Query, opt *Options, seq []uint64, minPrefill int) scored {
	bs := float64(q.Prompt.BlockSize)
	isl := float64(q.Prompt.Tokens)
	n := len(seq)
	var ov indexer.Overlap
	for _, o := range q.Prompt.Overlaps {
		if o.Rank == ws.w.Rank {
			ov = o
			break
		}
	}
	dev := float64(ov.Device)
	host := float64(max(ov.Host, ov.Device) - ov.Device)
	disk := float64(max(ov.Disk, ov.Host, ov.Device) - max(ov.Host, ov.Device))
	credit := 0.0
	if opt.OverlapCredit > 0 {
		decay := 1.0
		if opt.TrackPrefillTokens && opt.OverlapCreditDecay > 0 && n > 0 {
			decay = 1 / (1 + opt.OverlapCreditDecay*(float64(ws.prefill-minPrefill)/bs)/float64(n))
		}
		credit = opt.OverlapCredit*decay*dev + opt.HostWeight*host + opt.DiskWeight*disk
	}
	depth := 0
	if opt.AssumeKVReuse {
		for depth < n && ws.refs[seq[depth]] > 0 {
			depth++
		}
	}
	potDecode := ws.effBlocks() + n - depth
	raw := (float64(ws.prefill) + isl) / bs
	reqCost := opt.DecodeActiveRequestWeight * float64(ws.effReqs())
	cost := opt.PrefillLoadScale*max(0, raw-credit) + float64(potDecode) + reqCost
	if opt.DecodeCostRule && !opt.TrackPrefillTokens && credit > 0 {
		cost = max(0, float64(potDecode)-credit) + reqCost
	}
	var w float64
	for t, wt := range q.Constraints.Preferred {
		if ws.hasTaint(t) {
			w += wt
		}
	}
	cost *= math.Exp(-math.Tanh(w))
	cached := credit * bs
	eff := max(0, isl-cached)
	potPrefill := ws.prefill
	if opt.TrackPrefillTokens {
		potPrefill += effTokens(q.Prompt.Tokens, cached)
	}
	return scored{ws: ws, cost: cost, sel: Selection{
		Rank: ws.w.Rank, Endpoint: ws.w.Endpoint, Cost: cost, Overlap: ov, CachedTokens: cached, EffectivePrefillTokens: eff,
		PotentialPrefillTokens: potPrefill, PotentialDecodeBlocks: potDecode, ActiveRequests: ws.effReqs(),
	}}
}

// effTokens is the integer prefill load of a booking: prompt tokens less the
// whole cached tokens, never negative.
func effTokens(tokens int, cached float64) int {
	c := math.Floor(cached)
	if c >= float64(tokens) {
		return 0
	}
	return tokens - int(c)
}

// sample picks an index of sc (non-empty): the argmin at temperature 0 with
// ties broken by rng, else a softmax over range-normalised costs
// p_i ∝ exp(−(c_i − c_min) / ((c_max − c_min) · T)), uniform when all equal.
func sample(sc []scored, temp float64, rng Rand) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range sc {
		lo, hi = min(lo, s.cost), max(hi, s.cost)
	}
	if temp <= 0 || hi == lo {
		var ties []int
		for i, s := range sc {
			if temp > 0 || s.cost == lo {
				ties = append(ties, i)
			}
		}
		return ties[rng.IntN(len(ties))]
	}
	// Halves keep the range finite even for extreme finite costs.
	span := hi/2 - lo/2
	w := make([]float64, len(sc))
	var sum float64
	for i, s := range sc {
		w[i] = math.Exp(-((s.cost/2 - lo/2) / span) / temp)
		sum += w[i]
	}
	r := rng.Float64() * sum
	for i, x := range w {
		if r < x {
			return i
		}
		r -= x
	}
	return len(sc) - 1
}

// spreadSample picks an index of sc (non-empty) with
// p_i ∝ exp(−(c_i − c_min) / scale), scale > 0: a softmax on an absolute
// scale, unlike sample's range-normalised one, so an engine's chance does
// not depend on how far the worst candidate is.
func spreadSample(sc []scored, scale float64, rng Rand) int {
	lo := math.Inf(1)
	for _, s := range sc {
		lo = min(lo, s.cost)
	}
	var sum float64
	for _, s := range sc {
		sum += math.Exp(-(s.cost - lo) / scale)
	}
	r := rng.Float64() * sum
	for i, s := range sc {
		if r -= math.Exp(-(s.cost - lo) / scale); r < 0 {
			return i
		}
	}
	return len(sc) - 1
}

// SelectAndReserve selects as Select does and books the request on the
// chosen rank under id. A live reservation with the same id is a conflict
// (ErrDuplicateReservation); at the cap it fails with ErrTooManyReservations.
// Neither books anything.
func (p *Pool) SelectAndReserve(id string, q Query, now time.Time) (Selection, error) {
	s, _, err := p.SelectAndReserveFallbacks(id, q, now)
	return s, err
}

// SelectAndReserveFallbacks is SelectAndReserve with the next-best ranks
// q.Fallbacks asks for (as SelectFallbacks), of which none is booked.
func (p *Pool) SelectAndReserveFallbacks(id string, q Query, now time.Time) (Selection, []Selection, error) {
	if _, dup := p.res[id]; dup {
		return Selection{}, nil, fmt.Errorf("pool %v reserve %q: %w", p.key, id, ErrDuplicateReservation)
	}
	if len(p.res) >= p.cfg.MaxReservations {
		return Selection{}, nil, fmt.Errorf("pool %v reserve %q: %d live: %w", p.key, id, len(p.res), ErrTooManyReservations)
	}
	s, fb, seq, err := p.sel(&q)
	if err != nil {
		return Selection{}, nil, err
	}
	opt := p.options(&q)
	ws := p.workers[s.Rank]
	r := &reservation{id: id, rank: s.Rank, created: now}
	if opt.AssumeKVReuse {
		r.seq = seq
		for _, h := range seq {
			if ws.refs[h]++; ws.refs[h] == 1 {
				r.fresh++
			}
		}
	} else {
		r.private = len(seq)
		ws.private += r.private
		r.fresh = r.private
	}
	if opt.TrackPrefillTokens {
		r.prefill = effTokens(q.Prompt.Tokens, s.CachedTokens)
		ws.prefill += r.prefill
	}
	ws.reqs++
	ws.booked(r, false)
	p.res[id] = r
	p.booked(BookingAdmit, r)
	return s, fb, nil
}

// Move moves live reservation id to rank, a worker of the pool, with
// everything it books (its blocks, its prefill tokens if its prefill has
// not completed, its request), whatever rank's load: the request already
// runs there (a gateway fell back to it). It reports false, changing
// nothing, for an unknown id or rank; moving to the rank that holds it
// changes nothing and reports true.
func (p *Pool) Move(id string, rank indexer.Rank) bool {
	r, ok := p.res[id]
	to, known := p.workers[rank]
	if !ok || !known {
		return false
	}
	if r.rank == rank {
		return true
	}
	from := p.workers[r.rank]
	from.unbook(r)
	r.fresh = r.private
	for _, h := range r.seq {
		if from.refs[h]--; from.refs[h] <= 0 {
			delete(from.refs, h)
		}
		if to.refs[h]++; to.refs[h] == 1 {
			r.fresh++
		}
	}
	from.private -= r.private
	to.private += r.private
	from.prefill -= r.prefill
	to.prefill += r.prefill
	from.reqs--
	to.reqs++
	p.booked(BookingFree, r)
	r.rank = rank
	p.booked(BookingAdmit, r)
	to.booked(r, true)
	return true
}

// PrefillComplete removes reservation id's prefill tokens from its worker's
// prefill load. It reports whether anything changed: false for an unknown
// id or a second call.
func (p *Pool) PrefillComplete(id string) bool {
	r, ok := p.res[id]
	if !ok || r.prefill == 0 {
		return false
	}
	p.prefillDone(r)
	p.booked(BookingPrefilled, r)
	return true
}

func (p *Pool) prefillDone(r *reservation) {
	p.workers[r.rank].prefill -= r.prefill
	r.prefill = 0
}

// Free releases reservation id (implying PrefillComplete). It is
// idempotent: it reports false, changing nothing, for an unknown or already
// freed id.
func (p *Pool) Free(id string) bool {
	r, ok := p.res[id]
	if !ok {
		return false
	}
	p.prefillDone(r)
	ws := p.workers[r.rank]
	ws.unbook(r)
	for _, h := range r.seq {
		if ws.refs[h]--; ws.refs[h] <= 0 {
			delete(ws.refs, h)
		}
	}
	ws.private -= r.private
	ws.reqs--
	delete(p.res, id)
	p.booked(BookingFree, r)
	return true
}

// Expire frees every reservation created at least ReservationTTL before
// now and returns them sorted by id. It scans all live reservations.
func (p *Pool) Expire(now time.Time) []Freed {
	var freed []Freed
	for id, r := range p.res {
		if !now.Before(r.created.Add(p.cfg.ReservationTTL)) {
			freed = append(freed, Freed{Pool: p.key, ID: id, Rank: r.rank})
		}
	}
	sortFreed(freed)
	for _, f := range freed {
		p.Free(f.ID)
	}
	return freed
}

func sortFreed(f []Freed) {
	sort.Slice(f, func(i, j int) bool { return f[i].ID < f[j].ID })
}

func cmpRank(a, b indexer.Rank) int {
	if a.WorkerID != b.WorkerID {
		if a.WorkerID < b.WorkerID {
			return -1
		}
		return 1
	}
	return int(a.DPRank) - int(b.DPRank)
}
