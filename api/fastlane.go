package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/retry"
)

// A FastLane serves the query routes of an http.Server without net/http's
// per-request machinery, and hands every other connection to the server.
//
// net/http serves a request with a background read: once the body is
// read, a goroutine of the connection waits on it to notice the client
// leaving, and finishing the request stops it again (a read deadline, a
// wakeup and a handshake between goroutines). On a virtual machine, where
// each wakeup is an exit, net/http and the kernel cost POST /query about
// 120 µs of CPU a request against 65 µs for a plain read-parse-write loop
// on the same socket (docs/benchmarks.md). The fast lane is that loop, for
// the requests a router sends at rate: a GET, POST or DELETE to one of its
// paths (FastLanePaths: the routes answered from memory), in HTTP/1.1,
// whose head it reads itself and checks strictly. It then calls the server's handler as net/http would, with an
// http.Request and a ResponseWriter that buffers the response and writes
// it, head and body, in one system call.
//
// Whatever it does not serve it does not interpret: the first request of
// a connection that is not a fast one (another method or path, a
// Transfer-Encoding, an Expect, HTTP/1.0, a head over 4 KiB or anything
// net/http might read differently) goes to the http.Server, with the bytes
// already read replayed, and the server keeps the connection from then
// on. So every answer is net/http's own but for the fast requests, whose
// answers are the handler's, and TestFastLaneTransparent sends the same
// bytes to both and compares.
//
// Differences from net/http on the fast requests, none visible to the
// handlers of FastLanePaths: the request's context is not canceled when
// the client leaves (the handlers take microseconds and do not look), and
// the handler's response is buffered whole (the score and plan responses
// are bounded by the fleet's ranks) and sent with its Content-Length.
//
// The lane is a net.Listener for the server: Serve the server on it. It
// applies the server's ReadHeaderTimeout, ReadTimeout, WriteTimeout and
// IdleTimeout to its own connections, and logs a handler's panic to its
// ErrorLog, as net/http does. Closing it (the server's Shutdown or Close does) stops
// accepting and closes its idle connections; Drain then waits for the
// requests in flight. A TLS connection goes to the server untouched. The
// server's ConnState and ConnContext hooks, and SetKeepAlivesEnabled, see
// only the connections the lane hands over.
type FastLane struct {
	ln      net.Listener
	srv     *http.Server
	paths   lanePaths
	maxHead int // the longest head the lane reads: laneBuf, or the server's MaxHeaderBytes if less
	handoff chan net.Conn
	ctx     context.Context // the requests' context: the server's keys, canceled by Drain
	cancel  context.CancelFunc

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
	failed    chan struct{} // closed when accepting failed for good
	acceptErr error         // set before failed is closed

	mu     sync.Mutex
	closed bool
	conns  map[*laneConn]bool // the lane's connections: true while idle
	wg     sync.WaitGroup     // the accept loop and the connections

	served   atomic.Int64
	handoffs [numHandoffReasons]atomic.Int64

	// testHookIdle, if set, runs when a connection has been marked idle,
	// before it waits for its next request.
	testHookIdle func()
}

// FastLanePaths are the paths NewFastLane serves by default: every route
// whose handler answers from memory — the queries, the selections and
// bookings a router or prefixd proxy makes for every request it routes,
// the fleet view (/workers) it refreshes, and the probes. Not /register
// and /unregister (they write etcd under the request's context), /dump
// (a stream) or /metrics.
var FastLanePaths = []string{"/query", "/query_by_hash", "/select", "/select_and_reserve",
	"/reservations", "/reservations/", "/disagg/plans", "/disagg/plans/", "/workers", "/health", "/ready"}

// NewFastLane returns a FastLane accepting on ln for srv, serving the GET,
// POST and DELETE requests to paths (FastLanePaths if none) with
// srv.Handler, and starts accepting. A path ending in a slash names the
// paths below it, as in a ServeMux pattern. Serve srv on the lane
// (srv.Serve(lane), or httpserve.Serve, which also drains it).
func NewFastLane(srv *http.Server, ln net.Listener, paths ...string) *FastLane {
	return newFastLane(srv, ln, nil, paths...)
}

