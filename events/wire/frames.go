package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Frame helpers for the ZMQ layer: the live PUB messages and the replay
// ROUTER protocol of vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py;
// docs/wire.md says what prefixd accepts). They do no I/O and keep no
// state, so the subscriber and the test publisher share them. Frames are
// [][]byte as go-zeromq's Msg.Frames holds them.

// SeqLen is the length of a seq frame: 8 bytes, big-endian, unsigned.
const SeqLen = 8

// EndSeq is the seq frame of a replay end marker: (-1).to_bytes(8, "big",
// signed=True), i.e. FF×8.
var EndSeq = [SeqLen]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ErrMalformedFrame is matched, with errors.Is, by every error ParseLive and
// ParseReplay return.
var ErrMalformedFrame = errors.New("events: malformed frame")

// FrameError.Reason values. They are stable and suitable as a metric label
// (…_dropped_total{reason}); they do not collide with the DecodeError ones.
const (
	// ReasonBadFrames: the message has the wrong number of frames.
	ReasonBadFrames = "bad_frames"
	// ReasonBadSeq: the seq frame is not exactly SeqLen bytes.
	ReasonBadSeq = "bad_seq"
	// ReasonTopic: a live message's topic frame lacks the subscribed prefix.
	ReasonTopic = "topic"
	// ReasonBadDelimiter: a replay message (DEALER view) does not start
	// with an empty frame.
	ReasonBadDelimiter = "bad_delimiter"
	// ReasonBadEndMarker: a replay message has the end seq FF×8 with a
	// non-empty payload, or an empty payload with another seq (a protocol
	// error, not a batch: vLLM always sends both signals together).
	ReasonBadEndMarker = "bad_end_marker"
)

// FrameError describes why a multipart message was rejected. It matches
// ErrMalformedFrame with errors.Is.
type FrameError struct {
	Reason string // one of ReasonBadFrames, ReasonBadSeq, ReasonTopic, ReasonBadDelimiter, ReasonBadEndMarker
	Detail string // human-readable specifics, e.g. "seq frame is 7 bytes"
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("events: malformed frame (%s): %s", e.Reason, e.Detail)
}

// Is reports whether target is ErrMalformedFrame.
func (e *FrameError) Is(target error) bool { return target == ErrMalformedFrame }

func frameErr(reason, format string, args ...any) error {
	return &FrameError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// AppendSeq appends seq as SeqLen big-endian bytes to dst.
func AppendSeq(dst []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, seq)
}

// ParseLive checks a message received on a SUB socket (vLLM's live message,
// docs/wire.md): exactly 3 frames [topic, seq, payload], a seq frame of
// exactly SeqLen bytes, and a topic frame that starts with topicPrefix (the
// subscription; nil or empty accepts any topic). Checks run in that order;
// the first failure is returned as a *FrameError.
//
// payload aliases frames[2]. The payload is not inspected: an empty one is
// returned as is and left to the decoder to reject.
func ParseLive(frames [][]byte, topicPrefix []byte) (seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return 0, nil, frameErr(ReasonBadFrames, "live message has %d frames, want 3", len(frames))
	}
	if len(frames[1]) != SeqLen {
		return 0, nil, frameErr(ReasonBadSeq, "live seq frame is %d bytes, want %d", len(frames[1]), SeqLen)
	}
	if !bytes.HasPrefix(frames[0], topicPrefix) {
		return 0, nil, frameErr(ReasonTopic, "topic %q lacks prefix %q", frames[0], topicPrefix)
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// ParseReplay classifies one replay reply message as a DEALER receives it
// (the layouts before and after vLLM PR #45177, which added the topic
// frame):
//
//  1. The first frame must be empty (the ROUTER envelope delimiter) and is
//     stripped; a missing or non-empty one is ReasonBadDelimiter.
//  2. Three remaining frames are the topic layout [topic, seq, payload]
//     (vLLM ≥ v0.26), two the legacy layout [seq, payload]; any other count
//     is ReasonBadFrames. Both layouts are always accepted. The topic frame
//     is not checked: in the end marker it is empty whatever the topic.
//  3. seq must be exactly SeqLen bytes (ReasonBadSeq).
//  4. seq == EndSeq with an empty payload is the end marker (end is true,
//     seq and payload are zero); exactly one of the two is
//     ReasonBadEndMarker.
//  5. Otherwise it is a batch (seq, payload); payload aliases the last
//     frame.
func ParseReplay(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return 0, nil, false, frameErr(ReasonBadDelimiter, "replay message does not start with an empty frame")
	}
	var seqf []byte
	switch rest := frames[1:]; len(rest) {
	case 3:
		seqf, payload = rest[1], rest[2]
	case 2:
		seqf, payload = rest[0], rest[1]
	default:
		return 0, nil, false, frameErr(ReasonBadFrames, "replay message has %d frames after the delimiter, want 2 or 3", len(rest))
	}
	if len(seqf) != SeqLen {
		return 0, nil, false, frameErr(ReasonBadSeq, "replay seq frame is %d bytes, want %d", len(seqf), SeqLen)
	}
	isEnd := [SeqLen]byte(seqf) == EndSeq
	switch {
	case isEnd && len(payload) == 0:
		return 0, nil, true, nil
	case isEnd:
		return 0, nil, false, frameErr(ReasonBadEndMarker, "end seq with a %d-byte payload", len(payload))
	case len(payload) == 0:
		return 0, nil, false, frameErr(ReasonBadEndMarker, "empty payload with seq %d", binary.BigEndian.Uint64(seqf))
	}
	return binary.BigEndian.Uint64(seqf), payload, false, nil
}

// ReplayRequest returns the frames a DEALER sends to ask for a replay from
// start: ["", start as SeqLen big-endian bytes]. vLLM's ROUTER needs the
// empty delimiter frame (without it the request is never answered), and the
// Dynamo mocker ignores a start that is not exactly 8 bytes. The slices are
// freshly allocated.
func ReplayRequest(start uint64) [][]byte {
	return [][]byte{{}, AppendSeq(make([]byte, 0, SeqLen), start)}
}
