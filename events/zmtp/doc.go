// Package zmtp owns the bounded reader under go-zeromq: transports that
// guard every ZMQ connection prefixd makes or accepts, so that a peer can
// neither crash the process nor make it allocate, wait or leak without
// bound. Engine endpoints are controlled by whoever can register a worker,
// so every engine is an untrusted peer.
//
// # Why
//
// go-zeromq (github.com/go-zeromq/zmq4 v0.17.0) trusts its peer completely:
//
//   - Conn.read allocates each frame body at the size its header claims
//     before reading it: a claim of 2^62 bytes panics the process
//     (makeslice: len out of range), 2^36 kills it out of memory, and 1 GiB
//     with the body trickled in holds a gigabyte per connection. The same
//     holds for a command frame before READY, on every socket type.
//   - Frames with MORE set accumulate without bound, and empty ones cost
//     the peer two bytes each.
//   - Metadata.UnmarshalZMTP and Property.Write index past the end of a
//     malformed READY property list (a name length equal to the bytes left,
//     fewer than 4 bytes of value length) and panic; SocketType.IsCompatible
//     panics on a missing or unknown Socket-Type; and names are title-cased
//     with Unicode rules, so a non-ASCII "ſocket-type" overrides the real
//     Socket-Type.
//   - Dial runs the whole handshake synchronously with no deadline: a peer
//     that accepts and never greets blocks it forever, and cancelling the
//     socket's context does not help (the connection is not yet the
//     socket's). The accept loop of a listening socket runs each handshake
//     synchronously too, so one silent client stalls every later one.
//   - A connection whose handshake fails (a failed Open, in Dial or in the
//     accept loop) is never closed.
//   - A PUB queues every non-subscription message from a SUB peer for a
//     Recv it never serves; after ten, that connection's reader blocks for
//     good.
//
// # How
//
// The package registers two transports with go-zeromq, SchemeTCP and
// SchemeIPC (go-zeromq's own "tcp" and "ipc" cannot be replaced), and
// Endpoint rewrites an ordinary endpoint to them. A guarded connection
// parses the peer's ZMTP 3 byte stream as it passes (the 64-byte greeting,
// then frames: flags, a 1- or 8-byte size, the body) and never reads past
// the end of one of these in one underlying Read, so it can refuse a frame
// header before the library sees the size it would allocate. It refuses,
// and closes the connection, on:
//
//   - a message frame that would take the message past
//     Limits.MaxMessageBytes, counting FrameOverhead per frame (*LimitError,
//     What "message");
//   - a command frame over MaxCommandBytes (*LimitError, What "command");
//   - a greeting without the ZMTP 3 signature, frames out of order (a
//     message before the handshake completed, a command with MORE or inside
//     a message), READY (or, under PLAIN, INITIATE) metadata that is not a
//     well-formed list of ASCII-named properties with exactly one
//     Socket-Type go-zeromq knows, and, from a SUB peer, any message but a
//     one-frame subscription (from an XSUB peer, an empty first frame)
//     (*ProtocolError).
//
// The handshake runs under a deadline of Limits.HandshakeTimeout from the
// moment the connection is made, cleared once the peer's READY has been
// read (ErrHandshakeTimeout). If go-zeromq does not come back to read the
// connection within HandshakeTimeout after that, it has abandoned it after
// a failed Open, and the guard closes it. A connection is closed when its
// socket's context ends, which aborts a Dial stuck in the handshake. A
// guarded listener runs the greeting exchange and reads the peer's first
// handshake command (under NULL, its READY) in a goroutine of its own per
// connection before go-zeromq's accept loop sees it, so stalled peers hold
// up no one.
//
// # Use
//
// Limits travel on the socket's context, which go-zeromq hands to the
// transport:
//
//	sub := zmq4.NewSub(zmtp.WithLimits(ctx, lim), opts...)
//	err := sub.Dial(zmtp.Endpoint(ep))
//
// A context without limits gets the defaults: DefaultMaxMessageBytes
// (16 MiB) and DefaultHandshakeTimeout (10 s). Errors reach the caller
// wrapped with %w by go-zeromq: from Dial during the handshake, from Recv
// after it, on the sockets whose reader passes errors on (SUB, DEALER and
// the other qreader sockets). Tell them apart with errors.As for
// *LimitError and *ProtocolError and errors.Is for ErrHandshakeTimeout;
// a socket closed or cancelled mid-Dial matches its context's cause
// (context.Canceled). ROUTER and PUB readers drop connection errors, so
// on a listening socket a refused peer is only closed.
//
// The guard costs no allocation per frame and about 75 ns per three-frame
// message next to go-zeromq's own syscalls (BenchmarkStream,
// BenchmarkPubSub). It loses one thing: go-zeromq's SendMulti writes a
// message with writev on a plain *net.TCPConn, and with one Write per
// frame piece through the guard.
package zmtp