// newFastLane is NewFastLane with testHookIdle set before it accepts.
func newFastLane(srv *http.Server, ln net.Listener, testHookIdle func(), paths ...string) *FastLane {
	if len(paths) == 0 {
		paths = FastLanePaths
	}
	l := &FastLane{
		ln: ln, srv: srv, paths: lanePaths{exact: make(map[string]bool, len(paths))}, handoff: make(chan net.Conn),
		done: make(chan struct{}), failed: make(chan struct{}), conns: make(map[*laneConn]bool), testHookIdle: testHookIdle,
	}
	for _, p := range paths {
		if strings.HasSuffix(p, "/") {
			l.paths.prefixes = append(l.paths.prefixes, p)
		} else {
			l.paths.exact[p] = true
		}
	}
	l.maxHead = laneBuf
	if srv.MaxHeaderBytes > 0 {
		l.maxHead = min(l.maxHead, srv.MaxHeaderBytes)
	}
	ctx := context.WithValue(context.Background(), http.ServerContextKey, srv)
	ctx = context.WithValue(ctx, http.LocalAddrContextKey, ln.Addr())
	l.ctx, l.cancel = context.WithCancel(ctx)
	l.wg.Add(1)
	go l.accept()
	return l
}

// handoffReason is why a connection went to the http.Server.
type handoffReason uint8

const (
	handoffMethod handoffReason = iota // not a GET, POST or DELETE
	handoffPath                        // not a lane path, or one (or a query) it does not read
	handoffProto                       // not HTTP/1.1, or a malformed request line
	handoffHeader                      // a header the lane leaves to net/http, or a malformed one
	handoffLength                      // two Content-Lengths, or one the lane does not read
	handoffSize                        // a head over the lane's 4 KiB buffer
	handoffTLS                         // a TLS connection
	handoffEOF                         // the client ended inside a head
	numHandoffReasons
)

var handoffNames = [numHandoffReasons]string{"method", "path", "proto", "header", "length", "size", "tls", "eof"}

func (r handoffReason) String() string { return handoffNames[r] }

// FastLaneStats counts what a FastLane did.
type FastLaneStats struct {
	Served   int64            // requests it served itself
	Handoffs map[string]int64 // connections it gave the server, by reason
}

// Stats returns the lane's counts so far.
func (l *FastLane) Stats() FastLaneStats {
	s := FastLaneStats{Served: l.served.Load(), Handoffs: make(map[string]int64, numHandoffReasons)}
	for r := range numHandoffReasons {
		s.Handoffs[r.String()] = l.handoffs[r].Load()
	}
	return s
}

var (
	laneServedDesc = prometheus.NewDesc("prefixd_http_fast_lane_requests_total",
		"HTTP requests the fast lane served itself (the rest go to net/http).", nil, nil)
	laneHandoffDesc = prometheus.NewDesc("prefixd_http_fast_lane_handoffs_total",
		"Connections the fast lane gave to net/http, by the reason of their first other request.", []string{"reason"}, nil)
)

// Describe and Collect make the lane a prometheus.Collector of its counts.
func (l *FastLane) Describe(ch chan<- *prometheus.Desc) {
	ch <- laneServedDesc
	ch <- laneHandoffDesc
}

func (l *FastLane) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(laneServedDesc, prometheus.CounterValue, float64(l.served.Load()))
	for r := range numHandoffReasons {
		ch <- prometheus.MustNewConstMetric(laneHandoffDesc, prometheus.CounterValue, float64(l.handoffs[r].Load()), r.String())
	}
}

// Accept returns the next connection handed to the server.
func (l *FastLane) Accept() (net.Conn, error) {
	select {
	case c := <-l.handoff:
		return c, nil
	case <-l.failed:
		return nil, l.acceptErr
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Addr returns the listener's address.
func (l *FastLane) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting and closes the lane's idle connections; a
// connection serving a request closes once it has answered it.
func (l *FastLane) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.done)
		for c, idle := range l.conns {
			if idle {
				c.conn.SetReadDeadline(aLongTimeAgo) // wakes its read; it closes
			}
		}
		l.mu.Unlock()
		l.closeErr = l.ln.Close()
	})
	return l.closeErr
}

