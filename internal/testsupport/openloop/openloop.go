// Package openloop is the open-loop load generator of prefixd's
// benchmarks (BenchmarkQuery8K and BenchmarkQuery8KExternal in
// internal/apiserver, BenchmarkEPPExternal in internal/epp): requests
// due on a schedule, each one's latency counted from its due time, so
// that a late hand-out, a busy sender pool or a stalled server counts
// against the requests it delays (no coordinated omission). Only tests
// import it.
package openloop

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/sim/quantile"
)

// A Sender sends one request and reads its whole response; Run uses
// each from one goroutine at a time.
type Sender interface {
	Send() error
	Close()
}

// HTTPSender sends through net/http's client (shared by every Sender).
type HTTPSender struct {
	Client *http.Client
	URL    string
	Body   []byte
}

func (s HTTPSender) Send() error { return Post(s.Client, s.URL, s.Body) }
func (s HTTPSender) Close()      {}

// Post sends one POST of body to url and checks the answer: a 200 of
// at least 100 bytes, read whole.
func Post(c *http.Client, url string, body []byte) error {
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

// Latencies collects request Latencies from several goroutines.
type Latencies struct {
	mu sync.Mutex // guards all
	d  []time.Duration
}

func (l *Latencies) Add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// Micros returns the f-quantile of d in µs, 0 if empty.
func Micros(d []time.Duration, f float64) float64 {
	return float64(quantile.Of(d).At(f).Nanoseconds()) / 1e3
}

func (l *Latencies) Report(b interface{ ReportMetric(float64, string) }, elapsed time.Duration) {
	b.ReportMetric(Micros(l.d, 0.50), "p50-µs")
	b.ReportMetric(Micros(l.d, 0.99), "p99-µs")
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "req/s")
	b.ReportMetric(0, "ns/op")
}

