// Package httpserve runs an http.Server for as long as a context lives and
// drains it when the context ends: the daemon's API and the mock engines'
// HTTP servers stop the same way.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve serves srv on ln until ctx ends, then shuts it down, letting
// requests in flight finish for at most drain. It returns when the server
// has stopped: Serve's error, or Shutdown's.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, drain time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err // never ErrServerClosed: only Shutdown below closes it
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
