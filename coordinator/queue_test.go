package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// refQueue is the brute-force reference for Queue: a slice, searched and
// sorted on every call.
type refQueue struct {
	cfg QueueConfig // defaults applied
	ws  []refWaiter
}

type refWaiter struct {
	w  Waiter
	dl time.Time
}

func (r *refQueue) limits(p int) (int, time.Duration) {
	maxLen, maxWait := r.cfg.MaxLen, r.cfg.MaxWait
	for _, b := range r.cfg.Bands {
		if b.Priority == p {
			if b.MaxLen > 0 {
				maxLen = b.MaxLen
			}
			if b.MaxWait > 0 {
				maxWait = b.MaxWait
			}
		}
	}
	return maxLen, maxWait
}

func (r *refQueue) find(id string) int {
	return slices.IndexFunc(r.ws, func(x refWaiter) bool { return x.w.ID == id })
}

func (r *refQueue) count(p int) int {
	n := 0
	for _, x := range r.ws {
		if x.w.Priority == p {
			n++
		}
	}
	return n
}

func refArrCmp(a, b Waiter) int {
	return cmp.Or(a.Arrived.Compare(b.Arrived), strings.Compare(a.ID, b.ID))
}

// push returns the waiter shed, or the sentinel w is refused with.
func (r *refQueue) push(w Waiter, now time.Time) (shed []Waiter, err error) {
	if r.find(w.ID) >= 0 {
		return nil, ErrDuplicateWaiter
	}
	maxLen, maxWait := r.limits(w.Priority)
	dl := w.Arrived.Add(maxWait)
	if !w.Deadline.IsZero() && w.Deadline.Before(dl) {
		dl = w.Deadline
	}
	if !dl.After(now) {
		return nil, ErrWaitExpired
	}
	if r.count(w.Priority) >= maxLen {
		return nil, ErrQueueFull
	}
	if len(r.ws) >= r.cfg.MaxLen {
		victim := -1
		for i, x := range r.ws {
			if victim < 0 || x.w.Priority < r.ws[victim].w.Priority ||
				x.w.Priority == r.ws[victim].w.Priority && refArrCmp(x.w, r.ws[victim].w) > 0 {
				victim = i
			}
		}
		if r.ws[victim].w.Priority >= w.Priority {
			return nil, ErrQueueFull
		}
		shed = []Waiter{r.ws[victim].w}
		r.ws = slices.Delete(r.ws, victim, victim+1)
	}
	r.ws = append(r.ws, refWaiter{w, dl})
	return shed, nil
}

func (r *refQueue) remove(id string) (Waiter, bool) {
	i := r.find(id)
	if i < 0 {
		return Waiter{}, false
	}
	w := r.ws[i].w
	r.ws = slices.Delete(r.ws, i, i+1)
	return w, true
}

func (r *refQueue) aged(w Waiter, now time.Time) bool { return now.Sub(w.Arrived) >= r.cfg.Aging }

// cmp is the placement order at now.
func (r *refQueue) cmp(a, b Waiter, now time.Time) int {
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	if r.cfg.Order == QueueShortestWork {
		aa, ba := r.aged(a, now), r.aged(b, now)
		switch {
		case aa && !ba:
			return -1
		case ba && !aa:
			return 1
		case !aa:
			if c := cmp.Compare(a.Work, b.Work); c != 0 {
				return c
			}
		}
	}
	return refArrCmp(a, b)
}

// order is the placement order at now, sorted from scratch.
func (r *refQueue) order(now time.Time) []Waiter {
	out := make([]Waiter, 0, len(r.ws))
	for _, x := range r.ws {
		out = append(out, x.w)
	}
	slices.SortFunc(out, func(a, b Waiter) int { return r.cmp(a, b, now) })
	return out
}

// waiting reports whether w itself (not only its id) waits.
func (r *refQueue) waiting(w Waiter) bool {
	i := r.find(w.ID)
	return i >= 0 && r.ws[i].w == w
}