// Result is what an open-loop run measured.
type Result struct {
	Latencies []time.Duration
	// Waits are how long each request waited, from when it was due to
	// when its Sender began writing it: a late hand-out, a busy Sender
	// pool or a generator short of CPU. They are part of Latencies.
	Waits   []time.Duration
	Elapsed time.Duration // of the measured part
	Dropped int64
	Failed  int64
	// Warmup is how many requests were sent, on the same connections,
	// before the measured ones (Run's warm); they are not in
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
func (r *Result) SentRate() float64 {
	if r.SentIn <= 0 {
		return 0
	}
	return float64(r.Sent) / r.SentIn.Seconds()
}

// Short reports whether the generator fell more than 1 % short of its
// offered rate, or dropped any request: then the run measured a lighter
// load than it was asked for, and says so.
func (r *Result) Short() bool { return r.Dropped > 0 || r.SentRate() < 0.99*r.Offered }

// report reports the run's metrics to b, and says so in b's log when
// the generator fell short of its offered rate.
func (r *Result) Report(b interface {
	ReportMetric(float64, string)
	Logf(string, ...any)
}) {
	l := Latencies{d: r.Latencies}
	l.Report(b, r.Elapsed)
	b.ReportMetric(Micros(r.Waits, 0.50), "wait-p50-µs")
	b.ReportMetric(Micros(r.Waits, 0.99), "wait-p99-µs")
	b.ReportMetric(float64(r.Dropped), "dropped")
	b.ReportMetric(r.SentRate(), "sent-req/s")
	if r.Short() {
		b.ReportMetric(1, "short")
		b.Logf("the load generator fell short: %.0f requests/s sent of %.0f offered (%d dropped); the figures are for the load it reached, not the one asked for",
			r.SentRate(), r.Offered, r.Dropped)
	}
}

// Senders is the size of Run's Sender pool.
const Senders = 64

// Run sends at rate requests/s for warm and then window, measuring
// the requests due in window only (warm lets a run's connections reach
// their steady state first), each request by one of
// a pool of 64 Senders made by newSender before the first is due (a
// rawSender dials its connection then). Request i is due at
// start + i/rate and is handed out at that time (a waker's: Go's timers
// are no finer than 1 ms on Linux). Its latency runs from that due time to the last byte of its
// response, so that a late hand-out, a wait for a free Sender or a
// stalled generator counts against the request, as the server's own
// delays do (no coordinated omission). A request more than 1 s late is
// dropped.
//
// The pacer writes a SplitSender's request itself (pacedWrites) while
// the Sender's goroutine waits for the response; any other Sender is
// handed its requests through a queue (queued).
func Run(newSender func() (Sender, error), rate int, warm, window time.Duration) Result {
	pool := make([]Sender, Senders)
	for i := range pool {
		s, err := newSender()
		if err != nil {
			for _, s := range pool[:i] {
				s.Close()
			}
			return Result{Failed: 1}
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
	split := make([]SplitSender, 0, len(pool))
	for _, s := range pool {
		if ss, ok := s.(SplitSender); ok {
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
		s.Close()
	}
	return Result{Latencies: lg.lat.d, Waits: lg.waits.d, Elapsed: time.Since(lg.from), Dropped: lg.dropped.Load(), Failed: lg.failed.Load(), Warmup: lg.warmups,
		Offered: float64(rate), Sent: lg.sent, SentIn: lg.lastSent.Sub(lg.from)}
}

// A Marker is a Sender whose request is measured to an instant of its
// own (Mark, read after each Send) rather than to Send's return: the
// answer a benchmark measures may come before the end of the exchange
// the sender must finish.
type Marker interface {
	Sender
	Mark() time.Time
}

// A SplitSender writes a request and reads its response apart.
type SplitSender interface {
	Sender
	Write() error
	Read() (keep bool, err error)
}

// loadgen is one run of Run.
type loadgen struct {
	start    time.Time
	warm     time.Duration // requests due before from are sent but not measured
	from     time.Time
	warmups  int       // requests due before from (the pacer's count)
	sent     int       // requests due from from on, handed out (the pacer's count)
	lastSent time.Time // when the pacer handed out the last of them
	interval time.Duration
	n        int // requests due
	lat      Latencies
	waits    Latencies
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

// pacedWrites runs the load over Senders whose requests the pacer
// writes itself, at their due time: no hand-off to another goroutine
// delays them (about 50 µs at the median on the benchmark VM, a thread
// woken on the other core). Each Sender's goroutine meanwhile waits for the response
// in read — not for a request, so that its only wake-up is the
// response's — and takes its due time from dues, where the pacer put it
// before writing. A failure stops the run: the benchmark fails on any.
func (lg *loadgen) pacedWrites(pool []SplitSender) {
	free := make(chan int, len(pool)) // Senders with nothing outstanding; -1 for one that retired
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
			defer func() { lg.lat.Add(mine) }()
			for {
				keep, err := s.Read() // until a response, or the connection ends
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
					s.Close()
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
				if pool[k].Write() != nil {
					fail() // and the Sender's read fails too
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
		s.Close() // the readers' reads return
	}
	wg.Wait()
}

// queued runs the load over Senders that each send a whole request,
// handed to the first free one through a queue of at most 1 s of
// requests.
func (lg *loadgen) queued(pool []Sender) {
	due := make(chan time.Time, int(time.Second/lg.interval))
	var wg sync.WaitGroup
	for _, s := range pool {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 2*lg.n/len(pool))
			waited := make([]time.Duration, 0, cap(mine))
			for at := range due {
				w := time.Since(at)
				if err := s.Send(); err != nil {
					lg.failed.Add(1)
					continue
				}
				done := time.Now()
				if m, ok := s.(Marker); ok {
					done = m.Mark()
				}
				if !at.Before(lg.from) {
					waited = append(waited, w)
					mine = append(mine, done.Sub(at))
				}
			}
			lg.lat.Add(mine)
			lg.waits.Add(waited)
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

// RunProcess runs cmd, a generator that writes its Result as JSON to
// its stdout, and returns the Result. It reports the CPU each process
// used per request sent: srv-cpu-µs/req (this process, the one under
// load) and gen-cpu-µs/req. It fails b if the generator fails or any
// request failed.
func RunProcess(b *testing.B, cmd *exec.Cmd) Result {
	b.Helper()
	cpu0 := CPUTime()
	out, err := cmd.Output()
	srvCPU := CPUTime() - cpu0
	if err != nil {
		b.Fatalf("load generator: %v", err)
	}
	var r Result
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("load generator's result: %v", err)
	}
	if r.Failed > 0 {
		b.Fatalf("%d requests failed", r.Failed)
	}
	if n := len(r.Latencies) + r.Warmup; n > 0 { // the CPU went to every request sent
		genCPU := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		b.ReportMetric(float64(srvCPU.Microseconds())/float64(n), "srv-cpu-µs/req")
		b.ReportMetric(float64(genCPU.Microseconds())/float64(n), "gen-cpu-µs/req")
	}
	return r
}
