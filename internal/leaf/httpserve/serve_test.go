package httpserve

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestServeDrains: when Serve's context ends with a request in flight, the
// listener stops accepting at once, the request still runs to its full
// response, and Serve returns only after it. (It fails if Serve closed the
// server instead of shutting it down: the client would see its connection
// dropped and Serve would return while the handler still runs.)
func TestServeDrains(t *testing.T) {
	const reply = "done, all of it"
	entered, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		io.WriteString(w, reply)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, srv, ln, time.Minute) }()

	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.Get("http://" + addr)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{resp.StatusCode, string(b), err}
	}()
	<-entered
	cancel()
	// The listener closes while the request is still in its handler.
	testsupport.Eventually(t, 10*time.Second, "the listener to refuse connections", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	case a := <-answered:
		t.Fatalf("the request in flight ended before its handler: %+v", a)
	default:
	}
	close(release)
	if a := <-answered; a.err != nil || a.status != http.StatusOK || a.body != reply {
		t.Fatalf("request in flight at shutdown: %d %q %v", a.status, a.body, a.err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

// TestServeListenerError: Serve returns the server's own error (here, a
// listener already closed) without waiting for its context.
func TestServeListenerError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := Serve(context.Background(), &http.Server{}, ln, time.Second); err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve = %v, want the listener's error", err)
	}
}
