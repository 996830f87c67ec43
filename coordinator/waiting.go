package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The Service's router queue. With ServiceConfig.Queue set, a
// SelectAndReserve whose request carries a Wait and finds every eligible
// worker of its pool over the busy thresholds (ErrAllOverloaded) waits in
// the pool's Queue instead of failing. Whenever capacity may have freed
// (a prefill completes, a booking is freed or expires, an engine joins or
// reports its load, a peer's booking ends) the Service walks its queues in
// their order and places what fits, each on the cache state of that
// moment: the overlaps are read again, not kept from arrival.

// Wait lets a SelectAndReserve wait in its pool's queue.
type Wait struct {
	// Priority orders the queue: higher first. A negative priority is
	// sheddable: shed first when the queue is full.
	Priority int
	// Deadline, if set, is when the request stops waiting; the queue's
	// MaxWait applies too, whichever is earlier.
	Deadline time.Time
}

// WaitOutcome is how a request left its pool's queue.
type WaitOutcome uint8

const (
	// WaitPlaced: booked on a worker.
	WaitPlaced WaitOutcome = iota
	// WaitShed: pushed out by a request of higher priority, or refused
	// on arrival because the queue was full (ErrQueueFull).
	WaitShed
	// WaitExpired: its deadline or the queue's MaxWait passed (ErrWaitExpired).
	WaitExpired
	// WaitCancelled: its caller left (Cancel).
	WaitCancelled
	// WaitFailed: its placement failed for another reason (its pool or
	// partition went away).
	WaitFailed
)

var waitOutcomeNames = []string{WaitPlaced: "placed", WaitShed: "shed", WaitExpired: "expired", WaitCancelled: "cancelled", WaitFailed: "failed"}

func (o WaitOutcome) String() string { return nameOf(waitOutcomeNames, o, "WaitOutcome") }

// QueueObserver is told what the router queues do. It runs under the
// Service's lock and must not block or call the Service.
type QueueObserver interface {
	// Waited reports a request that left k's queue after waiting d; a
	// request refused on arrival reports WaitShed with d = 0.
	Waited(k PoolKey, priority int, d time.Duration, o WaitOutcome)
	// QueueLen reports the length of k's queue after it changed.
	QueueLen(k PoolKey, n int)
}

// ErrWaitCancelled: the caller of a waiting request left (Cancel).
var ErrWaitCancelled = errors.New("wait cancelled")

// A ShedError is a request the queue would not hold: refused on arrival
// or pushed out (wrapping ErrQueueFull), or past its deadline
// (ErrWaitExpired). RetryAfter is the queue's estimate of when to try
// again.
type ShedError struct {
	Pool       PoolKey
	Priority   int
	RetryAfter time.Duration
	Err        error
}

func (e *ShedError) Error() string {
	return fmt.Sprintf("pool %v priority %d: %v (retry after %v)", e.Pool, e.Priority, e.Err, e.RetryAfter)
}

func (e *ShedError) Unwrap() error { return e.Err }

// A Ticket is a request waiting in a pool's queue (Enqueue). Done is
// closed once it left the queue; Result then says how.
type Ticket struct {
	id       string
	pool     PoolKey
	priority int
	r        SelectRequest
	arrived  time.Time
	passed   int // younger waiters placed while this one was compared
	done     chan struct{}
	c        Choice
	err      error
}

// Done is closed when the request left the queue.
func (t *Ticket) Done() <-chan struct{} { return t.done }

// Result is the request's booking, or why it has none; valid once Done
// is closed.
func (t *Ticket) Result() (Choice, error) { return t.c, t.err }

// ID is the request's reservation id.
func (t *Ticket) ID() string { return t.id }

// maxLookahead bounds how many waiters one pass over a queue tries that
// do not fit (their allow-set or constraints name only busy workers)
// before it stops: a pass costs at most this many failed selections.
const maxLookahead = 4

// waiting is the Service's share of the router queues, guarded by
// Service.mu.
type waiting struct {
	cfg     *QueueConfig // nil: no queue
	busy    Thresholds   // ServiceConfig.QueueBusy
	obs     QueueObserver
	queues  map[PoolKey]*Queue
	tickets map[string]*Ticket // by reservation id
	window  []*Ticket          // placeNext's compared waiters (reused)
	bestFit int                // bestFit (tests lower it)
}

