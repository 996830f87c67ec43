package zmtp

import (
	"errors"
	"fmt"
	"time"
)

// ErrHandshakeTimeout is matched (errors.Is) by the error of a connection
// whose peer did not complete the ZMTP handshake within
// Limits.HandshakeTimeout. It reaches the caller wrapped by go-zeromq, from
// Socket.Dial.
var ErrHandshakeTimeout = errors.New("zmtp: handshake timed out")

// LimitError reports a frame refused because its claimed size exceeds a
// limit. It reaches the caller (errors.As) wrapped by go-zeromq: from
// Socket.Dial when it happens during the handshake, from Socket.Recv after.
//
// LimitError implements net.Error (not a timeout) so that go-zeromq marks
// the connection closed and drops it; the guard has closed it already.
type LimitError struct {
	What string // "message" or "command"
	Size int64  // bytes the peer claimed: for a message, the running total with this frame and FrameOverhead per frame, saturated at MaxInt64
	Max  int64  // the limit: Limits.MaxMessageBytes or MaxCommandBytes
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("zmtp: %s of %d bytes exceeds the limit of %d", e.What, e.Size, e.Max)
}

// Timeout reports false: a refused frame is not a timeout.
func (e *LimitError) Timeout() bool { return false }

// Temporary reports false.
func (e *LimitError) Temporary() bool { return false }

// ProtocolError reports a peer that broke ZMTP 3 in a way go-zeromq does not
// survive or should not see: a bad greeting signature, malformed READY
// metadata, a missing or unknown Socket-Type, frames out of order, or (from
// a SUB or XSUB peer) a message that is not a subscription. Like LimitError
// it reaches the caller wrapped and implements net.Error (not a timeout).
type ProtocolError struct {
	Reason string // stable label: "greeting", "metadata", "socket-type", "frame" or "subscription"
	Detail string // what was wrong, for people
}

func (e *ProtocolError) Error() string {
	return "zmtp: bad " + e.Reason + ": " + e.Detail
}

// Timeout reports false.
func (e *ProtocolError) Timeout() bool { return false }

// Temporary reports false.
func (e *ProtocolError) Temporary() bool { return false }

// handshakeTimeout is the error of a handshake that ran out of time; it
// matches ErrHandshakeTimeout and wraps the I/O error that surfaced it.
type handshakeTimeout struct {
	after time.Duration
	err   error
}

func (e *handshakeTimeout) Error() string {
	return fmt.Sprintf("zmtp: peer did not complete the ZMTP handshake within %v: %v", e.after, e.err)
}

func (e *handshakeTimeout) Unwrap() []error { return []error{ErrHandshakeTimeout, e.err} }
func (e *handshakeTimeout) Timeout() bool   { return true }
func (e *handshakeTimeout) Temporary() bool { return false }

// canceled is the error of I/O on a connection the guard closed because the
// socket's context ended; it matches the context's cause and wraps the I/O
// error (a net.Error, so go-zeromq drops the connection).
type canceled struct {
	cause error
	err   error
}

func (e *canceled) Error() string {
	return fmt.Sprintf("zmtp: connection closed with its socket: %v", e.cause)
}

func (e *canceled) Unwrap() []error { return []error{e.cause, e.err} }
