package indexer

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DefaultMaxPredicted bounds a Predictions' (block, rank) entries.
const DefaultMaxPredicted = 1 << 20

// Predictions is a short-lived side index of the blocks ranks are about
// to hold: a router books a request on a rank and, until that rank's KV
// events arrive, nothing in the index says it will cache the prompt, so
// requests arriving together with the same new prefix — or while the
// first waits in the engine's queue — all see it uncached and spread over
// the fleet. Each booking predicts its prompt's blocks on its rank (Book):
// while the booking waits for its prefill, at most PendingTTL; once the
// prefill is done or the booking ends (Settle), for TTL more, which
// covers the events' way to the index. A prediction also ends as soon as
// the index holds the rank's blocks (the events arrived: Merge).
// Predictions never enter the index (index ⊆ engine truth): a query
// scores the larger of the two (Merge) and shows them apart.
//
// Entries are keyed by the sequence hash of a block (HashSequence of the
// prompt's local hashes), so that a prediction matches a prefix, not a
// block content. It is bounded (MaxEntries, the soonest to expire
// first) and safe for concurrent use; every method takes now, none reads
// a clock.
type Predictions struct {
	ttl, pending time.Duration
	max          int

	mu       sync.Mutex // guards parts, bookings, booked and n
	parts    map[PartitionKey]*predPart
	bookings map[string]*predBooking // pending bookings, by id
	// booked is every pending booking in the order it was made (so in
	// the order its pending time ends), to forget those never settled.
	booked     []bookedItem
	bookedHead int
	n          int // live (block, rank) entries over all partitions
}

type bookedItem struct {
	id string
	b  *predBooking
}

// predBooking is what a pending booking predicted, to settle it.
type predBooking struct {
	k     PartitionKey
	rank  Rank
	seq   []uint64
	until time.Time // end of its pending time
}

type predPart struct {
	blocks map[uint64][]predEntry // sequence hash → the ranks predicted to hold it
	// queues hold every entry in the order it was made or refreshed, one
	// per lifetime (pending, settled), so each is in expiry order. A
	// refreshed entry leaves a stale item behind, skipped when it reaches
	// the front (its expiry differs).
	queues [2]predQueue
}

type predQueue struct {
	items []predItem
	head  int
}

type predEntry struct {
	rank    Rank
	expires time.Time
}

type predItem struct {
	seq     uint64
	rank    Rank
	expires time.Time
}

// DefaultPendingTTL bounds how long a booking's predictions wait for
// Settle: the coordinator's reservation lifetime.
const DefaultPendingTTL = 300 * time.Second

// NewPredictions returns a side index whose settled entries live ttl
// (> 0) and pending ones at most pending (≤ 0: DefaultPendingTTL), of at
// most maxEntries (block, rank) entries (≤ 0: DefaultMaxPredicted).
func NewPredictions(ttl, pending time.Duration, maxEntries int) *Predictions {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxPredicted
	}
	if pending <= 0 {
		pending = DefaultPendingTTL
	}
	return &Predictions{ttl: ttl, pending: max(pending, ttl), max: maxEntries, parts: map[PartitionKey]*predPart{},
		bookings: map[string]*predBooking{}}
}

// Len returns the live (block, rank) entries, expired ones not yet
// dropped included.
func (p *Predictions) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Add predicts that rank r of partition k holds the blocks of a prompt
// given by its local block hashes (HashBlocks) until now+TTL: a booking
// whose prefill is already done. Predicting blocks again refreshes them.
func (p *Predictions) Add(k PartitionKey, r Rank, local []uint64, now time.Time) {
	if len(local) == 0 || p.ttl <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addLocked(k, r, HashSequence(make([]uint64, 0, len(local)), local), now, settled)
}

// Book predicts the prompt (local block hashes) of booking id on rank r
// of partition k until Settle(id) (or PendingTTL). Booking an id again
// settles its previous prediction first.
func (p *Predictions) Book(id string, k PartitionKey, r Rank, local []uint64, now time.Time) {
	if len(local) == 0 || p.ttl <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleLocked(id, now)
	seq := HashSequence(make([]uint64, 0, len(local)), local)
	p.addLocked(k, r, seq, now, pending)
	b := &predBooking{k: k, rank: r, seq: seq, until: now.Add(p.pending)}
	p.bookings[id] = b
	p.booked = append(p.booked, bookedItem{id, b})
}

// Settle says booking id's prefill is done, or the booking ended: its
// predictions live TTL from now. An unknown id is ignored.
func (p *Predictions) Settle(id string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settleLocked(id, now)
}