// newWaiting keeps a copy of cfg; NewQueue checks it when a pool's
// queue is first made, and Enqueue returns its error.
func newWaiting(cfg *QueueConfig, busy Thresholds, obs QueueObserver) waiting {
	w := waiting{busy: busy, obs: obs, queues: map[PoolKey]*Queue{}, tickets: map[string]*Ticket{}, bestFit: bestFit}
	if cfg != nil {
		c := *cfg
		w.cfg = &c
	}
	return w
}

// Enqueue books r as SelectAndReserve does. When r.Wait is set, the
// Service has a queue and every worker of r's pool is over the queue's
// busy thresholds (QueueBusy), r waits instead: Enqueue returns a Ticket
// and books nothing yet. While some worker is not, r is selected among
// all its pool's workers, busy ones included, exactly as without a
// queue: the thresholds decide when to wait, not where a request that
// need not wait goes. A pool with waiters queues every newcomer that
// waits, so none overtakes the queue's order; it is placed at once if
// it comes first. A waiter is placed on a worker under the thresholds. A
// full queue returns a *ShedError, with nothing booked.
func (s *Service) Enqueue(r SelectRequest) (Choice, *Ticket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewID(r.ID); err != nil {
		return Choice{}, nil, err
	}
	if r.Wait == nil || s.wait.cfg == nil || r.Pin != nil || !s.mustWait(r.Pool) {
		direct := r
		direct.Wait = nil
		direct.waits = r.Wait != nil && s.wait.cfg != nil
		c, err := s.reserveLocked(&direct, OpSelectAndReserve)
		return c, nil, err
	}
	t, err := s.push(&r)
	if err != nil {
		return Choice{}, nil, err
	}
	s.drainLocked()
	return Choice{}, t, nil
}

// mustWait reports whether a request of pool k that may wait must: its
// pool has waiters, or every one of its workers is busy.
func (s *Service) mustWait(k PoolKey) bool {
	if q := s.wait.queues[k]; q != nil && q.Len() > 0 {
		return true
	}
	p := s.pools.Pool(k)
	return p != nil && p.saturated(&s.wait.busy)
}

// push queues r in its pool's queue.
func (s *Service) push(r *SelectRequest) (*Ticket, error) {
	k := r.Pool
	q := s.wait.queues[k]
	if q == nil {
		var err error
		if q, err = NewQueue(*s.wait.cfg); err != nil {
			return nil, err
		}
		s.wait.queues[k] = q
	}
	now := s.now()
	work, prompt, err := s.uncachedWork(r)
	if err != nil {
		return nil, err
	}
	t := &Ticket{id: r.ID, pool: k, priority: r.Wait.Priority, r: *r, arrived: now, done: make(chan struct{})}
	// The waiter is scored again at every placement: keep its block
	// hashes, not its tokens, so that it is looked up, not hashed,
	// each time.
	if _, byHash := s.src.(HashOverlapSource); (s.src == nil || byHash) && len(prompt.Hashes) > 0 && t.r.Tokens != nil {
		t.r.Tokens, t.r.Lora, t.r.Salt = nil, "", ""
		t.r.Hashes, t.r.PromptTokens = prompt.Hashes, prompt.Tokens
	}
	shed, err := q.Push(Waiter{ID: r.ID, Priority: r.Wait.Priority, Work: work, Arrived: now, Deadline: r.Wait.Deadline}, now)
	if err != nil {
		if s.wait.obs != nil {
			o := WaitShed
			if errors.Is(err, ErrWaitExpired) {
				o = WaitExpired
			}
			s.wait.obs.Waited(k, r.Wait.Priority, 0, o)
		}
		return nil, shedError(k, q, r.Wait.Priority, err, now)
	}
	s.wait.tickets[r.ID] = t
	for _, w := range shed {
		if st := s.wait.tickets[w.ID]; st != nil {
			delete(s.wait.tickets, w.ID)
			s.finish(st, Choice{}, shedError(k, q, w.Priority, ErrQueueFull, now), WaitShed, now)
		}
	}
	if s.wait.obs != nil {
		s.wait.obs.QueueLen(k, q.Len())
	}
	return t, nil
}

