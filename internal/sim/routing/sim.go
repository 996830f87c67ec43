package routing

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/cursor"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

// The fleet's model and routing group.
const (
	model = "mooncake"
	group = catalog.DefaultRoutingGroup
)

// epoch is the virtual clock's start.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// engine is one simulated engine: the mocker's pool and scheduler, driven
// step by step, and its event stream as the daemon receives it.
type engine struct {
	idx   int
	rank  indexer.Rank
	role  coordinator.Role
	pool  *mocker.Pool
	sched *mocker.Scheduler

	stepping bool      // a step runs until until
	until    time.Time // end of the running step
	busy     time.Duration

	// inflight is the requests routed here and not finished, as each
	// replica's router counts them (by replica).
	inflight []int

	// pubSeq numbers the engine's event batches; every replica receives
	// each one (replica.feeds).
	pubSeq uint64
}

// replica is one router of a replicated deployment: requests are spread
// over the replicas round-robin, and each routes its share with its own
// state: its own coordinator.Service (only its own bookings), its own
// index built from every engine's events after its own delay, its own
// predictions, its own router. Nothing is shared between replicas but the
// engines; with one replica the simulation is the single router's.
//
// Two ways for replicas to agree, each optional:
//   - Config.ScrapeInterval: every engine's own load reported to each
//     replica (Service.SetEngineLoad) at its scrapes (sim.scrape).
//   - Config.Sync: each booking's delta (ServiceConfig.OnBooking)
//     applied on every other replica (Service.ApplyPeer) SyncDelay
//     later (sim.sync).
type replica struct {
	i int
	// delay is how long engines' events take to reach this replica's
	// index: Config.EventDelay, plus a spread for every replica but the
	// first (replicaDelays).
	delay   time.Duration
	router  router
	svc     *coordinator.Service // the KV-aware policies'
	ix      *indexer.Index
	applier *stream.IndexApplier
	pred    *indexer.Predictions
	// feeds is each engine's event stream as this replica receives it,
	// by engine.
	feeds []*feed
	// nextScrape is the replica's next reading of the engines' load
	// (zero: it does not scrape); lastScrape its latest.
	nextScrape, lastScrape time.Time
	// origin names the replica in its booking deltas (Config.Sync).
	origin string
}

// peerDelta is a booking delta on its way to the other replicas.
type peerDelta struct {
	due time.Time
	d   coordinator.BookingDelta
}

// feed is one engine's event stream at one replica: published batches
// wait in inbox until their delivery time, then go through the cursor to
// the replica's index.
type feed struct {
	inbox []delivery
	head  int
	cur   *cursor.Cursor
}

type delivery struct {
	due     time.Time
	seq     uint64
	payload []byte
}

// stage is where a request is.
type stage uint8

const (
	stageOne     stage = iota // aggregated: one sequence does it all
	stagePrefill              // disaggregated: prefilling on the prefill engine
	stageDecode               // disaggregated: decoding on the decode engine
)

type request struct {
	i       int
	id      string
	arrival time.Time
	tokens  []uint32
	output  int

	stage   stage
	replica int // the router it arrived at
	engine  int // of the current sequence
	seq     *mocker.Seq
	decode  int    // Disagg: the plan's decode engine
	hit     int    // prompt tokens served by a prefix cache
	session string // PrefixdSession: the conversation (Sessions)

	firstToken, finished time.Time
	failed               bool
}

// router routes aggregated requests (every policy but Disagg).
type router interface {
	route(r *request) (int, error)
	prefilled(r *request)
	done(r *request)
}

type sim struct {
	cfg      Config
	policy   Policy
	now      time.Time
	rng      *rand.Rand
	engines  []*engine
	byRank   map[indexer.Rank]int
	reqs     []*request
	next     int // next arrival
	bySeq    map[*mocker.Seq]*request
	replicas []*replica
	nextExp  time.Time // next Service.Expire

	// The events' codec and the work of every replica's index (KV-aware
	// policies only).
	enc    wire.Encoder
	dec    wire.Decoder
	batch  wire.Batch
	work   IndexWork
	events bool // publish events to the indexes

	bypass int

	// Booking sync (Config.Sync): deltas in the order the replicas
	// reported them, which is their due order (one delay for all);
	// syncHead is the first not yet delivered.
	syncQ    []peerDelta
	syncHead int
	syncBuf  []coordinator.BookingDelta
	// peerDropped counts deltas a replica refused; scrapeErrors engine
	// loads a replica refused.
	peerDropped, scrapeErrors int

	// waiting are the requests a replica's router queue holds
	// (PrefixdQueued), in arrival order.
	waiting []queued
	queued  int // requests that waited

	// stepped, if set, is called after each instant of the replay (tests).
	stepped func()
}

