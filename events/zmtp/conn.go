package zmtp

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// conn is a guarded connection. Its Read hands go-zeromq the peer's bytes
// only after its stream accepted them, never reading past a state boundary
// in one underlying Read, and returns (0, err) for the read that completes
// what the stream refuses (io.ReadFull would drop an error that came with a
// full read). Any refusal or handshake timeout closes the connection.
//
// The handshake runs under a deadline set when the connection is made and
// cleared once go-zeromq has read the peer's last handshake command (READY;
// the library writes its own before it reads the peer's). A timer closes
// the connection if go-zeromq has not come back to read it within
// HandshakeTimeout after that: the library has abandoned it after a failed
// Open, and it never closes such a connection. The connection is also
// closed when the socket's context ends, which aborts a Dial stuck in the
// handshake.
//
// Read must not be called concurrently with itself (go-zeromq reads each
// connection from one goroutine). Read, Write and Close may run
// concurrently with each other, and Write with itself once the handshake
// is over (it only passes bytes on then).
type conn struct {
	net.Conn
	ctx     context.Context
	timeout time.Duration
	stopCtx func() bool // stops the AfterFunc that closes the connection with ctx
	timer   *time.Timer // closes the connection unless resumed is set in time

	// Read side, owned by the reading goroutine (Open, then go-zeromq's
	// reader; the listener's handshake goroutine before either).
	rx      stream
	err     error  // sticky refusal
	pre     []byte // bytes fed during the prefetch, not yet handed on
	cleared bool   // the handshake deadline has been cleared
	waiting bool   // the peer's handshake has been handed on; the next Read resumes

	// Write side: set by the prefetch, then used by the goroutine writing
	// the handshake (before the connection is shared).
	swallow int // bytes of go-zeromq's greeting still to drop: the prefetch sent ours

	resumed atomic.Bool // go-zeromq read again after the handshake
	expired atomic.Bool // the timer closed the connection
}

func newConn(ctx context.Context, c net.Conn, lim Limits) *conn {
	g := &conn{Conn: c, ctx: ctx, timeout: lim.HandshakeTimeout, rx: stream{maxMsg: lim.MaxMessageBytes}}
	_ = c.SetDeadline(time.Now().Add(lim.HandshakeTimeout))
	g.timer = time.AfterFunc(lim.HandshakeTimeout, g.expire)
	g.stopCtx = context.AfterFunc(ctx, func() { _ = g.Conn.Close() })
	return g
}

// expire closes a connection whose handshake did not complete, or that
// go-zeromq did not resume, in time.
func (g *conn) expire() {
	if g.resumed.Load() {
		return
	}
	g.expired.Store(true)
	_ = g.Conn.Close()
}

func (g *conn) Close() error {
	g.stopCtx()
	g.timer.Stop()
	return g.Conn.Close()
}

func (g *conn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.waiting {
		g.waiting = false
		g.resumed.Store(true)
		g.timer.Stop()
	}
	if len(g.pre) > 0 {
		n := copy(p, g.pre)
		g.pre = g.pre[n:]
		if len(g.pre) == 0 {
			g.pre = nil
			if g.rx.ready { // go-zeromq has written its READY and read the peer's
				g.endHandshake()
				g.waiting = true
			}
		}
		return n, nil
	}
	n := g.rx.room(len(p))
	if n == 0 {
		return 0, nil
	}
	n, err := g.Conn.Read(p[:n])
	if n > 0 {
		if ferr := g.rx.feed(p[:n]); ferr != nil {
			return 0, g.fail(ferr)
		}
		if g.rx.ready && !g.cleared {
			g.endHandshake()
			g.waiting = true
		}
	}
	if err != nil {
		if gerr := g.guardErr(err); gerr != nil {
			return 0, g.fail(gerr)
		}
	}
	return n, err
}

