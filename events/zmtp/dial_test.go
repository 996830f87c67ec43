package zmtp

// Hostile engines: a raw-TCP rogue that go-zeromq SUB and DEALER sockets
// (the subscriber's live and replay sockets) dial through the guard. Each of
// these tests panics, runs out of memory or hangs (bounded by its waits)
// when the guard is bypassed (guarded returning the plain endpoint), except
// where a comment says otherwise.

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// dialedSockets are the socket types prefixd dials engines with.
var dialedSockets = []zmq4.SocketType{zmq4.Sub, zmq4.Dealer}

// dialRogue starts a Dial of a new socket of type typ to a rogue server and
// returns the socket, the rogue's side of the connection and Dial's result.
func dialToRogue(t *testing.T, typ zmq4.SocketType, lim Limits) (zmq4.Socket, *peer, <-chan error) {
	t.Helper()
	rs := newRogueServer(t)
	sock := newSocket(t, t.Context(), typ, lim)
	dialed := async(func() error { return sock.Dial(guarded(rs.endpoint())) })
	return sock, rs.accept(), dialed
}

// dialHandshaken dials a rogue and completes a good handshake.
func dialHandshaken(t *testing.T, typ zmq4.SocketType, lim Limits) (zmq4.Socket, *peer) {
	t.Helper()
	sock, p, dialed := dialToRogue(t, typ, lim)
	p.handshake(peerOf(typ))
	if err := within(t, wait, "Dial", dialed); err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return sock, p
}

// TestDialRefusesOversizeFrame: a long frame header claiming more than the
// limit fails Recv with a *LimitError before the rogue has sent one body
// byte (it holds the body back until the connection closes), and nothing
// near the claim is allocated. Without the guard, 2^62 panics
// (makeslice: len out of range), 2^36 dies out of memory, and 1 GiB is
// allocated and waits for a body that never comes. Not parallel: it
// counts the whole process's allocations.
func TestDialRefusesOversizeFrame(t *testing.T) {
	claims := []struct {
		name string
		size uint64
	}{
		{"2^62", 1 << 62},
		{"2^36", 1 << 36},
		{"1GiB held back", 1 << 30},
	}
	for _, typ := range dialedSockets {
		for _, c := range claims {
			t.Run(string(typ)+"/"+c.name, func(t *testing.T) {
				sock, p := dialHandshaken(t, typ, Limits{})
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				got := recvAsync(sock)
				p.mustSend(header(0, c.size, true))
				p.mustBeClosed(wait) // no body byte has been sent
				r := within(t, wait, "Recv", got)
				runtime.ReadMemStats(&after)
				le := wantLimit(t, r.err, "message", int64(c.size))
				if le.Max != DefaultMaxMessageBytes {
					t.Errorf("Max %d, want the default %d", le.Max, DefaultMaxMessageBytes)
				}
				if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20 {
					t.Errorf("allocated %d bytes while refusing a %d-byte claim", d, c.size)
				}
			})
		}
	}
}

// TestDialRefusesEndlessEmptyMoreFrames: empty frames with MORE set cost
// FrameOverhead each, so a message that never ends is refused. Without the
// guard go-zeromq accumulates them until the rogue stops, and never closes.
func TestDialRefusesEndlessEmptyMoreFrames(t *testing.T) {
	t.Parallel()
	const max = 1 << 20
	for _, typ := range dialedSockets {
		t.Run(string(typ), func(t *testing.T) {
			sock, p := dialHandshaken(t, typ, Limits{MaxMessageBytes: max})
			got := recvAsync(sock)
			batch := bytes.Repeat([]byte{flagMore, 0}, 4096)
			_ = p.c.SetWriteDeadline(time.Now().Add(wait))
			var err error
			for sent := 0; sent < 4<<20 && err == nil; sent += 4096 {
				_, err = p.c.Write(batch)
			}
			if err == nil { // all written, some of it to socket buffers
				p.mustBeClosed(wait)
			}
			le := wantLimit(t, within(t, wait, "Recv", got).err, "message", max+1)
			if le.Max != max {
				t.Errorf("Max %d, want %d", le.Max, max)
			}
		})
	}
}

