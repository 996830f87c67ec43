package zmtp

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// listener accepts guarded connections. Its own goroutine accepts, and one
// goroutine per new connection runs the prefetch (conn.prefetch) under the
// handshake deadline; only connections that passed it are returned by
// Accept. go-zeromq's accept loop runs each handshake synchronously, so a
// silent or stalled peer would otherwise hold up every later accept.
//
// The goroutines are the listener's: Close (called by go-zeromq when the
// socket closes, and when the socket's context ends) closes the connections
// still in their handshake and returns once every goroutine has exited.
// Connections already returned by Accept belong to go-zeromq.
//
// A peer refused during the prefetch is closed and not reported: go-zeromq
// discards accept errors, and its own handshake errors only reach its log.
type listener struct {
	net.Listener
	ctx  context.Context
	lim  Limits
	out  chan *conn    // handshake prefetched, waiting for Accept
	done chan struct{} // closed by Close
	once sync.Once
	stop func() bool // stops the AfterFunc that closes the listener with ctx
	wg   sync.WaitGroup

	mu      sync.Mutex
	closed  bool               // guarded by mu
	pending map[*conn]struct{} // connections in the prefetch; guarded by mu
}

func listen(ctx context.Context, network, addr string, lim Limits) (*listener, error) {
	inner, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return newListener(ctx, inner, lim), nil
}

// newListener guards inner and starts accepting on it.
func newListener(ctx context.Context, inner net.Listener, lim Limits) *listener {
	l := &listener{
		Listener: inner,
		ctx:      ctx,
		lim:      lim,
		out:      make(chan *conn),
		done:     make(chan struct{}),
		pending:  make(map[*conn]struct{}),
	}
	l.wg.Add(1)
	go l.run()
	l.stop = context.AfterFunc(ctx, func() { _ = l.Close() })
	return l
}

// Accept returns the next connection whose peer has completed the greeting
// and sent its first handshake command, or net.ErrClosed once closed.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case g := <-l.out:
		return g, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes the connections still in their handshake
// and waits for the listener's goroutines.
func (l *listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.mu.Lock()
		l.closed = true
		for g := range l.pending {
			_ = g.Close()
		}
		l.mu.Unlock()
		l.stop()
		l.wg.Wait()
	})
	return err
}

// run accepts until the listener is closed, backing off on other accept
// errors (running out of file descriptors) as net/http does: 5 ms
// doubling to 1 s, with the retry schedule's jitter, and from 5 ms again
// after a connection is accepted.
func (l *listener) run() {
	defer l.wg.Done()
	bo := retry.Backoff(5*time.Millisecond, time.Second)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t := time.NewTimer(bo.NextBackOff())
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			continue
		}
		bo.Reset()
		g := newConn(l.ctx, c, l.lim)
		if !l.track(g) {
			_ = g.Close()
			return
		}
		l.wg.Add(1)
		go l.handshake(g)
	}
}

// handshake prefetches g's handshake and hands it to Accept.
func (l *listener) handshake(g *conn) {
	defer l.wg.Done()
	err := g.prefetch()
	l.untrack(g)
	if err != nil {
		return // g closed itself
	}
	select {
	case l.out <- g:
	case <-l.done:
		_ = g.Close()
	}
}

func (l *listener) track(g *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[g] = struct{}{}
	return true
}

func (l *listener) untrack(g *conn) {
	l.mu.Lock()
	delete(l.pending, g)
	l.mu.Unlock()
}

var _ net.Listener = (*listener)(nil)
