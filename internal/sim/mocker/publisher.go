package mocker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/events/zmtp"
)

// ReplayLayout selects the frames a Publisher's ROUTER writes per replayed
// batch: with the topic frame (vLLM ≥ v0.26) or without it (older vLLM,
// SGLang, the Dynamo mocker).
type ReplayLayout uint8

const (
	// ReplayTopic is vLLM ≥ v0.26 (PR #45177): a DEALER receives
	// ["", topic, seq, payload] per batch and ["", "", END, ""] at the end
	// (the end marker's topic frame is empty whatever the topic). It is the
	// zero ReplayLayout.
	ReplayTopic ReplayLayout = iota
	// ReplayLegacy is vLLM ≤ v0.25, SGLang and the Dynamo mocker:
	// ["", seq, payload] per batch and ["", END, ""] at the end.
	ReplayLegacy
)

// String returns "topic", "legacy" or "ReplayLayout(n)".
func (l ReplayLayout) String() string {
	switch l {
	case ReplayTopic:
		return "topic"
	case ReplayLegacy:
		return "legacy"
	}
	return "ReplayLayout(" + strconv.Itoa(int(l)) + ")"
}

// DefaultBufferSteps is vLLM's replay buffer length in batches
// (KVEventsConfig.buffer_steps).
const DefaultBufferSteps = 10_000

// ErrPublisherNotRunning is returned by Publish before Run has bound the
// sockets or after Run has returned.
var ErrPublisherNotRunning = errors.New("events: publisher not running")

// PublisherConfig configures a Publisher. The zero value of every field but
// Endpoint is usable.
type PublisherConfig struct {
	// Endpoint is the PUB bind address, e.g. "tcp://127.0.0.1:0" (port 0
	// picks a free port; Endpoint() then reports it). Required. Unlike
	// vLLM, the Publisher always binds, whatever the address looks like.
	Endpoint string
	// ReplayEndpoint is the ROUTER bind address; "" means no replay socket
	// (as vLLM without replay_endpoint).
	ReplayEndpoint string
	// Topic is sent as the first frame of every live message and, in
	// ReplayTopic, of every replayed batch. "" sends an empty frame.
	Topic string
	// BufferSteps is the replay buffer length in batches; 0 means
	// DefaultBufferSteps.
	BufferSteps int
	// Layout selects the replay frames; the zero value is ReplayTopic.
	Layout ReplayLayout
	// Limits bound what a connecting peer can make the sockets hold or
	// wait for (zmtp's defaults for zero fields).
	Limits zmtp.Limits

	// Fault knobs, fractions in [0, 1]; 0 disables. Decisions are drawn
	// from Rand.

	// DropLive is the fraction of live batches not sent. A dropped batch
	// still consumes its seq and is buffered for replay, as when a PUB
	// drops at its high-water mark: subscribers see a gap that replay
	// repairs.
	DropLive float64
	// DropReplay is the fraction of replay messages (batches and end
	// markers alike) not sent, as vLLM's ROUTER drops silently at libzmq's
	// default SNDHWM of 1000 (it sets no socket options):
	// replays have holes and may end without an end marker. As with a real
	// high-water mark, the first message of a reply is never dropped, so
	// a reply that starts above the requested seq still means the history
	// is gone.
	DropReplay float64
	// Rand draws the fault decisions. nil means a generator with a fixed
	// seed, so that runs are reproducible. The Publisher takes ownership:
	// do not use Rand after NewPublisher. Live decisions are drawn once
	// per Publish, in seq order; replay decisions from a second generator
	// seeded from Rand, once per replay message, so neither sequence
	// depends on how Publish and replays interleave.
	Rand *rand.Rand
}