func (p *Predictions) settleLocked(id string, now time.Time) {
	b, ok := p.bookings[id]
	if !ok {
		return
	}
	delete(p.bookings, id)
	pp := p.parts[b.k]
	if pp == nil {
		return
	}
	exp := now.Add(p.ttl)
	q := &pp.queues[settled]
	for _, h := range b.seq {
		es := pp.blocks[h]
		if i := slices.IndexFunc(es, func(e predEntry) bool { return e.rank == b.rank }); i >= 0 && es[i].expires.After(exp) {
			es[i].expires = exp
			q.items = append(q.items, predItem{seq: h, rank: b.rank, expires: exp})
		}
	}
}

// The two lifetimes, indexes of predPart.queues.
const (
	pending = 0
	settled = 1
)

func (p *Predictions) addLocked(k PartitionKey, r Rank, seq []uint64, now time.Time, life int) {
	p.expireLocked(now)
	pp := p.parts[k]
	if pp == nil {
		pp = &predPart{blocks: map[uint64][]predEntry{}}
		p.parts[k] = pp
	}
	exp := now.Add(p.ttl)
	if life == pending {
		exp = now.Add(p.pending)
	}
	q := &pp.queues[life]
	for _, h := range seq {
		es := pp.blocks[h]
		i := slices.IndexFunc(es, func(e predEntry) bool { return e.rank == r })
		switch {
		case i < 0:
			pp.blocks[h] = append(es, predEntry{rank: r, expires: exp})
			p.n++
		case es[i].expires.Before(exp):
			es[i].expires = exp
		default:
			continue // already predicted longer
		}
		q.items = append(q.items, predItem{seq: h, rank: r, expires: exp})
	}
	for p.n > p.max && p.dropOldestLocked() {
	}
}

// Match returns, per rank of partition k with a live prediction of the
// prompt's first block, how many leading blocks of the prompt (local
// block hashes) it is predicted to hold, as device-tier overlaps in rank
// order, appended to dst.
func (p *Predictions) Match(k PartitionKey, local []uint64, now time.Time, dst []Overlap) []Overlap {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.matchLocked(k, local, now, dst)
}

func (p *Predictions) matchLocked(k PartitionKey, local []uint64, now time.Time, dst []Overlap) []Overlap {
	pp := p.parts[k]
	if pp == nil || len(local) == 0 {
		return dst
	}
	start := len(dst)
	var prev uint64
	for i, h := range local {
		if i > 0 {
			h = seqNext(prev, h)
		}
		prev = h
		es := pp.blocks[h]
		if i == 0 {
			for _, e := range es {
				if e.expires.After(now) {
					dst = append(dst, Overlap{Rank: e.rank, Device: 1, Host: 1, Disk: 1})
				}
			}
			if len(dst) == start {
				return dst
			}
			continue
		}
		alive := false
		for j := start; j < len(dst); j++ {
			o := &dst[j]
			if o.Device != uint32(i) {
				continue // stopped earlier
			}
			for _, e := range es {
				if e.rank == o.Rank && e.expires.After(now) {
					o.Device, o.Host, o.Disk = o.Device+1, o.Host+1, o.Disk+1
					alive = true
					break
				}
			}
		}
		if !alive {
			break
		}
	}
	slices.SortFunc(dst[start:], compareRank)
	return dst
}

// Merge scores a prompt (local block hashes) of partition k from the
// index's overlaps ov and the predictions: each rank's overlap is the
// larger of the two (a predicted block counts as a device block), so ov
// is returned with the predicted ranks added, in rank order. pred, if not
// nil, receives the predictions' own overlaps. Predictions the index
// already covers (the rank's events arrived) end here.
func (p *Predictions) Merge(k PartitionKey, local []uint64, ov []Overlap, now time.Time, pred *[]Overlap) []Overlap {
	p.mu.Lock()
	defer p.mu.Unlock()
	var buf [8]Overlap
	got := p.matchLocked(k, local, now, buf[:0])
	if pred != nil {
		*pred = append((*pred)[:0], got...)
	}
	if len(got) == 0 {
		return ov
	}
	for _, g := range got {
		i := slices.IndexFunc(ov, func(o Overlap) bool { return o.Rank == g.Rank })
		if i < 0 {
			ov = append(ov, g)
			continue
		}
		o := &ov[i]
		if o.Device >= g.Device {
			p.confirmLocked(k, g.Rank, local[:g.Device])
			continue
		}
		o.Device = g.Device
		o.Host, o.Disk = max(o.Host, o.Device), max(o.Disk, o.Device)
	}
	slices.SortFunc(ov, compareRank)
	return ov
}

