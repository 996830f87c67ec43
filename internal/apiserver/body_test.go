package apiserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/httpserve"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// liveServer serves h through NewServer(h, cfg) on a loopback listener
// until the test ends, as the daemon does.
func liveServer(t testing.TB, h http.Handler, cfg ServerConfig) (addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(h, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, srv, ln, 10*time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawPost opens a connection and sends the headers of a POST to path
// claiming a body of length bytes, then the first bytes of it.
func rawPost(t *testing.T, addr, path string, length int, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: prefixd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, length, first)
	return c
}

// readStatus reads the response to a rawPost: its status line and body
// (to the end of the connection). The deadline only keeps a broken server
// from hanging the test.
func readStatus(t *testing.T, c net.Conn) (status, body string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.Status, string(b)
}

// bodyProbe wraps a handler and counts the request bodies that have
// delivered their first bytes to it, and the requests it has finished.
type bodyProbe struct {
	next          http.Handler
	arrived, done atomic.Int64
}

func (p *bodyProbe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer p.done.Add(1)
	if r.ContentLength > 0 {
		r.Body = &firstRead{ReadCloser: r.Body, p: p}
	}
	p.next.ServeHTTP(w, r)
}

type firstRead struct {
	io.ReadCloser
	p    *bodyProbe
	seen bool
}

func (f *firstRead) Read(b []byte) (int, error) {
	n, err := f.ReadCloser.Read(b)
	if n > 0 && !f.seen {
		f.seen = true
		f.p.arrived.Add(1)
	}
	return n, err
}

// TestSlowBodies: 250 connections each claim an 8 MiB body and send 10
// bytes of it (the attack that took the heap from 6 MB to 2 GB). The heap
// must grow by far less than the 2 GiB claimed, a normal request must be
// served meanwhile, every slow body must be cut off with a 408 once the
// read timeout passes, and the body budget must be whole again after.
func TestSlowBodies(t *testing.T) {
	const (
		conns   = 250
		claimed = 8 << 20
		timeout = 5 * time.Second
	)
	ix, p := dynamoExample(t)
	h, mux := newHandler(Config{Index: ix})
	probe := &bodyProbe{next: mux}
	addr := liveServer(t, probe, ServerConfig{ReadTimeout: timeout})

	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	slow := make([]net.Conn, conns)
	for i := range slow {
		slow[i] = rawPost(t, addr, "/query", claimed, `{"token_id`) // 10 bytes
	}
	testsupport.Eventually(t, time.Minute, "every slow body to reach its handler", func() bool { return probe.arrived.Load() == conns })
	runtime.GC()
	runtime.ReadMemStats(&during)
	growth := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap %.1f MiB before, %.1f MiB with %d bodies of %d claimed bytes in flight (growth %.1f MiB; %.0f MiB claimed)",
		float64(before.HeapAlloc)/(1<<20), float64(during.HeapAlloc)/(1<<20), conns, claimed, float64(growth)/(1<<20), float64(conns*claimed)/(1<<20))
	if growth > 64<<20 {
		t.Errorf("heap grew by %d bytes for %d slow bodies", growth, conns)
	}
	if got := h.bodies.Used(); got != conns*4096 {
		t.Errorf("budget holds %d bytes, want %d (a first 4 KiB buffer per slow body)", got, conns*4096)
	}

	// A normal request is served while the slow ones are held.
	resp, err := http.Post("http://"+addr+"/query", "application/json", strings.NewReader(`{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"longest_matched":48`) {
		t.Fatalf("normal request: %d %s", resp.StatusCode, b)
	}
	if d := probe.done.Load(); d != 1 {
		t.Fatalf("%d requests finished besides the normal one before the %v read timeout: the machine is too slow for this test", d-1, timeout)
	}

	// Each slow body is cut off after the read timeout.
	for _, c := range slow {
		if status, body := readStatus(t, c); status != "408 Request Timeout" || !strings.Contains(body, `"body: not received in time (10 bytes arrived)"`) {
			t.Fatalf("slow body: %s %s", status, body)
		}
	}
	testsupport.Eventually(t, 10*time.Second, "the budget to be given back", func() bool { return h.bodies.Used() == 0 })
}

// TestBodyBudget: a body that would take the bytes held by requests in
// flight past MaxInflightBodyBytes is refused with a 503, and what a
// request held is given back when it ends, success or error.
func TestBodyBudget(t *testing.T) {
	ix, p := dynamoExample(t)
	h, mux := newHandler(Config{Index: ix, MaxBodyBytes: 40 << 10, MaxInflightBodyBytes: 64 << 10})
	addr := liveServer(t, mux, ServerConfig{})
	query := `{"token_ids":` + tokensJSON(p) + `,"model_name":"m"}`
	pad := func(n int) string {
		return query[:len(query)-1] + `,"pad":"` + strings.Repeat("x", n-len(query)-9) + `"}`
	}
	held, other := pad(40<<10), pad(30<<10)

	// A holds 36 KiB of its 40 KiB body: its buffer has grown to the
	// claimed length + 1, and that is what the budget charges (the memory
	// held, not only the bytes arrived).
	a := rawPost(t, addr, "/query", len(held), held[:36<<10])
	aHolds := int64(len(held) + 1)
	testsupport.Eventually(t, time.Minute, "A's first 36 KiB to be read", func() bool { return h.bodies.Used() == aHolds })
	// B's 30 KiB do not fit beside it.
	resp, err := http.Post("http://"+addr+"/query", "application/json", strings.NewReader(other))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `{"error":"body: request bodies in flight exceed the server's budget of 65536 bytes; retry later"}`
	if resp.StatusCode != 503 || strings.TrimSpace(string(b)) != want || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("over budget: %d %s (Retry-After %q)", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if got := h.bodies.Used(); got != aHolds {
		t.Fatalf("after the refusal the budget holds %d, want A's %d", got, aHolds)
	}
	// A completes; everything is given back, and B now fits.
	io.WriteString(a, held[36<<10:])
	if status, body := readStatus(t, a); status != "200 OK" || !strings.Contains(body, `"longest_matched":48`) {
		t.Fatalf("A: %s %s", status, body)
	}
	testsupport.Eventually(t, 10*time.Second, "A's bytes to be given back", func() bool { return h.bodies.Used() == 0 })
	resp, err = http.Post("http://"+addr+"/query", "application/json", strings.NewReader(other))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("B after A: %d", resp.StatusCode)
	}
	// Error paths give back too: a bad body, a body over the limit.
	for _, body := range []string{`{"token_ids":[-1],"model_name":"m"}`, pad(41 << 10)} {
		resp, err := http.Post("http://"+addr+"/query", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("bad body: %d", resp.StatusCode)
		}
	}
	if got := h.bodies.Used(); got != 0 {
		t.Fatalf("after errors the budget holds %d", got)
	}
}

// TestServerLongResponse: ReadTimeout bounds bodies only; a request
// without a body keeps its context however long its response takes
// (GET /dump streaming a large index), here past a slow body's cut-off.
// net/http provides this (it clears the read deadline when it starts its
// background read); the test guards NewServer's documented behaviour.
func TestServerLongResponse(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	canceled := make(chan bool, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /long", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
			canceled <- true
		case <-release:
			canceled <- false
		}
		io.WriteString(w, "long")
	})
	mux.HandleFunc("POST /slow", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
		}
	})
	addr := liveServer(t, mux, ServerConfig{ReadTimeout: 300 * time.Millisecond})
	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/long")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- string(b)
	}()
	<-entered
	// A body that starts after /long's request is cut off by the read
	// timeout, so /long has outlived the timeout too.
	if status, _ := readStatus(t, rawPost(t, addr, "/slow", 100, "x")); status != "408 Request Timeout" {
		t.Fatalf("slow body: %s", status)
	}
	close(release)
	if <-canceled {
		t.Error("the context of a request without a body was canceled by the read timeout")
	}
	if b := <-got; b != "long" {
		t.Errorf("long response: %q", b)
	}
}

// TestNewServerDefaults: zero fields take the documented defaults, and no
// WriteTimeout is set.
func TestNewServerDefaults(t *testing.T) {
	srv := NewServer(http.NotFoundHandler(), ServerConfig{})
	if srv.ReadHeaderTimeout != DefaultReadHeaderTimeout || srv.ReadTimeout != DefaultReadTimeout || srv.IdleTimeout != DefaultIdleTimeout ||
		srv.MaxHeaderBytes != DefaultMaxHeaderBytes || srv.WriteTimeout != 0 {
		t.Errorf("server %+v", srv)
	}
}

// TestServerClosesAfterChunked: a request with both Content-Length and
// Transfer-Encoding is read as chunked and answered with its connection
// closed (httpbody.CloseChunked), as RFC 9112 §6.3 requires.
func TestServerClosesAfterChunked(t *testing.T) {
	ix, _ := dynamoExample(t)
	addr := liveServer(t, NewHandler(Config{Index: ix}), ServerConfig{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"token_ids":[1],"model_name":"m"}`
	fmt.Fprintf(c, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("%d close=%v %s; want 200 and the connection closed", resp.StatusCode, resp.Close, b)
	}
}