func newSim(cfg Config, reqs []trace.Request, prompts [][]uint32, policy Policy) (*sim, error) {
	s := &sim{cfg: cfg, policy: policy, now: epoch, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed)),
		byRank: map[indexer.Rank]int{}, bySeq: map[*mocker.Seq]*request{}}
	phases := cfg.scrapePhases()
	for i, d := range cfg.replicaDelays() {
		s.replicas = append(s.replicas, &replica{i: i, delay: d, origin: "replica-" + strconv.Itoa(i)})
		if cfg.ScrapeInterval > 0 {
			s.replicas[i].nextScrape = epoch.Add(phases[i])
		}
	}
	prefill := 0
	if policy == Disagg {
		prefill = cfg.prefillEngines()
	}
	for i := range cfg.Engines {
		pool, err := mocker.NewPool(cfg.TotalBlocks, cfg.BlockSize)
		if err != nil {
			return nil, err
		}
		sched, err := mocker.NewScheduler(pool, cfg.Timing)
		if err != nil {
			return nil, err
		}
		role := coordinator.RoleAggregated
		if policy == Disagg {
			role = coordinator.RoleDecode
			if i < prefill {
				role = coordinator.RolePrefill
			}
		}
		e := &engine{idx: i, rank: indexer.Rank{WorkerID: uint64(i + 1)}, role: role, pool: pool, sched: sched,
			inflight: make([]int, len(s.replicas))}
		s.engines = append(s.engines, e)
		s.byRank[e.rank] = i
		for _, rep := range s.replicas {
			f := &feed{cur: cursor.New(cursor.Config{})}
			f.cur.Connected(epoch)
			rep.feeds = append(rep.feeds, f)
		}
	}
	arrival := cfg.arrivals(reqs)
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(arrival[a], arrival[b]) })
	var sessions []string
	if policy == PrefixdSession {
		sessions = Sessions(reqs)
	}
	for k, i := range order {
		r := reqs[i]
		s.reqs = append(s.reqs, &request{i: i, id: strconv.Itoa(i), tokens: prompts[i], output: max(r.OutputLength, 1),
			arrival: epoch.Add(time.Duration(float64(arrival[i]) / cfg.Speedup)), replica: k % len(s.replicas)})
		if sessions != nil {
			s.reqs[k].session = sessions[i]
		}
	}
	return s, s.setPolicy()
}

// setPolicy gives every replica its router. Random and consistent
// hashing keep no state, so the replicas share one; round-robin and
// least-loaded count per replica, as separate routers do.
func (s *sim) setPolicy() error {
	var shared router
	switch s.policy {
	case Random:
		shared = randomRouter{s}
	case ConsistentHash:
		shared = newRing(s, 64)
	}
	for _, rep := range s.replicas {
		switch s.policy {
		case Random, ConsistentHash:
			rep.router = shared
		case RoundRobin:
			rep.router = &roundRobin{s: s}
		case LeastLoaded:
			rep.router = leastLoaded{s: s, rep: rep.i}
		case Approx, Prefixd, PrefixdPredicted, Oracle, Disagg, PrefixdQueued, PrefixdSession:
			if err := s.newService(rep); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown policy %q", s.policy)
		}
	}
	return nil
}