func (r *refQueue) expire(now time.Time) []Waiter {
	var out []Waiter
	r.ws = slices.DeleteFunc(r.ws, func(x refWaiter) bool {
		if !x.dl.After(now) {
			out = append(out, x.w)
			return true
		}
		return false
	})
	slices.SortFunc(out, refArrCmp)
	return out
}

func (r *refQueue) nextDeadline() (time.Time, bool) {
	var d time.Time
	for _, x := range r.ws {
		if d.IsZero() || x.dl.Before(d) {
			d = x.dl
		}
	}
	return d, !d.IsZero()
}

var queuePriorities = []int{-1, 0, 1, 2}

func drawQueueConfig(t *rapid.T) QueueConfig {
	cfg := QueueConfig{
		Order:   QueueOrder(rapid.IntRange(0, 1).Draw(t, "order")),
		Aging:   time.Duration(rapid.IntRange(1, 5).Draw(t, "aging")) * time.Second,
		MaxLen:  rapid.IntRange(1, 32).Draw(t, "maxLen"),
		MaxWait: time.Duration(rapid.IntRange(2, 20).Draw(t, "maxWait")) * time.Second,
	}
	for _, p := range queuePriorities {
		if rapid.Bool().Draw(t, fmt.Sprint("band", p)) {
			cfg.Bands = append(cfg.Bands, QueueBand{Priority: p,
				MaxLen:  rapid.IntRange(0, 8).Draw(t, fmt.Sprint("bandMaxLen", p)),
				MaxWait: time.Duration(rapid.IntRange(0, 10).Draw(t, fmt.Sprint("bandMaxWait", p))) * time.Second})
		}
	}
	return cfg
}

// queueRun is one property run: the queue, its reference, and the fate of
// every waiter pushed.
type queueRun struct {
	t     *rapid.T
	q     *Queue
	ref   *refQueue
	now   time.Time
	ended map[string]int // id → waiters of that id that ended (placed, shed, refused, cancelled)
	live  map[string]bool
	// priorities are those pushed: one, so that a band grows deep, or
	// up to all of queuePriorities.
	priorities []int
	// pushed counts the waiters pushed.
	pushed int
}

// end records that id left the queue (or never entered it): it must have
// been live (or just refused), and leaves exactly once.
func (r *queueRun) end(w Waiter, how string) {
	if !r.live[w.ID] {
		r.t.Fatalf("%s %q: not waiting (lost, or ended twice)", how, w.ID)
	}
	delete(r.live, w.ID)
	r.ended[w.ID]++
}

func (r *queueRun) check() {
	t := r.t
	if err := r.q.invariants(); err != nil {
		t.Fatal(err)
	}
	if r.q.Len() != len(r.ref.ws) {
		t.Fatalf("Len %d, reference %d", r.q.Len(), len(r.ref.ws))
	}
	if r.q.Len() > r.ref.cfg.MaxLen {
		t.Fatalf("Len %d > MaxLen %d", r.q.Len(), r.ref.cfg.MaxLen)
	}
	for _, p := range queuePriorities {
		maxLen, _ := r.ref.limits(p)
		if n := r.q.LenPriority(p); n != r.ref.count(p) || n > maxLen {
			t.Fatalf("LenPriority(%d) %d, reference %d, band MaxLen %d", p, n, r.ref.count(p), maxLen)
		}
	}
	got := slices.Collect(r.q.All(r.now))
	want := r.ref.order(r.now)
	if !slices.Equal(got, want) {
		t.Fatalf("All at %v:\n got %v\nwant %v", r.now.Sub(t0), ids(got), ids(want))
	}
	// The bounds themselves, not only equality with the reference.
	for j, b := range got {
		if j > 0 && got[j-1].Priority < b.Priority {
			t.Fatalf("priority %d placed after %d", b.Priority, got[j-1].Priority)
		}
		if r.ref.cfg.Order != QueueShortestWork || r.now.Sub(b.Arrived) < r.ref.cfg.Aging {
			continue
		}
		for _, a := range got[:j] {
			if a.Priority == b.Priority && refArrCmp(a, b) > 0 {
				t.Fatalf("%q, waiting %v >= aging %v, overtaken by younger %q", b.ID, r.now.Sub(b.Arrived), r.ref.cfg.Aging, a.ID)
			}
		}
	}
	d, ok := r.q.NextDeadline()
	wd, wok := r.ref.nextDeadline()
	if ok != wok || !d.Equal(wd) {
		t.Fatalf("NextDeadline %v %v, reference %v %v", d, ok, wd, wok)
	}
}

