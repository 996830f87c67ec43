package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// frameVectorPayload stands in for the payload frame in the frame-level
// vectors below; the frame helpers never look inside it.
var frameVectorPayload = []byte{0x93, 0xcb, 0x41, 0xda}

func TestFrameSeq(t *testing.T) {
	if got := hex.EncodeToString(AppendSeq(nil, 19)); got != "0000000000000013" {
		t.Errorf("AppendSeq(19) = %s", got)
	}
	if got := AppendSeq([]byte("x"), 1<<56); !bytes.Equal(got, []byte("x\x01\x00\x00\x00\x00\x00\x00\x00")) {
		t.Errorf("AppendSeq appends wrongly: %x", got)
	}
	if got := hex.EncodeToString(EndSeq[:]); got != "ffffffffffffffff" {
		t.Errorf("EndSeq = %s", got)
	}
	// A DEALER's replay request from seq 5: F0 empty, F1 0000000000000005.
	req := ReplayRequest(5)
	if len(req) != 2 || len(req[0]) != 0 || hex.EncodeToString(req[1]) != "0000000000000005" {
		t.Errorf("ReplayRequest(5) = %x", req)
	}
}

func TestFrameParseLive(t *testing.T) {
	topic := unhex(t, "6b7640706f6431406d") // "kv@pod1@m"
	p := frameVectorPayload
	seq19 := unhex(t, "0000000000000013")
	seq0 := unhex(t, "0000000000000000")
	tests := []struct {
		name    string
		frames  [][]byte
		prefix  string
		seq     uint64
		payload []byte
		reason  string // "" = valid
	}{
		// Frame-level vectors: an llm-d-style topic and the default one.
		{name: "topic kv@pod1@m seq 19", frames: [][]byte{topic, seq19, p}, prefix: "kv@pod1@m", seq: 19, payload: p},
		{name: "default empty topic", frames: [][]byte{{}, seq0, p}, prefix: "", seq: 0, payload: p},
		{name: "prefix of the topic", frames: [][]byte{topic, seq19, p}, prefix: "kv@pod1", seq: 19, payload: p},
		{name: "any topic with empty prefix", frames: [][]byte{topic, seq19, p}, prefix: "", seq: 19, payload: p},
		{name: "largest seq", frames: [][]byte{{}, EndSeq[:], p}, seq: 1<<64 - 1, payload: p},
		// Negative vectors (wrong frame counts, seq widths) and the topic check.
		{name: "2 frames", frames: [][]byte{seq19, p}, reason: ReasonBadFrames},
		{name: "4 frames", frames: [][]byte{topic, seq19, p, p}, reason: ReasonBadFrames},
		{name: "no frames", frames: nil, reason: ReasonBadFrames},
		{name: "7-byte seq", frames: [][]byte{topic, seq19[1:], p}, prefix: "kv@pod1@m", reason: ReasonBadSeq},
		{name: "9-byte seq", frames: [][]byte{topic, append([]byte{0}, seq19...), p}, prefix: "kv@pod1@m", reason: ReasonBadSeq},
		{name: "other topic", frames: [][]byte{topic, seq19, p}, prefix: "kv@pod2", reason: ReasonTopic},
		{name: "topic shorter than prefix", frames: [][]byte{{}, seq19, p}, prefix: "kv", reason: ReasonTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, payload, err := ParseLive(tt.frames, []byte(tt.prefix))
			checkFrameErr(t, err, tt.reason)
			if tt.reason != "" {
				return
			}
			if seq != tt.seq || !bytes.Equal(payload, tt.payload) {
				t.Errorf("ParseLive = (%d, %x), want (%d, %x)", seq, payload, tt.seq, tt.payload)
			}
		})
	}
}

