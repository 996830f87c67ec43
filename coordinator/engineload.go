package coordinator

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// The engine's own load, and bookings made since it.
//
// A rank's load as selection sees it (its effective load) combines two
// sources. The engine's figure (EngineLoad, from its /metrics) is the
// truth as of its scrape, At. Bookings are what selection has sent the
// rank. The rule:
//
//   - a booking created at or before the figure's At is assumed inside
//     the figure (the engine had it, or it is gone);
//   - a booking created after At adds on top: its request, and the blocks
//     it added to the rank when booked (its blocks no earlier live
//     booking of the rank held, or all of them without KV reuse);
//   - decode blocks = round(KVUsage × TotalKVBlocks) + blocks since, when
//     the rank's capacity is known; without it, bookings alone;
//   - requests = Running + Waiting + requests since;
//   - prefill tokens: bookings alone. Neither vLLM nor SGLang reports the
//     prompt tokens it has yet to prefill, and a booking's prefill tokens
//     leave the load when its prefill completes, so the bookings are the
//     better figure;
//   - without a figure (none yet, or SetEngineLoad forgot it because it
//     went stale), every term is the bookings'.
//
// So each booking counts at most once (inside the figure, or on top,
// never both), no term goes negative (a booking takes away exactly what
// it added), and when traffic stops the next figure is the whole load:
// 0 when the engine reports 0. A booking that leaked (a client that never
// freed it) stops counting in blocks and requests at the next figure,
// long before its TTL. Reading the effective load is O(1) and booking
// stays O(1); a new figure walks only the bookings made since the
// previous one.
//
// A booking moved to another rank (Move) counts on top there until that
// rank's next figure, as one just made: the request arrives there now. A
// peer replica's booking (ApplyPeer) is made, for this rule, when this
// replica receives it: one received after the figure counts on top,
// though the engine may already hold it (counted twice until the next
// figure, never missed).

// EngineLoad is an engine rank's own report of its load, as of At (its
// scrape).
type EngineLoad struct {
	At      time.Time
	Running int     // vllm:num_requests_running / sglang:num_running_reqs
	Waiting int     // vllm:num_requests_waiting / sglang:num_queue_reqs
	KVUsage float64 // vllm:kv_cache_usage_perc / sglang:token_usage, in [0, 1]
}

// MaxEngineRequests bounds EngineLoad.Running and Waiting: an engine
// reporting more is not believed.
const MaxEngineRequests = 1 << 20

// Engine-load errors.
var (
	// ErrInvalidLoad: an EngineLoad out of range (negative or absurd
	// counts, a usage outside [0, 1] or not a number).
	ErrInvalidLoad = errors.New("invalid engine load")
	// ErrStaleLoad: an EngineLoad older than the rank's current figure
	// (scrapes that finished out of order).
	ErrStaleLoad = errors.New("engine load older than the current figure")
	// ErrUnknownRank: the engine or dp rank is not in a pool.
	ErrUnknownRank = errors.New("engine rank not in a pool")
)

// Validate reports whether l is believable: counts in [0,
// MaxEngineRequests], KVUsage a number in [0, 1], At set.
func (l EngineLoad) Validate() error {
	switch {
	case l.At.IsZero():
		return fmt.Errorf("no time: %w", ErrInvalidLoad)
	case l.Running < 0 || l.Running > MaxEngineRequests:
		return fmt.Errorf("running %d outside [0, %d]: %w", l.Running, MaxEngineRequests, ErrInvalidLoad)
	case l.Waiting < 0 || l.Waiting > MaxEngineRequests:
		return fmt.Errorf("waiting %d outside [0, %d]: %w", l.Waiting, MaxEngineRequests, ErrInvalidLoad)
	case math.IsNaN(l.KVUsage) || l.KVUsage < 0 || l.KVUsage > 1:
		return fmt.Errorf("kv usage %g outside [0, 1]: %w", l.KVUsage, ErrInvalidLoad)
	}
	return nil
}

// RankLoad is a rank's load from both sources, for /workers.
type RankLoad struct {
	// Engine is the rank's figure, if HasEngine.
	Engine    EngineLoad
	HasEngine bool
	// Booked is every live booking of the rank (Pool.Load).
	Booked Load
	// Since is the bookings made after Engine.At (Blocks and Requests;
	// PrefillTokens is 0: prefill counts bookings alone); zero without a
	// figure.
	Since Load
	// Effective is the load selection uses.
	Effective Load
}

// engineState is a rank's engine figure and the bookings made since it.
type engineState struct {
	fig   EngineLoad
	has   bool
	since Load // Blocks and Requests of the reservations flagged since
	// queue holds the reservations flagged since; freed and moved ones
	// linger until the next figure or a compaction. A new figure walks
	// it whole (a moved booking is not in creation order).
	queue []*reservation
}

// engineBlocks maps a KV usage to blocks of a rank with total blocks.
func engineBlocks(usage float64, total int) int {
	return int(math.Round(usage * float64(total)))
}

// effBlocks is the rank's decode blocks as selection sees them.
func (ws *workerState) effBlocks() int {
	if !ws.eng.has || ws.w.TotalKVBlocks <= 0 {
		return ws.blocks()
	}
	return engineBlocks(ws.eng.fig.KVUsage, ws.w.TotalKVBlocks) + ws.eng.since.Blocks
}