// invariants checks q's structure: bands sorted and non-empty, each
// band's list in arrival order, its heaps ordered with their indices
// right, the counts and the id map in agreement.
func (q *Queue) invariants() error {
	total := 0
	for i, b := range q.bands {
		if i > 0 && q.bands[i-1].priority <= b.priority {
			return fmt.Errorf("bands out of order: %d then %d", q.bands[i-1].priority, b.priority)
		}
		n := 0
		for x := b.head; x != nil; x = x.next {
			if x.gone || x.band != b || q.byID[x.w.ID] != x {
				return fmt.Errorf("priority %d: %q in the list is not waiting there", b.priority, x.w.ID)
			}
			if x.next != nil && (!arrLess(x, x.next) || x.next.prev != x) {
				return fmt.Errorf("priority %d: list broken at %q", b.priority, x.w.ID)
			}
			if x.next == nil && b.tail != x {
				return fmt.Errorf("priority %d: tail", b.priority)
			}
			n++
		}
		heaps := []*nodeHeap{&b.deadlines}
		if q.order == QueueShortestWork {
			heaps = append(heaps, &b.work)
		}
		for _, h := range heaps {
			if len(h.s) != n {
				return fmt.Errorf("priority %d: heap of %d, list of %d", b.priority, len(h.s), n)
			}
			for j, x := range h.s {
				if idx := map[bool]int{true: x.di, false: x.wi}[h.byDeadline]; idx != j {
					return fmt.Errorf("priority %d: %q at %d has index %d", b.priority, x.w.ID, j, idx)
				}
				if j > 0 && h.less(j, (j-1)/2) {
					return fmt.Errorf("priority %d: heap order broken at %d", b.priority, j)
				}
			}
		}
		if n == 0 || n != b.n {
			return fmt.Errorf("priority %d: %d listed, count %d", b.priority, n, b.n)
		}
		total += n
	}
	if total != q.n || len(q.byID) != q.n {
		return fmt.Errorf("%d listed, Len %d, %d ids", total, q.n, len(q.byID))
	}
	return nil
}

func ids(ws []Waiter) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = fmt.Sprintf("%s/p%d/w%g/a%v", w.ID, w.Priority, w.Work, w.Arrived.Sub(t0))
	}
	return out
}

func (r *queueRun) push() {
	t := r.t
	r.pushed++
	w := Waiter{
		ID:       fmt.Sprint("r", rapid.IntRange(0, 39).Draw(t, "id")),
		Priority: rapid.SampledFrom(r.priorities).Draw(t, "priority"),
		Work:     float64(rapid.IntRange(0, 4).Draw(t, "work")),
		Arrived:  r.now.Add(-time.Duration(rapid.IntRange(0, 3000).Draw(t, "age")) * time.Millisecond),
	}
	if rapid.Bool().Draw(t, "deadline") {
		w.Deadline = r.now.Add(time.Duration(rapid.IntRange(-1000, 8000).Draw(t, "in")) * time.Millisecond)
	}
	shed, err := r.q.Push(w, r.now)
	wantShed, wantErr := r.ref.push(w, r.now)
	if !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
		t.Fatalf("Push %v: error %v, reference %v", ids([]Waiter{w}), err, wantErr)
	}
	if !slices.Equal(shed, wantShed) {
		t.Fatalf("Push %v: shed %v, reference %v", ids([]Waiter{w}), ids(shed), ids(wantShed))
	}
	for _, s := range shed {
		// Never a priority >= the newcomer's, always the lowest present
		// and its newest.
		if s.Priority >= w.Priority {
			t.Fatalf("Push priority %d shed priority %d", w.Priority, s.Priority)
		}
		for _, x := range r.ref.ws {
			if x.w.Priority < s.Priority || x.w.Priority == s.Priority && refArrCmp(x.w, s) > 0 {
				t.Fatalf("shed %v while %v waits", ids([]Waiter{s}), ids([]Waiter{x.w}))
			}
		}
		r.end(s, "shed")
	}
	if err != nil {
		r.ended[w.ID]++ // refused: it ends here
		return
	}
	r.live[w.ID] = true
}

