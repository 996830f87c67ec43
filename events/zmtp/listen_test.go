package zmtp

// Hostile clients: raw-TCP rogues dialing go-zeromq ROUTER and PUB sockets
// (the publisher's replay and live sockets) that listen through the guard.
// go-zeromq drops the errors of a listening socket's connections (its
// ROUTER and PUB readers return without delivering them), so these tests
// observe the refusal as the rogue's connection closing, and then check the
// socket still serves a well-behaved client.

import (
	"bytes"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prefixd/prefixd/internal/leaf/retry"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// listeningSockets are the socket types prefixd listens with.
var listeningSockets = []zmq4.SocketType{zmq4.Router, zmq4.Pub}

// clientOf is the socket type that talks to typ.
func clientOf(typ zmq4.SocketType) zmq4.SocketType {
	if typ == zmq4.Pub {
		return zmq4.Sub
	}
	return zmq4.Dealer
}

// serves checks that server (listening) exchanges a message with a
// well-behaved go-zeromq client dialing through the guard.
func serves(t *testing.T, server zmq4.Socket) {
	t.Helper()
	client := newSocket(t, t.Context(), clientOf(server.Type()), Limits{HandshakeTimeout: 5 * time.Second})
	if err := within(t, wait, "Dial", async(func() error {
		return client.Dial(guarded("tcp://" + server.Addr().String()))
	})); err != nil {
		t.Fatalf("a well-behaved client cannot dial: %v", err)
	}
	switch server.Type() {
	case zmq4.Pub:
		// A topic of its own: rogues' subscriptions may linger in Topics
		// until go-zeromq reaps their connections.
		topic := "news for " + t.Name()
		if err := client.SetOption(zmq4.OptionSubscribe, topic); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, wait, "the subscription", func() bool {
			return slices.Contains(server.(zmq4.Topics).Topics(), topic)
		})
		if err := server.Send(zmq4.NewMsgString(topic)); err != nil {
			t.Fatal(err)
		}
		r := within(t, wait, "SUB Recv", recvAsync(client))
		if r.err != nil || string(r.msg.Bytes()) != topic {
			t.Fatalf("SUB Recv: %v %v", r.msg, r.err)
		}
	case zmq4.Router:
		if err := client.Send(zmq4.NewMsgString("ping")); err != nil {
			t.Fatal(err)
		}
		r := within(t, wait, "ROUTER Recv", recvAsync(server))
		if r.err != nil || len(r.msg.Frames) != 2 || string(r.msg.Frames[1]) != "ping" {
			t.Fatalf("ROUTER Recv: %v %v", r.msg, r.err)
		}
		if err := server.Send(zmq4.NewMsgFrom(r.msg.Frames[0], []byte("pong"))); err != nil {
			t.Fatal(err)
		}
		r = within(t, wait, "DEALER Recv", recvAsync(client))
		if r.err != nil || string(r.msg.Bytes()) != "pong" {
			t.Fatalf("DEALER Recv: %v %v", r.msg, r.err)
		}
	}
}

// TestListenRefusesHostilePeers: the dial-side hostile frames, sent by a
// client, close that client's connection (before any body byte of an
// oversize frame) and leave the socket serving. Without the guard 2^62
// panics, 2^36 and the huge command die out of memory, the malformed READY
// panics, and 1 GiB and the endless frames are never refused.
func TestListenRefusesHostilePeers(t *testing.T) {
	t.Parallel()
	oversize := func(size uint64) func(p *peer, typ string) {
		return func(p *peer, typ string) {
			p.handshake(typ)
			p.mustSend(header(0, size, true)) // the body is held back
		}
	}
	cases := []struct {
		name  string
		rogue func(p *peer, typ string)
	}{
		{"frame claiming 2^62", oversize(1 << 62)},
		{"frame claiming 2^36", oversize(1 << 36)},
		{"frame claiming 1GiB held back", oversize(1 << 30)},
		{"command claiming 2^40 before READY", func(p *peer, typ string) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
			p.mustSend(header(flagCommand, 1<<40, true))
		}},
		{"property name length equals the rest", badReady([]byte("\x05abcd"))},
		{"no Socket-Type", badReady(property("Identity", "x"))},
		{"endless empty MORE frames", func(p *peer, typ string) {
			p.handshake(typ)
			batch := bytes.Repeat([]byte{flagMore, 0}, 4096)
			_ = p.c.SetWriteDeadline(time.Now().Add(wait))
			for sent := 0; sent < 4<<20; sent += 4096 {
				if _, err := p.c.Write(batch); err != nil {
					return
				}
			}
		}},
	}
	for _, typ := range listeningSockets {
		t.Run(string(typ), func(t *testing.T) {
			server := newSocket(t, t.Context(), typ, Limits{MaxMessageBytes: 1 << 20})
			listenGuarded(t, server)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					p := dialRogue(t, server)
					c.rogue(p, peerOf(typ))
					p.mustBeClosed(wait)
				})
			}
			serves(t, server)
		})
	}
}

