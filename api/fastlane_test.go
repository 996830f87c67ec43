package api

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/httpserve"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// laneServer serves h through NewServer and a FastLane on a loopback
// listener until the test ends, and returns its address and the lane.
func laneServer(t *testing.T, h http.Handler, cfg ServerConfig) (string, *FastLane) {
	t.Helper()
	return serveLive(t, h, cfg, true)
}

// halfClose, as a part of exchange, closes the connection's write side.
const halfClose = "\x00half-close"

// exchange writes each of parts to a new connection to addr, in turn,
// and then reads n responses: each as its status, body and the headers
// that both servers must agree on, with Date cleared.
func exchange(t *testing.T, addr string, parts []string, n int) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute)) // only keeps a broken server from hanging the test
	for _, p := range parts {
		if p == halfClose {
			c.(*net.TCPConn).CloseWrite()
			continue
		}
		if _, err := io.WriteString(c, p); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(c)
	var out []string
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out = append(out, "read: "+err.Error())
			break
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			out = append(out, "body: "+err.Error())
			break
		}
		var hs []string
		for _, k := range []string{"Content-Type", "Content-Length", "Connection", "Allow", "Www-Authenticate", "Retry-After", "X-Content-Type-Options"} {
			if v := resp.Header.Values(k); v != nil {
				hs = append(hs, k+": "+strings.Join(v, ","))
			}
		}
		out = append(out, fmt.Sprintf("%s close=%v %s\n%s", resp.Status, resp.Close, strings.Join(hs, "; "), b))
	}
	return out
}