func (r *queueRun) remove(id string) {
	got, ok := r.q.Remove(id)
	want, wok := r.ref.remove(id)
	if ok != wok || got != want {
		r.t.Fatalf("Remove %q: %v %v, reference %v %v", id, got, ok, want, wok)
	}
	if ok {
		r.end(got, "removed")
	}
}

// walk walks All and, at each step, places (removes) the waiter yielded,
// cancels another, does both, pushes a new one, or stops. The walk must
// yield in strictly increasing placement order (so never one twice),
// every waiter of the order at its start that still waits when the walk
// reaches it, and nothing that no longer waits.
func (r *queueRun) walk() {
	t := r.t
	order := r.ref.order(r.now)
	k := 0
	var last *Waiter
	for w := range r.q.All(r.now) {
		if !r.ref.waiting(w) {
			t.Fatalf("walk yielded %v, not waiting", ids([]Waiter{w}))
		}
		if last != nil && r.ref.cmp(*last, w, r.now) >= 0 {
			t.Fatalf("walk yielded %v after %v", ids([]Waiter{w}), ids([]Waiter{*last}))
		}
		for ; k < len(order) && r.ref.cmp(order[k], w, r.now) <= 0; k++ {
			if order[k] != w && r.ref.waiting(order[k]) {
				t.Fatalf("walk yielded %v, skipping %v", ids([]Waiter{w}), ids([]Waiter{order[k]}))
			}
		}
		last = &w
		step := rapid.IntRange(0, 4).Draw(t, "step")
		if step == 0 || step == 2 {
			r.remove(w.ID)
		}
		if (step == 1 || step == 2) && len(r.ref.ws) > 0 {
			r.remove(rapid.SampledFrom(r.ref.ws).Draw(t, "other").w.ID)
		}
		if step == 3 {
			if rapid.IntRange(0, 3).Draw(t, "stop") == 0 {
				return
			}
			r.push()
		}
	}
	for ; k < len(order); k++ {
		if r.ref.waiting(order[k]) {
			t.Fatalf("walk ended before %v", ids([]Waiter{order[k]}))
		}
	}
}

// TestPropertyQueue drives random pushes (duplicates, past deadlines,
// out-of-order arrivals, full bands and queue), removals, walks with
// removals, expiry and time against refQueue. Every waiter pushed ends
// exactly once: placed or cancelled (Remove), shed (Push or Expire) or
// refused (Push's error).
func TestPropertyQueue(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := drawQueueConfig(t)
		q, err := NewQueue(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := &queueRun{t: t, q: q, ref: &refQueue{cfg: cfg}, now: t0, ended: map[string]int{}, live: map[string]bool{},
			priorities: queuePriorities[rapid.IntRange(0, len(queuePriorities)-1).Draw(t, "lowest"):]}
		// A loop of weighted actions rather than t.Repeat: pushes must
		// outnumber the rest for the queue to fill and shed.
		steps := rapid.IntRange(0, 400).Draw(t, "steps")
		for range steps {
			switch rapid.IntRange(0, 9).Draw(t, "action") {
			case 0, 1, 2, 3:
				r.push()
			case 4:
				r.remove(fmt.Sprint("r", rapid.IntRange(0, 39).Draw(t, "rid")))
			case 5:
				r.walk()
			case 6:
				r.now = r.now.Add(time.Duration(rapid.IntRange(1, 3000).Draw(t, "ms")) * time.Millisecond)
			case 7:
				if d, ok := q.NextDeadline(); ok && d.After(r.now) {
					r.now = d // exactly at a deadline
				}
			default:
				got, want := q.Expire(r.now), r.ref.expire(r.now)
				if !slices.Equal(got, want) {
					t.Fatalf("Expire at %v: %v, reference %v", r.now.Sub(t0), ids(got), ids(want))
				}
				for _, w := range got {
					if w.Deadline.IsZero() && r.now.Sub(w.Arrived) < cfg.MaxWait && len(cfg.Bands) == 0 {
						t.Fatalf("expired %v before its MaxWait", ids([]Waiter{w}))
					}
					r.end(w, "expired")
				}
			}
			r.check()
		}
		// Drain: whatever waits ends by Expire at the end of time.
		for _, w := range q.Expire(r.now.Add(time.Hour)) {
			r.end(w, "expired")
		}
		if q.Len() != 0 || len(r.live) != 0 {
			t.Fatalf("drained: Len %d, live %v", q.Len(), r.live)
		}
		total := 0
		for _, n := range r.ended {
			total += n
		}
		if total != r.pushed {
			t.Fatalf("%d pushed, %d ended", r.pushed, total)
		}
	})
}

