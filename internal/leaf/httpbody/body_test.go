package httpbody

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport"
)

// serve runs a loopback server whose handler reads each body with Read
// within limit and b, and answers "<status> <reason> <len>" (200 with the
// body's length when it was read), giving back what it held.
func serve(t *testing.T, b *Budget, limit int, readTimeout time.Duration) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var held int64
		defer func() { b.Give(held) }()
		body, err := Read(w, r, nil, limit, b, &held)
		if err != nil {
			w.WriteHeader(err.Status)
			fmt.Fprintf(w, "%s %s", err.Reason, err.Msg)
			return
		}
		fmt.Fprintf(w, "ok %d", len(body))
	}))
	srv.Config.ReadTimeout = readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// post opens a connection and sends the headers of a POST claiming
// length bytes, then the first of them.
func post(t *testing.T, addr string, length int, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", length, first)
	return c
}

// answer reads the response on c. The deadline only keeps a broken
// server from hanging the test.
func answer(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// closed reports whether the server closed c after its response (what
// is left of the body on the wire must not be read as a request).
func closed(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF)
}

func TestReadGrowsAsBytesArrive(t *testing.T) {
	b := &Budget{Limit: 1 << 30}
	addr := serve(t, b, 8<<20, time.Minute)
	// 8 MiB claimed, 10 bytes sent: a first buffer of 4 KiB, not 8 MiB.
	c := post(t, addr, 8<<20, "0123456789")
	testsupport.Eventually(t, 10*time.Second, "the first bytes read", func() bool { return b.Used() == 4096 })
	// The rest arrives: the buffer doubles up to the claimed length + 1.
	io.WriteString(c, strings.Repeat("x", 8<<20-10))
	if code, body := answer(t, c); code != 200 || body != "ok "+strconv.Itoa(8<<20) {
		t.Fatalf("%d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return b.Used() == 0 })
}

func TestReadLimits(t *testing.T) {
	b := &Budget{Limit: 1 << 20}
	addr := serve(t, b, 1000, time.Minute)
	for _, c := range []struct {
		name string
		req  func() (*http.Response, error)
		code int
		want string
	}{
		{"claimed over the limit", func() (*http.Response, error) {
			return http.Post("http://"+addr, "text/plain", strings.NewReader(strings.Repeat("x", 1001)))
		}, 413, "too_large body: 1001 bytes exceeds the limit of 1000"},
		{"chunked over the limit", func() (*http.Response, error) {
			return http.Post("http://"+addr, "text/plain", io.MultiReader(strings.NewReader(strings.Repeat("x", 1001))))
		}, 413, "too_large body: exceeds the limit of 1000 bytes"},
		{"at the limit", func() (*http.Response, error) {
			return http.Post("http://"+addr, "text/plain", strings.NewReader(strings.Repeat("x", 1000)))
		}, 200, "ok 1000"},
		{"chunked at the limit", func() (*http.Response, error) {
			return http.Post("http://"+addr, "text/plain", io.MultiReader(strings.NewReader(strings.Repeat("x", 1000))))
		}, 200, "ok 1000"},
	} {
		resp, err := c.req()
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || string(got) != c.want {
			t.Errorf("%s: %d %q, want %d %q", c.name, resp.StatusCode, got, c.code, c.want)
		}
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return b.Used() == 0 })
}

// TestReadBudget: a growth that does not fit is a 503 with Retry-After,
// taking nothing; what a body held is given back when it is done.
func TestReadBudget(t *testing.T) {
	b := &Budget{Limit: 16 << 10}
	addr := serve(t, b, 1<<20, time.Minute)
	a := post(t, addr, 12<<10, strings.Repeat("a", 9<<10)) // holds 12 KiB + 1
	testsupport.Eventually(t, 10*time.Second, "A's bytes read", func() bool { return b.Used() == 12<<10+1 })
	resp, err := http.Post("http://"+addr, "text/plain", strings.NewReader(strings.Repeat("b", 8<<10)))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" ||
		string(got) != "budget body: request bodies in flight exceed the server's budget of 16384 bytes; retry later" {
		t.Fatalf("over budget: %d %q (Retry-After %q)", resp.StatusCode, got, resp.Header.Get("Retry-After"))
	}
	if u := b.Used(); u != 12<<10+1 {
		t.Fatalf("after the refusal the budget holds %d", u)
	}
	io.WriteString(a, strings.Repeat("a", 3<<10))
	if code, body := answer(t, a); code != 200 || body != "ok 12288" {
		t.Fatalf("A: %d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return b.Used() == 0 })
}

// TestReadTimeout: a body still arriving at the server's read deadline is
// a 408, and the server closes the connection.
func TestReadTimeout(t *testing.T) {
	b := &Budget{Limit: 1 << 20}
	addr := serve(t, b, 1<<20, 200*time.Millisecond)
	c := post(t, addr, 1000, "0123456789")
	if code, body := answer(t, c); code != 408 || body != "timeout body: not received in time (10 bytes arrived)" || !closed(t, c) {
		t.Fatalf("%d %q", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return b.Used() == 0 })
}

// TestReserve: a body that stalls holding bytes below the reserve's line
// keeps them until the server's read deadline; one that stalls holding
// the reserve is cut off after Hold; a body that keeps arriving is read
// from the reserve meanwhile.
func TestReserve(t *testing.T) {
	b := &Budget{Limit: 64 << 10, Reserve: 16 << 10, Hold: 300 * time.Millisecond, ReadTimeout: time.Minute}
	addr := serve(t, b, 1<<20, time.Minute)
	// A: 36,000 of its 40,000 bytes, then nothing: 40,001 bytes held, all
	// below the line (48 KiB).
	a := post(t, addr, 40000, strings.Repeat("a", 36000))
	testsupport.Eventually(t, 10*time.Second, "A's bytes read", func() bool { return b.Used() == 40001 })
	// B: 10,000 of 20,000, then nothing. Its growth to 16 KiB takes the
	// budget past the line: lent the reserve, it must keep arriving.
	start := time.Now()
	bc := post(t, addr, 20000, strings.Repeat("b", 10000))
	testsupport.Eventually(t, 10*time.Second, "B's bytes read", func() bool { return b.Used() == 40001+16384 })
	// C arrives whole: read from the reserve while B stalls (C's 4,001
	// bytes fit beside A and B).
	resp, err := http.Post("http://"+addr, "text/plain", strings.NewReader(strings.Repeat("c", 4000)))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != "ok 4000" {
		t.Fatalf("C: %d %s", resp.StatusCode, got)
	}
	// B is cut off Hold after its growth, long before the read timeout.
	code, body := answer(t, bc)
	if code != 408 || !strings.HasPrefix(body, "stalled body: not received in time") || !strings.HasSuffix(body, "(10000 bytes arrived)") || !closed(t, bc) {
		t.Fatalf("B: %d %q", code, body)
	}
	if took := time.Since(start); took < b.Hold || took > 30*time.Second {
		t.Errorf("B cut off after %v (hold %v)", took, b.Hold)
	}
	testsupport.Eventually(t, 10*time.Second, "B's bytes given back", func() bool { return b.Used() == 40001 })
	// A, below the line, was not cut off: it still completes.
	io.WriteString(a, strings.Repeat("a", 4000))
	if code, body := answer(t, a); code != 200 || body != "ok 40000" {
		t.Fatalf("A: %d %s", code, body)
	}
	testsupport.Eventually(t, 10*time.Second, "the budget given back", func() bool { return b.Used() == 0 })
}