// TestFastLaneTransparent sends the same bytes to a server with a
// FastLane and to one without, and compares the answers: the fast
// requests (served by the lane) get net/http's answers, and everything
// else goes to net/http, whatever came before on the connection.
func TestFastLaneTransparent(t *testing.T) {
	ix, p := dynamoExample(t)
	query := `{"token_ids":` + tokensJSON(p) + `,"model_name":"m"}`
	byHash := `{"block_hashes":[1,2,3],"model_name":"m"}`
	post := func(path, body string, headers ...string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: prefixd\r\n" + strings.Join(append(headers, ""), "\r\n") +
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
	}
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: prefixd\r\n\r\n" }
	type tc struct {
		name   string
		parts  []string
		n      int // responses
		served int // requests the lane serves
		reason string
		cfg    Config
		srv    ServerConfig
		// selector gives each server a fakeSelector of its own (the
		// bookings are state).
		selector bool
	}
	long := post("/query", query, "X-Pad: "+strings.Repeat("p", laneBuf))
	cases := []tc{
		{name: "query", parts: []string{post("/query", query)}, n: 1, served: 1},
		{name: "query_by_hash", parts: []string{post("/query_by_hash", byHash)}, n: 1, served: 1},
		{name: "three on one connection", parts: []string{post("/query", query), post("/query_by_hash", byHash), post("/query", query)}, n: 3, served: 3},
		{name: "pipelined", parts: []string{post("/query", query) + post("/query", query) + post("/query_by_hash", byHash)}, n: 3, served: 3},
		{name: "head in pieces", parts: []string{"POST /query HT", "TP/1.1\r\nHost: prefixd\r\nContent-Le", fmt.Sprintf("ngth: %d\r\n", len(query)), "\r\n" + query[:9], query[9:]}, n: 1, served: 1},
		{name: "bad JSON", parts: []string{post("/query", `{"token_ids":[-1],"model_name":"m"}`)}, n: 1, served: 1},
		{name: "unknown model", parts: []string{post("/query", `{"token_ids":[1],"model_name":"nope"}`)}, n: 1, served: 1},
		{name: "empty body", parts: []string{post("/query", "")}, n: 1, served: 1},
		{name: "client closes", parts: []string{post("/query", query, "Connection: close")}, n: 1, served: 1},
		{name: "keep-alive header", parts: []string{post("/query", query, "connection: Keep-Alive", "User-Agent: x", "X-Request-Id: 7")}, n: 1, served: 1},
		{name: "over the body limit", parts: []string{post("/query", query)}, n: 1, served: 1, cfg: Config{MaxBodyBytes: 100}},
		{name: "over the limit, then another", parts: []string{post("/query", query) + post("/query", query)}, n: 2, served: 2, cfg: Config{MaxBodyBytes: 100}},
		{name: "unauthorized", parts: []string{post("/query", query)}, n: 1, served: 1, cfg: Config{ReadToken: "r"}},
		{name: "authorized", parts: []string{post("/query", query, "Authorization: Bearer r")}, n: 1, served: 1, cfg: Config{ReadToken: "r"}},
		{name: "fast, then /metrics", parts: []string{post("/query", query), get("/metrics"), post("/query", query)}, n: 3, served: 1, reason: "path"},
		{name: "fast, then /metrics, pipelined", parts: []string{post("/query", query) + get("/metrics") + post("/query", query)}, n: 3, served: 1, reason: "path"},
		{name: "workers", parts: []string{get("/workers"), get("/workers?model_name=m&routing_group=default"), get("/workers?model_name=a%20b+c")}, n: 3, served: 3},
		{name: "GET /health", parts: []string{get("/health")}, n: 1, served: 1},
		{name: "GET /health in pieces", parts: []string{"GE", "T /health HTTP/1.1\r\nHost: x\r\n\r\n"}, n: 1, served: 1},
		{name: "GET /ready, then a query", parts: []string{get("/ready") + post("/query", query)}, n: 2, served: 2},
		{name: "select", parts: []string{post("/select", `{"model_name":"m","token_ids":[1,2]}`)}, n: 1, served: 1, selector: true},
		{name: "reservations", parts: []string{post("/select_and_reserve", `{"model_name":"m","token_ids":[1,2],"selection_id":"r1"}`),
			post("/select_and_reserve", `{"model_name":"m","token_ids":[1,2],"selection_id":"r1"}`), post("/reservations/r1/prefill_complete", ""),
			"DELETE /reservations/r1 HTTP/1.1\r\nHost: x\r\n\r\n", "DELETE /reservations/r1 HTTP/1.1\r\nHost: x\r\n\r\n",
			post("/reservations/r1", "")}, n: 6, served: 6, selector: true},
		{name: "plans", parts: []string{post("/disagg/plans", `{"request_id":"p1","model_name":"m","token_ids":[1,2,3,4]}`), get("/disagg/plans/p1"),
			post("/disagg/plans/p1/prefill_complete", ""), post("/disagg/plans/p1/decode", ""), "DELETE /disagg/plans/p1 HTTP/1.1\r\nHost: x\r\n\r\n"},
			n: 5, served: 5, selector: true},
		{name: "a GET with a body", parts: []string{strings.Replace(post("/health", "{}"), "POST", "GET", 1)}, n: 1, served: 1},

		{name: "GET /dump", parts: []string{get("/dump")}, n: 1, reason: "path"},
		{name: "an empty query", parts: []string{get("/workers?")}, n: 1, reason: "path"},
		{name: "an odd query", parts: []string{get("/workers?model_name=<m>")}, n: 1, reason: "path"},
		{name: "a fragment", parts: []string{get("/workers#x")}, n: 1, reason: "path"},
		{name: "GET /metrics in pieces", parts: []string{"GE", "T /metrics HTTP/1.1\r\nHost: x\r\n\r\n"}, n: 1, reason: "path"},
		{name: "OPTIONS in pieces", parts: []string{"OPTIO", "NS /query HTTP/1.1\r\nHost: x\r\n\r\n"}, n: 1, reason: "method"},
		{name: "a long method", parts: []string{"PROPFIND /query HTTP/1.1\r\nHost: x\r\n\r\n"}, n: 1, reason: "method"},
		{name: "dot segments", parts: []string{strings.Replace(post("/query", query), "/query", "/reservations/../query", 1)}, n: 1, reason: "path"},
		{name: "an escape", parts: []string{strings.Replace(post("/query", query), "/query", "/quer%79", 1)}, n: 1, reason: "path"},
		{name: "two slashes", parts: []string{strings.Replace(post("/query", query), "/query", "//query", 1)}, n: 1, reason: "path"},
		{name: "a prefix alone", parts: []string{strings.Replace(post("/query", query), "/query", "/disagg/plans/", 1)}, n: 1, reason: "path"},
		{name: "PUT", parts: []string{strings.Replace(post("/query", query), "POST", "PUT", 1)}, n: 1, reason: "method"},
		{name: "other path", parts: []string{post("/register", `{}`)}, n: 1, reason: "path"},
		{name: "query string", parts: []string{post("/query?x=1", query)}, n: 1, served: 1},
		{name: "absolute form", parts: []string{strings.Replace(post("/query", query), "/query", "http://prefixd/query", 1)}, n: 1, reason: "path"},
		{name: "HTTP/1.0", parts: []string{strings.Replace(post("/query", query), "HTTP/1.1", "HTTP/1.0", 1)}, n: 1, reason: "proto"},
		{name: "lower-case version", parts: []string{strings.Replace(post("/query", query), "HTTP/1.1", "http/1.1", 1)}, n: 1, reason: "proto"},
		{name: "two spaces", parts: []string{strings.Replace(post("/query", query), "POST ", "POST  ", 1)}, n: 1, reason: "proto"},
		{name: "bare LF", parts: []string{strings.ReplaceAll(post("/query", query), "\r\n", "\n")}, n: 1, reason: "proto"},
		{name: "bare LF in headers", parts: []string{strings.Replace(post("/query", query), "prefixd\r\n", "prefixd\n", 1)}, n: 1, reason: "header"},
		{name: "expect", parts: []string{post("/query", query, "Expect: 100-continue")}, n: 2, reason: "header"},
		{name: "chunked", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(query), query)}, n: 1, reason: "header"},
		{name: "chunked and a length", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(query), query)}, n: 1, reason: "header"},
		{name: "two lengths", parts: []string{post("/query", query, fmt.Sprintf("Content-Length: %d", len(query)))}, n: 1, reason: "length"},
		{name: "two different lengths", parts: []string{post("/query", query, "Content-Length: 3")}, n: 1, reason: "length"},
		{name: "signed length", parts: []string{strings.Replace(post("/query", query), "Length: ", "Length: +", 1)}, n: 1, reason: "length"},
		{name: "no length", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\n\r\n"}, n: 1, served: 1},
		{name: "no host", parts: []string{strings.Replace(post("/query", query), "Host: prefixd\r\n", "", 1)}, n: 1, reason: "header"},
		{name: "two hosts", parts: []string{post("/query", query, "Host: other")}, n: 1, reason: "header"},
		{name: "odd host", parts: []string{strings.Replace(post("/query", query), "Host: prefixd", "Host: a b", 1)}, n: 1, reason: "header"},
		{name: "space before colon", parts: []string{post("/query", query, "X-A : 1")}, n: 1, reason: "header"},
		{name: "continuation line", parts: []string{post("/query", query, "X-A: 1", " 2")}, n: 1, reason: "header"},
		{name: "control byte", parts: []string{post("/query", query, "X-A: 1\x002")}, n: 1, reason: "header"},
		{name: "upgrade", parts: []string{post("/query", query, "Connection: Upgrade", "Upgrade: h2c")}, n: 1, reason: "header"},
		{name: "long head", parts: []string{long}, n: 1, reason: "size"},
		{name: "over MaxHeaderBytes", parts: []string{post("/query", query, "X-Pad: "+strings.Repeat("p", 70<<10))}, n: 1, reason: "size"},
		{name: "body cut short", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}", halfClose}, n: 1, served: 1},
		{name: "head cut short", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\n", halfClose}, n: 1, reason: "eof"},
		{name: "a query, then the client half-closes", parts: []string{post("/query", query), halfClose}, n: 2, served: 1},
		{name: "a huge length", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999\r\n\r\n{}"}, n: 1, served: 1},
		{name: "a length past int64", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999999999999999\r\n\r\n{}"}, n: 1, reason: "length"},
		{name: "a length with leading zeros", parts: []string{strings.Replace(post("/query", query), "Content-Length: ", "Content-Length: 000", 1)}, n: 1, served: 1},
		{name: "a lower-case method", parts: []string{strings.Replace(post("/query", query), "POST", "post", 1)}, n: 1, reason: "method"},
		{name: "fast, then garbage", parts: []string{post("/query", query) + "\x01\x02\r\n\r\n"}, n: 2, served: 1, reason: "proto"},
		{name: "nothing sent", parts: nil, n: 1, srv: ServerConfig{ReadHeaderTimeout: 100 * time.Millisecond, IdleTimeout: time.Hour}},
		{name: "head not in time", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\n"}, n: 1, srv: ServerConfig{ReadHeaderTimeout: 100 * time.Millisecond}},
		{name: "body not in time", parts: []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}"}, n: 1, served: 1, srv: ServerConfig{ReadTimeout: 100 * time.Millisecond}},
		{name: "idle", parts: []string{post("/query", query)}, n: 2, served: 1, srv: ServerConfig{IdleTimeout: 100 * time.Millisecond}},
		{name: "over a small MaxHeaderBytes", parts: []string{post("/query", query, "X-Pad: "+strings.Repeat("p", 200))}, n: 1, reason: "size", srv: ServerConfig{MaxHeaderBytes: 100}},
		{name: "garbage", parts: []string{"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"}, n: 1, reason: "proto"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			handler := func() http.Handler {
				cfg := tc.cfg
				cfg.Index = ix
				if tc.selector {
					cfg.Selector = newFakeSelector()
				}
				return NewHandler(cfg)
			}
			plain := liveServer(t, handler(), tc.srv, false)
			fast, lane := laneServer(t, handler(), tc.srv)
			want := exchange(t, plain, tc.parts, tc.n)
			got := exchange(t, fast, tc.parts, tc.n)
			if len(want) != tc.n {
				t.Fatalf("net/http answered %d of %d: %q", len(want), tc.n, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("answer %d:\nlane     %q\nnet/http %q", i, clipped(got[i]), clipped(want[i]))
				}
			}
			st := lane.Stats()
			handed := int64(0)
			for r, n := range st.Handoffs {
				handed += n
				if n > 0 && r != tc.reason {
					t.Errorf("handed off for %s, want %q", r, tc.reason)
				}
			}
			if st.Served != int64(tc.served) || (handed == 1) != (tc.reason != "") || handed > 1 {
				t.Errorf("the lane served %d, handed off %d (%v); want %d served, handed off for %q", st.Served, handed, st.Handoffs, tc.served, tc.reason)
			}
		})
	}
}

func clipped(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// TestFastLaneShutdown: closing the server with a fast request in its
// handler lets it finish and answer (with Connection: close), closes the
// lane's idle connections at once, and Serve returns after both.
func TestFastLaneShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Wait") != "" {
			close(entered)
			<-release
		}
		io.WriteString(w, "done")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(h, ServerConfig{})
	lane := NewFastLane(srv, ln, "/q")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, srv, lane, time.Minute) }()

	req := "POST /q HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(idle, req)
	idleR := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(idleR, nil); err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("idle connection's request: %v %v", resp, err)
	} else {
		io.ReadAll(resp.Body)
	}
	busy, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busy.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(busy, strings.Replace(req, "Host: x\r\n", "Host: x\r\nX-Wait: 1\r\n", 1))
	<-entered
	cancel()
	// The idle connection is closed without an answer...
	if rest, err := io.ReadAll(idleR); err != nil || len(rest) > 0 {
		t.Fatalf("idle connection after Close: %q %v, want EOF", rest, err)
	}
	// ...Serve waits for the busy one...
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	// ...which answers, closing.
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "done" || !resp.Close {
		t.Fatalf("request in flight at shutdown: %d %q close=%v", resp.StatusCode, b, resp.Close)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Fatal("the listener still accepts")
	}
}

