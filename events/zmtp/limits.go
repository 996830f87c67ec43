package zmtp

import (
	"context"
	"time"
)

const (
	// DefaultMaxMessageBytes is the message budget of a context without
	// Limits: 16 MiB, comfortably above the largest real KV-event batch.
	DefaultMaxMessageBytes = 16 << 20

	// DefaultHandshakeTimeout is the handshake deadline of a context
	// without Limits.
	DefaultHandshakeTimeout = 10 * time.Second

	// FrameOverhead is what each frame costs against MaxMessageBytes on top
	// of its body: roughly what go-zeromq spends holding one frame (a slice
	// header in Msg.Frames and its share of that slice's growth). It bounds
	// a message of endless empty frames, which would otherwise cost nothing.
	FrameOverhead = 64

	// MaxCommandBytes bounds one command frame (READY, PING, ERROR, ...).
	// ZMTP commands are tiny: a READY carries Socket-Type, an Identity of at
	// most 255 bytes and whatever few application properties the peer sets;
	// PING carries at most 16 bytes of context; PLAIN and CURVE commands are
	// a few hundred bytes. 64 KiB is two orders of magnitude above any of
	// them and small enough to buffer whole, which the guard does for the
	// handshake commands it validates.
	MaxCommandBytes = 64 << 10
)

// Limits bound what a peer may make a guarded connection do. A field left
// zero (or negative) means its default.
type Limits struct {
	// MaxMessageBytes bounds one message: the sum over its frames of the
	// body length plus FrameOverhead must not exceed it (default
	// DefaultMaxMessageBytes). A frame whose claimed size would exceed it
	// is refused before go-zeromq allocates its body.
	MaxMessageBytes int64

	// HandshakeTimeout bounds the ZMTP handshake (greeting and security
	// handshake up to the peer's READY) from the moment the connection is
	// made (default DefaultHandshakeTimeout). It also bounds how long a
	// connection whose handshake go-zeromq abandoned (a failed Open, which
	// the library never closes) stays open.
	HandshakeTimeout time.Duration
}

// withDefaults returns l with zero (or negative) fields set to defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return l
}

type limitsKey struct{}

// WithLimits returns a copy of ctx carrying lim. Pass it to the go-zeromq
// socket constructor (zmq4.NewSub(zmtp.WithLimits(ctx, lim), ...)): the
// library hands the socket's context to the transport, so every connection
// the socket dials or accepts through a guarded endpoint gets lim.
func WithLimits(ctx context.Context, lim Limits) context.Context {
	return context.WithValue(ctx, limitsKey{}, lim.withDefaults())
}

// LimitsFrom returns the limits ctx carries, with defaults for the fields it
// leaves zero, or the defaults when it carries none.
func LimitsFrom(ctx context.Context) Limits {
	lim, _ := ctx.Value(limitsKey{}).(Limits)
	return lim.withDefaults()
}
