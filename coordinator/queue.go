package coordinator

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// The router queue's pure core: requests that no worker can take now wait
// here, by priority, until the caller places them (a worker freed), they
// expire, or a request of higher priority sheds them. The Service drives
// it under its lock; the queue itself reads no clock.

// Queue errors. Callers branch on them (a 429 with Retry-After, a 409, a
// 504), so they are sentinels; Push wraps them with the waiter's id and
// priority.
var (
	// ErrQueueFull: the waiter's priority, or the whole queue, holds its
	// maximum and nothing of lower priority waits to be shed.
	ErrQueueFull = errors.New("queue full")
	// ErrDuplicateWaiter: a waiter with this id is already waiting.
	ErrDuplicateWaiter = errors.New("duplicate waiter id")
	// ErrWaitExpired: the waiter's deadline had passed when it was pushed.
	ErrWaitExpired = errors.New("wait expired")
)

// QueueOrder is how a Queue orders the waiting requests of one priority.
type QueueOrder uint8

const (
	QueueFCFS         QueueOrder = iota // arrival order
	QueueShortestWork                   // least uncached work first, with aging
)

var queueOrderNames = []string{QueueFCFS: "fcfs", QueueShortestWork: "shortest-work"}

func (o QueueOrder) String() string { return nameOf(queueOrderNames, o, "QueueOrder") }

// MarshalText implements encoding.TextMarshaler: fcfs or shortest-work.
func (o QueueOrder) MarshalText() ([]byte, error) {
	return marshalName(queueOrderNames, o, "QueueOrder")
}

// UnmarshalText implements encoding.TextUnmarshaler, as ParseQueueOrder.
func (o *QueueOrder) UnmarshalText(text []byte) (err error) {
	*o, err = ParseQueueOrder(string(text))
	return err
}

// ParseQueueOrder parses "fcfs" or "shortest-work". Another name is a
// *NameError that repeats at most clip.Echo bytes of it.
func ParseQueueOrder(s string) (QueueOrder, error) {
	if i := slices.Index(queueOrderNames, s); i >= 0 {
		return QueueOrder(i), nil
	}
	return 0, &NameError{Type: "queue order", Name: clip.String(s), Names: slices.Clone(queueOrderNames)}
}

// Defaults of QueueConfig.
const (
	// DefaultQueueAging bounds how long shortest-work may hold a request
	// back for shorter ones: about one long prefill (tens of thousands of
	// uncached tokens), so short requests jump ahead of what is waiting
	// now but a long request is never overtaken for more than that.
	DefaultQueueAging = 2 * time.Second
	// DefaultQueueMaxLen bounds the requests waiting in one pool's queue.
	// Each holds a client's connection (the proxy's, or an ext_proc
	// stream) while it waits, so the bound is on held connections, not
	// memory (a waiter is a few hundred bytes).
	DefaultQueueMaxLen = 1024
	// DefaultQueueMaxWait bounds a wait: past it the client is better
	// answered 429 with Retry-After, to back off or go elsewhere, than
	// held while the fleet stays saturated.
	DefaultQueueMaxWait = 30 * time.Second
)

// QueueConfig bounds and orders a Queue. Start from DefaultQueueConfig().
type QueueConfig struct {
	Order QueueOrder
	// Aging (QueueShortestWork): a request that has waited Aging goes ahead of every
	// request of its priority that arrived after it. The bound: no request is overtaken by
	// a younger request of its priority once it has waited Aging. <= 0: DefaultQueueAging.
	Aging time.Duration
	// MaxLen bounds the waiting requests of all priorities; MaxWait how
	// long any waits. 0: DefaultQueueMaxLen, DefaultQueueMaxWait; negative
	// is an error.
	MaxLen  int
	MaxWait time.Duration
	// Bands override MaxLen/MaxWait for one priority (a band's MaxLen counts that priority's
	// requests only; the total MaxLen still applies). Zero fields inherit the totals.
	Bands []QueueBand
}

// QueueBand is one priority's own bounds in a QueueConfig.
type QueueBand struct {
	Priority int
	MaxLen   int
	MaxWait  time.Duration
}

