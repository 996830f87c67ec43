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
// requests arriving together with the same new prefix all see it
// uncached and spread over the fleet. Each booking predicts its prompt's
// blocks on its rank; a prediction ends after the TTL, or as soon as the
// index holds the rank's blocks (the events arrived: Merge), whichever
// comes first. Predictions never enter the index (index ⊆ engine truth):
// a query scores the larger of the two (Merge) and shows them apart.
//
// Entries are keyed by the sequence hash of a block (HashSequence of the
// prompt's local hashes), so that a prediction matches a prefix, not a
// block content. It is bounded (MaxEntries, the oldest first) and safe for
// concurrent use; every method takes now, none reads a clock.
type Predictions struct {
	ttl time.Duration
	max int

	mu    sync.Mutex // guards parts and n
	parts map[PartitionKey]*predPart
	n     int // live (block, rank) entries over all partitions
}

type predPart struct {
	blocks map[uint64][]predEntry // sequence hash → the ranks predicted to hold it
	// queue is every entry in the order it was made (or refreshed), so in
	// expiry order: one TTL for all. A refreshed entry leaves a stale item
	// behind, skipped when it reaches the front (its expiry differs).
	queue []predItem
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

// NewPredictions returns a side index whose entries live ttl (> 0), of at
// most maxEntries (block, rank) entries (≤ 0: DefaultMaxPredicted).
func NewPredictions(ttl time.Duration, maxEntries int) *Predictions {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxPredicted
	}
	return &Predictions{ttl: ttl, max: maxEntries, parts: map[PartitionKey]*predPart{}}
}

// TTL returns how long a prediction lives.
func (p *Predictions) TTL() time.Duration { return p.ttl }

// Len returns the live (block, rank) entries, expired ones not yet
// dropped included.
func (p *Predictions) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Add predicts that rank r of partition k is about to hold the blocks of
// a prompt given by its local block hashes (HashBlocks), until now+TTL.
// Predicting blocks again refreshes them.
func (p *Predictions) Add(k PartitionKey, r Rank, local []uint64, now time.Time) {
	if len(local) == 0 || p.ttl <= 0 {
		return
	}
	seq := HashSequence(make([]uint64, 0, len(local)), local)
	exp := now.Add(p.ttl)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	pp := p.parts[k]
	if pp == nil {
		pp = &predPart{blocks: map[uint64][]predEntry{}}
		p.parts[k] = pp
	}
	for _, h := range seq {
		es := pp.blocks[h]
		i := slices.IndexFunc(es, func(e predEntry) bool { return e.rank == r })
		if i >= 0 {
			es[i].expires = exp
		} else {
			pp.blocks[h] = append(es, predEntry{rank: r, expires: exp})
			p.n++
		}
		pp.queue = append(pp.queue, predItem{seq: h, rank: r, expires: exp})
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

// Expire drops every prediction that ended by now.
func (p *Predictions) Expire(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
}

func (p *Predictions) expireLocked(now time.Time) {
	for k, pp := range p.parts {
		for pp.head < len(pp.queue) && !pp.queue[pp.head].expires.After(now) {
			it := pp.queue[pp.head]
			pp.head++
			if pp.remove(it.seq, it.rank, it.expires) {
				p.n--
			}
		}
		pp.compact()
		if len(pp.blocks) == 0 && pp.head == len(pp.queue) {
			delete(p.parts, k)
		}
	}
}

// dropOldestLocked drops the oldest entry of any partition (the one that
// expires first) and reports whether there was one.
func (p *Predictions) dropOldestLocked() bool {
	var oldest *predPart
	for _, pp := range p.parts {
		for pp.head < len(pp.queue) {
			it := pp.queue[pp.head]
			es := pp.blocks[it.seq]
			if slices.ContainsFunc(es, func(e predEntry) bool { return e.rank == it.rank && e.expires.Equal(it.expires) }) {
				break
			}
			pp.head++ // stale: refreshed or confirmed since
		}
		if pp.head < len(pp.queue) && (oldest == nil || pp.queue[pp.head].expires.Before(oldest.queue[oldest.head].expires)) {
			oldest = pp
		}
	}
	if oldest == nil {
		return false
	}
	it := oldest.queue[oldest.head]
	oldest.head++
	if oldest.remove(it.seq, it.rank, it.expires) {
		p.n--
	}
	oldest.compact()
	return true
}

// compact reclaims the queue's consumed front once it is half the queue.
func (pp *predPart) compact() {
	if pp.head > 1024 && pp.head*2 >= len(pp.queue) {
		pp.queue = append(pp.queue[:0], pp.queue[pp.head:]...)
		pp.head = 0
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