// PublisherStats counts what a Publisher did. All counts are cumulative
// over the Publisher's life (Restart does not reset them).
type PublisherStats struct {
	Published       uint64 // batches given a seq by Publish, sent or dropped
	LiveDropped     uint64 // of those, batches not sent because of DropLive
	ReplayRequests  uint64 // valid replay requests received
	InvalidRequests uint64 // replay requests ignored as invalid (no reply)
	ReplaySent      uint64 // replay messages written, batches and end markers
	ReplayDropped   uint64 // replay messages not sent because of DropReplay
	ReplayAborted   uint64 // replays abandoned because a write failed
}

// Publisher is a KV-event publisher with the socket semantics of vLLM's
// ZmqEventPublisher (vllm/distributed/kv_events.py) for the mocker and for
// tests: a PUB socket sending [topic, seq, payload], a ROUTER socket
// answering replay requests from a bounded buffer of the latest batches, and
// fault knobs to provoke the losses real publishers produce. Payloads are
// opaque; build them with a wire.Encoder.
//
// Differences from vLLM, all deliberate: both sockets always bind; live
// publishing does not pause while a replay is written (a replay sends the
// buffer as it was when the request was read, so live and replayed batches
// interleave on the subscriber, which it must handle anyway); go-zeromq's
// ROUTER does not drop at a high-water mark but blocks on a peer that stops
// reading, so ROUTER loss is simulated with DropReplay instead.
//
// Publish, Restart, Seq, Stall, Stats and the endpoint getters are safe for
// concurrent use with each other and with Run.
type Publisher struct {
	cfg   PublisherConfig
	topic []byte

	// mu guards pub, next, buf, liveRand, endpoint and replayEP. Publish
	// holds it while handing a message to the PUB socket, so that wire
	// order is seq order; go-zeromq's PUB Send only appends to an unbounded
	// in-memory queue and does not block. Nothing else does I/O under mu: a
	// replay copies what it needs and writes after unlocking.
	mu       sync.Mutex
	pub      zmq4.Socket // nil unless Run is serving
	next     uint64      // seq of the next Publish
	buf      [][]byte    // ring of payloads: seq s at buf[s%BufferSteps]; holds seqs [next-len(buf), next)
	liveRand *rand.Rand  // draws DropLive decisions
	endpoint string      // bound PUB address, set by Run
	replayEP string      // bound ROUTER address, set by Run

	// replayRand draws DropReplay decisions; owned by the serve goroutine.
	replayRand *rand.Rand
	// scratch is the serve goroutine's reusable replay snapshot.
	scratch [][]byte

	ready   chan struct{} // closed by Run once the sockets are bound
	wake    chan struct{} // Stall pokes the serve goroutine (capacity 1)
	stall   atomic.Int64  // replay servicing pauses until this time, in Unix nanoseconds
	started atomic.Bool

	published, liveDropped                   atomic.Uint64
	requests, invalid                        atomic.Uint64
	replaySent, replayDropped, replayAborted atomic.Uint64
}

// NewPublisher validates cfg and returns a Publisher. It starts nothing:
// Run binds the sockets.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("events: publisher: empty Endpoint")
	}
	if cfg.BufferSteps < 0 {
		return nil, fmt.Errorf("events: publisher: negative BufferSteps %d", cfg.BufferSteps)
	}
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.Layout != ReplayTopic && cfg.Layout != ReplayLegacy {
		return nil, fmt.Errorf("events: publisher: invalid %v", cfg.Layout)
	}
	if !(cfg.DropLive >= 0 && cfg.DropLive <= 1) { // also rejects NaN
		return nil, fmt.Errorf("events: publisher: DropLive %v not in [0, 1]", cfg.DropLive)
	}
	if !(cfg.DropReplay >= 0 && cfg.DropReplay <= 1) {
		return nil, fmt.Errorf("events: publisher: DropReplay %v not in [0, 1]", cfg.DropReplay)
	}
	r := cfg.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(0x70726566, 0x69786421))
	}
	cfg.Rand = nil // owned below
	return &Publisher{
		cfg:        cfg,
		topic:      []byte(cfg.Topic),
		buf:        make([][]byte, 0, min(cfg.BufferSteps, 1024)),
		liveRand:   r,
		replayRand: rand.New(rand.NewPCG(r.Uint64(), r.Uint64())),
		ready:      make(chan struct{}),
		wake:       make(chan struct{}, 1),
	}, nil
}