// Drain waits, after Close, until the lane's connections have answered
// their requests in flight and closed; when ctx ends first it closes them
// at once and returns ctx's error, as http.Server.Shutdown does.
func (l *FastLane) Drain(ctx context.Context) error {
	drained := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(drained)
	}()
	select {
	case <-drained:
		l.cancel()
		return nil
	case <-ctx.Done():
	}
	l.cancel()
	l.mu.Lock()
	for c := range l.conns {
		c.conn.Close()
	}
	l.mu.Unlock()
	return ctx.Err() // a handler still running ends on its own, as net/http's
}

// aLongTimeAgo is a deadline in the past: it fails a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// accept accepts connections until the listener closes, retrying
// temporary errors with backoff as net/http does.
func (l *FastLane) accept() {
	defer l.wg.Done()
	b := retry.Backoff(5*time.Millisecond, time.Second)
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				delay := b.NextBackOff()
				l.logf("http: fast lane: accept error: %v; retrying in %v", err, delay)
				select {
				case <-time.After(delay):
				case <-l.done:
					return
				}
				continue
			}
			l.acceptErr = err
			close(l.failed)
			return
		}
		b.Reset()
		if _, ok := c.(*tls.Conn); ok {
			l.handoffs[handoffTLS].Add(1)
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.give(c)
			}()
			continue
		}
		lc := &laneConn{l: l, conn: c, remote: c.RemoteAddr().String()}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.conns[lc] = false
		l.wg.Add(1)
		l.mu.Unlock()
		go lc.serve()
	}
}