// uncachedWork is r's prompt tokens less the longest device-tier prefix
// any rank caches: the shortest-work order's key.
func (s *Service) uncachedWork(r *SelectRequest) (float64, Prompt, error) {
	_, q, err := s.query(r)
	if err != nil {
		return 0, Prompt{}, err
	}
	best := 0
	for _, o := range q.Prompt.Overlaps {
		best = max(best, int(o.Device))
	}
	return float64(max(0, q.Prompt.Tokens-best*q.Prompt.BlockSize)), q.Prompt, nil
}

// finish ends t's wait with (c, err); t is out of its queue already.
func (s *Service) finish(t *Ticket, c Choice, err error, o WaitOutcome, now time.Time) {
	t.c, t.err = c, err
	close(t.done)
	if s.wait.obs != nil {
		s.wait.obs.Waited(t.pool, t.priority, now.Sub(t.arrived), o)
	}
}

// drainLocked places what fits of every queue. It runs under s.mu after
// every change that may free capacity.
func (s *Service) drainLocked() {
	if len(s.wait.tickets) == 0 {
		return
	}
	now := s.now()
	for k, q := range s.wait.queues {
		if q.Len() == 0 {
			continue
		}
		for s.placeNext(k, q, now) {
		}
	}
}

// bestFit is how many waiters, at the head of the queue's order, a
// shortest-work placement compares (placeNext), and how often a compared
// waiter may be overtaken by younger ones. On the routing bench at ×16,
// 16 compared waiters left the hit rate at prefixd's without a queue;
// 128 raised it above approximate prefix affinity's (docs/benchmarks.md).
const bestFit = 128

// placeNext places one waiter of k's queue, reporting whether it did.
// Under FCFS the first waiter that fits goes. Under shortest-work the
// first bestFit waiters of the queue's order are compared: the one whose
// prompt the free workers cache the most of (the least uncached prefill
// on the worker selection picks) goes, so a freed worker takes the
// request it serves best; but a compared waiter that younger ones have
// overtaken bestFit times goes first (the oldest such), so none is
// overtaken more than bestFit times once compared. Waiters that fit
// nowhere (their allow-set names only busy workers) are passed over, at
// most maxLookahead of them.
func (s *Service) placeNext(k PoolKey, q *Queue, now time.Time) bool {
	if p := s.pools.Pool(k); p != nil && p.saturated(&s.wait.busy) {
		return false
	}
	if s.wait.cfg.Order == QueueFCFS {
		misses := 0
		for w := range q.All(now) {
			t := s.wait.tickets[w.ID]
			c, err := s.reserveLocked(&t.r, OpSelectAndReserve)
			if errors.Is(err, ErrAllOverloaded) {
				if misses++; misses >= maxLookahead {
					return false
				}
				continue
			}
			s.placed(q, t, c, err, now)
			return true
		}
		return false
	}
	var best, due *Ticket
	bestWork := 0.0
	s.wait.window = s.wait.window[:0]
	for w := range q.All(now) {
		t := s.wait.tickets[w.ID]
		p, qq, err := s.query(&t.r)
		if err != nil {
			s.placed(q, t, Choice{}, err, now)
			return true
		}
		s.wait.window = append(s.wait.window, t)
		if t.passed >= s.wait.bestFit && (due == nil || t.arrived.Before(due.arrived)) {
			due = t
		}
		if sel, err := p.Select(qq); err == nil && (best == nil || sel.EffectivePrefillTokens < bestWork) {
			best, bestWork = t, sel.EffectivePrefillTokens
		}
		if len(s.wait.window) >= s.wait.bestFit {
			break
		}
	}
	if due != nil {
		best = due
	}
	if best == nil {
		return false
	}
	c, err := s.reserveLocked(&best.r, OpSelectAndReserve)
	if errors.Is(err, ErrAllOverloaded) {
		return false
	}
	for _, t := range s.wait.window {
		if t != best && t.arrived.Before(best.arrived) {
			t.passed++
		}
	}
	s.placed(q, best, c, err, now)
	return true
}

// placed takes t out of q with its booking c, or err.
func (s *Service) placed(q *Queue, t *Ticket, c Choice, err error, now time.Time) {
	o := WaitPlaced
	if err != nil {
		o = WaitFailed
	}
	s.withdraw(t, c, err, o, now)
}

