package routing

import (
	"cmp"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"

	"github.com/zeebo/xxh3"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/sim/trace"
)

type randomRouter struct{ s *sim }

func (p randomRouter) route(*request) (int, error) { return p.s.rng.IntN(len(p.s.engines)), nil }
func (randomRouter) prefilled(*request)            {}
func (randomRouter) done(*request)                 {}

type roundRobin struct {
	s    *sim
	next int
}

func (p *roundRobin) route(*request) (int, error) {
	i := p.next
	p.next = (p.next + 1) % len(p.s.engines)
	return i, nil
}
func (*roundRobin) prefilled(*request) {}
func (*roundRobin) done(*request)      {}

// leastLoaded counts what a router without engine metrics knows: the
// requests it (replica rep) sent each engine that have not finished.
type leastLoaded struct {
	s   *sim
	rep int
}

func (p leastLoaded) route(*request) (int, error) {
	best, ties := -1, 0
	for i, e := range p.s.engines {
		n, b := e.inflight[p.rep], 0
		if best >= 0 {
			b = p.s.engines[best].inflight[p.rep]
		}
		switch {
		case best < 0 || n < b:
			best, ties = i, 1
		case n == b:
			// Reservoir sampling: each tie equally likely.
			if ties++; p.s.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best, nil
}
func (leastLoaded) prefilled(*request) {}
func (leastLoaded) done(*request)      {}

// ring is consistent hashing of the prompt's first block (its engine
// block hash) onto points engines each own.
type ring struct {
	s      *sim
	points []uint64
	owner  []int
}

func newRing(s *sim, perEngine int) *ring {
	type pt struct {
		h uint64
		e int
	}
	var pts []pt
	var buf [16]byte
	for e := range s.engines {
		for v := range perEngine {
			binary.LittleEndian.PutUint64(buf[:8], uint64(e))
			binary.LittleEndian.PutUint64(buf[8:], uint64(v))
			pts = append(pts, pt{xxh3.Hash(buf[:]), e})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int { return cmp.Compare(a.h, b.h) })
	r := &ring{s: s}
	for _, p := range pts {
		r.points, r.owner = append(r.points, p.h), append(r.owner, p.e)
	}
	return r
}

func (p *ring) route(r *request) (int, error) {
	n := min(len(r.tokens), p.s.cfg.BlockSize)
	key := mocker.BlockHash(0, r.tokens[:n])
	i, _ := slices.BinarySearch(p.points, key)
	if i == len(p.points) {
		i = 0
	}
	return p.owner[i], nil
}
func (*ring) prefilled(*request) {}
func (*ring) done(*request)      {}

// svcRouter routes through a replica's coordinator service: select and
// reserve, prefill complete at the first token, free at the end.
type svcRouter struct {
	s   *sim
	svc *coordinator.Service
}

var aggregated = coordinator.PoolKey{Model: model, Group: group, Role: coordinator.RoleAggregated}

func (p svcRouter) route(r *request) (int, error) {
	c, err := p.svc.SelectAndReserve(coordinator.SelectRequest{ID: r.id, Pool: aggregated, Tokens: r.tokens})
	if err != nil {
		return 0, err
	}
	return p.s.byRank[c.Rank], nil
}

func (p svcRouter) prefilled(r *request) { _ = p.svc.ReservePrefillComplete(r.id) }

// done frees the booking; one already expired is gone (not an error here).
func (p svcRouter) done(r *request) { _ = p.svc.Free(r.id) }

// oracle is an overlap source that reads every engine's true prefix
// cache: the cost function with perfect knowledge.
type oracle struct{ s *sim }

func (o oracle) Overlaps(_, _ string, tokens []uint32, _, _ string) ([]indexer.Overlap, int, error) {
	hashes := mocker.BlockHashes(tokens, o.s.cfg.BlockSize)
	var ov []indexer.Overlap
	for _, e := range o.s.engines {
		if n := uint32(e.pool.HitBlocks(hashes)); n > 0 {
			ov = append(ov, indexer.Overlap{Rank: e.rank, Device: n, Host: n, Disk: n})
		}
	}
	return ov, o.s.cfg.BlockSize, nil
}

// errQueued is a queuedRouter's answer for a request that waits in its
// replica's router queue: the sim starts it when placed (placeWaiting).
var errQueued = errors.New("queued")

// queued is a request waiting in a replica's router queue.
type queued struct {
	r *request
	t *coordinator.Ticket
}

// queuedRouter routes as svcRouter does, through the router queue: a
// request that finds every engine busy waits. Under PrefixdSession it
// names the request's session.
type queuedRouter struct{ svcRouter }

func (p queuedRouter) route(r *request) (int, error) {
	c, t, err := p.svc.Enqueue(coordinator.SelectRequest{ID: r.id, Pool: aggregated, Tokens: r.tokens, Wait: &coordinator.Wait{},
		Session: r.session})
	switch {
	case err != nil:
		return 0, err
	case t != nil:
		p.s.queued++
		p.s.waiting = append(p.s.waiting, queued{r: r, t: t})
		return 0, errQueued
	}
	return p.s.byRank[c.Rank], nil
}

// Sessions derives each request's session from its hash ids, as the
// Mooncake trace names none: the first hash id after the longest prefix
// of hash ids every request shares (on the shipped trace one block, the
// common system prompt; a conversation's turns then share the next id,
// their first message). A request with no id past that prefix has no
// session ("").
func Sessions(reqs []trace.Request) []string {
	common := 0
	if len(reqs) > 0 {
		common = len(reqs[0].HashIDs)
		for _, r := range reqs[1:] {
			n := 0
			for n < common && n < len(r.HashIDs) && r.HashIDs[n] == reqs[0].HashIDs[n] {
				n++
			}
			common = n
		}
	}
	out := make([]string, len(reqs))
	for i, r := range reqs {
		if len(r.HashIDs) > common {
			out[i] = strconv.FormatUint(r.HashIDs[common], 10)
		}
	}
	return out
}