// newService sets up rep's coordinator service over the source the policy
// reads: its own index, predictions and bookings.
func (s *sim) newService(rep *replica) error {
	pcfg := coordinator.DefaultPoolConfig()
	pcfg.Options = s.cfg.Options
	pcfg.PeerSpread = s.cfg.PeerSpread
	// The first replica draws the single router's numbers; the others
	// their own.
	scfg := coordinator.ServiceConfig{Pool: pcfg, Now: func() time.Time { return s.now },
		Rand: rand.New(rand.NewPCG(s.cfg.Seed^1, s.cfg.Seed^2^uint64(rep.i)))}
	switch s.policy {
	case Prefixd, PrefixdPredicted, Disagg, PrefixdQueued, PrefixdSession:
		s.events = true
		rep.ix = indexer.New(indexer.Options{})
		k := indexer.PartitionKey{Model: model, Group: group}
		if err := rep.ix.AddPartition(k, s.cfg.BlockSize); err != nil {
			return err
		}
		rep.applier = &stream.IndexApplier{Index: rep.ix, Partition: k}
		scfg.Source = coordinator.IndexOverlaps{Index: rep.ix}
		if s.policy == PrefixdPredicted {
			rep.pred = indexer.NewPredictions(s.cfg.PredictedTTL, 0, 0)
		}
	case Approx:
		rep.pred = indexer.NewPredictions(s.cfg.ApproxTTL, s.cfg.ApproxTTL, 1<<30)
	case Oracle:
		scfg.Source = oracle{s}
	}
	scfg.Predicted = rep.pred
	if s.policy == PrefixdQueued || s.policy == PrefixdSession {
		q := s.cfg.Queue
		q.MaxLen, q.MaxWait = max(q.MaxLen, len(s.reqs)), max(q.MaxWait, time.Hour*24*365)
		scfg.Queue = &q
		scfg.QueueBusy.PrefillTokensFrac = s.cfg.QueueThreshold
	}
	if s.policy == PrefixdSession {
		scfg.SessionTTL = s.cfg.SessionTTL
	}
	if s.cfg.Sync && len(s.replicas) > 1 {
		// OnBooking runs under the Service's lock: it only queues the
		// delta, and sim.sync applies it at the others once due.
		scfg.Origin = rep.origin
		scfg.OnBooking = func(d coordinator.BookingDelta) {
			s.syncQ = append(s.syncQ, peerDelta{due: s.now.Add(s.cfg.SyncDelay), d: d})
		}
	}
	rep.svc = coordinator.NewService(scfg)
	for _, e := range s.engines {
		w := catalog.Worker{WorkerID: e.rank.WorkerID, ModelName: model, RoutingGroup: group,
			Endpoint: "sim://engine-" + strconv.Itoa(e.idx), BlockSize: uint32(s.cfg.BlockSize)}
		w.TotalKVBlocks, w.MaxNumBatchedTokens = uint64(s.cfg.TotalBlocks), uint64(e.sched.Timing().MaxNumBatchedTokens)
		w.Role = catalog.Role(e.role.String())
		if err := rep.svc.SetRecord(w.WithDefaults()); err != nil {
			return fmt.Errorf("engine %d: %w", e.idx, err)
		}
	}
	switch s.policy {
	case Disagg:
	case PrefixdQueued, PrefixdSession:
		rep.router = queuedRouter{svcRouter{s: s, svc: rep.svc}}
	default:
		rep.router = svcRouter{s: s, svc: rep.svc}
	}
	return nil
}

// run replays the trace to its end: every request arrived and ended.
func (s *sim) run() error {
	for {
		t, ok := s.nextTime()
		if !ok {
			break
		}
		if t.After(s.now) {
			s.now = t
		}
		s.finishSteps()
		s.deliver()
		s.sync()
		if !s.now.Before(s.nextExp) {
			for _, rep := range s.replicas {
				if rep.svc != nil {
					rep.svc.Expire(s.now)
				}
			}
			s.nextExp = s.now.Add(time.Second)
		}
		for s.next < len(s.reqs) && !s.reqs[s.next].arrival.After(s.now) {
			s.sync() // bookings of requests arrived at this instant
			s.arrive(s.reqs[s.next])
			s.next++
		}
		s.placeWaiting()
		for _, e := range s.engines {
			if !e.stepping {
				s.plan(e)
			}
		}
		s.sync()
		if s.placeWaiting() { // placed by the bookings just synced
			for _, e := range s.engines {
				if !e.stepping {
					s.plan(e)
				}
			}
		}
		// Scrapes read the engines as this instant leaves them: every
		// request booked until now is in the engine's figure, as the
		// rule assumes of a booking made at or before the figure's time.
		for _, rep := range s.replicas {
			if !rep.nextScrape.IsZero() && !rep.nextScrape.After(s.now) {
				s.scrape(rep)
			}
		}
		if s.stepped != nil {
			s.stepped()
		}
	}
	for _, r := range s.reqs {
		if r.finished.IsZero() && !r.failed {
			return fmt.Errorf("request %s never finished", r.id)
		}
	}
	return nil
}

