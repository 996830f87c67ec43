package zmtp

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/go-zeromq/zmq4"
)

// feedAll feeds in to s the way conn does: chunks of at most chunk bytes,
// never more than room allows. It returns the offsets at which room cut a
// chunk short of chunk (the state boundaries) and the stream's first error.
func feedAll(t testing.TB, s *stream, in []byte, chunk int) (cuts []int, err error) {
	off := 0
	for off < len(in) {
		want := min(chunk, len(in)-off)
		n := s.room(want)
		if n <= 0 || n > want {
			t.Fatalf("room(%d) = %d at offset %d", want, n, off)
		}
		if n < want {
			cuts = append(cuts, off+n)
		}
		if err := s.feed(in[off : off+n]); err != nil {
			return cuts, err
		}
		off += n
	}
	return cuts, nil
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

const testMax = 4096

func TestStream(t *testing.T) {
	t.Parallel()
	hello := cat(greeting("NULL"), ready("PUB"))
	sub := cat(greeting("NULL"), ready("SUB"))
	xsub := cat(greeting("NULL"), ready("XSUB"))
	badGreeting := greeting("NULL")
	badGreeting[9] = 0
	zmtp2 := greeting("NULL")
	zmtp2[10] = 1
	cases := []struct {
		name string
		in   []byte
		want string // "" for none, else "limit:what" or "protocol:reason"
	}{
		{"handshake and messages", cat(hello, message([]byte("a"), []byte("b")), message(nil), command("PING", []byte("\x00\x01"))), ""},
		{"long frames", cat(hello, frame(0, make([]byte, 300)), header(0, 3, true), []byte("abc")), ""},
		{"bad signature", badGreeting, "protocol:greeting"},
		{"ZMTP 1", zmtp2, "protocol:greeting"},
		{"command too big before READY", cat(greeting("NULL"), header(flagCommand, 1<<40, true)), "limit:command"},
		{"command too big after READY", cat(hello, header(flagCommand, MaxCommandBytes+1, true)), "limit:command"},
		{"command just fits", cat(hello, header(flagCommand, MaxCommandBytes, true), make([]byte, MaxCommandBytes)), ""},
		{"command with MORE", cat(hello, frame(flagCommand|flagMore, []byte("\x04PING"))), "protocol:frame"},
		{"command inside a message", cat(hello, frame(flagMore, []byte("a")), command("PING", nil)), "protocol:frame"},
		{"message before READY", cat(greeting("NULL"), frame(0, []byte("a"))), "protocol:frame"},
		{"command name past its frame", cat(greeting("NULL"), frame(flagCommand, []byte("\x09READY"))), "protocol:frame"},
		{"empty command", cat(greeting("NULL"), frame(flagCommand, nil)), "protocol:frame"},
		{"frame at the limit", cat(hello, header(0, testMax-FrameOverhead, true), make([]byte, testMax-FrameOverhead)), ""},
		{"frame over the limit", cat(hello, header(0, testMax-FrameOverhead+1, true)), "limit:message"},
		{"frames over the limit", cat(hello, frame(flagMore, make([]byte, 2000)), header(0, testMax-2*FrameOverhead-2000+1, true)), "limit:message"},
		{"endless empty MORE frames", cat(hello, bytes.Repeat([]byte{flagMore, 0}, testMax/FrameOverhead+1)), "limit:message"},
		{"limit is per message", cat(hello, bytes.Repeat(frame(0, make([]byte, 3000)), 3)), ""},
		{"claim of 2^64-1", cat(hello, header(0, 1<<64-1, true)), "limit:message"},
		{"SUB subscriptions", cat(sub, frame(0, []byte("\x01topic")), frame(0, []byte("\x00topic")), frame(0, []byte("\x01"))), ""},
		{"SUB empty message", cat(sub, frame(0, nil)), "protocol:subscription"},
		{"SUB not a subscription", cat(sub, frame(0, []byte("x"))), "protocol:subscription"},
		{"SUB two frames", cat(sub, message([]byte("\x01a"), []byte("b"))), "protocol:subscription"},
		{"XSUB empty first frame", cat(xsub, frame(0, nil)), "protocol:subscription"},
		{"XSUB other messages", cat(xsub, message([]byte("x"), nil)), ""},
		{"metadata name length equals the rest", cat(greeting("NULL"), command("READY", []byte("\x05abcd"))), "protocol:metadata"},
		{"metadata value length cut short", cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "PUB"), []byte("\x03abc\x00\x00")))), "protocol:metadata"},
		{"metadata value past the end", cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "PUB"), []byte("\x03abc\x00\x00\x00\x09xy")))), "protocol:metadata"},
		{"metadata empty name", cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "PUB"), property("", "x")))), "protocol:metadata"},
		{"metadata non-ASCII name", cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "PUB"), property("ſocket-type", "FOO")))), "protocol:metadata"},
		{"no Socket-Type", cat(greeting("NULL"), command("READY", property("Identity", ""))), "protocol:socket-type"},
		{"empty metadata", cat(greeting("NULL"), command("READY", nil)), "protocol:socket-type"},
		{"unknown Socket-Type", cat(greeting("NULL"), command("READY", property("Socket-Type", "sub"))), "protocol:socket-type"},
		{"Socket-Type twice", cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "PUB"), property("Socket-Type", "PUB")))), "protocol:socket-type"},
		{"Socket-Type in upper case", cat(greeting("NULL"), command("READY", property("SOCKET-TYPE", "PUB"))), "protocol:socket-type"},
		{"Socket-Type in lower case", cat(greeting("NULL"), command("READY", property("socket-type", "PUB")), frame(0, nil)), ""},
		{"application properties", cat(greeting("NULL"), command("READY", cat(property("X-Engine", "vllm"), property("Socket-Type", "ROUTER"), property("Identity", "w1"))), frame(0, nil)), ""},
		{"NULL: a command before READY is not metadata", cat(greeting("NULL"), command("ERROR", []byte("\x03bad"))), ""},
		{"PLAIN server side", cat(greeting("PLAIN"), command("HELLO", []byte("\x01u\x01p")), command("INITIATE", property("Socket-Type", "DEALER")), frame(0, nil)), ""},
		{"PLAIN client side", cat(greeting("PLAIN"), command("WELCOME", nil), command("READY", property("Socket-Type", "ROUTER")), frame(0, nil)), ""},
		{"PLAIN malformed INITIATE", cat(greeting("PLAIN"), command("HELLO", nil), command("INITIATE", []byte("\x05abcd"))), "protocol:metadata"},
		{"PLAIN any second command is metadata", cat(greeting("PLAIN"), command("HELLO", nil), command("XYZ", []byte("\x05abcd"))), "protocol:metadata"},
		{"CURVE metadata is not read", cat(greeting("CURVE"), command("READY", []byte("\x05abcd")), frame(0, nil)), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, chunk := range []int{1, 2, 3, 7, 64, 1 << 20} {
				s := stream{maxMsg: testMax}
				_, err := feedAll(t, &s, c.in, chunk)
				if got := describe(err); got != c.want {
					t.Fatalf("chunks of %d: error %v (%s), want %q", chunk, err, got, c.want)
				}
			}
		})
	}
}