// give hands c to the server, or closes it if the lane closes first.
func (l *FastLane) give(c net.Conn) {
	select {
	case l.handoff <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *FastLane) logf(format string, args ...any) {
	if l.srv.ErrorLog != nil {
		l.srv.ErrorLog.Printf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// Limits of the lane's connections.
const (
	laneBuf = 4 << 10 // the head buffer: a longer head goes to net/http
	// laneMaxHeaders bounds a fast request's header lines.
	laneMaxHeaders = 64
	// laneMaxDiscard is the most of an unread body the lane reads and
	// drops to keep the connection, as net/http (256 KiB); beyond, it
	// closes the connection after the response.
	laneMaxDiscard = 256 << 10
	// laneLinger bounds how long a closing connection waits for the
	// client's unread bytes after its response, so that closing does not
	// reset the connection before the client has read the response
	// (net/http waits 500 ms too).
	laneLinger = 500 * time.Millisecond
)

// laneConn is one connection of the lane, served by one goroutine.
type laneConn struct {
	l      *FastLane
	conn   net.Conn
	remote string
	buf    []byte // the head buffer; buf[r:w] is read and not consumed
	r, w   int
	kept   bool // it has answered a request and stays open for the next
	ended  bool // the client ended its side inside the request's body

	h    head
	body laneBody
	rw   laneWriter
	// out is the response head, kept for the next response.
	out []byte
}

// serve serves c's requests until it closes or goes to the server.
func (c *laneConn) serve() {
	defer c.l.wg.Done()
	c.buf = make([]byte, laneBuf)
	for {
		keep, give := c.next()
		if give {
			c.forget()
			c.conn.SetReadDeadline(time.Time{}) // the server sets its own
			c.l.give(&replayConn{Conn: c.conn, pending: c.buf[c.r:c.w]})
			return
		}
		if !keep {
			c.forget()
			c.conn.Close()
			return
		}
	}
}

// forget removes c from the lane's connections.
func (c *laneConn) forget() {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
}

// setIdle marks c idle or busy; marking it idle, it reports false if
// the lane has closed (c should close instead).
func (c *laneConn) setIdle(idle bool) bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.l.conns[c] = idle
	return !(idle && c.l.closed)
}

// next reads and serves one request: keep reports whether the connection
// stays open for another, give whether it goes to the server (with
// buf[r:w], the request's bytes read so far).
func (c *laneConn) next() (keep, give bool) {
	srv := c.l.srv
	if c.r == c.w {
		c.r, c.w = 0, 0
		// A new connection gets the header timeout for its first
		// request, as net/http's; a kept one the idle timeout. Set
		// before c is marked idle: from then on Close may set a
		// deadline in the past, which this one must not replace.
		d := idleTimeout(srv)
		if !c.kept {
			d = headerTimeout(srv)
		}
		if d > 0 {
			c.conn.SetReadDeadline(time.Now().Add(d))
		} else {
			c.conn.SetReadDeadline(time.Time{})
		}
		if !c.setIdle(true) {
			return false, false
		}
		if c.l.testHookIdle != nil {
			c.l.testHookIdle()
		}
		n, _ := c.conn.Read(c.buf)
		c.w = n
		c.setIdle(false)
		if n == 0 {
			return false, false // the client left, the idle timeout passed, or the lane closed
		}
	}
	t0 := time.Now()
	// The head: complete in the first read, as a router's requests are,
	// or read under ReadHeaderTimeout.
	var timed bool
	var end int
	for parse := true; ; {
		// Parsed again only when a line has ended since: a head
		// trickling in byte by byte is not parsed once a byte.
		if parse {
			var why handoffReason
			var ok bool
			end, why, ok = c.h.parse(c.buf[c.r:c.w], c.l.paths)
			if !ok {
				c.l.handoffs[why].Add(1)
				return false, true
			}
			if end > c.l.maxHead {
				c.l.handoffs[handoffSize].Add(1)
				return false, true
			}
			if end > 0 {
				break
			}
		}
		if c.w == len(c.buf) {
			if c.r == 0 {
				c.l.handoffs[handoffSize].Add(1)
				return false, true
			}
			c.w = copy(c.buf, c.buf[c.r:c.w])
			c.r = 0
		}
		if !timed {
			timed = true
			if d := headerTimeout(srv); d > 0 {
				c.conn.SetReadDeadline(t0.Add(d))
			}
		}
		n, err := c.conn.Read(c.buf[c.w:])
		parse = bytes.IndexByte(c.buf[c.w:c.w+n], '\n') >= 0
		c.w += n
		if n == 0 && errors.Is(err, io.EOF) {
			// The client ended inside a head: net/http answers what
			// arrived (a 400), so it gets it.
			c.l.handoffs[handoffEOF].Add(1)
			return false, true
		}
		if n == 0 && err != nil {
			// The header timeout passed, or the connection failed:
			// closed without an answer, as net/http does.
			return false, false
		}
	}
	c.r += end
	// The body: what the buffer holds, then the connection, under
	// ReadTimeout from the request's first byte.
	c.body = laneBody{c: c, left: c.h.length}
	if c.h.length > int64(c.w-c.r) {
		if d := srv.ReadTimeout; d > 0 {
			c.conn.SetReadDeadline(t0.Add(d))
		} else {
			c.conn.SetReadDeadline(time.Time{})
		}
	}
	if d := srv.WriteTimeout; d > 0 {
		c.conn.SetWriteDeadline(time.Now().Add(d)) // from the end of the head, as net/http
	}
	if !c.serveRequest() {
		return false, false
	}
	if c.rw.close || c.ended {
		c.linger()
		return false, false
	}
	c.kept = true
	return true, false
}

// serveRequest runs the handler for the parsed request and writes its
// response. It returns false if the connection must close at once: the
// handler panicked or the write failed.
func (c *laneConn) serveRequest() (ok bool) {
	h := &c.h
	req := &http.Request{
		Method:        h.method,
		URL:           &url.URL{Path: h.path, RawQuery: h.query},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h.header,
		Body:          &c.body,
		ContentLength: h.length,
		Host:          h.host,
		Close:         h.close,
		RemoteAddr:    c.remote,
		RequestURI:    h.target,
	}
	if h.length == 0 {
		req.Body = http.NoBody // as net/http
	}
	req = req.WithContext(c.l.ctx)
	h.header = nil // the request owns it now
	c.rw.reset()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.l.logf("http: panic serving %v: %v\n%s", c.remote, v, buf)
			}
			ok = false
		}
	}()
	handler := c.l.srv.Handler
	if handler == nil {
		handler = http.DefaultServeMux // as net/http
	}
	handler.ServeHTTP(&c.rw, req)
	c.l.served.Add(1)
	return c.write(h.close || c.settle())
}