// nextTime is the time of the next thing to happen: an arrival, the end of
// a step, a KV transfer's end on an idle engine, an event delivery.
func (s *sim) nextTime() (time.Time, bool) {
	var t time.Time
	ok := false
	take := func(x time.Time) {
		if !ok || x.Before(t) {
			t, ok = x, true
		}
	}
	if s.next < len(s.reqs) {
		take(s.reqs[s.next].arrival)
	}
	for _, e := range s.engines {
		if e.stepping {
			take(e.until)
		} else if at, has := e.sched.NextTransfer(); has {
			take(at)
		}
	}
	for _, rep := range s.replicas {
		for _, f := range rep.feeds {
			if f.head < len(f.inbox) {
				take(f.inbox[f.head].due)
			}
		}
	}
	if s.syncHead < len(s.syncQ) {
		take(s.syncQ[s.syncHead].due)
	}
	if !ok {
		return t, false // scrapes alone do not keep the replay going
	}
	for _, rep := range s.replicas {
		if !rep.nextScrape.IsZero() {
			take(rep.nextScrape)
		}
	}
	return t, ok
}

// scrape reads every engine's load as its /metrics reports it (the
// mocker's Scheduler.Load, Load.Queued waiting) into rep's Service, as of
// now, and schedules rep's next scrape.
func (s *sim) scrape(rep *replica) {
	for !rep.nextScrape.After(s.now) {
		rep.nextScrape = rep.nextScrape.Add(s.cfg.ScrapeInterval)
	}
	rep.lastScrape = s.now
	if rep.svc == nil {
		return
	}
	for _, e := range s.engines {
		l := e.sched.Load()
		k := coordinator.EngineKey{Model: model, Group: group, WorkerID: e.rank.WorkerID}
		if err := rep.svc.SetEngineLoad(k, e.rank.DPRank, coordinator.EngineLoad{At: s.now, Running: l.Running,
			Waiting: l.Queued(), KVUsage: l.KVUsage}); err != nil {
			s.scrapeErrors++
		}
	}
}

// sync delivers the booking deltas due now to every replica but their
// origin, in the order they were reported.
func (s *sim) sync() {
	end := s.syncHead
	for end < len(s.syncQ) && !s.syncQ[end].due.After(s.now) {
		end++
	}
	if end == s.syncHead {
		return
	}
	due := s.syncQ[s.syncHead:end]
	for _, rep := range s.replicas {
		s.syncBuf = s.syncBuf[:0]
		for _, p := range due {
			if p.d.Origin != rep.origin {
				s.syncBuf = append(s.syncBuf, p.d)
			}
		}
		if len(s.syncBuf) > 0 {
			_, dropped := rep.svc.ApplyPeer(s.syncBuf)
			s.peerDropped += dropped
		}
	}
	clear(due)
	s.syncHead = end
	if s.syncHead == len(s.syncQ) {
		s.syncQ, s.syncHead = s.syncQ[:0], 0
	}
}

// plan starts the next step of an idle engine, if it has work.
func (s *sim) plan(e *engine) {
	st := e.sched.Plan(s.now)
	for _, q := range st.Ended {
		s.ended(e, q)
	}
	if st.Empty() {
		s.publish(e) // admissions may have evicted
		return
	}
	e.stepping, e.until = true, s.now.Add(st.Duration)
	e.busy += st.Duration
}

// finishSteps ends the steps due now.
func (s *sim) finishSteps() {
	for _, e := range s.engines {
		if !e.stepping || e.until.After(s.now) {
			continue
		}
		e.stepping = false
		for _, q := range e.sched.Finish(s.now) {
			r := s.bySeq[q]
			if r == nil {
				continue
			}
			if q.Output == 1 && q.FirstToken.Equal(s.now) {
				s.firstToken(r, q)
			}
			if q.State == mocker.SeqDone {
				s.ended(e, q)
			}
		}
		s.publish(e)
	}
}