// TestFastLaneCloseWhileGoingIdle: a lane closed just as a kept
// connection becomes idle (after it is marked idle, before it reads)
// still closes that connection at once, not when its idle timeout (2
// minutes) passes: the connection's own read deadline must not replace
// the one Close sets.
func TestFastLaneCloseWhileGoingIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "done")
	}), ServerConfig{})
	var lane *FastLane
	laneSet := make(chan struct{})
	idles := 0
	hook := func() { // runs on the connection's goroutine
		if idles++; idles == 2 { // the first is before its first request
			<-laneSet
			lane.Close()
		}
	}
	lane = newFastLane(srv, ln, hook, "/q")
	close(laneSet)
	defer lane.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) // far below the idle timeout
	io.WriteString(c, "GET /q HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("request: %v %v", resp, err)
	}
	io.ReadAll(resp.Body)
	if rest, err := io.ReadAll(r); err != nil || len(rest) > 0 {
		t.Fatalf("connection after Close: %q %v, want EOF", rest, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lane.Drain(ctx); err != nil {
		t.Fatalf("Drain = %v", err)
	}
}

// TestFastLanePanic: a handler's panic on the lane is logged as net/http
// logs it and closes that connection only; http.ErrAbortHandler closes it
// silently.
func TestFastLanePanic(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("boom")
		case "/abort":
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, "ok")
	})
	var logged testsupport.Buffer
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(h, ServerConfig{})
	srv.ErrorLog = log.New(&logged, "", 0)
	lane := NewFastLane(srv, ln, "/panic", "/abort", "/ok")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, srv, lane, time.Minute) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	addr := ln.Addr().String()
	for _, path := range []string{"/panic", "/abort"} {
		got := exchange(t, addr, []string{"POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"}, 1)
		if len(got) != 1 || !strings.HasPrefix(got[0], "read: ") {
			t.Errorf("%s: %q, want the connection closed", path, got)
		}
	}
	if got := exchange(t, addr, []string{"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"}, 1); len(got) != 1 || !strings.HasPrefix(got[0], "200 OK") {
		t.Errorf("after the panics: %q", got)
	}
	out := logged.String()
	if !strings.Contains(out, "http: panic serving 127.0.0.1:") || !strings.Contains(out, "boom") || strings.Count(out, "http: panic") != 1 {
		t.Errorf("log: %q", out)
	}
}