func TestQueuePushErrors(t *testing.T) {
	cfg := QueueConfig{Order: QueueFCFS, MaxLen: 3, MaxWait: 10 * time.Second, Bands: []QueueBand{{Priority: 5, MaxLen: 1}}}
	w := func(id string, p int) Waiter { return Waiter{ID: id, Priority: p, Arrived: t0} }
	for _, tc := range []struct {
		name    string
		waiting []Waiter
		push    Waiter
		now     time.Time
		want    error  // a sentinel, or nil
		errText string // for errors without one
		shed    string
	}{
		{name: "accepted", push: w("a", 0), now: t0},
		{name: "duplicate", waiting: []Waiter{w("a", 0)}, push: w("a", 1), now: t0, want: ErrDuplicateWaiter},
		{name: "deadline passed", push: Waiter{ID: "a", Arrived: t0, Deadline: t0}, now: t0, want: ErrWaitExpired},
		{name: "max wait passed", push: w("a", 0), now: t0.Add(10 * time.Second), want: ErrWaitExpired},
		{name: "band full", waiting: []Waiter{w("a", 5)}, push: w("b", 5), now: t0, want: ErrQueueFull},
		{name: "band full, lower waits: no shed", waiting: []Waiter{w("a", 5), w("b", 0)}, push: w("c", 5), now: t0, want: ErrQueueFull},
		{name: "full, none lower", waiting: []Waiter{w("a", 1), w("b", 1), w("c", 2)}, push: w("d", 1), now: t0, want: ErrQueueFull},
		{name: "full, sheds lowest newest", waiting: []Waiter{w("a", 0), w("b", -1), w("c", -1)}, push: w("d", 1), now: t0, shed: "c"},
		{name: "empty id", push: w("", 0), now: t0, errText: "empty waiter ID"},
		{name: "zero arrival", push: Waiter{ID: "a"}, now: t0, errText: "Arrived is zero"},
		{name: "NaN work", push: Waiter{ID: "a", Work: math.NaN(), Arrived: t0}, now: t0, errText: "Work NaN"},
		{name: "negative work", push: Waiter{ID: "a", Work: -1, Arrived: t0}, now: t0, errText: "Work -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewQueue(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range tc.waiting {
				if _, err := q.Push(x, t0); err != nil {
					t.Fatal(err)
				}
			}
			before := slices.Collect(q.All(tc.now))
			shed, err := q.Push(tc.push, tc.now)
			switch {
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("error %v, want one saying %q", err, tc.errText)
				}
			case !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil):
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if err != nil {
				if after := slices.Collect(q.All(tc.now)); !slices.Equal(before, after) || shed != nil {
					t.Fatalf("a refused push changed the queue: %v → %v, shed %v", ids(before), ids(after), shed)
				}
				return
			}
			var gotShed string
			if len(shed) == 1 {
				gotShed = shed[0].ID
			}
			if len(shed) > 1 || gotShed != tc.shed {
				t.Fatalf("shed %v, want %q", ids(shed), tc.shed)
			}
		})
	}
}