// publish sends the engine's pending KV events as one batch to every
// replica, each receiving it after its own delay (the payload is shared:
// nothing writes to it).
func (s *sim) publish(e *engine) {
	evs := e.pool.Events()
	if len(evs) == 0 || !s.events {
		return
	}
	b := wire.Batch{TS: float64(s.now.UnixNano()) / 1e9, Events: evs}
	payload, err := s.enc.AppendBatch(nil, &b)
	if err != nil {
		s.work.ApplyErrors++
		return
	}
	for _, rep := range s.replicas {
		f := rep.feeds[e.idx]
		f.inbox = append(f.inbox, delivery{due: s.now.Add(rep.delay), seq: e.pubSeq, payload: payload})
	}
	e.pubSeq++
}

// deliver applies the batches due now, in order, through each stream's
// cursor at each replica, as a subscriber does.
func (s *sim) deliver() {
	for _, rep := range s.replicas {
		for _, e := range s.engines {
			f := rep.feeds[e.idx]
			for f.head < len(f.inbox) && !f.inbox[f.head].due.After(s.now) {
				d := f.inbox[f.head]
				f.inbox[f.head] = delivery{}
				f.head++
				for _, a := range f.cur.Live(d.seq, d.payload, s.now) {
					s.act(rep, e, a)
				}
			}
			if f.head == len(f.inbox) {
				f.inbox, f.head = f.inbox[:0], 0
			}
		}
		if rep.ix != nil {
			s.work.MaxEntries = max(s.work.MaxEntries, rep.ix.Entries())
		}
	}
}

func (s *sim) act(rep *replica, e *engine, a cursor.Action) {
	switch a.Kind {
	case cursor.ActApply:
		if err := s.dec.Decode(a.Payload, &s.batch); err != nil {
			s.work.ApplyErrors++
			return
		}
		s.work.Batches++
		s.work.Events += uint64(len(s.batch.Events))
		for i := range s.batch.Events {
			ev := &s.batch.Events[i]
			s.work.Blocks += uint64(len(ev.BlockHashes))
			if ev.Kind == wire.KindBlockRemoved {
				s.work.Removed += uint64(len(ev.BlockHashes))
			}
		}
		if err := rep.applier.ApplyBatch(e.rank, indexer.Mark{Seq: a.Seq, Digest: a.Digest}, &s.batch); err != nil {
			s.work.ApplyErrors++
		}
	default:
		// A gap or a reset: impossible on a lossless in-order stream.
		s.work.ApplyErrors++
	}
}

// arrive routes a request that arrives now.
func (s *sim) arrive(r *request) {
	if s.policy == Disagg {
		s.arriveDisagg(r)
		return
	}
	i, err := s.replicas[r.replica].router.route(r)
	switch {
	case errors.Is(err, errQueued):
		return
	case err != nil:
		r.failed = true
		return
	}
	s.start(r, i, &mocker.Seq{Tokens: r.tokens, MaxTokens: r.output})
}

// placeWaiting starts the queued requests their replica placed since the
// last call (PrefixdQueued), now, and fails those it shed.
func (s *sim) placeWaiting() bool {
	if len(s.waiting) == 0 {
		return false
	}
	n := len(s.waiting)
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		select {
		case <-w.t.Done():
		default:
			kept = append(kept, w)
			continue
		}
		c, err := w.t.Result()
		if err != nil {
			w.r.failed = true
			continue
		}
		s.start(w.r, s.byRank[c.Rank], &mocker.Seq{Tokens: w.r.tokens, MaxTokens: w.r.output})
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
	return len(kept) < n
}

// start adds r's sequence q to engine i.
func (s *sim) start(r *request, i int, q *mocker.Seq) {
	e := s.engines[i]
	r.engine, r.seq = i, q
	if err := e.sched.Add(q, s.now); err != nil {
		s.fail(r)
		return
	}
	e.inflight[r.replica]++
	s.bySeq[q] = r
}

