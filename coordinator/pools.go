package coordinator

import (
	"fmt"
	"slices"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// Pools holds one Pool per (model, group, role), created when its first
// worker arrives, all with the same configuration and random source. A
// rank belongs to at most one pool. Not safe for concurrent use.
type Pools struct {
	cfg   PoolConfig
	rng   Rand
	pools map[PoolKey]*Pool
	owner map[indexer.Rank]PoolKey
	// onBook is every pool's Pool.onBook (Service.booked).
	onBook func(PoolKey, BookingOp, *reservation)
	// spread is every pool's PeerSpread in force: the Service sets it
	// while it holds peers (peers.go).
	spread float64
}

// NewPools returns an empty set of pools. rng must not be nil.
func NewPools(cfg PoolConfig, rng Rand) *Pools {
	return &Pools{cfg: cfg, rng: rng, pools: map[PoolKey]*Pool{}, owner: map[indexer.Rank]PoolKey{}}
}

// Pool returns the pool of k, or nil if no worker ever joined it.
func (ps *Pools) Pool(k PoolKey) *Pool { return ps.pools[k] }

// Keys returns the keys of the existing pools, sorted.
func (ps *Pools) Keys() []PoolKey {
	ks := make([]PoolKey, 0, len(ps.pools))
	for k := range ps.pools {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b PoolKey) int {
		if a.Model != b.Model {
			return cmpStr(a.Model, b.Model)
		}
		if a.Group != b.Group {
			return cmpStr(a.Group, b.Group)
		}
		return int(a.Role) - int(b.Role)
	})
	return ks
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// SetWorker adds or updates w in the pool of w.Key(). A rank that moves to
// another pool is removed from its old pool first; the reservations that
// frees are returned.
func (ps *Pools) SetWorker(w Worker) ([]Freed, error) {
	var freed []Freed
	if old, ok := ps.owner[w.Rank]; ok && old != w.Key() {
		freed = ps.RemoveWorker(w.Rank)
	}
	p := ps.pools[w.Key()]
	if p == nil {
		p = NewPool(w.Key(), ps.cfg, ps.rng)
		p.onBook = ps.onBook
		p.spread = &ps.spread
	}
	if err := p.SetWorker(w); err != nil {
		return freed, fmt.Errorf("pools: %w", err)
	}
	ps.pools[w.Key()] = p
	ps.owner[w.Rank] = w.Key()
	return freed, nil
}

// Owner reports the pool rank belongs to.
func (ps *Pools) Owner(rank indexer.Rank) (PoolKey, bool) {
	k, ok := ps.owner[rank]
	return k, ok
}

// RemoveWorker removes rank from its pool, freeing its reservations.
func (ps *Pools) RemoveWorker(rank indexer.Rank) []Freed {
	k, ok := ps.owner[rank]
	if !ok {
		return nil
	}
	delete(ps.owner, rank)
	return ps.pools[k].RemoveWorker(rank)
}

// Expire expires every pool's stale reservations, in key order.
func (ps *Pools) Expire(now time.Time) []Freed {
	var out []Freed
	for _, k := range ps.Keys() {
		out = append(out, ps.pools[k].Expire(now)...)
	}
	return out
}