func TestQueuePushErrorBoundsEcho(t *testing.T) {
	q, _ := NewQueue(DefaultQueueConfig())
	id := strings.Repeat("x", 10_000)
	if _, err := q.Push(Waiter{ID: id, Arrived: t0}, t0); err != nil {
		t.Fatal(err)
	}
	_, err := q.Push(Waiter{ID: id, Arrived: t0}, t0)
	if !errors.Is(err, ErrDuplicateWaiter) || len(err.Error()) > 200 {
		t.Fatalf("error %d bytes: %.300v", len(err.Error()), err)
	}
}

func TestQueueConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  QueueConfig
		want string // "" for valid
	}{
		{name: "default", cfg: DefaultQueueConfig()},
		{name: "zero: defaults", cfg: QueueConfig{}},
		{name: "negative aging: default", cfg: QueueConfig{Aging: -time.Second}},
		{name: "order", cfg: QueueConfig{Order: 7}, want: "Order 7"},
		{name: "max len", cfg: QueueConfig{MaxLen: -1}, want: "MaxLen -1 is negative"},
		{name: "max wait", cfg: QueueConfig{MaxWait: -time.Second}, want: "MaxWait -1s is negative"},
		{name: "band max len", cfg: QueueConfig{Bands: []QueueBand{{Priority: 1}, {Priority: 2, MaxLen: -3}}}, want: "Bands[1].MaxLen -3"},
		{name: "band max wait", cfg: QueueConfig{Bands: []QueueBand{{Priority: 1, MaxWait: -time.Second}}}, want: "Bands[0].MaxWait -1s"},
		{name: "duplicate band", cfg: QueueConfig{Bands: []QueueBand{{Priority: -1}, {Priority: 3}, {Priority: -1}}}, want: "Bands[2].Priority -1 is given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewQueue(tc.cfg)
			if tc.want == "" {
				if err != nil || q == nil {
					t.Fatalf("NewQueue: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestQueueDefaults(t *testing.T) {
	q, err := NewQueue(QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if q.maxLen != DefaultQueueMaxLen || q.maxWait != DefaultQueueMaxWait || q.aging != DefaultQueueAging || q.order != QueueFCFS {
		t.Fatalf("zero config: %+v", q)
	}
	if c := DefaultQueueConfig(); c.Order != QueueShortestWork || c.Aging != 2*time.Second || c.MaxLen != 1024 || c.MaxWait != 30*time.Second || c.Bands != nil {
		t.Fatalf("DefaultQueueConfig %+v", c)
	}
}

func TestParseQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want QueueOrder
		err  string
	}{
		{in: "fcfs", want: QueueFCFS},
		{in: "shortest-work", want: QueueShortestWork},
		{in: "FCFS", err: `queue order "FCFS": want fcfs or shortest-work`},
		{in: "", err: `queue order "": want fcfs or shortest-work`},
		{in: strings.Repeat("w", 5000), err: "(5000 bytes)"},
	} {
		got, err := ParseQueueOrder(tc.in)
		if tc.err == "" {
			if err != nil || got != tc.want || got.String() != tc.in {
				t.Errorf("ParseQueueOrder(%q) = %v, %v", tc.in, got, err)
			}
			var u QueueOrder
			if err := u.UnmarshalText([]byte(tc.in)); err != nil || u != tc.want {
				t.Errorf("UnmarshalText(%q) = %v, %v", tc.in, u, err)
			}
			continue
		}
		var ne *NameError
		if !errors.As(err, &ne) || !strings.Contains(err.Error(), tc.err) || len(err.Error()) > 200 {
			t.Errorf("ParseQueueOrder(%.20q…) error %.300v, want a *NameError saying %q", tc.in, err, tc.err)
		}
	}
	if s := QueueOrder(9).String(); s != "QueueOrder(9)" {
		t.Errorf("String of an unknown order: %q", s)
	}
}

func TestQueueRetryAfter(t *testing.T) {
	cfg := QueueConfig{MaxLen: 3, MaxWait: 20 * time.Second, Bands: []QueueBand{{Priority: 1, MaxLen: 1, MaxWait: 5 * time.Second}, {Priority: 3, MaxWait: 100 * time.Second}}}
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name    string
		waiting []Waiter
		p       int
		now     time.Time
		want    time.Duration
	}{
		{name: "empty", p: 0, now: t0, want: time.Second},
		{name: "full: earliest deadline of p or higher", p: 0, now: at(2),
			waiting: []Waiter{{ID: "a", Arrived: t0}, {ID: "b", Arrived: at(1)}, {ID: "c", Priority: 2, Arrived: t0, Deadline: at(8.5)}},
			want:    7 * time.Second}, // c leaves at 8.5: 6.5s, rounded up
		{name: "band full: its own waiters only", p: 1, now: at(1),
			waiting: []Waiter{{ID: "a", Priority: 1, Arrived: t0}, {ID: "b", Priority: 2, Arrived: t0, Deadline: at(2)}},
			want:    4 * time.Second}, // a's band MaxWait: leaves at 5
		{name: "at least 1s", p: 0, now: at(19.9),
			waiting: []Waiter{{ID: "a", Arrived: t0}, {ID: "b", Arrived: t0}, {ID: "c", Arrived: t0}},
			want:    time.Second},
		{name: "at most MaxWait", p: 0, now: t0,
			waiting: []Waiter{{ID: "a", Priority: 3, Arrived: t0, Deadline: at(1000)}},
			want:    20 * time.Second},
		{name: "band's MaxWait", p: 1, now: t0,
			waiting: []Waiter{{ID: "a", Priority: 3, Arrived: t0}},
			want:    5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewQueue(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.waiting {
				if _, err := q.Push(w, t0); err != nil {
					t.Fatal(err)
				}
			}
			if got := q.RetryAfter(tc.p, tc.now); got != tc.want {
				t.Fatalf("RetryAfter(%d) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

// TestQueueShortestWorkAging: the shorter go first until the long one has
// waited Aging; then it goes ahead of everyone who arrived after it.
func TestQueueShortestWorkAging(t *testing.T) {
	q, err := NewQueue(DefaultQueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	push := func(id string, work float64, at time.Duration) {
		t.Helper()
		if _, err := q.Push(Waiter{ID: id, Work: work, Arrived: t0.Add(at)}, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	push("long", 30_000, 0)
	push("short", 10, time.Second)
	push("mid", 500, 1500*time.Millisecond)
	push("hi", 1e6, 0)
	if _, err := q.Push(Waiter{ID: "urgent", Priority: 1, Work: 1e9, Arrived: t0.Add(1900 * time.Millisecond)}, t0); err != nil {
		t.Fatal(err)
	}
	order := func(now time.Duration) string {
		var s []string
		for w := range q.All(t0.Add(now)) {
			s = append(s, w.ID)
		}
		return strings.Join(s, " ")
	}
	if got, want := order(1900*time.Millisecond), "urgent short mid long hi"; got != want {
		t.Errorf("before aging: %q, want %q", got, want)
	}
	if got, want := order(2*time.Second), "urgent hi long short mid"; got != want {
		t.Errorf("long and hi aged: %q, want %q", got, want)
	}
}

// TestQueueAllRemoveDuringWalk: the Service's loop, placing the waiter
// yielded and cancelling another, sees every other waiter once, in order.
func TestQueueAllRemoveDuringWalk(t *testing.T) {
	for _, order := range []QueueOrder{QueueFCFS, QueueShortestWork} {
		t.Run(order.String(), func(t *testing.T) {
			cfg := DefaultQueueConfig()
			cfg.Order = order
			q, err := NewQueue(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				w := Waiter{ID: fmt.Sprintf("w%02d", i), Priority: i % 3, Work: float64((i * 7) % 10), Arrived: t0.Add(time.Duration(i) * 100 * time.Millisecond)}
				if _, err := q.Push(w, t0); err != nil {
					t.Fatal(err)
				}
			}
			now := t0.Add(3 * time.Second) // some aged, some not
			want := slices.Collect(q.All(now))
			var got []Waiter
			cancelled := map[string]bool{}
			for w := range q.All(now) {
				got = append(got, w)
				if len(got)%2 == 0 {
					if _, ok := q.Remove(w.ID); !ok {
						t.Fatalf("placed %s: not waiting", w.ID)
					}
				}
				if len(got)%5 == 0 {
					// Cancel the one after next.
					i := slices.Index(want, w)
					for _, x := range want[i+1:] {
						if !cancelled[x.ID] && x != want[i+1] {
							q.Remove(x.ID)
							cancelled[x.ID] = true
							break
						}
					}
				}
			}
			want = slices.DeleteFunc(want, func(w Waiter) bool { return cancelled[w.ID] })
			if !slices.Equal(got, want) {
				t.Fatalf("walk with removals:\n got %v\nwant %v", ids(got), ids(want))
			}
		})
	}
}

// TestQueueDeepOrder: a deep queue (deeper than the property test's)
// walked whole in both orders equals the reference, with some aged.
func TestQueueDeepOrder(t *testing.T) {
	for _, order := range []QueueOrder{QueueFCFS, QueueShortestWork} {
		t.Run(order.String(), func(t *testing.T) {
			cfg := QueueConfig{Order: order, Aging: time.Second, MaxLen: 2000, MaxWait: time.Minute}
			q, err := NewQueue(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ref := &refQueue{cfg: cfg}
			rng := seeded(7)
			for i := range 1500 {
				w := Waiter{ID: fmt.Sprint("w", i), Priority: rng.IntN(3), Work: float64(rng.IntN(1000)),
					Arrived: t0.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)}
				if _, err := q.Push(w, t0); err != nil {
					t.Fatal(err)
				}
				ref.push(w, t0)
			}
			for i := range 500 {
				id := fmt.Sprint("w", rng.IntN(1500))
				if _, ok := q.Remove(id); ok != (ref.find(id) >= 0) {
					t.Fatalf("Remove %d %s: %v", i, id, ok)
				}
				ref.remove(id)
			}
			now := t0.Add(3 * time.Second)
			if got, want := slices.Collect(q.All(now)), ref.order(now); !slices.Equal(got, want) {
				t.Fatalf("All:\n got %v\nwant %v", ids(got), ids(want))
			}
			if err := q.invariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// BenchmarkQueue is the Service's step at a given number waiting: a
// request arrives (Push), a worker frees and takes the first in order
// (All, stopped after one) and it leaves (Remove).
func BenchmarkQueue(b *testing.B) {
	for _, order := range []QueueOrder{QueueShortestWork, QueueFCFS} {
		for _, n := range []int{10, 1_000, 10_000} {
			b.Run(fmt.Sprintf("%s/waiting=%d", order, n), func(b *testing.B) {
				cfg := DefaultQueueConfig()
				cfg.Order, cfg.MaxLen, cfg.MaxWait = order, 2*n, time.Hour
				q, err := NewQueue(cfg)
				if err != nil {
					b.Fatal(err)
				}
				rng := seeded(1)
				now := t0
				newWaiter := func(i int) Waiter {
					return Waiter{ID: fmt.Sprint("w", i), Priority: rng.IntN(3) - 1, Work: float64(rng.IntN(32_000)), Arrived: now}
				}
				for i := range n {
					now = now.Add(time.Millisecond)
					if _, err := q.Push(newWaiter(i), now); err != nil {
						b.Fatal(err)
					}
				}
				ws := make([]Waiter, b.N)
				for i := range ws {
					ws[i] = newWaiter(n + i)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					now = now.Add(time.Millisecond)
					ws[i].Arrived = now
					if _, err := q.Push(ws[i], now); err != nil {
						b.Fatal(err)
					}
					for w := range q.All(now) {
						q.Remove(w.ID)
						break
					}
				}
			})
		}
	}
}