func (s *sim) firstToken(r *request, q *mocker.Seq) {
	switch r.stage {
	case stageOne:
		r.firstToken = s.now
		s.replicas[r.replica].router.prefilled(r)
	case stageDecode:
		r.firstToken = s.now
	}
}

// ended handles a sequence that finished or was refused.
func (s *sim) ended(e *engine, q *mocker.Seq) {
	r := s.bySeq[q]
	if r == nil {
		return
	}
	delete(s.bySeq, q)
	e.inflight[r.replica]--
	if q.Err != nil {
		s.fail(r)
		return
	}
	switch r.stage {
	case stageOne:
		r.hit, r.finished = q.CachedTokens, s.now
		s.replicas[r.replica].router.done(r)
	case stagePrefill:
		r.hit = q.CachedTokens
		s.prefillDone(r)
	case stageDecode:
		r.finished = s.now
		s.release(r)
	}
}

func (s *sim) fail(r *request) {
	r.failed = true
	switch {
	case s.policy == Disagg:
		s.release(r)
	case s.replicas[r.replica].router != nil:
		s.replicas[r.replica].router.done(r)
	}
}

// result summarises the run.
func (s *sim) result() Result {
	res := Result{Policy: s.policy, Replicas: len(s.replicas), Speedup: s.cfg.Speedup, Weight: s.cfg.Options.OverlapCredit,
		Requests: len(s.reqs), Bypass: s.bypass, PeerDropped: s.peerDropped, ScrapeErrors: s.scrapeErrors, Queued: s.queued}
	for _, rep := range s.replicas {
		if rep.svc != nil {
			st := rep.svc.SessionStats()
			res.SessionHits += int(st.Hits)
			res.SessionMoves += int(st.Moves)
		}
	}
	var ttft, e2e []float64
	var prompt, hit, out int
	var last time.Time
	first := s.reqs[0].arrival
	for _, r := range s.reqs {
		if r.failed {
			res.Failed++
			continue
		}
		res.Completed++
		ttft = append(ttft, ms(r.firstToken.Sub(r.arrival)))
		e2e = append(e2e, ms(r.finished.Sub(r.arrival)))
		prompt += len(r.tokens)
		hit += min(r.hit, len(r.tokens))
		out += r.output
		if r.finished.After(last) {
			last = r.finished
		}
	}
	lastArrival := s.reqs[len(s.reqs)-1].arrival
	if span := lastArrival.Sub(first).Seconds(); span > 0 {
		res.OfferedRPS = float64(len(s.reqs)) / span
		// Throughput over the arrival window: what the fleet completed
		// while requests kept coming. Past saturation the backlog grows
		// and it falls behind the offered rate.
		byLast := 0
		for _, r := range s.reqs {
			if !r.failed && !r.finished.After(lastArrival) {
				byLast++
			}
		}
		res.ThroughputRPS = float64(byLast) / span
	}
	if d := last.Sub(first).Seconds(); d > 0 {
		res.OutputTPS = float64(out) / d
	}
	if prompt > 0 {
		res.HitRate = float64(hit) / float64(prompt)
	}
	// Sorted: TTFTs feed the CDFs, and the means add up in this order.
	slices.Sort(ttft)
	slices.Sort(e2e)
	res.TTFT, res.E2E = summarize(ttft), summarize(e2e)
	res.TTFTs = ttft
	var busy []time.Duration
	for _, e := range s.engines {
		if s.policy != Disagg || e.role == coordinator.RolePrefill {
			busy = append(busy, e.busy)
		}
	}
	var sum, peak time.Duration
	for _, b := range busy {
		sum += b
		peak = max(peak, b)
	}
	if sum > 0 {
		res.Imbalance = float64(peak) / (float64(sum) / float64(len(busy)))
	}
	// The indexes' work adds up over the replicas; their entries are the
	// largest replica's.
	for _, rep := range s.replicas {
		if rep.svc != nil {
			res.Bookings += rep.svc.Reservations()
		}
	}
	if s.events {
		w := s.work
		for _, rep := range s.replicas {
			w.Entries = max(w.Entries, rep.ix.Entries())
			if rep.pred != nil {
				w.Predicted = max(w.Predicted, rep.pred.Len())
			}
		}
		res.Index = &w
	}
	res.Virtual = s.now.Sub(epoch).Seconds()
	return res
}