// TestListenStalledPeersDoNotBlockAccept: clients that connect and stall in
// the handshake hold up no one: a well-behaved client is served at once,
// long before their HandshakeTimeout, and closing the socket closes them.
// Without the guard go-zeromq's accept loop waits on the first of them
// forever, and the well-behaved client's Dial times out.
func TestListenStalledPeersDoNotBlockAccept(t *testing.T) {
	t.Parallel()
	for _, typ := range listeningSockets {
		t.Run(string(typ), func(t *testing.T) {
			server := newSocket(t, t.Context(), typ, Limits{HandshakeTimeout: time.Hour})
			listenGuarded(t, server)
			silent := dialRogue(t, server)
			greets := dialRogue(t, server)
			greets.mustSend(greeting("NULL"))
			half := dialRogue(t, server)
			half.mustSend(greeting("NULL"), header(flagCommand, 30, false), []byte("\x05REA"))
			greets.readGreeting()
			serves(t, server)
			_ = server.Close()
			for _, p := range []*peer{silent, greets, half} {
				p.mustBeClosed(wait)
			}
		})
	}
}

// TestListenRefusesNonSubscription: a SUB peer may only send subscriptions
// (one frame starting 0 or 1). An empty message, anything else, or more
// than one frame closes its connection. Without the guard go-zeromq's PUB
// queues such messages for a Recv that PUB never serves (after 10 of them
// the connection's reader blocks for good) and never closes the
// connection. (go-zeromq v0.17.0 does not index an empty frame: its topic
// check comes first.)
func TestListenRefusesNonSubscription(t *testing.T) {
	t.Parallel()
	pub := newSocket(t, t.Context(), zmq4.Pub, Limits{})
	listenGuarded(t, pub)
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"empty message", frame(0, nil)},
		{"not a subscription", frame(0, []byte("hello"))},
		{"two frames", message([]byte("\x01a"), []byte("b"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := dialRogue(t, pub)
			p.handshake("SUB")
			p.mustSend(frame(0, []byte("\x01")), c.msg) // a good subscription first
			p.mustBeClosed(wait)
		})
	}
	serves(t, pub)
}

// TestListenAbandonedHandshakeIsClosed: go-zeromq's accept loop refuses a
// client of an incompatible type after the handshake and forgets the
// connection without closing it; the guard closes it within
// HandshakeTimeout. Without the guard it stays open until a garbage
// collection happens to finalise it.
func TestListenAbandonedHandshakeIsClosed(t *testing.T) {
	t.Parallel()
	for _, typ := range listeningSockets {
		t.Run(string(typ), func(t *testing.T) {
			server := newSocket(t, t.Context(), typ, Limits{HandshakeTimeout: 500 * time.Millisecond})
			listenGuarded(t, server)
			p := dialRogue(t, server)
			p.handshake("PUSH")
			p.mustBeClosed(wait)
			serves(t, server)
		})
	}
}

// failingListener fails its first errs Accepts with EMFILE, reports the
// next on reached and blocks it until Close.
type failingListener struct {
	net.Listener // not called
	errs         int
	calls        int // Accept is called from the guard's one goroutine
	reached      chan struct{}
	closed       chan struct{}
}

func (f *failingListener) Accept() (net.Conn, error) {
	f.calls++
	if f.calls <= f.errs {
		return nil, syscall.EMFILE
	}
	if f.calls == f.errs+1 {
		close(f.reached)
	}
	<-f.closed
	return nil, net.ErrClosed
}

func (f *failingListener) Close() error { close(f.closed); return nil }

// TestListenBacksOffOnAcceptErrors: accept errors (running out of file
// descriptors) do not end the guard's accept loop; it accepts again after
// backing off on the retry schedule, 5 ms doubling: three errors wait
// 5 + 10 + 20 ms, less the jitter at most.
func TestListenBacksOffOnAcceptErrors(t *testing.T) {
	f := &failingListener{errs: 3, reached: make(chan struct{}), closed: make(chan struct{})}
	start := time.Now()
	l := newListener(t.Context(), f, LimitsFrom(t.Context()))
	defer l.Close()
	select {
	case <-f.reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("the guard did not accept again after %d accept errors", f.errs)
	}
	least := time.Duration(float64((5+10+20)*time.Millisecond) * (1 - retry.Jitter))
	if waited := time.Since(start); waited < least {
		t.Fatalf("%d accept errors retried within %v, want at least %v of backoff", f.errs, waited, least)
	}
}