// describe returns "limit:what", "protocol:reason" or "" for err.
func describe(err error) string {
	var le *LimitError
	var pe *ProtocolError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &le):
		return "limit:" + le.What
	case errors.As(err, &pe):
		return "protocol:" + pe.Reason
	}
	return fmt.Sprintf("other:%T", err)
}

// TestStreamRoomStopsAtBoundaries: fed in large chunks, the stream cuts
// every read at the end of the greeting, of each frame header and of each
// body, so the read that completes a header carries nothing after it. (A
// long header is read as its first 2 bytes, which say it is long, then 7.)
func TestStreamRoomStopsAtBoundaries(t *testing.T) {
	t.Parallel()
	rdy := ready("PUB")
	in := cat(
		greeting("NULL"), rdy,
		header(flagMore, 3, false), []byte("abc"),
		header(0, 300, true), make([]byte, 300),
		header(0, 0, false),
	)
	var want []int
	off := 0
	for _, n := range []int{64, 2, len(rdy) - 2, 2, 3, 2, 7, 300} {
		off += n
		want = append(want, off)
	}
	s := stream{maxMsg: testMax}
	cuts, err := feedAll(t, &s, in, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cuts) != fmt.Sprint(want) {
		t.Fatalf("cuts at %v, want %v", cuts, want)
	}
	if !s.ready || s.peer != peerOther {
		t.Fatalf("ready %v peer %v after READY from a PUB", s.ready, s.peer)
	}
}

// TestStreamReportsSizes: the LimitError says what was claimed.
func TestStreamReportsSizes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []byte
		want LimitError
	}{
		{cat(greeting("NULL"), ready("PUB"), header(0, 1<<62, true)), LimitError{"message", 1<<62 + FrameOverhead, testMax}},
		{cat(greeting("NULL"), ready("PUB"), header(0, 1<<64-1, true)), LimitError{"message", 1<<63 - 1, testMax}},
		{cat(greeting("NULL"), ready("PUB"), frame(flagMore, make([]byte, 100)), header(0, testMax, true)), LimitError{"message", 100 + testMax + 2*FrameOverhead, testMax}},
		{cat(greeting("NULL"), header(flagCommand, 1<<40, true)), LimitError{"command", 1 << 40, MaxCommandBytes}},
	} {
		s := stream{maxMsg: testMax}
		_, err := feedAll(t, &s, c.in, 1<<20)
		var le *LimitError
		if !errors.As(err, &le) || *le != c.want {
			t.Errorf("error %v, want %+v", err, c.want)
		}
	}
}

// FuzzStream: whatever the peer sends, the stream never panics, never lets
// a message's accounted size pass the limit, and any READY it accepts is
// one go-zeromq parses without error or panic.
func FuzzStream(f *testing.F) {
	f.Add(cat(greeting("NULL"), ready("PUB"), message([]byte("a"), nil)), uint8(7))
	f.Add(cat(greeting("NULL"), command("READY", []byte("\x05abcd"))), uint8(0))
	f.Add(cat(greeting("NULL"), command("READY", cat(property("Socket-Type", "SUB"), property("x", "y"))), frame(0, []byte("\x01"))), uint8(3))
	f.Add(cat(greeting("PLAIN"), command("HELLO", nil), command("INITIATE", property("Socket-Type", "DEALER"))), uint8(64))
	f.Add(cat(greeting("NULL"), ready("DEALER"), bytes.Repeat([]byte{flagMore, 0}, 100)), uint8(255))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		s := stream{maxMsg: testMax}
		_, _ = feedAll(t, &s, in, int(chunk)+1)
		if s.total > s.maxMsg {
			t.Fatalf("message accounted at %d, over the limit %d", s.total, s.maxMsg)
		}
		if !s.ready || s.mech != "NULL" {
			return
		}
		body := s.cmdBuf // the READY: nothing is collected after it
		data := body[1+int(body[0]):]
		md := make(zmq4.Metadata)
		if err := md.UnmarshalZMTP(data); err != nil {
			t.Fatalf("accepted metadata %q that go-zeromq refuses: %v", data, err)
		}
		_ = zmq4.SocketType(md["Socket-Type"]).IsCompatible(zmq4.Pub) // panics on what it does not know
	})
}
