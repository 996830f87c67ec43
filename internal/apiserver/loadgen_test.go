package apiserver

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// The open-loop load generator of BenchmarkQuery8K (in process) and
// BenchmarkQuery8KExternal (in a process of its own).

// A sender sends one request and reads its whole response; openLoop
// uses each from one goroutine at a time.
type sender interface {
	send() error
	close()
}

// httpSender sends through net/http's client (shared by every sender).
type httpSender struct {
	client *http.Client
	url    string
	body   []byte
}

func (s httpSender) send() error { return post(s.client, s.url, s.body) }
func (s httpSender) close()      {}

// post sends one /query and checks the answer.
func post(c *http.Client, url string, body []byte) error {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || n < 100 {
		return fmt.Errorf("status %d, %d bytes", resp.StatusCode, n)
	}
	return nil
}

// rawSender sends over one keep-alive HTTP/1.1 connection of its own:
// the request, headers and body prepared once, in one Write, and the
// response read through its Content-Length, which must be there (the API
// never chunks a query's answer) and at least 100 bytes, after a 200
// status line. It allocates nothing per request, and as a splitSender
// its requests are written by openLoop's pacer at their due time, where
// net/http's client hands each request to two goroutines of the
// connection and allocates its Request, Response and headers: on a
// 2-core machine whatever the generator spends is taken from the server
// it measures. Through send, a connection that fails or that the server
// closes is dialled again by the next send; under pacedWrites such a
// sender retires.
type rawSender struct {
	addr string
	req  []byte
	conn net.Conn // set by dial (send's goroutine), cleared by close
	r    *bufio.Reader
	mu   sync.Mutex // serialises close
}

// newRawSender returns a sender of POST requests of body to rawURL
// (http://host:port/path), its connection dialled.
func newRawSender(rawURL string, body []byte) (*rawSender, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("loadgen: %s: not http://", rawURL)
	}
	req := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		u.RequestURI(), u.Host, len(body))
	s := &rawSender{addr: u.Host, req: append(req, body...)}
	return s, s.dial()
}

func (s *rawSender) dial() error {
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		return err
	}
	s.conn = c
	if s.r == nil {
		s.r = bufio.NewReaderSize(c, 32<<10)
	} else {
		s.r.Reset(c)
	}
	return nil
}

func (s *rawSender) send() error {
	if s.conn == nil {
		if err := s.dial(); err != nil {
			return err
		}
	}
	keep, err := s.exchange()
	if err != nil || !keep {
		s.close()
	}
	return err
}

var (
	status200     = []byte("HTTP/1.1 200 ")
	contentLength = []byte("Content-Length")
	connection    = []byte("Connection")
)

// exchange writes the request and reads the response; keep reports
// whether the connection may carry another.
func (s *rawSender) exchange() (keep bool, err error) {
	if err := s.write(); err != nil {
		return false, err
	}
	return s.read()
}

// write writes the request.
func (s *rawSender) write() error {
	_, err := s.conn.Write(s.req)
	return err
}

// read reads a response; keep reports whether the connection may carry
// another.
func (s *rawSender) read() (keep bool, err error) {
	line, err := s.r.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	if !bytes.HasPrefix(line, status200) {
		return false, fmt.Errorf("status line %.40q", line)
	}
	n, keep := -1, true
	for {
		line, err := s.r.ReadSlice('\n')
		if err != nil {
			return false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		k, v, _ := bytes.Cut(line, []byte{':'})
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, contentLength):
			n = 0
			for _, c := range v {
				if c < '0' || c > '9' || n > 1<<30 {
					return false, fmt.Errorf("Content-Length %.40q", v)
				}
				n = n*10 + int(c-'0')
			}
		case bytes.EqualFold(k, connection):
			keep = !bytes.EqualFold(v, []byte("close"))
		}
	}
	if n < 100 {
		return false, fmt.Errorf("Content-Length %d: want at least 100 bytes", n)
	}
	if _, err := s.r.Discard(n); err != nil {
		return false, err
	}
	return keep, nil
}

func (s *rawSender) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// latencies collects request latencies from several goroutines.
type latencies struct {
	mu sync.Mutex // guards all
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// µs returns the f-quantile of d in µs, 0 if empty.
func µs(d []time.Duration, f float64) float64 {
	return float64(quantile.Of(d).At(f).Nanoseconds()) / 1e3
}

func (l *latencies) report(b interface{ ReportMetric(float64, string) }, elapsed time.Duration) {
	b.ReportMetric(µs(l.d, 0.50), "p50-µs")
	b.ReportMetric(µs(l.d, 0.99), "p99-µs")
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "req/s")
	b.ReportMetric(0, "ns/op")
}