// settle reads what the handler left of the body, as net/http does before
// it answers: up to laneMaxDiscard bytes are read and dropped, which
// keeps the connection. It reports whether the connection must close
// instead: more was left, the body failed to arrive, or the lane is
// closing.
func (c *laneConn) settle() (closeAfter bool) {
	switch b := &c.body; {
	case b.err == io.ErrUnexpectedEOF:
		// The client ended its side inside the body: the connection
		// ends with this answer, which says nothing of it, as
		// net/http's.
		c.ended = true
	case b.err != nil, b.left >= laneMaxDiscard:
		return true
	case b.left > 0:
		if _, err := io.Copy(io.Discard, b); err != nil {
			return true
		}
	}
	select {
	case <-c.l.done:
		return true
	default:
		return false
	}
}

// write sends the handler's response: the status line and headers, then
// the body, in one writev; with Connection: close if closing, or if the
// handler set it (c.rw.close is then set).
func (c *laneConn) write(closing bool) bool {
	rw := &c.rw
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	hd := rw.header
	hd.Del("Content-Length")
	hd.Del("Transfer-Encoding")
	if _, have := hd["Content-Type"]; !have && len(rw.body) > 0 {
		hd.Set("Content-Type", http.DetectContentType(rw.body))
	}
	if _, ok := hd["Date"]; !ok {
		hd.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	for _, v := range hd.Values("Connection") {
		if asciiEqualFold(v, "close") {
			rw.close = true
		}
	}
	if closing && !rw.close {
		rw.close = true
		hd.Set("Connection", "close")
	}
	b := append(c.out[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(rw.status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(rw.status)...)
	b = append(b, "\r\n"...)
	if rw.status == http.StatusNoContent || rw.status == http.StatusNotModified {
		rw.body = rw.body[:0] // no body, nor its length, as net/http
	} else {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(rw.body)), 10)
		b = append(b, "\r\n"...)
	}
	keys := make([]string, 0, len(hd))
	for k := range hd {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range hd[k] {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendHeaderValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "\r\n"...)
	c.out = b
	bufs := net.Buffers{b, rw.body}
	_, err := bufs.WriteTo(c.conn)
	return err == nil
}

// appendHeaderValue appends v with CR and LF replaced by spaces, as
// net/http writes header values.
func appendHeaderValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		ch := v[i]
		if ch == '\r' || ch == '\n' {
			ch = ' '
		}
		b = append(b, ch)
	}
	return b
}

// linger closes the write side, then waits up to laneLinger for the
// client to close, dropping what it still sends, so that the close does
// not reset the connection under a response the client has not read.
func (c *laneConn) linger() {
	if cw, ok := c.conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		c.conn.SetReadDeadline(time.Now().Add(laneLinger))
		io.Copy(io.Discard, io.LimitReader(c.conn, laneMaxDiscard))
	}
}

// laneWriter is the ResponseWriter of a fast request: it buffers the
// response, which the connection writes when the handler returns.
type laneWriter struct {
	header http.Header
	status int
	body   []byte
	close  bool // the handler asked for Connection: close
}

func (w *laneWriter) reset() {
	w.header = make(http.Header, 4)
	w.status = 0
	w.body = w.body[:0]
	w.close = false
}

func (w *laneWriter) Header() http.Header { return w.header }

func (w *laneWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *laneWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// laneBody is a fast request's body: the bytes of the head buffer, then
// the connection's, to the Content-Length.
type laneBody struct {
	c    *laneConn
	left int64 // bytes of the body not yet read
	err  error // the connection's read error, which ends the connection
}

func (b *laneBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	c := b.c
	var n int
	if c.r < c.w {
		n = copy(p, c.buf[c.r:c.w])
		c.r += n
	} else {
		var err error
		n, err = c.conn.Read(p)
		if err != nil && (n == 0 || err != io.EOF) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			b.err = err
		}
	}
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	if n == 0 && b.err != nil {
		return 0, b.err
	}
	return n, nil
}

func (b *laneBody) Close() error { return nil }

// replayConn is a connection handed to the server with the bytes the
// lane read from it and did not consume: its reads return those first.
type replayConn struct {
	net.Conn
	pending []byte
}

