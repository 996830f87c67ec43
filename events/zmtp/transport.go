package zmtp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	zmqtransport "github.com/go-zeromq/zmq4/transport"
)

// The guarded transports' scheme names. go-zeromq's own "tcp" and "ipc"
// cannot be replaced (its registry refuses duplicates), so the guard
// registers its own and Endpoint rewrites endpoints to them.
const (
	SchemeTCP = "zmtp+tcp"
	SchemeIPC = "zmtp+ipc"
)

var registerOnce sync.Once

// register adds the guarded transports to go-zeromq's registry, once.
func register() {
	registerOnce.Do(func() {
		for _, t := range []transport{{SchemeTCP, "tcp"}, {SchemeIPC, "unix"}} {
			if err := zmq4.RegisterTransport(t.scheme, t); err != nil {
				// Only another package registering our names can cause this.
				panic(fmt.Sprintf("zmtp: registering the guarded transport: %v", err))
			}
		}
	})
}

// Endpoint returns the guarded form of a go-zeromq endpoint: "tcp://h:p"
// becomes "zmtp+tcp://h:p" and "ipc://path" "zmtp+ipc://path", which dial
// and listen like the originals with every connection guarded by the
// Limits of the socket's context (see WithLimits). Endpoints of other
// transports are returned unchanged: inproc stays in the process, and
// go-zeromq's udp is not a transport engines publish on. An already guarded
// endpoint is returned as it is.
//
// The first call registers the guarded transports with go-zeromq; Endpoint
// is safe for concurrent use.
func Endpoint(ep string) string {
	register()
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return ep
	}
	switch scheme {
	case "tcp":
		return SchemeTCP + "://" + rest
	case "ipc":
		return SchemeIPC + "://" + rest
	}
	return ep
}

// transport is a go-zeromq transport whose connections are guarded.
type transport struct {
	scheme  string
	network string // for package net: "tcp" or "unix"
}

// Dial dials addr and guards the connection with ctx's limits. go-zeromq
// passes the socket's context.
func (t transport) Dial(ctx context.Context, d zmqtransport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return newConn(ctx, c, LimitsFrom(ctx)), nil
}

// Listen listens on addr; accepted connections are guarded with ctx's
// limits and returned only once their peer has sent its first handshake
// command.
func (t transport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return listen(ctx, t.network, addr, LimitsFrom(ctx))
}

// Addr normalises an endpoint address as go-zeromq's own transport does.
func (t transport) Addr(ep string) (string, error) {
	return zmqtransport.New(t.network).Addr(ep)
}

var _ zmqtransport.Transport = transport{}