// confirmLocked ends rank r's predictions of the prompt's leading blocks
// local: the index holds them now.
func (p *Predictions) confirmLocked(k PartitionKey, r Rank, local []uint64) {
	pp := p.parts[k]
	var prev uint64
	for i, h := range local {
		if i > 0 {
			h = seqNext(prev, h)
		}
		prev = h
		if pp.remove(h, r, time.Time{}) {
			p.n--
		}
	}
}

// remove deletes rank r's entry of block h, if its expiry is exp (zero:
// whatever it is), and reports whether it did.
func (pp *predPart) remove(h uint64, r Rank, exp time.Time) bool {
	es := pp.blocks[h]
	i := slices.IndexFunc(es, func(e predEntry) bool { return e.rank == r })
	if i < 0 || (!exp.IsZero() && !es[i].expires.Equal(exp)) {
		return false
	}
	if len(es) == 1 {
		delete(pp.blocks, h)
	} else {
		pp.blocks[h] = slices.Delete(es, i, i+1)
	}
	return true
}

// Expire drops every prediction that ended by now, and forgets pending
// bookings whose predictions all did.
func (p *Predictions) Expire(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
}

func (p *Predictions) expireLocked(now time.Time) {
	for k, pp := range p.parts {
		for i := range pp.queues {
			q := &pp.queues[i]
			for q.head < len(q.items) && !q.items[q.head].expires.After(now) {
				it := q.items[q.head]
				q.head++
				if pp.remove(it.seq, it.rank, it.expires) {
					p.n--
				}
			}
			q.compact()
		}
		if len(pp.blocks) == 0 && pp.queues[0].empty() && pp.queues[1].empty() {
			delete(p.parts, k)
		}
	}
	// A booking is pending at most PendingTTL: past it, there is nothing
	// left to settle.
	for p.bookedHead < len(p.booked) && !p.booked[p.bookedHead].b.until.After(now) {
		it := p.booked[p.bookedHead]
		p.booked[p.bookedHead] = bookedItem{}
		p.bookedHead++
		if p.bookings[it.id] == it.b {
			delete(p.bookings, it.id)
		}
	}
	if p.bookedHead > 1024 && p.bookedHead*2 >= len(p.booked) {
		p.booked = append(p.booked[:0], p.booked[p.bookedHead:]...)
		p.bookedHead = 0
	}
}

// Pending returns the bookings waiting for Settle.
func (p *Predictions) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.bookings)
}

// dropOldestLocked drops the entry that expires first, over every
// partition and lifetime, and reports whether there was one.
func (p *Predictions) dropOldestLocked() bool {
	var oldest *predQueue
	var part *predPart
	for _, pp := range p.parts {
		for i := range pp.queues {
			q := &pp.queues[i]
			for q.head < len(q.items) {
				it := q.items[q.head]
				if slices.ContainsFunc(pp.blocks[it.seq], func(e predEntry) bool { return e.rank == it.rank && e.expires.Equal(it.expires) }) {
					break
				}
				q.head++ // stale: refreshed or confirmed since
			}
			if q.head < len(q.items) && (oldest == nil || q.items[q.head].expires.Before(oldest.items[oldest.head].expires)) {
				oldest, part = q, pp
			}
		}
	}
	if oldest == nil {
		return false
	}
	it := oldest.items[oldest.head]
	oldest.head++
	if part.remove(it.seq, it.rank, it.expires) {
		p.n--
	}
	oldest.compact()
	return true
}

func (q *predQueue) empty() bool { return q.head == len(q.items) }

// compact reclaims the queue's consumed front once it is half the queue.
func (q *predQueue) compact() {
	if q.head > 1024 && q.head*2 >= len(q.items) {
		q.items = append(q.items[:0], q.items[q.head:]...)
		q.head = 0
	} else if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

// RemoveRank drops every prediction of rank r (it left the index).
func (p *Predictions) RemoveRank(k PartitionKey, r Rank) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.parts[k]
	if pp == nil {
		return
	}
	for h, es := range pp.blocks {
		if i := slices.IndexFunc(es, func(e predEntry) bool { return e.rank == r }); i >= 0 {
			p.n--
			if len(es) == 1 {
				delete(pp.blocks, h)
			} else {
				pp.blocks[h] = slices.Delete(es, i, i+1)
			}
		}
	}
}

func compareRank(a, b Overlap) int {
	if c := cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID); c != 0 {
		return c
	}
	return cmp.Compare(a.Rank.DPRank, b.Rank.DPRank)
}