// CloseWrite closes the connection's write side, if it has one: net/http
// half-closes before it closes a connection with unread bytes, so that
// the client reads the answer before the reset.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// idleTimeout and headerTimeout are net/http's: IdleTimeout, else
// ReadTimeout; ReadHeaderTimeout, else ReadTimeout.
func idleTimeout(s *http.Server) time.Duration {
	if s.IdleTimeout != 0 {
		return s.IdleTimeout
	}
	return s.ReadTimeout
}

func headerTimeout(s *http.Server) time.Duration {
	if s.ReadHeaderTimeout != 0 {
		return s.ReadHeaderTimeout
	}
	return s.ReadTimeout
}

// head is a fast request's head, as parse reads it.
type head struct {
	method string
	target string // as sent: path, and ?query if any
	path   string
	query  string
	host   string
	length int64
	close  bool // the client sent Connection: close
	header http.Header
}

// parse reads a request head from b. It returns the head's length once
// b holds all of it (0 while it does not), or ok false and the reason the
// request goes to net/http. It accepts only what net/http reads the same
// way: CRLF line ends, a request line "<method> <path> HTTP/1.1" with a
// method of laneMethod and a path paths match, header names of token
// characters, values without control characters, no continuation lines,
// exactly one Host, at most one Content-Length, of decimal digits (none:
// no body), a Connection of close or keep-alive, and no
// Transfer-Encoding, Expect, Upgrade or Trailer.
func (h *head) parse(b []byte, paths lanePaths) (end int, why handoffReason, ok bool) {
	line, rest, found := cutLine(b)
	if !found {
		if line == nil {
			return 0, handoffProto, false // a bare LF
		}
		// The request line is incomplete; it can still go either way,
		// unless what arrived already decides.
		if m, _, sp := bytes.Cut(b, []byte{' '}); sp && laneMethod(m) == "" || !sp && len(b) > len("DELETE") {
			return 0, handoffMethod, false
		}
		return 0, 0, true
	}
	m, target, proto, ok3 := splitRequestLine(line)
	method := laneMethod(m)
	if !ok3 {
		return 0, handoffProto, false
	}
	if method == "" {
		return 0, handoffMethod, false
	}
	path, query, okPath := paths.match(target)
	switch {
	case !okPath:
		return 0, handoffPath, false
	case proto != "HTTP/1.1":
		return 0, handoffProto, false
	}
	*h = head{method: method, target: string(target), length: -1}
	h.path, h.query = h.target[:len(path)], h.target[len(h.target)-len(query):]
	hosts := 0
	for i := 0; ; i++ {
		line, rest, found = cutLine(rest)
		if !found {
			if line == nil {
				return 0, handoffHeader, false
			}
			return 0, 0, true // more to come
		}
		if len(line) == 0 {
			break
		}
		if i == laneMaxHeaders {
			return 0, handoffHeader, false
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return 0, handoffHeader, false
		}
		name, value := line[:colon], trimOWS(line[colon+1:])
		if !validValue(value) {
			return 0, handoffHeader, false
		}
		k := http.CanonicalHeaderKey(string(name)) // a token: ASCII case only
		switch k {
		case "Content-Length":
			if h.length >= 0 {
				return 0, handoffLength, false
			}
			n, ok := parseLength(value)
			if !ok {
				return 0, handoffLength, false
			}
			h.length = n
		case "Host":
			if hosts++; hosts > 1 || !validHost(value) {
				return 0, handoffHeader, false
			}
			h.host = string(value)
			continue // net/http moves it to Request.Host
		case "Connection":
			switch {
			case asciiEqualFold(string(value), "close"):
				h.close = true
			case asciiEqualFold(string(value), "keep-alive"):
			default:
				return 0, handoffHeader, false
			}
		case "Transfer-Encoding", "Expect", "Upgrade", "Trailer", "Te":
			return 0, handoffHeader, false
		}
		if h.header == nil {
			h.header = make(http.Header, 8)
		}
		h.header[k] = append(h.header[k], string(value))
	}
	if hosts != 1 {
		return 0, handoffHeader, false
	}
	if h.length < 0 {
		h.length = 0 // no Content-Length and no Transfer-Encoding: no body
	}
	if h.header == nil {
		h.header = make(http.Header)
	}
	return len(b) - len(rest), 0, true
}

