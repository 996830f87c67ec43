package daemon

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prefixd/prefixd/catalog"
)

// DefaultMaxRanks is the default cap on worker ranks over all workers
// (Config.MaxRanks): each rank is a stream (a goroutine, a socket and its
// state) whether or not its engine answers.
const DefaultMaxRanks = 4096

// rankCap admits catalog records while the ranks of the admitted records
// fit under a limit. It turns the watcher's changes into the changes the
// daemon applies: a record whose ranks do not fit is held back (ignored:
// no streams, no pool, not in /workers) until ranks leave, when held
// records are admitted in key order while they fit. An admitted record
// whose update no longer fits leaves, and is held like any other.
// Admitted records stay admitted: no record is displaced by another.
//
// It also checks registrations before they are written (Reserve): the
// ranks of the catalog — admitted, held, and reserved by registrations
// whose records the watch has not delivered yet — must stay within the
// limit, so concurrent registrations through one daemon cannot pass it
// together.
//
// A driven type, on an injected clock: not safe for concurrent use.
type rankCap struct {
	limit    int // 0: no limit
	admitted map[catalog.Key]catalog.Worker
	held     map[catalog.Key]catalog.Change // as an Added change
	total    int                            // ranks of the admitted records
	heldN    int                            // ranks of the held records
	reserved map[uint64]reservation         // by id
	nextID   uint64
}

// reservation is ranks a registration of key is writing.
type reservation struct {
	key   catalog.Key
	ranks int
	until time.Time // dropped then, if the watch never delivered the key
}

func newRankCap(limit int) *rankCap {
	return &rankCap{limit: max(limit, 0), admitted: map[catalog.Key]catalog.Worker{}, held: map[catalog.Key]catalog.Change{},
		reserved: map[uint64]reservation{}}
}

// Reserve checks that a registration adding n ranks to record k fits
// under the limit, counting the catalog's ranks and those other
// registrations reserved, and reserves them until the watch delivers k,
// Release, or until. It returns the reservation's id (0 when it reserves
// nothing), or a *catalog.ConflictError naming the limit and the count.
func (c *rankCap) Reserve(k catalog.Key, n int, now, until time.Time) (uint64, error) {
	if c.limit == 0 || n == 0 {
		return 0, nil
	}
	reserved := 0
	for id, r := range c.reserved {
		if !now.Before(r.until) {
			delete(c.reserved, id)
			continue
		}
		reserved += r.ranks
	}
	registered := c.total + c.heldN
	if registered+reserved+n > c.limit {
		being := ""
		if reserved > 0 {
			being = fmt.Sprintf(" and %d are being registered", reserved)
		}
		return 0, &catalog.ConflictError{Field: "data_parallel_size", Reason: fmt.Sprintf(
			"%d more ranks would make %d, beyond this daemon's limit of %d ranks (--max-ranks): %d are registered%s; unregister workers first",
			n, registered+reserved+n, c.limit, registered, being)}
	}
	c.nextID++
	c.reserved[c.nextID] = reservation{key: k, ranks: n, until: until}
	return c.nextID, nil
}

// Release drops reservation id (a registration that failed).
func (c *rankCap) Release(id uint64) { delete(c.reserved, id) }

// ranksOf is how many ranks a record streams.
func ranksOf(w catalog.Worker) int { return int(w.DataParallelSize) }

func (c *rankCap) fits(n int) bool { return c.limit == 0 || c.total+n <= c.limit }

// Apply takes a change from the watcher and returns the changes to apply,
// in order, and whether ch's record was held back.
func (c *rankCap) Apply(ch catalog.Change) (out []catalog.Change, held bool) {
	for id, r := range c.reserved {
		if r.key == ch.Key { // delivered: counted from now on as admitted or held
			delete(c.reserved, id)
		}
	}
	old, was := c.admitted[ch.Key]
	if was {
		c.total -= ranksOf(old)
		delete(c.admitted, ch.Key)
	}
	if h, ok := c.held[ch.Key]; ok {
		c.heldN -= ranksOf(h.Worker)
		delete(c.held, ch.Key)
	}
	if ch.Kind == catalog.Removed {
		if was {
			out = append(out, ch)
		}
		return c.fill(out), false
	}
	if n := ranksOf(ch.Worker); c.fits(n) {
		c.admitted[ch.Key], c.total = ch.Worker, c.total+n
		if was { // what the daemon applied before is old, whatever the watcher delivered
			return append(out, catalog.Change{Kind: catalog.Updated, Key: ch.Key, Worker: ch.Worker, Old: old, Lease: ch.Lease, Revision: ch.Revision}), false
		}
		return append(out, catalog.Change{Kind: catalog.Added, Key: ch.Key, Worker: ch.Worker, Lease: ch.Lease, Revision: ch.Revision}), false
	}
	c.held[ch.Key] = catalog.Change{Kind: catalog.Added, Key: ch.Key, Worker: ch.Worker, Lease: ch.Lease, Revision: ch.Revision}
	c.heldN += ranksOf(ch.Worker)
	if was {
		out = append(out, catalog.Change{Kind: catalog.Removed, Key: ch.Key, Worker: old, Revision: ch.Revision})
		out = c.fill(out) // its old ranks may make room for others
	}
	return out, true
}

// fill admits held records, in key order, while they fit.
func (c *rankCap) fill(out []catalog.Change) []catalog.Change {
	if len(c.held) == 0 {
		return out
	}
	keys := slices.SortedFunc(maps.Keys(c.held), func(a, b catalog.Key) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID))
	})
	for _, k := range keys {
		h := c.held[k]
		if n := ranksOf(h.Worker); c.fits(n) {
			delete(c.held, k)
			c.heldN -= n
			c.admitted[k], c.total = h.Worker, c.total+n
			out = append(out, h)
		}
	}
	return out
}

// Admitted returns the ranks of the admitted records.
func (c *rankCap) Admitted() int { return c.total }

// Held returns the ranks of the records held back.
func (c *rankCap) Held() int { return c.heldN }

// Registered returns record k as the watcher delivered it last, admitted
// or held back.
func (c *rankCap) Registered(k catalog.Key) (catalog.Worker, bool) {
	if w, ok := c.admitted[k]; ok {
		return w, true
	}
	h, ok := c.held[k]
	return h.Worker, ok
}