// DefaultQueueConfig returns shortest-work order with DefaultQueueAging,
// DefaultQueueMaxLen, DefaultQueueMaxWait and no bands. Shortest-work
// because it is what cuts the mean wait under overload (a short request
// is not stuck behind a long one), with aging to bound what it costs the
// long ones.
func DefaultQueueConfig() QueueConfig {
	return QueueConfig{Order: QueueShortestWork, Aging: DefaultQueueAging, MaxLen: DefaultQueueMaxLen, MaxWait: DefaultQueueMaxWait}
}

// Waiter is one request waiting in a Queue.
type Waiter struct {
	ID       string
	Priority int     // higher first; negative is sheddable first (GIE's convention: priority < 0 sheddable)
	Work     float64 // uncached prefill tokens when it arrived: the shortest-work key
	Arrived  time.Time
	Deadline time.Time // zero: none; the earlier of Deadline and Arrived+MaxWait (band's or total) applies
}

// Queue holds the requests waiting for a worker, by priority, ordered
// within a priority by its QueueOrder, bounded in length and in wait.
//
// A Queue is not safe for concurrent use; the caller (the Service) holds
// its lock. It reads no clock (every time-dependent method takes now),
// starts no goroutines and never holds more than MaxLen waiters. Times
// are compared on the wall clock (monotonic readings are ignored), so
// waiters pushed with time.Now and with parsed times order alike.
//
// Costs, for n waiting in a priority: Push and Remove are O(log n) (plus
// the distance from the newest arrival, when a waiter arrives out of
// order); All is O(1) per waiter passed in FCFS order and O(log k) for
// the k-th passed in shortest-work order (which passes the aged twice),
// and after a Remove during a shortest-work walk its next step costs
// O(the waiters passed that still wait); Expire is O(log n) per waiter
// expired. Priorities are kept sorted: O(log p) to find one of p.
type Queue struct {
	order   QueueOrder
	aging   time.Duration
	maxLen  int
	maxWait time.Duration
	bandCfg map[int]QueueBand

	bands []*qband // live (non-empty) priorities, highest first
	byID  map[string]*qnode
	n     int
	// version counts every change, pushes every insertion: All's
	// iterators check them to resume correctly after the caller changed
	// the queue during a walk.
	version, pushes uint64
}

// qband is the waiters of one priority.
type qband struct {
	priority int
	n        int
	// head..tail: every waiter, by (arrival, id).
	head, tail *qnode
	work       nodeHeap // shortest-work only: (work, arrival, id)
	deadlines  nodeHeap // (deadline, arrival, id)
}

// qnode is one waiter. A removed node keeps its next pointer, so an
// iterator standing on it can still reach the waiters after it.
type qnode struct {
	w          Waiter
	arr, dl    time.Time // Arrived and the effective deadline, wall clock only
	band       *qband
	prev, next *qnode
	wi, di     int // index in band.work, band.deadlines
	gone       bool
}

// NewQueue returns an empty Queue. It refuses a negative MaxLen or
// MaxWait, an unknown Order, and a band with a negative field or a
// priority given twice, naming the field.
func NewQueue(cfg QueueConfig) (*Queue, error) {
	if int(cfg.Order) >= len(queueOrderNames) {
		return nil, fmt.Errorf("queue config: Order %d is not a queue order", cfg.Order)
	}
	if cfg.MaxLen < 0 {
		return nil, fmt.Errorf("queue config: MaxLen %d is negative", cfg.MaxLen)
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("queue config: MaxWait %v is negative", cfg.MaxWait)
	}
	q := &Queue{order: cfg.Order, aging: cfg.Aging, maxLen: cfg.MaxLen, maxWait: cfg.MaxWait,
		bandCfg: make(map[int]QueueBand, len(cfg.Bands)), byID: map[string]*qnode{}}
	if q.aging <= 0 {
		q.aging = DefaultQueueAging
	}
	if q.maxLen == 0 {
		q.maxLen = DefaultQueueMaxLen
	}
	if q.maxWait == 0 {
		q.maxWait = DefaultQueueMaxWait
	}
	for i, b := range cfg.Bands {
		if b.MaxLen < 0 {
			return nil, fmt.Errorf("queue config: Bands[%d].MaxLen %d is negative", i, b.MaxLen)
		}
		if b.MaxWait < 0 {
			return nil, fmt.Errorf("queue config: Bands[%d].MaxWait %v is negative", i, b.MaxWait)
		}
		if _, dup := q.bandCfg[b.Priority]; dup {
			return nil, fmt.Errorf("queue config: Bands[%d].Priority %d is given twice", i, b.Priority)
		}
		q.bandCfg[b.Priority] = b
	}
	return q, nil
}

