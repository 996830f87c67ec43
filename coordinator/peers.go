package coordinator

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

// Bookings shared between replicas.
//
// Every replica of prefixd books the requests routed through it. To
// decide as one, each tells the others of its bookings as a stream of
// BookingDeltas (ServiceConfig.OnBooking) and books theirs in its own
// pools (ApplyPeer): a peer's booking holds refs by sequence hash,
// private blocks, prefill tokens and a request exactly like a local one,
// so selection reads local and peer bookings from the same Pool
// bookkeeping, with no lock beyond the Service's one mutex. Deltas are
// applied under that mutex, a batch (one message of a peer) at a time.
//
// The sharing is best effort, like Dynamo's --router-replica-sync: a
// delta lost in transit is detected by its origin's sequence and counted
// (PeerStatus.Gaps); what it would have booked or freed is repaired by a
// fresh snapshot when the transport resyncs (ResetPeer), by the
// reservation TTL (peer bookings expire like local ones), and by the
// engines' own load readings. DropPeer takes a departed replica's
// bookings away.

// BookingOp is what a BookingDelta does to a booking.
type BookingOp uint8

// The booking operations.
const (
	// BookingAdmit books a request: its blocks, private blocks, prefill
	// tokens and one request on a rank.
	BookingAdmit BookingOp = iota + 1
	// BookingPrefilled removes a booking's prefill tokens.
	BookingPrefilled
	// BookingFree releases a booking (freed, expired, its worker gone, or
	// moved: a move is a free and an admit on the new rank).
	BookingFree
)

func (op BookingOp) String() string {
	switch op {
	case BookingAdmit:
		return "admit"
	case BookingPrefilled:
		return "prefilled"
	case BookingFree:
		return "free"
	}
	return fmt.Sprintf("BookingOp(%d)", uint8(op))
}

// BookingDelta is one change to one booking of one replica.
type BookingDelta struct {
	// Origin is the replica that booked (ServiceConfig.Origin).
	Origin string
	// Seq numbers the origin's deltas from 1, without gaps.
	Seq uint64
	Op  BookingOp
	// ID is the reservation id at the origin (a plan's bookings are
	// "<plan>/decode" and "<plan>/prefill").
	ID   string
	Pool PoolKey
	Rank indexer.Rank
	// Blocks are, for an admit, the sequence hashes booked with KV reuse
	// (shared with other bookings of the rank); nil otherwise. A delta
	// OnBooking reports shares the slice with the booking: it must not
	// be modified.
	Blocks []uint64
	// Private (blocks booked without reuse) and PrefillTokens are an
	// admit's; zero otherwise.
	Private, PrefillTokens int
}

// PeerStatus is what a Service holds of one peer replica.
type PeerStatus struct {
	Origin string
	// Seq is the last sequence number seen from the origin.
	Seq uint64
	// Bookings are the origin's live bookings held here.
	Bookings int
	// Applied counts the deltas applied; Dropped those refused (a
	// duplicate or old Seq, an unknown pool, rank or id, a duplicate id,
	// a bad field, the reservation cap); Gaps the breaks in Seq, and
	// Missed the deltas those breaks skipped.
	Applied, Dropped, Gaps, Missed uint64
}

// peerSync is the Service's share of replica sync, guarded by Service.mu.
type peerSync struct {
	origin string
	emit   func(BookingDelta) // nil: nothing reported
	seq    uint64             // the last Seq reported
	peers  map[string]*peerState
	spread float64 // PoolConfig.PeerSpread, in force while peers is not empty
}

type peerState struct {
	PeerStatus
	ids map[string]PoolKey // origin's reservation id → its pool here
}

func newPeerSync(origin string, emit func(BookingDelta), spread float64) peerSync {
	return peerSync{origin: origin, emit: emit, peers: map[string]*peerState{}, spread: spread}
}