// TestDialRefusesBadHandshake: what a rogue sends in place of a good
// handshake fails Dial with a typed error and a closed connection. Without
// the guard the malformed metadata cases panic go-zeromq (index out of
// range in Property.Write, "unknown socket-type" in IsCompatible); the
// huge command dies out of memory; the others (bad signature, message
// before READY, value past the end, Socket-Type twice) fail Dial with the
// library's own untyped error, so those fail only the error-type check.
func TestDialRefusesBadHandshake(t *testing.T) {
	t.Parallel()
	pad := func(b []byte) []byte { return append(b, make([]byte, greetingLen-len(b))...) }
	cases := []struct {
		name  string
		rogue func(p *peer, typ string)
		check func(t *testing.T, err error)
	}{
		{"command claiming 2^40 before READY", func(p *peer, typ string) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
			p.mustSend(header(flagCommand, 1<<40, true))
		}, func(t *testing.T, err error) { wantLimit(t, err, "command", 1<<40) }},
		{"command claiming 1MiB before READY", func(p *peer, typ string) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
			p.mustSend(header(flagCommand, 1<<20, true))
		}, func(t *testing.T, err error) { wantLimit(t, err, "command", 1<<20) }},
		{"not ZMTP", func(p *peer, typ string) {
			p.mustSend(pad([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")))
		}, protocol("greeting")},
		{"message before READY", func(p *peer, typ string) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
			p.mustSend(frame(0, []byte("hello")))
		}, protocol("frame")},
		{"property name length equals the rest", badReady([]byte("\x05abcd")), protocol("metadata")},
		{"value length cut short", func(p *peer, typ string) {
			badReady(append(property("Socket-Type", typ), "\x03abc\x00\x00"...))(p, typ)
		}, protocol("metadata")},
		{"value past the end", func(p *peer, typ string) {
			badReady(append(property("Socket-Type", typ), "\x03abc\x00\x00\x01\x00xy"...))(p, typ)
		}, protocol("metadata")},
		{"no Socket-Type", badReady(property("Identity", "x")), protocol("socket-type")},
		{"unknown Socket-Type", badReady(property("Socket-Type", "FOO")), protocol("socket-type")},
		{"Socket-Type go-zeromq cannot find", func(p *peer, typ string) {
			badReady(property("SOCKET-TYPE", typ))(p, typ)
		}, protocol("socket-type")},
		{"Socket-Type twice", func(p *peer, typ string) {
			badReady(append(property("Socket-Type", typ), property("socket-type", typ)...))(p, typ)
		}, protocol("socket-type")},
		{"non-ASCII alias of Socket-Type", func(p *peer, typ string) {
			// go-zeromq title-cases "ſocket-type" to "Socket-Type".
			badReady(append(property("Socket-Type", typ), property("ſocket-type", "FOO")...))(p, typ)
		}, protocol("metadata")},
	}
	for _, typ := range dialedSockets {
		for _, c := range cases {
			t.Run(string(typ)+"/"+c.name, func(t *testing.T) {
				_, p, dialed := dialToRogue(t, typ, Limits{})
				c.rogue(p, peerOf(typ))
				c.check(t, within(t, wait, "Dial", dialed))
				p.mustBeClosed(wait)
			})
		}
	}
}

// badReady greets and then sends a READY whose metadata is data.
func badReady(data []byte) func(p *peer, typ string) {
	return func(p *peer, typ string) {
		p.mustSend(greeting("NULL"))
		p.readGreeting()
		p.mustSend(command("READY", data))
	}
}

func protocol(reason string) func(t *testing.T, err error) {
	return func(t *testing.T, err error) { wantProtocol(t, err, reason) }
}

// TestDialHandshakeTimeout: a rogue that stalls anywhere in the handshake
// fails Dial with ErrHandshakeTimeout after HandshakeTimeout, and its
// connection is closed. Without the guard Dial blocks forever.
func TestDialHandshakeTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	cases := []struct {
		name  string
		rogue func(p *peer)
	}{
		{"never greets", func(p *peer) {}},
		{"greets then stalls", func(p *peer) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
		}},
		{"stalls inside READY", func(p *peer) {
			p.mustSend(greeting("NULL"))
			p.readGreeting()
			p.mustSend(header(flagCommand, 30, false), []byte("\x05REA"))
		}},
	}
	for _, typ := range dialedSockets {
		for _, c := range cases {
			t.Run(string(typ)+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				_, p, dialed := dialToRogue(t, typ, Limits{HandshakeTimeout: timeout})
				c.rogue(p)
				err := within(t, timeout+wait, "Dial", dialed)
				elapsed := time.Since(start)
				if !errors.Is(err, ErrHandshakeTimeout) {
					t.Fatalf("Dial: %v, want ErrHandshakeTimeout", err)
				}
				if elapsed < timeout || elapsed > timeout+5*time.Second {
					t.Errorf("Dial returned after %v, want about %v", elapsed, timeout)
				}
				p.mustBeClosed(wait)
			})
		}
	}
}

// TestDialCancelAbortsHandshake: ending the socket's context, or closing
// the socket, aborts a Dial stuck in the handshake at once, long before
// HandshakeTimeout. Without the guard Dial blocks forever.
func TestDialCancelAbortsHandshake(t *testing.T) {
	t.Parallel()
	for _, typ := range dialedSockets {
		for _, how := range []string{"cancel", "Close"} {
			t.Run(string(typ)+"/"+how, func(t *testing.T) {
				rs := newRogueServer(t)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				sock := newSocket(t, ctx, typ, Limits{HandshakeTimeout: time.Hour})
				dialed := async(func() error { return sock.Dial(guarded(rs.endpoint())) })
				p := rs.accept()
				p.readGreeting() // Dial now waits for the rogue's, which never comes
				start := time.Now()
				if how == "cancel" {
					cancel()
				} else {
					_ = sock.Close()
				}
				err := within(t, wait, "Dial", dialed)
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("Dial returned %v after the %s", d, how)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Dial: %v, want context.Canceled", err)
				}
				p.mustBeClosed(wait)
			})
		}
	}
}

// TestDialAbandonedHandshakeIsClosed: go-zeromq refuses a peer of an
// incompatible type after the handshake and returns from Dial without
// closing the connection; the guard closes it within HandshakeTimeout.
// Without the guard the connection stays open until a garbage collection
// happens to finalise it, which in this test it usually does not.
func TestDialAbandonedHandshakeIsClosed(t *testing.T) {
	t.Parallel()
	for _, typ := range dialedSockets {
		t.Run(string(typ), func(t *testing.T) {
			_, p, dialed := dialToRogue(t, typ, Limits{HandshakeTimeout: 500 * time.Millisecond})
			p.handshake("PULL")
			if err := within(t, wait, "Dial", dialed); err == nil {
				t.Fatal("Dial to an incompatible peer succeeded")
			}
			p.mustBeClosed(wait)
		})
	}
}