// withdraw takes waiting t out of its queue and ends its wait with
// (c, err).
func (s *Service) withdraw(t *Ticket, c Choice, err error, o WaitOutcome, now time.Time) {
	q := s.wait.queues[t.pool]
	q.Remove(t.id)
	delete(s.wait.tickets, t.id)
	s.finish(t, c, err, o, now)
	if s.wait.obs != nil {
		s.wait.obs.QueueLen(t.pool, q.Len())
	}
}

// shedError is the *ShedError of a request of priority p that k's queue
// q turns away with err (ErrQueueFull, ErrWaitExpired).
func shedError(k PoolKey, q *Queue, p int, err error, now time.Time) *ShedError {
	return &ShedError{Pool: k, Priority: p, RetryAfter: q.RetryAfter(p, now), Err: err}
}

// expireWaiters sheds the waiters past their deadline at now.
func (s *Service) expireWaiters(now time.Time) {
	for k, q := range s.wait.queues {
		gone := q.Expire(now)
		for _, w := range gone {
			t := s.wait.tickets[w.ID]
			if t == nil {
				continue
			}
			delete(s.wait.tickets, w.ID)
			s.finish(t, Choice{}, shedError(k, q, w.Priority, ErrWaitExpired, now), WaitExpired, now)
		}
		if len(gone) > 0 && s.wait.obs != nil {
			s.wait.obs.QueueLen(k, q.Len())
		}
	}
}

// Cancel withdraws t, whose caller left. A request still waiting leaves
// its queue (its Result is ErrWaitCancelled) and Cancel reports true; one
// placed already has its reservation freed, so nothing stays booked for a
// caller that is gone.
func (s *Service) Cancel(t *Ticket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wait.tickets[t.id] == t {
		s.withdraw(t, Choice{}, fmt.Errorf("reservation %s: %w", t.id, ErrWaitCancelled), WaitCancelled, s.now())
		return true
	}
	if t.err == nil {
		if p, err := s.reservation(t.id); err == nil {
			p.Free(t.id)
			delete(s.byID, t.id)
			s.settle(s.now(), t.id)
			s.drainLocked()
		}
	}
	return false
}

// SelectAndReserveWait is Enqueue, then waits for a queued request's
// placement until ctx ends or the request's deadline passes (its
// *ShedError wraps ErrWaitExpired). A ctx that ends first cancels the
// request and returns ctx's error; nothing stays booked.
func (s *Service) SelectAndReserveWait(ctx context.Context, r SelectRequest) (Choice, error) {
	c, t, err := s.Enqueue(r)
	if t == nil {
		return c, err
	}
	var expire <-chan time.Time
	if d, ok := s.deadline(t); ok {
		timer := time.NewTimer(d.Sub(s.now()))
		defer timer.Stop()
		expire = timer.C
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		if s.Cancel(t) {
			return Choice{}, fmt.Errorf("reservation %s waiting: %w", t.id, ctx.Err())
		}
		<-t.done
		if _, err := t.Result(); err == nil {
			return Choice{}, fmt.Errorf("reservation %s placed after its caller left: %w", t.id, ctx.Err())
		}
	case <-expire:
		s.mu.Lock()
		s.expireWaiters(s.now())
		if s.wait.tickets[t.id] == t { // the clock is behind the timer
			now := s.now()
			s.withdraw(t, Choice{}, shedError(t.pool, s.wait.queues[t.pool], t.priority, ErrWaitExpired, now), WaitExpired, now)
		}
		s.mu.Unlock()
		<-t.done
	}
	return t.Result()
}

// deadline is when t stops waiting, if it still does.
func (s *Service) deadline(t *Ticket) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wait.tickets[t.id] != t {
		return time.Time{}, false
	}
	return s.wait.queues[t.pool].Deadline(t.id)
}

// Waiting reports how many requests wait in k's queue.
func (s *Service) Waiting(k PoolKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.wait.queues[k]; q != nil {
		return q.Len()
	}
	return 0
}

// saturated reports whether p has workers and every one is over a busy
// threshold, its own or busy.
func (p *Pool) saturated(busy *Thresholds) bool {
	if len(p.workers) == 0 {
		return false
	}
	for _, ws := range p.workers {
		if !p.overloaded(ws) && !over(ws, busy) {
			return false
		}
	}
	return true
}