// loadResult is what an open-loop run measured.
type loadResult struct {
	Latencies []time.Duration
	// Waits are how long each request waited, from when it was due to
	// when its sender began writing it: a late hand-out, a busy sender
	// pool or a generator short of CPU. They are part of Latencies.
	Waits   []time.Duration
	Elapsed time.Duration // of the measured part
	Dropped int64
	Failed  int64
	// Warmup is how many requests were sent, on the same connections,
	// before the measured ones (openLoop's warm); they are not in
	// Latencies.
	Warmup int
	// Offered is the rate asked for (requests/s). Sent counts the
	// requests due in the window that were sent, and SentIn is the time
	// from the window's start to the last of them going out: Sent/SentIn
	// is the rate the generator reached, short of Offered when it could
	// not keep pace (a generator starved of CPU, or one request more
	// than 1 s late, dropped).
	Offered float64
	Sent    int
	SentIn  time.Duration
}

// SentRate is the rate the generator reached over the window.
func (r *loadResult) SentRate() float64 {
	if r.SentIn <= 0 {
		return 0
	}
	return float64(r.Sent) / r.SentIn.Seconds()
}

// Short reports whether the generator fell more than 1 % short of its
// offered rate, or dropped any request: then the run measured a lighter
// load than it was asked for, and says so.
func (r *loadResult) Short() bool { return r.Dropped > 0 || r.SentRate() < 0.99*r.Offered }

// report reports the run's metrics to b, and says so in b's log when
// the generator fell short of its offered rate.
func (r *loadResult) report(b interface {
	ReportMetric(float64, string)
	Logf(string, ...any)
}) {
	l := latencies{d: r.Latencies}
	l.report(b, r.Elapsed)
	b.ReportMetric(µs(r.Waits, 0.50), "wait-p50-µs")
	b.ReportMetric(µs(r.Waits, 0.99), "wait-p99-µs")
	b.ReportMetric(float64(r.Dropped), "dropped")
	b.ReportMetric(r.SentRate(), "sent-req/s")
	if r.Short() {
		b.ReportMetric(1, "short")
		b.Logf("the load generator fell short: %.0f requests/s sent of %.0f offered (%d dropped); the figures are for the load it reached, not the one asked for",
			r.SentRate(), r.Offered, r.Dropped)
	}
}

// senders is the size of openLoop's sender pool.
const senders = 64

// openLoop sends at rate requests/s for warm and then window, measuring
// the requests due in window only (warm lets a run's connections reach
// their steady state first), each request by one of
// a pool of 64 senders made by newSender before the first is due (a
// rawSender dials its connection then). Request i is due at
// start + i/rate and is handed out at that time (a waker's: Go's timers
// are no finer than 1 ms on Linux). Its latency runs from that due time to the last byte of its
// response, so that a late hand-out, a wait for a free sender or a
// stalled generator counts against the request, as the server's own
// delays do (no coordinated omission). A request more than 1 s late is
// dropped.
//
// The pacer writes a splitSender's request itself (pacedWrites) while
// the sender's goroutine waits for the response; any other sender is
// handed its requests through a queue (queued).
func openLoop(newSender func() (sender, error), rate int, warm, window time.Duration) loadResult {
	pool := make([]sender, senders)
	for i := range pool {
		s, err := newSender()
		if err != nil {
			for _, s := range pool[:i] {
				s.close()
			}
			return loadResult{Failed: 1}
		}
		pool[i] = s
	}
	interval := time.Second / time.Duration(rate)
	n := int((warm + window) / interval)
	if n*int(interval) < int(warm+window) {
		n++
	}
	lg := &loadgen{interval: interval, n: n, warm: warm}
	lg.lat.d = make([]time.Duration, 0, n)
	lg.waits.d = make([]time.Duration, 0, n)
	split := make([]splitSender, 0, len(pool))
	for _, s := range pool {
		if ss, ok := s.(splitSender); ok {
			split = append(split, ss)
		}
	}
	lg.start = time.Now()
	lg.from = lg.start.Add(warm)
	if len(split) == len(pool) {
		lg.pacedWrites(split)
	} else {
		lg.queued(pool)
	}
	for _, s := range pool {
		s.close()
	}
	return loadResult{Latencies: lg.lat.d, Waits: lg.waits.d, Elapsed: time.Since(lg.from), Dropped: lg.dropped.Load(), Failed: lg.failed.Load(), Warmup: lg.warmups,
		Offered: float64(rate), Sent: lg.sent, SentIn: lg.lastSent.Sub(lg.from)}
}

// A splitSender writes a request and reads its response apart.
type splitSender interface {
	sender
	write() error
	read() (keep bool, err error)
}

