package httpbody

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestCloseChunked: over one connection, a request with Content-Length
// is answered and the connection kept; a request with both
// Content-Length and Transfer-Encoding (read as chunked, as RFC 9112
// allows) is answered with Connection: close and the connection closed;
// a plain chunked request likewise.
func TestCloseChunked(t *testing.T) {
	srv := httptest.NewServer(CloseChunked(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "got "+string(b))
	})))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, c := range []struct {
		name, req string
		body      string
		closes    bool
	}{
		{"content-length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", "got hello", false},
		{"both", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "got abc", true},
		{"chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "got abc", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(conn, c.req); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != c.body || resp.Close != c.closes {
				t.Fatalf("%d %q close=%v; want 200 %q close=%v", resp.StatusCode, b, resp.Close, c.body, c.closes)
			}
			// A closed connection reads EOF (waited for as long as it
			// takes); a kept one waits, until a short deadline ends the
			// wait: a timeout, never an EOF.
			wait := 200 * time.Millisecond
			if c.closes {
				wait = 10 * time.Second
			}
			conn.SetReadDeadline(time.Now().Add(wait))
			_, err = br.ReadByte()
			if gotEOF := err == io.EOF; gotEOF != c.closes {
				t.Fatalf("after the response: read %v; want the connection closed=%v", err, c.closes)
			}
		})
	}
}