// Ready returns a channel closed once Run has bound both sockets. It stays
// open if Run fails to bind.
func (p *Publisher) Ready() <-chan struct{} { return p.ready }

// Endpoint returns the bound PUB address with the real port, e.g.
// "tcp://127.0.0.1:40123"; "" before Ready. A wildcard host is reported as
// Go's listener reports it: "tcp://*:0" gives "tcp://[::]:40123", which
// go-zeromq can dial on the same host.
func (p *Publisher) Endpoint() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.endpoint
}

// ReplayEndpoint returns the bound ROUTER address like Endpoint; "" before
// Ready or when there is no replay socket.
func (p *Publisher) ReplayEndpoint() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replayEP
}

// Seq returns the seq the next Publish will assign.
func (p *Publisher) Seq() (next uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Stats returns the counters so far.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{
		Published:       p.published.Load(),
		LiveDropped:     p.liveDropped.Load(),
		ReplayRequests:  p.requests.Load(),
		InvalidRequests: p.invalid.Load(),
		ReplaySent:      p.replaySent.Load(),
		ReplayDropped:   p.replayDropped.Load(),
		ReplayAborted:   p.replayAborted.Load(),
	}
}

// Publish assigns payload the next seq, buffers it for replay (evicting the
// oldest batch beyond BufferSteps) and sends [topic, seq, payload] on the
// PUB socket, unless DropLive drops it. It copies payload, so the caller
// may reuse it. An empty payload is rejected (a real batch never is one,
// and in a replay it would read as a broken end marker); so is a call
// before Ready or after Run has returned, with ErrPublisherNotRunning, and
// one with ctx already done. These consume no seq. Should the socket refuse
// the message (go-zeromq's PUB never does), the seq is consumed, the batch
// stays buffered, and the error is returned with the seq.
//
// The send is asynchronous: go-zeromq queues the message and a socket
// goroutine writes it to every matching subscriber. There is no
// high-water mark: a subscriber that stops reading holds up the queue,
// which grows without bound.
func (p *Publisher) Publish(ctx context.Context, payload []byte) (seq uint64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("events: publish: %w", err)
	}
	if len(payload) == 0 {
		return 0, errors.New("events: publish: empty payload")
	}
	payload = append([]byte(nil), payload...)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub == nil {
		return 0, fmt.Errorf("events: publish: %w", ErrPublisherNotRunning)
	}
	seq = p.next
	p.next++
	p.bufferLocked(seq, payload)
	p.published.Add(1)
	if p.cfg.DropLive > 0 && p.liveRand.Float64() < p.cfg.DropLive {
		p.liveDropped.Add(1)
		return seq, nil
	}
	// The frames are read later by the PUB's writer goroutine; none of
	// them is ever modified, so sharing payload with the buffer is safe.
	msg := zmq4.NewMsgFrom(p.topic, wire.AppendSeq(make([]byte, 0, wire.SeqLen), seq), payload)
	if err := p.pub.SendMulti(msg); err != nil {
		return seq, fmt.Errorf("events: publish seq %d: %w", seq, err)
	}
	return seq, nil
}

// Subscribed reports whether a subscriber's subscription (any topic) has
// reached the PUB socket: a live batch published before that is lost to
// it (ZMQ's slow joiner). Tests wait on it before a batch they need
// delivered live.
func (p *Publisher) Subscribed() bool {
	p.mu.Lock()
	pub := p.pub
	p.mu.Unlock()
	t, ok := pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// bufferLocked stores payload as seq, the next seq in order. p.mu held.
func (p *Publisher) bufferLocked(seq uint64, payload []byte) {
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, payload) // seq == len(p.buf) until the ring is full
		return
	}
	p.buf[seq%uint64(p.cfg.BufferSteps)] = payload
}