// limits are priority p's own bounds: its band's, or the totals.
func (q *Queue) limits(p int) (maxLen int, maxWait time.Duration) {
	maxLen, maxWait = q.maxLen, q.maxWait
	if b, ok := q.bandCfg[p]; ok {
		if b.MaxLen > 0 {
			maxLen = b.MaxLen
		}
		if b.MaxWait > 0 {
			maxWait = b.MaxWait
		}
	}
	return maxLen, maxWait
}

// Len is the number of waiters, of all priorities.
func (q *Queue) Len() int { return q.n }

// LenPriority is the number of waiters of priority p.
func (q *Queue) LenPriority(p int) int {
	if b := q.band(p); b != nil {
		return b.n
	}
	return 0
}

// band returns priority p's waiters, nil when none wait.
func (q *Queue) band(p int) *qband {
	i, ok := q.bandIndex(p)
	if !ok {
		return nil
	}
	return q.bands[i]
}

// bandIndex finds p in q.bands (highest first), or where it would go.
func (q *Queue) bandIndex(p int) (int, bool) {
	lo, hi := 0, len(q.bands)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if q.bands[m].priority > p {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(q.bands) && q.bands[lo].priority == p
}

// Push adds w. If w's band or the whole queue is full it sheds, lowest
// priority first: when the whole queue is full and some waiting request
// has a LOWER priority than w, the newest waiter (latest Arrived, then
// greatest ID) of the lowest priority present is shed to make room and
// returned; otherwise w itself is refused with an error wrapping
// ErrQueueFull (nothing changes). A full band refuses w at once: shedding
// another priority frees no room in it. So Push sheds at most one waiter,
// and never one of w's priority or higher.
//
// A live ID is ErrDuplicateWaiter. A w already past its deadline at now
// (the earlier of w.Deadline and Arrived plus its MaxWait is <= now) is
// refused with an error wrapping ErrWaitExpired. An empty ID, a zero
// Arrived or a Work that is negative, NaN or infinite is an error naming
// the field. The shed slice is the caller's.
func (q *Queue) Push(w Waiter, now time.Time) (shed []Waiter, err error) {
	if w.ID == "" {
		return nil, errors.New("queue push: empty waiter ID")
	}
	if w.Arrived.IsZero() {
		return nil, fmt.Errorf("queue push %q: Arrived is zero", clip.String(w.ID))
	}
	if w.Work < 0 || math.IsNaN(w.Work) || math.IsInf(w.Work, 0) {
		return nil, fmt.Errorf("queue push %q: Work %v is not a finite non-negative number", clip.String(w.ID), w.Work)
	}
	if _, dup := q.byID[w.ID]; dup {
		return nil, fmt.Errorf("queue push %q: %w", clip.String(w.ID), ErrDuplicateWaiter)
	}
	maxLen, maxWait := q.limits(w.Priority)
	n := &qnode{w: w, arr: w.Arrived.Round(0)}
	n.dl = n.arr.Add(maxWait)
	if !w.Deadline.IsZero() && w.Deadline.Round(0).Before(n.dl) {
		n.dl = w.Deadline.Round(0)
	}
	if !n.dl.After(now.Round(0)) {
		return nil, fmt.Errorf("queue push %q: deadline %v is not after now %v: %w",
			clip.String(w.ID), n.dl.Format(time.RFC3339Nano), now.Round(0).Format(time.RFC3339Nano), ErrWaitExpired)
	}
	b := q.band(w.Priority)
	if b != nil && b.n >= maxLen {
		return nil, fmt.Errorf("queue push %q: priority %d holds its maximum of %d waiters: %w",
			clip.String(w.ID), w.Priority, maxLen, ErrQueueFull)
	}
	if q.n >= q.maxLen {
		lowest := q.bands[len(q.bands)-1]
		if lowest.priority >= w.Priority {
			return nil, fmt.Errorf("queue push %q: queue holds its maximum of %d waiters, none of priority below %d: %w",
				clip.String(w.ID), q.maxLen, w.Priority, ErrQueueFull)
		}
		shed = []Waiter{lowest.tail.w}
		q.remove(lowest.tail)
	}
	if b == nil {
		b = &qband{priority: w.Priority, deadlines: nodeHeap{byDeadline: true}}
		i, _ := q.bandIndex(w.Priority)
		q.bands = slices.Insert(q.bands, i, b)
	}
	n.band = b
	b.insert(n)
	b.deadlines.push(n)
	if q.order == QueueShortestWork {
		b.work.push(n)
	}
	b.n++
	q.n++
	q.byID[w.ID] = n
	q.version++
	q.pushes++
	return shed, nil
}

// insert links n into b's arrival list, searching from the newest: a
// waiter usually arrives last.
func (b *qband) insert(n *qnode) {
	at := b.tail
	for at != nil && arrLess(n, at) {
		at = at.prev
	}
	n.prev = at
	if at == nil {
		n.next, b.head = b.head, n
	} else {
		n.next, at.next = at.next, n
	}
	if n.next == nil {
		b.tail = n
	} else {
		n.next.prev = n
	}
}

// Remove takes id out (placed by the caller, or cancelled) and returns
// it; false if it is not waiting. It may be called during a walk of All.
func (q *Queue) Remove(id string) (Waiter, bool) {
	n, ok := q.byID[id]
	if !ok {
		return Waiter{}, false
	}
	q.remove(n)
	return n.w, true
}

// remove unlinks n everywhere and drops its band when it was the last.
// n keeps its next pointer (see qnode).
func (q *Queue) remove(n *qnode) {
	b := n.band
	if n.prev == nil {
		b.head = n.next
	} else {
		n.prev.next = n.next
	}
	if n.next == nil {
		b.tail = n.prev
	} else {
		n.next.prev = n.prev
	}
	n.gone = true
	b.deadlines.remove(n.di)
	if q.order == QueueShortestWork {
		b.work.remove(n.wi)
	}
	b.n--
	q.n--
	delete(q.byID, n.w.ID)
	q.version++
	if b.n == 0 {
		if i, ok := q.bandIndex(b.priority); ok {
			q.bands = slices.Delete(q.bands, i, i+1)
		}
	}
}

// All yields the waiters in placement order at now: priorities highest
// first; within one, FCFS by arrival (Arrived, ties by ID), or
// shortest-work: first the aged (waited >= Aging at now) in arrival
// order, then the rest by Work ascending, ties by arrival then ID.
//
// The caller may Remove during the walk (a placed or cancelled waiter,
// the one just yielded or any other): the walk goes on with the waiters
// still waiting that come after the last one yielded, and never yields
// one twice. A waiter pushed during the walk may or may not be yielded.
// A walk costs what it passes (see Queue): stopping after a few waiters
// is cheap at any length.
func (q *Queue) All(now time.Time) iter.Seq[Waiter] {
	return func(yield func(Waiter) bool) {
		cutoff := now.Round(0).Add(-q.aging)
		first := true
		p := 0
		for {
			// The next priority below p: looked up again each time, as
			// the walk may have emptied bands or made new ones.
			i := 0
			if !first {
				if p == math.MinInt {
					return
				}
				i, _ = q.bandIndex(p - 1)
			}
			if i >= len(q.bands) {
				return
			}
			first = false
			p = q.bands[i].priority
			var ok bool
			if q.order == QueueShortestWork {
				ok = q.walkShortest(p, cutoff, yield)
			} else {
				ok = q.walkArrival(p, time.Time{}, false, yield) != walkStopped
			}
			if !ok {
				return
			}
		}
	}
}

type walkEnd uint8

const (
	walkDone    walkEnd = iota // every waiter in the walk's range yielded
	walkStopped                // yield returned false
	walkCut                    // stopped at the first waiter not aged
)

// walkArrival yields priority p's waiters in arrival order; with aged, only
// those that arrived at or before cutoff. It returns how it ended and, for
// walkCut, leaves the rest to the caller.
func (q *Queue) walkArrival(p int, cutoff time.Time, aged bool, yield func(Waiter) bool) walkEnd {
	b := q.band(p)
	if b == nil {
		return walkDone
	}
	var last *qnode
	pushes := q.pushes
	for {
		var n *qnode
		switch {
		case last == nil:
			n = b.head
		case q.pushes == pushes:
			// Only removals since: last's next pointers (kept by removed
			// nodes) lead to the first waiter after it still waiting.
			n = last.next
			for n != nil && n.gone {
				n = n.next
			}
		default:
			// A push may have come anywhere: look again from the head.
			pushes = q.pushes
			if b = q.band(p); b == nil {
				return walkDone
			}
			n = b.head
			for n != nil && !arrLess(last, n) {
				n = n.next
			}
		}
		if n == nil {
			return walkDone
		}
		if aged && n.arr.After(cutoff) {
			return walkCut
		}
		last = n
		if !yield(n.w) {
			return walkStopped
		}
	}
}

// walkShortest yields priority p's waiters in shortest-work order at
// cutoff (now minus Aging); false when yield stopped the walk.
func (q *Queue) walkShortest(p int, cutoff time.Time, yield func(Waiter) bool) bool {
	switch q.walkArrival(p, cutoff, true, yield) {
	case walkStopped:
		return false
	case walkDone:
		return true
	}
	// The rest, by (work, arrival, id), skipping the aged: a walk of the
	// heap in order without popping it. frontier holds the smallest
	// waiters not yet visited whose parents were. After a change to the
	// queue it is rebuilt: the waiters at or before the last one visited
	// form a subtree at the heap's root, the rest start at its edge.
	var last *qnode
	var buf [16]*qnode
	var stack []int
	for {
		b := q.band(p)
		if b == nil {
			return true
		}
		frontier := buf[:0]
		if last == nil {
			frontier = framePush(frontier, b.work.s[0])
		} else {
			stack = append(stack[:0], 0)
			for len(stack) > 0 {
				i := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if n := b.work.s[i]; workLess(last, n) {
					frontier = framePush(frontier, n)
					continue
				}
				for _, c := range [2]int{2*i + 1, 2*i + 2} {
					if c < len(b.work.s) {
						stack = append(stack, c)
					}
				}
			}
		}
		for version := q.version; q.version == version; {
			if len(frontier) == 0 {
				return true
			}
			var n *qnode
			n, frontier = framePop(frontier)
			last = n
			for _, c := range [2]int{2*n.wi + 1, 2*n.wi + 2} {
				if c < len(b.work.s) {
					frontier = framePush(frontier, b.work.s[c])
				}
			}
			if !n.arr.After(cutoff) {
				continue // aged: yielded already
			}
			if !yield(n.w) {
				return false
			}
		}
	}
}

// Expire removes and returns the waiters whose deadline (the earlier of
// Deadline and Arrived plus its MaxWait) is <= now, oldest (by Arrived,
// then ID) first. The returned slice is the caller's.
func (q *Queue) Expire(now time.Time) []Waiter {
	now = now.Round(0)
	var out []*qnode
	for i := 0; i < len(q.bands); {
		b := q.bands[i]
		for b.n > 0 && !b.deadlines.s[0].dl.After(now) {
			n := b.deadlines.s[0]
			out = append(out, n)
			q.remove(n)
		}
		if b.n > 0 {
			i++
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b *qnode) int {
		if arrLess(a, b) {
			return -1
		}
		return 1
	})
	ws := make([]Waiter, len(out))
	for i, n := range out {
		ws[i] = n.w
	}
	return ws
}

// Deadline is when waiter id must leave: the earlier of its Deadline and
// its Arrived plus its priority's MaxWait. False when id does not wait.
func (q *Queue) Deadline(id string) (time.Time, bool) {
	n, ok := q.byID[id]
	if !ok {
		return time.Time{}, false
	}
	return n.dl, true
}

// NextDeadline is the earliest deadline of a waiter, for the caller's
// timer (its wall-clock reading); false when none waits.
func (q *Queue) NextDeadline() (time.Time, bool) {
	var d time.Time
	for _, b := range q.bands {
		if t := b.deadlines.s[0].dl; d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d, !d.IsZero()
}

// RetryAfter is what a 429 for priority p should say at now: how long
// until a waiter that holds p's place out must leave by its deadline, so
// that room frees even if no worker does. When p's band is at its own
// MaxLen, that is the earliest deadline of p's waiters; otherwise the
// earliest deadline of the waiters of priority p or higher (the queue is
// full of them, or Push would have shed a lower one). The estimate is
// rounded up to whole seconds (Retry-After counts seconds) and clamped to
// [1s, p's MaxWait rounded up]; with nothing to wait for it is 1s.
func (q *Queue) RetryAfter(p int, now time.Time) time.Duration {
	now = now.Round(0)
	maxLen, maxWait := q.limits(p)
	var d time.Time
	if b := q.band(p); b != nil && b.n >= maxLen {
		d = b.deadlines.s[0].dl
	} else {
		for _, b := range q.bands {
			if b.priority < p {
				break
			}
			if t := b.deadlines.s[0].dl; d.IsZero() || t.Before(d) {
				d = t
			}
		}
	}
	wait := time.Second
	if !d.IsZero() {
		wait = min(d.Sub(now), maxWait)
	}
	wait = (wait + time.Second - 1).Truncate(time.Second)
	return max(wait, time.Second)
}

// arrLess orders by arrival: (Arrived, ID).
func arrLess(a, b *qnode) bool {
	if c := a.arr.Compare(b.arr); c != 0 {
		return c < 0
	}
	return a.w.ID < b.w.ID
}

// workLess is shortest-work's order: (Work, Arrived, ID).
func workLess(a, b *qnode) bool {
	if a.w.Work != b.w.Work {
		return a.w.Work < b.w.Work
	}
	return arrLess(a, b)
}

// dlLess orders by deadline, then arrival.
func dlLess(a, b *qnode) bool {
	if c := a.dl.Compare(b.dl); c != 0 {
		return c < 0
	}
	return arrLess(a, b)
}

// nodeHeap is a binary min-heap of waiters by work (workLess) or by
// deadline (dlLess) that keeps each node's index (wi or di) for removal.
type nodeHeap struct {
	s          []*qnode
	byDeadline bool
}

func (h *nodeHeap) less(i, j int) bool {
	if h.byDeadline {
		return dlLess(h.s[i], h.s[j])
	}
	return workLess(h.s[i], h.s[j])
}

func (h *nodeHeap) set(i int, n *qnode) {
	h.s[i] = n
	switch {
	case h.byDeadline:
		n.di = i
	default:
		n.wi = i
	}
}

func (h *nodeHeap) push(n *qnode) {
	h.s = append(h.s, n)
	h.set(len(h.s)-1, n)
	h.up(len(h.s) - 1)
}

func (h *nodeHeap) remove(i int) {
	end := len(h.s) - 1
	if i != end {
		h.set(i, h.s[end])
	}
	h.s[end] = nil
	h.s = h.s[:end]
	if i < end {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h *nodeHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		pi, pn := h.s[i], h.s[parent]
		h.set(parent, pi)
		h.set(i, pn)
		i = parent
	}
}

// down sifts i down; it reports whether i moved.
func (h *nodeHeap) down(i0 int) bool {
	i, n := i0, len(h.s)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		ci, cn := h.s[i], h.s[c]
		h.set(i, cn)
		h.set(c, ci)
		i = c
	}
	return i > i0
}

// framePush and framePop are a min-heap by workLess on a plain slice,
// for a walk's frontier: kept apart from nodeHeap (no indices to keep),
// and on slices so that the frontier stays on the walk's stack.
func framePush(h []*qnode, n *qnode) []*qnode {
	h = append(h, n)
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !workLess(h[i], h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	return h
}

func framePop(h []*qnode) (*qnode, []*qnode) {
	top, end := h[0], len(h)-1
	h[0], h[end] = h[end], nil
	h = h[:end]
	for i := 0; ; {
		c := 2*i + 1
		if c >= end {
			break
		}
		if r := c + 1; r < end && workLess(h[r], h[c]) {
			c = r
		}
		if !workLess(h[c], h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}