// TestFastLaneAcceptError: a listener that fails for good fails the
// server's Serve with its error.
func TestFastLaneAcceptError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	srv := NewServer(http.NotFoundHandler(), ServerConfig{})
	lane := NewFastLane(srv, failingListener{ln, boom})
	if err := srv.Serve(lane); !errors.Is(err, boom) {
		t.Fatalf("Serve = %v, want %v", err, boom)
	}
}

type failingListener struct {
	net.Listener
	err error
}

func (l failingListener) Accept() (net.Conn, error) { return nil, l.err }

// FuzzFastLaneHead: whatever head the lane accepts, net/http reads the
// same way: the same method, path, host, length, headers and close.
func FuzzFastLaneHead(f *testing.F) {
	for _, s := range []string{
		"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /query HTTP/1.1\r\nhost: x:80\r\ncontent-length: 0\r\nconnection: close\r\nX-A:  b \r\n\r\n",
		"POST /select HTTP/1.1\r\nHost: [::1]:8080\r\nContent-Length: 007\r\nAuthorization: Bearer t\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
		"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nX-A: \t\r\n\r\n",
		"GET /select HTTP/1.1\r\nHost: x\r\n\r\n",
		"DELETE /reservations/7 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
		"DELETE /reservations/../query HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /select?model_name=a%20b&x=1+2,3:4 HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	paths := lanePaths{exact: map[string]bool{"/query": true, "/select": true}, prefixes: []string{"/reservations/"}}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h head
		end, _, ok := h.parse(b, paths)
		if !ok || end == 0 {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:end])))
		if err != nil {
			t.Fatalf("the lane accepts %q; net/http: %v", b[:end], err)
		}
		delete(r.Header, "Host") // ReadRequest keeps it; a server removes it
		if r.Method != h.method || r.URL.Path != h.path || r.URL.RawPath != "" || r.URL.RawQuery != h.query || r.RequestURI != h.target || r.URL.ForceQuery || r.Host != h.host ||
			r.ContentLength != h.length || r.Close != h.close || len(r.TransferEncoding) != 0 || fmt.Sprint(r.Header) != fmt.Sprint(h.header) {
			t.Fatalf("%q:\nlane     %s %s host %q length %d close %v %v\nnet/http %s %s host %q length %d close %v %v",
				b[:end], h.method, h.target, h.host, h.length, h.close, h.header, r.Method, r.URL, r.Host, r.ContentLength, r.Close, r.Header)
		}
	})
}