// peerKey is the key of a peer's booking in a Pool: NUL-separated, so no
// id of the local API (JSON text a client chose) and no other origin's
// booking can take it; a local id that did would be refused as a
// duplicate, never merged.
func peerKey(origin, id string) string { return "\x00peer\x00" + origin + "\x00" + id }

// booked reports a change to r to the pool's onBook.
func (p *Pool) booked(op BookingOp, r *reservation) {
	if p.onBook != nil && !r.peer {
		p.onBook(p.key, op, r)
	}
}

// booked reports a change to a local booking; every Pool calls it,
// under s.mu.
func (s *Service) booked(k PoolKey, op BookingOp, r *reservation) {
	if r.peer || s.sync.emit == nil {
		return
	}
	s.sync.seq++
	s.sync.emit(s.delta(k, op, r))
}

func (s *Service) delta(k PoolKey, op BookingOp, r *reservation) BookingDelta {
	d := BookingDelta{Origin: s.sync.origin, Seq: s.sync.seq, Op: op, ID: r.id, Pool: k, Rank: r.rank}
	if op == BookingAdmit {
		d.Blocks, d.Private, d.PrefillTokens = r.seq, r.private, r.prefill
	}
	return d
}

// SnapshotBookings calls fn, under the Service's lock, with the Seq of
// the last delta OnBooking reported and an admit for every live local
// booking (with its current prefill tokens; Seq set to seq), sorted by
// pool and id. The transport registers a new subscriber inside fn: the
// next delta OnBooking reports is seq+1, so the subscriber misses none
// and sees none twice. fn must not call the Service; live is fn's.
func (s *Service) SnapshotBookings(fn func(seq uint64, live []BookingDelta)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var live []BookingDelta
	for _, k := range s.pools.Keys() {
		p := s.pools.Pool(k)
		start := len(live)
		for _, r := range p.res {
			if !r.peer {
				live = append(live, s.delta(k, BookingAdmit, r))
			}
		}
		part := live[start:]
		sort.Slice(part, func(i, j int) bool { return part[i].ID < part[j].ID })
	}
	fn(s.sync.seq, live)
}

// ApplyPeer books other replicas' deltas, in order, as one batch under
// the Service's lock. A delta whose Seq is not above the last seen from
// its origin is a duplicate and dropped; one beyond the next counts a
// gap, then applies. An admit books the origin's request in its pool
// exactly as a local reservation (refs by sequence hash, private blocks,
// prefill tokens, a request), under a key no local id can take, created
// now: it expires by the pool's ReservationTTL like a local one. A
// prefilled or free undoes its part. Deltas that cannot apply (from this
// Service's own Origin or none, an unknown pool, rank or id, a duplicate
// id, negative sizes, the reservation cap) are dropped and counted, not
// errors. ApplyPeer keeps the deltas' Blocks slices.
func (s *Service) ApplyPeer(ds []BookingDelta) (applied, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	now := s.now()
	for i := range ds {
		d := &ds[i]
		if d.Origin == "" || d.Origin == s.sync.origin {
			dropped++
			continue
		}
		st := s.peer(d.Origin)
		switch {
		case d.Seq <= st.Seq:
			st.Dropped++
			dropped++
			continue
		case d.Seq > st.Seq+1:
			st.Gaps++
			st.Missed += d.Seq - st.Seq - 1
		}
		st.Seq = d.Seq
		if s.applyPeer(st, d, now) {
			st.Applied++
			applied++
		} else {
			st.Dropped++
			dropped++
		}
	}
	return applied, dropped
}

// ResetPeer replaces everything held of origin with live, the admits of
// its SnapshotBookings (their Seq ignored), and takes seq as the last
// Seq seen: the transport calls it when a stream from origin starts, so
// a replica that restarted (its Seq from 1 again) or a stream that broke
// and resumed starts clean. It returns what ApplyPeer would.
func (s *Service) ResetPeer(origin string, seq uint64, live []BookingDelta) (applied, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	if origin == "" || origin == s.sync.origin {
		return 0, len(live)
	}
	s.dropPeer(origin)
	st := s.peer(origin)
	st.Seq = seq
	now := s.now()
	for i := range live {
		d := &live[i]
		if d.Origin == origin && d.Op == BookingAdmit && s.applyPeer(st, d, now) {
			st.Applied++
			applied++
		} else {
			st.Dropped++
			dropped++
		}
	}
	return applied, dropped
}