func TestFrameParseReplay(t *testing.T) {
	topic := unhex(t, "6b7640706f6431406d")
	p := frameVectorPayload
	seq5 := unhex(t, "0000000000000005")
	end := unhex(t, "ffffffffffffffff")
	tests := []struct {
		name    string
		frames  [][]byte
		seq     uint64
		payload []byte
		end     bool
		reason  string // "" = valid
	}{
		// vLLM >= v0.26, since PR #45177 (topic layout).
		{name: "topic layout batch", frames: [][]byte{{}, topic, seq5, p}, seq: 5, payload: p},
		{name: "topic layout end", frames: [][]byte{{}, {}, end, {}}, end: true},
		// The 4-frame end marker's topic frame is empty even when the
		// configured topic is not, so a non-empty one is not required...
		{name: "topic layout batch, default topic", frames: [][]byte{{}, {}, seq5, p}, seq: 5, payload: p},
		// ...and not rejected either (the topic frame is never inspected).
		{name: "topic layout end with a topic", frames: [][]byte{{}, topic, end, {}}, end: true},
		// vLLM <= v0.25 / SGLang / Dynamo mocker (legacy layout).
		{name: "legacy batch", frames: [][]byte{{}, seq5, p}, seq: 5, payload: p},
		{name: "legacy end", frames: [][]byte{{}, end, {}}, end: true},
		{name: "nil frames count as empty", frames: [][]byte{nil, end, nil}, end: true},
		// Negatives: no leading delimiter, wrong frame counts and seq
		// widths, and end markers with only one of their two signals.
		{name: "legacy without leading empty frame", frames: [][]byte{seq5, p}, reason: ReasonBadDelimiter},
		{name: "topic layout without leading empty frame", frames: [][]byte{topic, seq5, p}, reason: ReasonBadDelimiter},
		{name: "REQ-view end marker", frames: [][]byte{end, {}}, reason: ReasonBadDelimiter},
		{name: "no frames", frames: nil, reason: ReasonBadDelimiter},
		{name: "only the delimiter", frames: [][]byte{{}}, reason: ReasonBadFrames},
		{name: "delimiter and seq", frames: [][]byte{{}, seq5}, reason: ReasonBadFrames},
		{name: "5 frames", frames: [][]byte{{}, {}, topic, seq5, p}, reason: ReasonBadFrames},
		{name: "legacy 7-byte seq", frames: [][]byte{{}, seq5[1:], p}, reason: ReasonBadSeq},
		{name: "topic layout 9-byte seq", frames: [][]byte{{}, topic, append([]byte{0}, seq5...), p}, reason: ReasonBadSeq},
		{name: "short end seq", frames: [][]byte{{}, end[1:], {}}, reason: ReasonBadSeq},
		{name: "legacy end seq with payload", frames: [][]byte{{}, end, p}, reason: ReasonBadEndMarker},
		{name: "topic layout end seq with payload", frames: [][]byte{{}, {}, end, p}, reason: ReasonBadEndMarker},
		{name: "legacy empty payload", frames: [][]byte{{}, seq5, {}}, reason: ReasonBadEndMarker},
		{name: "topic layout empty payload", frames: [][]byte{{}, topic, seq5, {}}, reason: ReasonBadEndMarker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, payload, isEnd, err := ParseReplay(tt.frames)
			checkFrameErr(t, err, tt.reason)
			if tt.reason != "" {
				if isEnd || seq != 0 || payload != nil {
					t.Errorf("error result carries values: (%d, %x, %v)", seq, payload, isEnd)
				}
				return
			}
			if seq != tt.seq || !bytes.Equal(payload, tt.payload) || isEnd != tt.end {
				t.Errorf("ParseReplay = (%d, %x, end=%v), want (%d, %x, end=%v)", seq, payload, isEnd, tt.seq, tt.payload, tt.end)
			}
		})
	}
}

// checkFrameErr checks err against the wanted reason ("" = no error).
func checkFrameErr(t *testing.T, err error, reason string) {
	t.Helper()
	if reason == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("error %v does not match ErrMalformedFrame", err)
	}
	var fe *FrameError
	if !errors.As(err, &fe) || fe.Reason != reason {
		t.Fatalf("error %v, want reason %q", err, reason)
	}
	if errors.Is(err, ErrMalformed) {
		t.Errorf("frame error %v matches the payload sentinel ErrMalformed", err)
	}
}

// splitFuzzFrames turns fuzz input into frames: each frame is a length byte
// followed by up to that many bytes.
func splitFuzzFrames(data []byte) [][]byte {
	var frames [][]byte
	for len(data) > 0 {
		n := min(int(data[0]), len(data)-1)
		frames = append(frames, data[1:1+n])
		data = data[1+n:]
	}
	return frames
}

// FuzzFrameParse checks that the frame parsers never panic and that they
// either accept a message or return a *FrameError.
func FuzzFrameParse(f *testing.F) {
	f.Add([]byte("\x00\x08\x00\x00\x00\x00\x00\x00\x00\x05\x02ab"))
	f.Add([]byte("\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff\x00"))
	f.Add([]byte("\x03kv@\x08\x00\x00\x00\x00\x00\x00\x00\x13\x01x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFuzzFrames(data)
		if _, _, err := ParseLive(frames, []byte("kv")); err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("ParseLive: %v is not a FrameError", err)
			}
		}
		seq, payload, end, err := ParseReplay(frames)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("ParseReplay: %v is not a FrameError", err)
			}
			return
		}
		if end == (len(payload) != 0) || (end && seq != 0) {
			t.Fatalf("ParseReplay = (%d, %x, end=%v): an end marker has no payload and a batch has one", seq, payload, end)
		}
	})
}