// Restart simulates an engine restart: the seq goes back to 0 and the
// replay buffer is emptied. The sockets and their connections stay, so
// subscribers see the seq fall back to 0 without reconnecting. A replay
// already being written finishes with the old batches.
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = 0
	clear(p.buf)
	p.buf = p.buf[:0]
}

// Stall pauses replay servicing for d from now: requests are still read,
// but no replay message is written until the stall ends, including in the
// middle of a replay. It provokes the subscriber's idle timeout. A later
// call replaces the deadline; Stall(0) ends a stall at once.
func (p *Publisher) Stall(d time.Duration) {
	d = min(d, 1<<62) // keeps UnixNano defined: "forever" is ~146 years
	p.stall.Store(time.Now().Add(d).UnixNano())
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run binds the PUB socket, and the ROUTER socket if configured, closes
// Ready, and serves replay requests until ctx is done. It then closes both
// sockets and returns nil after its goroutines have exited, or an error if
// a socket cannot be bound. Run may be called once.
//
// go-zeromq leaves one goroutine per PUB socket behind after Close (its
// queue writer waits on a condition variable that Close never signals);
// nothing can be done about it from outside the package.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("events: publisher: Run called twice")
	}
	// The sockets do not take ctx: they are closed explicitly after ctx is
	// done, because go-zeromq's context cancellation does not end a write
	// blocked on a peer that stopped reading, and Close does.
	sctx := zmtp.WithLimits(context.Background(), p.cfg.Limits)
	pub := zmq4.NewPub(sctx)
	if err := pub.Listen(zmtp.Endpoint(p.cfg.Endpoint)); err != nil {
		pub.Close()
		return fmt.Errorf("events: publisher: bind PUB %s: %w", p.cfg.Endpoint, err)
	}
	var router zmq4.Socket
	if p.cfg.ReplayEndpoint != "" {
		router = zmq4.NewRouter(sctx)
		if err := router.Listen(zmtp.Endpoint(p.cfg.ReplayEndpoint)); err != nil {
			router.Close()
			pub.Close()
			return fmt.Errorf("events: publisher: bind ROUTER %s: %w", p.cfg.ReplayEndpoint, err)
		}
	}
	p.mu.Lock()
	p.pub = pub
	p.endpoint = addrEndpoint(pub)
	if router != nil {
		p.replayEP = addrEndpoint(router)
	}
	p.mu.Unlock()
	close(p.ready)

	var wg sync.WaitGroup
	if router != nil {
		reqs := make(chan zmq4.Msg)
		wg.Go(func() { p.receive(ctx, router, reqs) })
		wg.Go(func() { p.serve(ctx, router, reqs) })
	}
	<-ctx.Done()

	// Shutdown order: detach the PUB so that Publish stops using it, then
	// close both sockets. Closing the ROUTER ends receive's Recv and any
	// reply write blocked on a peer that stopped reading; serve sees ctx
	// done at its next step. Only then can the goroutines be waited for.
	p.mu.Lock()
	p.pub = nil
	p.mu.Unlock()
	if router != nil {
		router.Close() // errors are those of tearing down dead connections
	}
	pub.Close()
	wg.Wait()
	return nil
}

// addrEndpoint formats a listening socket's address as an endpoint.
func addrEndpoint(s zmq4.Socket) string {
	a := s.Addr()
	return a.Network() + "://" + a.String()
}

// receive reads replay requests from the ROUTER and hands them to serve,
// until the ROUTER is closed or ctx is done. go-zeromq's Recv cannot
// select, hence this goroutine.
func (p *Publisher) receive(ctx context.Context, router zmq4.Socket, reqs chan<- zmq4.Msg) {
	for {
		msg, err := router.Recv()
		if err != nil {
			// The socket's context is cancelled only by Close, which Run
			// calls after ctx is done: every error means we are stopping.
			return
		}
		select {
		case reqs <- msg:
		case <-ctx.Done():
			return
		}
	}
}

