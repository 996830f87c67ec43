package zmtp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// guarded is how every test names a guarded endpoint: the one place to
// bypass the guard (return ep unchanged) when checking that the hostile
// tests fail without it.
var guarded = Endpoint

// wait bounds every single wait in these tests unless a test says otherwise.
const wait = 10 * time.Second

// peer is the raw side of a connection with a go-zeromq socket: a rogue that
// speaks just enough ZMTP.
type peer struct {
	t testing.TB
	c net.Conn
}

func (p *peer) send(bs ...[]byte) error {
	for _, b := range bs {
		if _, err := p.c.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func (p *peer) mustSend(bs ...[]byte) {
	p.t.Helper()
	if err := p.send(bs...); err != nil {
		p.t.Fatalf("rogue: send: %v", err)
	}
}

// readGreeting reads the other side's greeting.
func (p *peer) readGreeting() {
	p.t.Helper()
	_ = p.c.SetReadDeadline(time.Now().Add(wait))
	var g [greetingLen]byte
	if _, err := io.ReadFull(p.c, g[:]); err != nil {
		p.t.Fatalf("rogue: reading the greeting: %v", err)
	}
	if g[0] != 0xFF || g[9] != 0x7F {
		p.t.Fatalf("rogue: bad greeting % x", g)
	}
}

// readFrame reads one frame of at most 1 MiB.
func (p *peer) readFrame() (flags byte, body []byte) {
	p.t.Helper()
	_ = p.c.SetReadDeadline(time.Now().Add(wait))
	var h [longHeaderLen]byte
	if _, err := io.ReadFull(p.c, h[:2]); err != nil {
		p.t.Fatalf("rogue: reading a frame header: %v", err)
	}
	size := uint64(h[1])
	if h[0]&flagLong != 0 {
		if _, err := io.ReadFull(p.c, h[2:]); err != nil {
			p.t.Fatalf("rogue: reading a frame header: %v", err)
		}
		size = binary.BigEndian.Uint64(h[1:])
	}
	if size > 1<<20 {
		p.t.Fatalf("rogue: frame of %d bytes", size)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(p.c, body); err != nil {
		p.t.Fatalf("rogue: reading a frame body: %v", err)
	}
	return h[0], body
}

// handshake runs a NULL handshake as a socket of type typ: both sides write
// first, so it serves for either role.
func (p *peer) handshake(typ string) {
	p.t.Helper()
	p.mustSend(greeting("NULL"))
	p.readGreeting()
	p.mustSend(ready(typ))
	p.readReady()
}

// readReady reads the other side's READY.
func (p *peer) readReady() {
	p.t.Helper()
	fl, body := p.readFrame()
	if fl&flagCommand == 0 || len(body) < 6 || string(body[1:6]) != "READY" {
		p.t.Fatalf("rogue: want READY, got flags %#x body %q", fl, body)
	}
}

// closed waits up to d for the other side to close the connection, reading
// and discarding whatever it sends meanwhile.
func (p *peer) closed(d time.Duration) error {
	_ = p.c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := p.c.Read(buf)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("the connection is still open after %v", d)
		default:
			return nil // EOF or reset
		}
	}
}

func (p *peer) mustBeClosed(d time.Duration) {
	p.t.Helper()
	if err := p.closed(d); err != nil {
		p.t.Fatalf("rogue: %v", err)
	}
}

// rogueServer accepts raw connections for go-zeromq sockets to dial.
type rogueServer struct {
	t     testing.TB
	ln    net.Listener
	conns chan net.Conn
}

func newRogueServer(t testing.TB) *rogueServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rogueServer{t: t, ln: ln, conns: make(chan net.Conn, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.conns <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for {
			select {
			case c := <-r.conns:
				_ = c.Close()
			default:
				return
			}
		}
	})
	return r
}

func (r *rogueServer) endpoint() string { return "tcp://" + r.ln.Addr().String() }

