package replica

import (
	"sync"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// DefaultSendBuffer is the deltas a Hub holds per subscriber by default.
const DefaultSendBuffer = 1 << 14

// maxCounted bounds the subscriber names a Hub keeps counters for;
// further names count under "other".
const maxCounted = 256

// A Hub fans this replica's booking deltas out to the streams of its
// subscribers. Its Booked is the Service's OnBooking: it appends to each
// subscriber's bounded buffer and never blocks. It is safe for
// concurrent use.
type Hub struct {
	size int

	mu      sync.Mutex // guards everything below; held only to append, swap or count
	subs    map[*subscriber]struct{}
	sent    map[string]uint64 // deltas sent, by subscriber
	dropped map[string]uint64 // deltas dropped for a slow subscriber
}

type subscriber struct {
	peer     string
	buf      []coordinator.BookingDelta // guarded by Hub.mu
	overflow bool                       // guarded by Hub.mu: the stream must end
	ready    chan struct{}              // capacity 1: buf has deltas, or overflow
}

// NewHub returns a hub that holds at most size deltas per subscriber
// (≤ 0: DefaultSendBuffer).
func NewHub(size int) *Hub {
	if size <= 0 {
		size = DefaultSendBuffer
	}
	return &Hub{size: size, subs: map[*subscriber]struct{}{}, sent: map[string]uint64{}, dropped: map[string]uint64{}}
}

// Booked hands d to every subscriber. A subscriber whose buffer is full
// is marked to have its stream ended (it resubscribes from a snapshot),
// and d counts as dropped for it. It runs under the Service's lock.
func (h *Hub) Booked(d coordinator.BookingDelta) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		switch {
		case s.overflow:
			h.dropped[h.name(s.peer)]++
			continue
		case len(s.buf) >= h.size:
			s.overflow = true
			h.dropped[h.name(s.peer)]++
		default:
			s.buf = append(s.buf, d)
		}
		select {
		case s.ready <- struct{}{}:
		default:
		}
	}
}

// name is the counter label of peer.
func (h *Hub) name(peer string) string {
	peer = clip.String(peer)
	if _, ok := h.sent[peer]; ok || len(h.sent) < maxCounted {
		return peer
	}
	return "other"
}

func (h *Hub) add(peer string) *subscriber {
	s := &subscriber{peer: peer, ready: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs[s] = struct{}{}
	h.sent[h.name(peer)] += 0
	return s
}

func (h *Hub) remove(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

// take returns s's pending deltas (the slice is the caller's) and
// whether it overflowed.
func (h *Hub) take(s *subscriber) ([]coordinator.BookingDelta, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	buf := s.buf
	s.buf = nil
	return buf, s.overflow
}

func (h *Hub) countSent(peer string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent[h.name(peer)] += uint64(n)
}

// Subscribers returns the streams the hub feeds.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// counters returns copies of the sent and dropped counters.
func (h *Hub) counters() (sent, dropped map[string]uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sent, dropped = make(map[string]uint64, len(h.sent)), make(map[string]uint64, len(h.dropped))
	for k, v := range h.sent {
		sent[k] = v
	}
	for k, v := range h.dropped {
		dropped[k] = v
	}
	return sent, dropped
}