// serve answers replay requests one at a time until ctx is done. It owns
// the ROUTER's send side and replayRand.
func (p *Publisher) serve(ctx context.Context, router zmq4.Socket, reqs <-chan zmq4.Msg) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-reqs:
			p.replay(ctx, router, msg.Frames)
		}
	}
}

// parseReplayRequest parses a request as the ROUTER sees it: exactly
// [identity, "", start]. start is an unsigned big-endian integer of any
// length, as vLLM's int.from_bytes; one beyond uint64 is clamped to
// MaxUint64, which, like the real value, is newer than any buffered seq.
// vLLM checks only the frame count; the delimiter is checked here too, so
// that a DEALER forgetting it is always refused.
func parseReplayRequest(frames [][]byte) (id []byte, start uint64, ok bool) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return nil, 0, false
	}
	for i, b := range frames[2] {
		if len(frames[2])-i > wire.SeqLen && b != 0 {
			return frames[0], math.MaxUint64, true
		}
		start = start<<8 | uint64(b)
	}
	return frames[0], start, true
}

// replay answers one request: every buffered batch with seq >= start in
// ascending order, then the end marker, all addressed to the requesting
// identity. An invalid request is counted and gets no reply.
func (p *Publisher) replay(ctx context.Context, router zmq4.Socket, frames [][]byte) {
	id, start, ok := parseReplayRequest(frames)
	if !ok {
		p.invalid.Add(1)
		return
	}
	p.requests.Add(1)

	// Snapshot the entries under the lock; payloads are never modified,
	// so the copies of their slice headers stay valid after unlocking.
	p.mu.Lock()
	first := p.next - uint64(len(p.buf)) // oldest buffered seq
	from := max(start, first)
	batches := p.scratch[:0]
	for s := from; s < p.next; s++ {
		batches = append(batches, p.buf[s%uint64(p.cfg.BufferSteps)])
	}
	p.mu.Unlock()
	defer func() {
		clear(batches)
		p.scratch = batches[:0]
	}()

	for i, payload := range batches {
		seq := from + uint64(i)
		var msg zmq4.Msg
		if p.cfg.Layout == ReplayTopic {
			msg = zmq4.NewMsgFrom(id, nil, p.topic, wire.AppendSeq(nil, seq), payload)
		} else {
			msg = zmq4.NewMsgFrom(id, nil, wire.AppendSeq(nil, seq), payload)
		}
		if !p.send(ctx, router, msg, i > 0) {
			return
		}
	}
	var end zmq4.Msg
	if p.cfg.Layout == ReplayTopic {
		end = zmq4.NewMsgFrom(id, nil, nil, wire.EndSeq[:], nil)
	} else {
		end = zmq4.NewMsgFrom(id, nil, wire.EndSeq[:], nil)
	}
	p.send(ctx, router, end, len(batches) > 0)
}

// send writes one replay message after any stall, unless DropReplay drops
// it. The first message of a reply is never dropped: a ROUTER drops at its
// high-water mark, which an empty pipe has not reached. It reports whether
// the replay may go on.
func (p *Publisher) send(ctx context.Context, router zmq4.Socket, msg zmq4.Msg, droppable bool) bool {
	if !p.waitStall(ctx) {
		return false
	}
	if droppable && p.cfg.DropReplay > 0 && p.replayRand.Float64() < p.cfg.DropReplay {
		p.replayDropped.Add(1)
		return true
	}
	// go-zeromq's ROUTER write is synchronous and blocks while the peer
	// does not read; Run's Close ends it. A reply to an identity that has
	// disconnected is discarded without error.
	if err := router.SendMulti(msg); err != nil {
		p.replayAborted.Add(1)
		return false
	}
	p.replaySent.Add(1)
	return true
}

// waitStall blocks until no stall is in effect. It reports false if ctx
// ended first.
func (p *Publisher) waitStall(ctx context.Context) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		d := time.Until(time.Unix(0, p.stall.Load()))
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-p.wake:
		}
		t.Stop()
	}
}