// accept returns the next connection dialed to r.
func (r *rogueServer) accept() *peer {
	r.t.Helper()
	select {
	case c := <-r.conns:
		r.t.Cleanup(func() { _ = c.Close() })
		return &peer{t: r.t, c: c}
	case <-time.After(wait):
		r.t.Fatal("rogue: nothing dialed")
		return nil
	}
}

// dialRogue dials a go-zeromq socket's listener as a raw client.
func dialRogue(t testing.TB, sock zmq4.Socket) *peer {
	t.Helper()
	c, err := net.DialTimeout("tcp", sock.Addr().String(), wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &peer{t: t, c: c}
}

// Sockets.

// quiet discards go-zeromq's log (it logs every failed accept-side Open).
var quiet = zmq4.WithLogger(log.New(io.Discard, "", 0))

// newSocket returns a socket of type typ whose context carries lim, closed
// at cleanup.
func newSocket(t testing.TB, ctx context.Context, typ zmq4.SocketType, lim Limits, opts ...zmq4.Option) zmq4.Socket {
	t.Helper()
	ctx = WithLimits(ctx, lim)
	opts = append([]zmq4.Option{zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(wait), quiet}, opts...)
	var s zmq4.Socket
	switch typ {
	case zmq4.Sub:
		s = zmq4.NewSub(ctx, opts...)
	case zmq4.Pub:
		s = zmq4.NewPub(ctx, opts...)
	case zmq4.Dealer:
		s = zmq4.NewDealer(ctx, opts...)
	case zmq4.Router:
		s = zmq4.NewRouter(ctx, opts...)
	default:
		t.Fatalf("no constructor for %s", typ)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// listenGuarded makes s listen on a guarded loopback endpoint.
func listenGuarded(t testing.TB, s zmq4.Socket) {
	t.Helper()
	if err := s.Listen(guarded("tcp://127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
}

// peerOf is the socket type a rogue poses as to talk to typ.
func peerOf(typ zmq4.SocketType) string {
	switch typ {
	case zmq4.Sub:
		return "PUB"
	case zmq4.Pub:
		return "SUB"
	case zmq4.Dealer:
		return "ROUTER"
	case zmq4.Router:
		return "DEALER"
	}
	panic("no peer for " + string(typ))
}

// async runs f in a goroutine and returns its error on a channel.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// recvAsync receives one message from s in a goroutine.
func recvAsync(s zmq4.Socket) <-chan recvResult {
	ch := make(chan recvResult, 1)
	go func() {
		m, err := s.Recv()
		ch <- recvResult{m, err}
	}()
	return ch
}

type recvResult struct {
	msg zmq4.Msg
	err error
}

// within waits up to d for ch.
func within[T any](t testing.TB, d time.Duration, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing after %v", what, d)
		var zero T
		return zero
	}
}

// subscribed waits until pub has a subscriber.
func subscribed(t testing.TB, pub zmq4.Socket) {
	t.Helper()
	testsupport.Eventually(t, wait, "a subscription", func() bool { return len(pub.(zmq4.Topics).Topics()) > 0 })
}

// wantLimit fails t unless err is a *LimitError about what with at least
// size claimed.
func wantLimit(t testing.TB, err error, what string, size int64) *LimitError {
	t.Helper()
	var le *LimitError
	if !errors.As(err, &le) {
		t.Fatalf("error %v (%T), want a *LimitError", err, err)
	}
	if le.What != what || le.Size < size {
		t.Fatalf("LimitError %+v, want What %q and Size >= %d", le, what, size)
	}
	return le
}

// wantProtocol fails t unless err is a *ProtocolError with reason.
func wantProtocol(t testing.TB, err error, reason string) {
	t.Helper()
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T), want a *ProtocolError", err, err)
	}
	if pe.Reason != reason {
		t.Fatalf("ProtocolError %+v, want reason %q", pe, reason)
	}
}