// TestFastLaneConcurrent: clients on connections of their own, some
// fast only and some handed to net/http halfway, all at once: every
// answer is net/http's, and the lane's counts add up.
func TestFastLaneConcurrent(t *testing.T) {
	ix, p := dynamoExample(t)
	query := `{"token_ids":` + tokensJSON(p) + `,"model_name":"m"}`
	want := exchange(t, liveServer(t, NewHandler(Config{Index: ix}), ServerConfig{}, false),
		[]string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(query)) + "\r\n\r\n" + query}, 1)[0]
	addr, lane := laneServer(t, NewHandler(Config{Index: ix}), ServerConfig{})
	const clients, requests = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			br := bufio.NewReader(c)
			for j := range requests {
				req := "POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(query)) + "\r\n\r\n" + query
				if i%2 == 1 && j == requests/2 {
					req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" // the connection goes to net/http
				}
				if _, err := io.WriteString(c, req); err != nil {
					errs <- err
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("client %d, request %d: %v", i, j, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.HasPrefix(req, "GET") {
					if resp.StatusCode != 404 {
						errs <- fmt.Errorf("client %d: /metrics without a registry: %d", i, resp.StatusCode)
						return
					}
					continue
				}
				if got := fmt.Sprintf("%s close=%v Content-Type: %s; Content-Length: %s\n%s", resp.Status, resp.Close,
					resp.Header.Get("Content-Type"), resp.Header.Get("Content-Length"), b); got != want {
					errs <- fmt.Errorf("client %d, request %d: %q, want %q", i, j, clipped(got), clipped(want))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := lane.Stats()
	if fast := int64(clients/2*requests + clients/2*requests/2); st.Served != fast || st.Handoffs["path"] != clients/2 {
		t.Errorf("served %d, handed off %v; want %d served and %d handed off for path", st.Served, st.Handoffs, fast, clients/2)
	}
}

// BenchmarkQuery8KServer sends /query with the 8,192-token prompt over
// one keep-alive connection, one request at a time (rawSender, which
// allocates nothing), to the daemon's server (NewServer behind a
// FastLane) and to net/http alone: what each server costs a request in
// time and allocations, the handler included (BenchmarkQuery8KHandler is
// the handler alone).
func BenchmarkQuery8KServer(b *testing.B) {
	ix, p := benchIndex(b)
	body := benchBody(b, p)
	for _, lane := range []bool{true, false} {
		b.Run(map[bool]string{true: "lane", false: "net-http"}[lane], func(b *testing.B) {
			addr, _ := serveLive(b, NewHandler(Config{Index: ix}), ServerConfig{}, lane)
			s, err := newRawSender("http://"+addr+"/query", body)
			if err != nil {
				b.Fatal(err)
			}
			defer s.close()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := s.send(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFastLaneNilHandler: a server without a Handler serves
// http.DefaultServeMux on the lane too, as net/http does.
func TestFastLaneNilHandler(t *testing.T) {
	parts := []string{"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"}
	want := exchange(t, liveServer(t, nil, ServerConfig{}, false), parts, 1)
	addr, lane := laneServer(t, nil, ServerConfig{})
	if got := exchange(t, addr, parts, 1); got[0] != want[0] || lane.Stats().Served != 1 {
		t.Fatalf("lane %q (served %d), net/http %q", got, lane.Stats().Served, want)
	}
}