// effReqs is the rank's requests as selection sees them.
func (ws *workerState) effReqs() int {
	if !ws.eng.has {
		return ws.reqs
	}
	return ws.eng.fig.Running + ws.eng.fig.Waiting + ws.eng.since.Requests
}

// booked counts reservation r, just booked on ws (or moved there, moved),
// on top of the figure if it is newer than the figure.
func (ws *workerState) booked(r *reservation, moved bool) {
	e := &ws.eng
	if !e.has || (!moved && !r.created.After(e.fig.At)) {
		return
	}
	r.since = true
	e.since.Blocks += r.fresh
	e.since.Requests++
	if len(e.queue) >= 64 && len(e.queue) > 2*e.since.Requests {
		e.queue = slices.DeleteFunc(e.queue, func(q *reservation) bool { return !q.since || q.rank != ws.w.Rank })
	}
	e.queue = append(e.queue, r)
}

// unbook takes reservation r, leaving ws (freed or moved), off the
// bookings since.
func (ws *workerState) unbook(r *reservation) {
	if !r.since {
		return
	}
	r.since = false
	ws.eng.since.Blocks -= r.fresh
	ws.eng.since.Requests--
}

// setEngine makes l (validated, or zero to forget) rank ws's figure:
// the bookings it is assumed to include stop counting on top.
func (ws *workerState) setEngine(l EngineLoad) error {
	e := &ws.eng
	if l.At.IsZero() {
		for _, r := range e.queue {
			if r.rank == ws.w.Rank {
				r.since = false
			}
		}
		*e = engineState{}
		return nil
	}
	if e.has && l.At.Before(e.fig.At) {
		return fmt.Errorf("rank %v load at %v before %v: %w", ws.w.Rank, l.At, e.fig.At, ErrStaleLoad)
	}
	if !e.has {
		e.fig, e.has = l, true
		return nil // every live booking predates the first figure
	}
	e.queue = slices.DeleteFunc(e.queue, func(r *reservation) bool {
		if !r.since || r.rank != ws.w.Rank {
			return true // freed, moved away or already inside a figure
		}
		if !r.created.After(l.At) {
			ws.unbook(r)
			return true
		}
		return false
	})
	e.fig = l
	return nil
}

// SetEngineLoad makes l rank's engine figure (see the rule above); a zero
// l forgets it, so that selection counts the rank's bookings alone. An
// invalid l is ErrInvalidLoad, one older than the current figure
// ErrStaleLoad, an unknown rank ErrUnknownRank; none changes anything.
func (p *Pool) SetEngineLoad(rank indexer.Rank, l EngineLoad) error {
	if !l.At.IsZero() {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("pool %v rank %v: %w", p.key, rank, err)
		}
	}
	ws, ok := p.workers[rank]
	if !ok {
		return fmt.Errorf("pool %v rank %v: %w", p.key, rank, ErrUnknownRank)
	}
	return ws.setEngine(l)
}

// RankLoad returns rank's load from both sources.
func (p *Pool) RankLoad(rank indexer.Rank) (RankLoad, bool) {
	ws, ok := p.workers[rank]
	if !ok {
		return RankLoad{}, false
	}
	rl := RankLoad{Booked: ws.load(), Effective: ws.effLoad()}
	if ws.eng.has {
		rl.Engine, rl.HasEngine, rl.Since = ws.eng.fig, true, ws.eng.since
	}
	return rl, true
}

// effLoad is the rank's load as selection sees it.
func (ws *workerState) effLoad() Load {
	return Load{Blocks: ws.effBlocks(), PrefillTokens: ws.prefill, Requests: ws.effReqs()}
}

// SetEngineLoad makes l the engine figure of dp rank dpRank of engine k
// (Pool.SetEngineLoad): from now on selection counts the rank's load as
// the figure plus the bookings made after l.At. A zero l forgets the
// figure (it went stale): selection counts bookings alone.
func (s *Service) SetEngineLoad(k EngineKey, dpRank uint32, l EngineLoad) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	p, rank, err := s.rankPool(k, dpRank)
	if err != nil {
		return err
	}
	return p.SetEngineLoad(rank, l)
}

// EffectiveLoad returns the load selection sees on dp rank dpRank of
// engine k: the engine's figure plus bookings made since, or bookings
// alone without a figure.
func (s *Service) EffectiveLoad(k EngineKey, dpRank uint32) (Load, bool) {
	rl, ok := s.RankLoad(k, dpRank)
	return rl.Effective, ok
}

// RankLoad returns the load of dp rank dpRank of engine k from both
// sources.
func (s *Service) RankLoad(k EngineKey, dpRank uint32) (RankLoad, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, rank, err := s.rankPool(k, dpRank)
	if err != nil {
		return RankLoad{}, false
	}
	return p.RankLoad(rank)
}

// rankPool finds the pool of an engine's dp rank.
func (s *Service) rankPool(k EngineKey, dpRank uint32) (*Pool, indexer.Rank, error) {
	rank := indexer.Rank{WorkerID: k.WorkerID, DPRank: dpRank}
	if slices.Contains(s.engines[k], rank) {
		if pk, ok := s.pools.Owner(rank); ok {
			if p := s.pools.Pool(pk); p != nil {
				return p, rank, nil
			}
		}
	}
	return nil, rank, fmt.Errorf("model %q group %q worker %d dp rank %d: %w", k.Model, k.Group, k.WorkerID, dpRank, ErrUnknownRank)
}
