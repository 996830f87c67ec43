package daemon

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/zmtp"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// rogue is a raw-TCP peer that speaks just enough ZMTP 3 to get a
// go-zeromq socket to read what it sends next: a hostile engine endpoint.
type rogue struct {
	ln       net.Listener
	accepted atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// rogueBehaviour is what a rogue does on each connection.
type rogueBehaviour func(c net.Conn)

// startRogue listens on loopback and runs behave on every connection
// (after draining what the peer sends) until the test ends.
func startRogue(t *testing.T, behave rogueBehaviour) *rogue {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rogue{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			r.wg.Add(2)
			go func() { defer r.wg.Done(); _, _ = io.Copy(io.Discard, c) }() // whatever the daemon says
			go func() { defer r.wg.Done(); behave(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *rogue) endpoint() string { return "tcp://" + r.ln.Addr().String() }

// zmtpGreeting is a ZMTP 3.0 NULL-mechanism greeting (64 bytes).
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	return g
}

// zmtpReady is a READY command frame announcing socketType.
func zmtpReady(socketType string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType)))
	body = append(body, socketType...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// longHeader is the header of a long frame (command if cmd) claiming size
// bytes.
func longHeader(size uint64, cmd bool) []byte {
	flags := byte(0x02)
	if cmd {
		flags |= 0x04
	}
	return binary.BigEndian.AppendUint64([]byte{flags}, size)
}

// claims greets as socketType and sends a frame header claiming size
// bytes, then holds the connection open sending nothing more (a trickle
// that never comes).
func claims(socketType string, size uint64) rogueBehaviour {
	return func(c net.Conn) {
		_, _ = c.Write(append(append(zmtpGreeting(), zmtpReady(socketType)...), longHeader(size, false)...))
	}
}

// commandBeforeReady greets and sends a command frame claiming size bytes
// in place of READY.
func commandBeforeReady(size uint64) rogueBehaviour {
	return func(c net.Conn) { _, _ = c.Write(append(zmtpGreeting(), longHeader(size, true)...)) }
}

// silent accepts and never says anything.
func silent(net.Conn) {}

// TestRogueEngines: hostile endpoints registered next to a good engine —
// frame headers claiming 2^62, 2^36 and 1 GiB on the live socket and on the
// replay socket, a command before READY claiming 2^40, a peer that
// accepts and never greets — neither crash the daemon (2^62 used to panic
// in go-zeromq's makeslice, 2^36 to end it out of memory) nor make it
// allocate what they claim, nor freeze the catalog or shutdown: each
// refused connection is counted, logged once, and retried with backoff,
// and the good engine stays exact.
func TestRogueEngines(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	logs, log := testlog.New(nil)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) {
		c.Logger = log
		c.Subscriber.Limits = zmtp.Limits{HandshakeTimeout: time.Second}
		c.Subscriber.Cursor.MaxAttempts = 2
	})
	good := publishtest.Start(t, 0)
	good.Store(4)
	half := publishtest.Start(t, 0) // a real PUB whose replay endpoint is hostile
	half.Store(2)
	rogues := map[uint64]*rogue{
		2: startRogue(t, claims("PUB", 1<<62)),
		3: startRogue(t, claims("ROUTER", 1<<62)),
		4: startRogue(t, claims("PUB", 1<<36)),
		5: startRogue(t, claims("PUB", 1<<30)),
		6: startRogue(t, commandBeforeReady(1<<40)),
		7: startRogue(t, silent),
	}
	reg := func(id uint64, ep, replay string) {
		t.Helper()
		body := map[string]any{"instance_id": id, "endpoint": ep, "model_name": "m", "block_size": 16}
		if replay != "" {
			body["replay_endpoint"] = replay
		}
		if code, b := register(t, d, body); code != http.StatusCreated {
			t.Fatalf("register %d: %d %s", id, code, b)
		}
	}
	reg(1, good.Pub.Endpoint(), good.Pub.ReplayEndpoint())
	reg(3, half.Pub.Endpoint(), rogues[3].endpoint())
	for _, id := range []uint64{2, 4, 5, 6, 7} {
		reg(id, rogues[id].endpoint(), "")
	}

	// Every rogue is dialled again after its connection was refused.
	for id, r := range rogues {
		testsupport.Eventually(t, 30*time.Second, fmt.Sprintf("rogue %d dialled twice", id), func() bool { return r.accepted.Load() >= 2 })
	}
	// A worker registered now is indexed at once: the stuck ones hold
	// nothing up.
	late := publishtest.Start(t, 0)
	late.Store(3)
	reg(8, late.Pub.Endpoint(), late.Pub.ReplayEndpoint())
	testsupport.Eventually(t, 10*time.Second, "the late worker indexed", func() bool {
		l, ok := listener(t, d, "m", 8, 0)
		return ok && l.Blocks == 3 && l.Status == api.StatusActive
	})
	l, ok := listener(t, d, "m", 1, 0)
	if !ok || l.Blocks != 4 || l.Degraded || l.Status != api.StatusActive {
		t.Fatalf("the good engine's rank: %+v", l)
	}

	_, metrics := call(t, "GET", d.url+"/metrics", "", nil)
	for _, id := range []uint64{2, 3, 4, 5, 6} {
		series := fmt.Sprintf(`prefixd_stream_dropped_total{rank="0",reason="oversize",worker="%d"} `, id)
		i := strings.Index(string(metrics), series)
		if i < 0 {
			var got []string
			for _, line := range strings.Split(string(metrics), "\n") {
				if strings.Contains(line, fmt.Sprintf(`worker="%d"`, id)) {
					got = append(got, line)
				}
			}
			for _, rec := range logs.Records() {
				if rec.Attrs["worker"] == strconv.FormatUint(id, 10) {
					got = append(got, rec.String())
				}
			}
			t.Fatalf("no %s in /metrics; worker %d:\n%s", series, id, strings.Join(got, "\n"))
		}
		rest := string(metrics[i+len(series):])
		if n, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, '\n')], 64); err != nil || n < 1 {
			t.Fatalf("%s%s", series, rest[:strings.IndexByte(rest, '\n')])
		}
	}
	const refused = "frame refused: larger than the message size limit; connection closed, reconnecting with backoff"
	logs.Wait(t, 10*time.Second, refused, "worker=2", "socket=live", "claimed_bytes="+strconv.FormatUint(1<<62+zmtp.FrameOverhead, 10))
	logs.Wait(t, 10*time.Second, refused, "worker=3", "socket=replay")
	if n := logs.Count(refused, "worker=2"); n != 1 {
		t.Errorf("the refusal was logged %d times for %d connections; want once", n, rogues[2].accepted.Load())
	}
	logs.Wait(t, 10*time.Second, "stream handshake timed out: the endpoint accepted but did not speak ZMTP in time", "worker=7")

	// Shutdown does not wait for the silent peer.
	start := time.Now()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the daemon took %v to stop with a silent engine registered", took)
	}
	t.Logf("stopped in %v", time.Since(start))
}