func (g *conn) Write(p []byte) (int, error) {
	if g.swallow > 0 {
		return g.writeSwallow(p)
	}
	n, err := g.Conn.Write(p)
	if err != nil {
		if gerr := g.guardErr(err); gerr != nil {
			_ = g.Close()
			err = gerr
		}
	}
	return n, err
}

// writeSwallow drops the first bytes of go-zeromq's greeting, which the
// prefetch has already sent on its behalf, and writes the rest of p.
func (g *conn) writeSwallow(p []byte) (int, error) {
	k := min(len(p), g.swallow)
	g.swallow -= k
	if k == len(p) {
		return k, nil
	}
	n, err := g.Write(p[k:])
	return k + n, err
}

// endHandshake clears the handshake deadline once the peer's handshake has
// been read, and gives go-zeromq HandshakeTimeout to resume reading.
func (g *conn) endHandshake() {
	g.cleared = true
	_ = g.Conn.SetDeadline(time.Time{})
	g.timer.Reset(g.timeout)
}

// guardErr returns the error to report for an I/O error the guard caused
// (the socket's context ended, the handshake timed out), saying so, or nil
// for any other error (io.EOF among them), which is reported as it is.
func (g *conn) guardErr(err error) error {
	switch {
	case g.ctx.Err() != nil:
		return &canceled{cause: context.Cause(g.ctx), err: err}
	case g.expired.Load() || errors.Is(err, os.ErrDeadlineExceeded):
		// The only deadline ever set is the handshake's.
		return &handshakeTimeout{after: g.timeout, err: err}
	}
	return nil
}

// ioErr returns the error to report for err.
func (g *conn) ioErr(err error) error {
	if gerr := g.guardErr(err); gerr != nil {
		return gerr
	}
	return err
}

// fail records a refusal and closes the connection.
func (g *conn) fail(err error) error {
	g.err = err
	_ = g.Close()
	return err
}

// prefetch runs the greeting exchange and reads the peer's first handshake
// command before go-zeromq sees the connection, so that the library's
// accept loop, which runs the whole handshake synchronously, never waits on
// this peer. It sends the first 11 bytes of the greeting go-zeromq would
// send (signature and major version) at once, since libzmq sends its own
// greeting in steps and waits for ours; the rest, with the peer's mechanism
// mirrored, once the peer's greeting is in. go-zeromq's own greeting is
// then dropped when it writes it, and the bytes read here are handed to it
// before anything else is read. Under NULL the first command is the peer's
// READY, so the library's handshake then completes without waiting. The
// handshake deadline stays until go-zeromq has read that READY.
//
// On error the connection is closed.
func (g *conn) prefetch() error {
	var greet [greetingLen]byte
	greet[0], greet[9], greet[10] = 0xFF, 0x7F, 3 // version 3.0, as go-zeromq
	const early = 11
	if _, err := g.Conn.Write(greet[:early]); err != nil {
		return g.fail(g.ioErr(err))
	}
	buf := make([]byte, 0, greetingLen+longHeaderLen)
	for sent := false; g.rx.cmds == 0; {
		buf = slices.Grow(buf, g.rx.room(MaxCommandBytes))
		room := g.rx.room(cap(buf) - len(buf))
		n, err := g.Conn.Read(buf[len(buf) : len(buf)+room])
		if n > 0 {
			if ferr := g.rx.feed(buf[len(buf) : len(buf)+n]); ferr != nil {
				return g.fail(ferr)
			}
			buf = buf[:len(buf)+n]
		}
		if err != nil {
			return g.fail(g.ioErr(err))
		}
		if !sent && g.rx.st != stageGreeting {
			copy(greet[12:32], buf[12:32])
			if _, err := g.Conn.Write(greet[early:]); err != nil {
				return g.fail(g.ioErr(err))
			}
			sent = true
		}
	}
	g.pre, g.swallow = buf, greetingLen
	return nil
}

var _ net.Conn = (*conn)(nil)