// loadgen is one run of openLoop.
type loadgen struct {
	start    time.Time
	warm     time.Duration // requests due before from are sent but not measured
	from     time.Time
	warmups  int       // requests due before from (the pacer's count)
	sent     int       // requests due from from on, handed out (the pacer's count)
	lastSent time.Time // when the pacer handed out the last of them
	interval time.Duration
	n        int // requests due
	lat      latencies
	waits    latencies
	dropped  atomic.Int64
	failed   atomic.Int64
}

// pace calls f with each request's due time, at that time (a waker's),
// until the n requests are due or stop reports true. A request more than
// 1 s late is dropped instead.
func (lg *loadgen) pace(f func(at time.Time), stop func() bool) {
	w, err := newWaker()
	if err != nil {
		lg.failed.Add(1)
		return
	}
	defer w.close()
	for i := range lg.n {
		if stop() {
			return
		}
		at := lg.start.Add(time.Duration(i) * lg.interval)
		if err := w.sleepUntil(at); err != nil {
			lg.failed.Add(1)
			return
		}
		if time.Since(at) > time.Second {
			lg.dropped.Add(1)
			continue
		}
		if at.Before(lg.from) {
			lg.warmups++
		}
		f(at)
		if !at.Before(lg.from) {
			lg.sent++
			lg.lastSent = time.Now()
		}
	}
}

// pacedWrites runs the load over senders whose requests the pacer
// writes itself, at their due time: no hand-off to another goroutine
// delays them (about 50 µs at the median on the benchmark VM, a thread
// woken on the other core). Each sender's goroutine meanwhile waits for the response
// in read — not for a request, so that its only wake-up is the
// response's — and takes its due time from dues, where the pacer put it
// before writing. A failure stops the run: the benchmark fails on any.
func (lg *loadgen) pacedWrites(pool []splitSender) {
	free := make(chan int, len(pool)) // senders with nothing outstanding; -1 for one that retired
	dues := make([]chan time.Time, len(pool))
	var abort atomic.Bool
	fail := func() { lg.failed.Add(1); abort.Store(true) }
	var closing atomic.Bool
	var wg sync.WaitGroup
	for k, s := range pool {
		dues[k] = make(chan time.Time, 1)
		free <- k
		wg.Go(func() {
			mine := make([]time.Duration, 0, 2*lg.n/len(pool))
			defer func() { lg.lat.add(mine) }()
			for {
				keep, err := s.read() // until a response, or the connection ends
				if closing.Load() {
					return
				}
				var at time.Time
				select {
				case at = <-dues[k]:
				default: // nothing outstanding: the connection ended while idle
					fail()
					return
				}
				if err != nil {
					fail()
					free <- -1
					return
				}
				if !at.Before(lg.from) {
					mine = append(mine, time.Since(at))
				}
				if !keep {
					s.close()
					free <- -1
					return
				}
				free <- k
			}
		})
	}
	retired := 0
	lg.pace(func(at time.Time) {
		for {
			k := <-free
			if k >= 0 {
				dues[k] <- at
				if !at.Before(lg.from) {
					lg.waits.d = append(lg.waits.d, time.Since(at))
				}
				if pool[k].write() != nil {
					fail() // and the sender's read fails too
				}
				return
			}
			if retired++; retired == len(pool) {
				fail()
				return
			}
		}
	}, abort.Load)
	// Let what is outstanding finish, then end the readers.
	drain := time.After(5 * time.Second)
	for got := retired; got < len(pool) && !abort.Load(); got++ {
		select {
		case <-free:
		case <-drain:
			fail()
		}
	}
	closing.Store(true)
	for _, s := range pool {
		s.close() // the readers' reads return
	}
	wg.Wait()
}

// queued runs the load over senders that each send a whole request,
// handed to the first free one through a queue of at most 1 s of
// requests.
func (lg *loadgen) queued(pool []sender) {
	due := make(chan time.Time, int(time.Second/lg.interval))
	var wg sync.WaitGroup
	for _, s := range pool {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 2*lg.n/len(pool))
			waited := make([]time.Duration, 0, cap(mine))
			for at := range due {
				w := time.Since(at)
				if err := s.send(); err != nil {
					lg.failed.Add(1)
					continue
				}
				if !at.Before(lg.from) {
					waited = append(waited, w)
					mine = append(mine, time.Since(at))
				}
			}
			lg.lat.add(mine)
			lg.waits.add(waited)
		})
	}
	lg.pace(func(at time.Time) {
		select {
		case due <- at:
		default:
			lg.dropped.Add(1)
		}
	}, func() bool { return false })
	close(due)
	wg.Wait()
}
