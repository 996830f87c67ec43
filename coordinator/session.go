package coordinator

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/prefixd/prefixd/indexer"
)

// Session affinity. With ServiceConfig.SessionTTL set, a booking of a
// request that names a session (SelectRequest.Session) remembers the
// rank it was booked on; the session's next request goes back there
// while that rank is still in the pool, eligible for the request (its
// allow-set, required taints) and under the busy thresholds (the pool's
// and, for a request that may wait, the router queue's QueueBusy), and
// the session was used within the TTL. Otherwise the request is selected
// as any other and the session moves to the rank chosen. A conversation's
// turns then share a worker while it has room, whatever the index has
// seen of their prefix yet; the cost function still decides when it has
// not (Dynamo and llm-d keep sessions on their worker the same way).

// DefaultMaxSessions bounds the sessions a Service remembers when
// ServiceConfig.MaxSessions is 0.
const DefaultMaxSessions = 65_536

// MaxSessionIDLen is the longest session id kept as it is; a longer one
// is remembered by its SHA-256 ("sha256:" and 64 hex digits), so a
// session costs at most this much memory whatever the client sends.
const MaxSessionIDLen = 256

// SessionStats counts what session affinity did (Service.SessionStats).
type SessionStats struct {
	// Sessions is how many sessions the Service remembers now.
	Sessions int
	// Hits counts bookings that went back to their session's rank.
	Hits uint64
	// Moves counts bookings of a live session whose rank was gone,
	// ineligible or busy: booked elsewhere, the session moved there.
	Moves uint64
	// New counts bookings of a session the Service did not remember
	// (first seen, past its TTL or evicted).
	New uint64
}

// sessionKey names a session in a pool: the same id in two pools (two
// models) is two sessions.
type sessionKey struct {
	pool PoolKey
	id   string
}

type sessionEntry struct {
	rank indexer.Rank
	used time.Time // the last booking
}

// sessions is the Service's session → rank map, guarded by Service.mu.
// The LRU's order is the order of the last bookings (lookups Peek), so
// the oldest entry is the first to expire.
type sessions struct {
	ttl   time.Duration // 0: off
	m     *simplelru.LRU[sessionKey, sessionEntry]
	stats SessionStats
}

func newSessions(ttl time.Duration, maxSessions int) sessions {
	if ttl <= 0 {
		return sessions{}
	}
	if maxSessions <= 0 {
		maxSessions = DefaultMaxSessions
	}
	m, err := simplelru.NewLRU[sessionKey, sessionEntry](maxSessions, nil)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return sessions{ttl: ttl, m: m}
}

// sessionID bounds id (MaxSessionIDLen).
func sessionID(id string) string {
	if len(id) <= MaxSessionIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// stickiness is what a lookup found of a request's session.
type stickiness uint8

const (
	noSession    stickiness = iota // no session, or affinity off
	newSession                     // not remembered, or past its TTL
	stickySess                     // its rank is a candidate: q.prefer is set
	movedSession                   // its rank is gone, ineligible or busy
)

// stick looks r's session up and, when its rank may take r, makes it q's
// preferred rank. A pinned request keeps its pin: a hit if it names the
// session's rank, else its session moves there when booked. It runs under s.mu, before the booking.
func (s *Service) stick(r *SelectRequest, p *Pool, q *Query, now time.Time) stickiness {
	if s.sess.m == nil || r.Session == "" {
		return noSession
	}
	e, ok := s.sess.m.Peek(sessionKey{r.Pool, sessionID(r.Session)})
	if !ok || now.Sub(e.used) > s.sess.ttl {
		return newSession
	}
	if q.Pin != nil {
		if *q.Pin == e.rank {
			return stickySess
		}
		return movedSession
	}
	busy := q.busy
	if busy == nil && r.waits {
		busy = &s.wait.busy
	}
	ws, ok := p.workers[e.rank]
	if !ok || !p.eligible(ws, q) || p.overloaded(ws) || busy != nil && over(ws, busy) {
		return movedSession
	}
	rank := e.rank
	q.prefer = &rank
	return stickySess
}

// sessionBooked remembers that r, found st by stick, was booked on rank.
func (s *Service) sessionBooked(r *SelectRequest, st stickiness, rank indexer.Rank, now time.Time) {
	switch st {
	case noSession:
		return
	case newSession:
		s.sess.stats.New++
	case stickySess:
		s.sess.stats.Hits++
	case movedSession:
		s.sess.stats.Moves++
	}
	s.sess.m.Add(sessionKey{r.Pool, sessionID(r.Session)}, sessionEntry{rank: rank, used: now})
}

// expireSessions forgets the sessions unused for the TTL at now.
func (s *Service) expireSessions(now time.Time) {
	if s.sess.m == nil {
		return
	}
	for {
		_, e, ok := s.sess.m.GetOldest()
		if !ok || now.Sub(e.used) <= s.sess.ttl {
			return
		}
		s.sess.m.RemoveOldest()
	}
}

// SessionStats reports what session affinity did since the Service
// started; all zero when ServiceConfig.SessionTTL is 0.
func (s *Service) SessionStats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sess.stats
	if s.sess.m != nil {
		st.Sessions = s.sess.m.Len()
	}
	return st
}