// cutLine cuts b at its first CRLF. found is false if b holds no LF yet
// (line is b) or its first LF is not after a CR (line is nil).
func cutLine(b []byte) (line, rest []byte, found bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b[:len(b):len(b)], nil, false
	}
	if i == 0 || b[i-1] != '\r' {
		return nil, nil, false
	}
	return b[:i-1], b[i+1:], true
}

// splitRequestLine splits "METHOD SP target SP proto", each part
// non-empty and without further spaces.
func splitRequestLine(line []byte) (method, target []byte, proto string, ok bool) {
	m, rest, ok1 := bytes.Cut(line, []byte{' '})
	t, p, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 || len(m) == 0 || len(t) == 0 || bytes.IndexByte(p, ' ') >= 0 {
		return nil, nil, "", false
	}
	return m, t, string(p), true
}

// laneMethod returns m if the lane serves it (GET, POST, DELETE), else "".
// HEAD goes to net/http, which answers it without a body.
func laneMethod(m []byte) string {
	switch string(m) {
	case http.MethodPost:
		return http.MethodPost
	case http.MethodGet:
		return http.MethodGet
	case http.MethodDelete:
		return http.MethodDelete
	}
	return ""
}

// lanePaths are the paths a lane serves: exact ones, and the paths below
// prefixes (each ending in a slash).
type lanePaths struct {
	exact    map[string]bool
	prefixes []string
}

// match reports whether target is a path the lane serves, with an
// optional query: one of its paths, of letters, digits and "-._~/" only
// (no escapes, no dot segments), and a query of letters, digits and
// "-._~=&%+,:" (what net/http would not read as it stands goes there).
// The query is kept as sent, as net/http's URL.RawQuery.
func (p lanePaths) match(target []byte) (path, query []byte, ok bool) {
	path, query, q := bytes.Cut(target, []byte{'?'})
	if q && len(query) == 0 {
		return nil, nil, false // net/http's URL would say ForceQuery
	}
	if len(path) == 0 || path[0] != '/' || bytes.Contains(path, []byte("/.")) || bytes.Contains(path, []byte("//")) {
		return nil, nil, false
	}
	for _, ch := range path {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~' || ch == '/') {
			return nil, nil, false
		}
	}
	for _, ch := range query {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || strings.IndexByte("-._~=&%+,:", ch) >= 0) {
			return nil, nil, false
		}
	}
	if p.exact[string(path)] {
		return path, query, true
	}
	for _, pre := range p.prefixes {
		if len(path) > len(pre) && string(path[:len(pre)]) == pre {
			return path, query, true
		}
	}
	return nil, nil, false
}

// parseLength parses a Content-Length: 1 to 18 decimal digits.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	return n, true
}

// trimOWS trims spaces and tabs from both ends of v.
func trimOWS(v []byte) []byte {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// validValue reports whether v has no control characters but tab.
func validValue(v []byte) bool {
	for _, ch := range v {
		if ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

// isToken reports whether b is an RFC 9110 token.
func isToken(b []byte) bool {
	for _, ch := range b {
		if ch >= 0x80 || !tokenChars[ch] {
			return false
		}
	}
	return len(b) > 0
}

var tokenChars = func() (t [128]bool) {
	for ch := '0'; ch <= '9'; ch++ {
		t[ch] = true
	}
	for ch := 'a'; ch <= 'z'; ch++ {
		t[ch], t[ch-'a'+'A'] = true, true
	}
	for _, ch := range "!#$%&'*+-.^_`|~" {
		t[ch] = true
	}
	return t
}()

// validHost reports whether v is a Host the lane accepts: non-empty, of
// letters, digits and the characters of a host, an IPv6 literal and a
// port. Anything else goes to net/http, which has its own rules.
func validHost(v []byte) bool {
	for _, ch := range v {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			ch == '.' || ch == '-' || ch == ':' || ch == '[' || ch == ']' || ch == '_') {
			return false
		}
	}
	return len(v) > 0
}

// asciiEqualFold reports whether a and b are equal ignoring ASCII case.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