func (s *Service) peer(origin string) *peerState {
	st, ok := s.sync.peers[origin]
	if !ok {
		st = &peerState{PeerStatus: PeerStatus{Origin: origin}, ids: map[string]PoolKey{}}
		s.sync.peers[origin] = st
		s.pools.spread = s.sync.spread
	}
	return st
}

// applyPeer applies one delta of st's origin, reporting whether it did.
func (s *Service) applyPeer(st *peerState, d *BookingDelta, now time.Time) bool {
	key := peerKey(d.Origin, d.ID)
	switch d.Op {
	case BookingAdmit:
		return s.admitPeer(st, d, key, now)
	case BookingPrefilled, BookingFree:
		k, ok := st.ids[d.ID]
		if !ok {
			return false
		}
		p := s.pools.Pool(k)
		if p == nil {
			delete(st.ids, d.ID)
			return false
		}
		if d.Op == BookingPrefilled {
			_, live := p.res[key]
			p.PrefillComplete(key)
			return live
		}
		delete(st.ids, d.ID)
		return p.Free(key)
	}
	return false
}

func (s *Service) admitPeer(st *peerState, d *BookingDelta, key string, now time.Time) bool {
	p := s.pools.Pool(d.Pool)
	if p == nil || d.Private < 0 || d.PrefillTokens < 0 {
		return false
	}
	ws, ok := p.workers[d.Rank]
	if !ok || len(p.res) >= p.cfg.MaxReservations {
		return false
	}
	if _, dup := p.res[key]; dup {
		return false
	}
	r := &reservation{id: key, rank: d.Rank, seq: d.Blocks, private: d.Private, prefill: d.PrefillTokens, created: now, peer: true}
	for _, h := range r.seq {
		if ws.refs[h]++; ws.refs[h] == 1 {
			r.fresh++
		}
	}
	r.fresh += r.private
	ws.private += r.private
	ws.prefill += r.prefill
	ws.reqs++
	ws.booked(r, false) // made since the rank's figure if received after it (engineload.go)
	p.res[key] = r
	st.ids[d.ID] = d.Pool
	return true
}

// DropPeer frees every booking of origin (a replica that left) and
// forgets it; it returns how many it freed.
func (s *Service) DropPeer(origin string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.drainLocked()
	return s.dropPeer(origin)
}

func (s *Service) dropPeer(origin string) int {
	st, ok := s.sync.peers[origin]
	if !ok {
		return 0
	}
	n := 0
	for id, k := range st.ids {
		if p := s.pools.Pool(k); p != nil && p.Free(peerKey(origin, id)) {
			n++
		}
	}
	delete(s.sync.peers, origin)
	if len(s.sync.peers) == 0 {
		s.pools.spread = 0
	}
	return n
}

// forgetExpiredPeers forgets the ids of peer bookings a pool dropped on
// its own (expiry, a departed worker). It runs under s.mu.
func (s *Service) forgetExpiredPeers() {
	for origin, st := range s.sync.peers {
		for id, k := range st.ids {
			if p := s.pools.Pool(k); p == nil || p.res[peerKey(origin, id)] == nil {
				delete(st.ids, id)
			}
		}
	}
}

// Peers returns what the Service holds of each peer replica, sorted by
// origin.
func (s *Service) Peers() []PeerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PeerStatus, 0, len(s.sync.peers))
	for origin, st := range s.sync.peers {
		ps := st.PeerStatus
		for id, k := range st.ids {
			if p := s.pools.Pool(k); p != nil && p.res[peerKey(origin, id)] != nil {
				ps.Bookings++
			}
		}
		out = append(out, ps)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return cmpStr(a.Origin, b.Origin) })
	return out
}
