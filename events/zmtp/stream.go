package zmtp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// ZMTP 3 wire constants.
const (
	greetingLen = 64 // signature 10, version 2, mechanism 20, as-server 1, filler 31

	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	shortHeaderLen = 2 // flags, 1-byte size
	longHeaderLen  = 9 // flags, 8-byte size
)

type stage uint8

const (
	stageGreeting stage = iota
	stageHeader
	stageBody
)

type peerKind uint8

const (
	peerUnknown peerKind = iota // READY not read yet, or not readable (encrypted)
	peerOther
	peerSub  // SUB: sends subscriptions only
	peerXSub // XSUB: may send other messages upstream
)

// stream follows the peer's half of one ZMTP 3 connection byte by byte and
// refuses what go-zeromq must not see. It does no I/O: the caller asks room
// how many bytes it may read next, reads at most that many, and passes them
// to feed before handing them on. room never spans a state boundary (the
// greeting, a frame header, a frame body), so the read that completes a
// header is the last of its bytes, and feed can refuse it before the library
// sees a size it would allocate.
//
// stream keeps no reference to the bytes it is fed except the body of a
// handshake command (at most MaxCommandBytes), which it copies to validate.
//
// A stream is not safe for concurrent use.
type stream struct {
	maxMsg int64

	st    stage
	n     int // greeting or header bytes read so far
	greet [greetingLen]byte
	hdr   [longHeaderLen]byte
	left  uint64 // body bytes still to come

	// The current frame.
	cmd      bool
	more     bool
	collect  bool // copy the body into cmdBuf (a handshake command)
	checkSub bool // the next body byte opens a SUB peer's message

	// The current message.
	inMsg bool  // the previous frame had MORE set
	total int64 // accounted size of the message so far

	// The handshake.
	mech   string // the peer's security mechanism, from the greeting
	ready  bool   // the peer's last handshake command (READY or INITIATE) has been read
	peer   peerKind
	cmds   int // command frames read
	cmdBuf []byte
}

// room returns how many of max bytes may be read next.
func (s *stream) room(max int) int {
	var need uint64
	switch s.st {
	case stageGreeting:
		need = uint64(greetingLen - s.n)
	case stageHeader:
		switch {
		case s.n == 0:
			need = shortHeaderLen
		case s.hdr[0]&flagLong != 0:
			need = uint64(longHeaderLen - s.n)
		default:
			need = uint64(shortHeaderLen - s.n)
		}
	case stageBody:
		need = s.left
	}
	if need < uint64(max) {
		return int(need)
	}
	return max
}

// feed consumes p, which must be no longer than room allowed. A non-nil
// error (a *LimitError or *ProtocolError) means the connection must be
// closed and p must not be handed on; feed must not be called again.
func (s *stream) feed(p []byte) error {
	for len(p) > 0 {
		switch s.st {
		case stageGreeting:
			k := copy(s.greet[s.n:], p)
			s.n += k
			p = p[k:]
			if s.n == greetingLen {
				if err := s.greeting(); err != nil {
					return err
				}
				s.st, s.n = stageHeader, 0
			}
		case stageHeader:
			if s.n == 0 {
				s.hdr[0], s.n, p = p[0], 1, p[1:] // the flags say how long the header is
				continue
			}
			need := shortHeaderLen
			if s.hdr[0]&flagLong != 0 {
				need = longHeaderLen
			}
			k := copy(s.hdr[s.n:need], p)
			s.n += k
			p = p[k:]
			if s.n == need {
				if err := s.header(); err != nil {
					return err
				}
			}
		case stageBody:
			k := len(p)
			if uint64(k) > s.left {
				k = int(s.left)
			}
			if s.checkSub && k > 0 {
				if p[0] > 1 {
					return &ProtocolError{"subscription", fmt.Sprintf("message from a SUB peer starts with %#x, not 0 (cancel) or 1 (subscribe)", p[0])}
				}
				s.checkSub = false
			}
			if s.collect {
				s.cmdBuf = append(s.cmdBuf, p[:k]...)
			}
			s.left -= uint64(k)
			p = p[k:]
			if s.left == 0 {
				if err := s.endFrame(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// greeting validates a complete greeting.
func (s *stream) greeting() error {
	g := &s.greet
	if g[0] != 0xFF || g[9] != 0x7F {
		return &ProtocolError{"greeting", fmt.Sprintf("signature %#x...%#x, want 0xff...0x7f", g[0], g[9])}
	}
	if g[10] < 3 {
		return &ProtocolError{"greeting", fmt.Sprintf("ZMTP version %d.%d, want 3.0 or later", g[10], g[11])}
	}
	mech := g[12:32]
	if i := bytes.IndexByte(mech, 0); i >= 0 {
		mech = mech[:i]
	}
	s.mech = string(mech)
	return nil
}

// header checks a complete frame header against the limits and the frame
// order, and moves to the body.
func (s *stream) header() error {
	fl := s.hdr[0]
	size := uint64(s.hdr[1])
	if fl&flagLong != 0 {
		size = binary.BigEndian.Uint64(s.hdr[1:longHeaderLen])
	}
	s.cmd, s.more = fl&flagCommand != 0, fl&flagMore != 0
	s.collect, s.checkSub = false, false
	if s.cmd {
		switch {
		case s.more:
			return &ProtocolError{"frame", "command frame with MORE set"}
		case s.inMsg:
			return &ProtocolError{"frame", "command frame inside a multi-frame message"}
		case size > MaxCommandBytes:
			return &LimitError{What: "command", Size: saturate(size), Max: MaxCommandBytes}
		}
		if !s.ready {
			s.collect = true
			if s.cmdBuf == nil {
				s.cmdBuf = make([]byte, 0, size)
			}
			s.cmdBuf = s.cmdBuf[:0]
		}
	} else {
		if !s.ready {
			return &ProtocolError{"frame", "message frame before the handshake completed"}
		}
		first := !s.inMsg
		if first {
			s.total = 0
			switch s.peer {
			case peerSub:
				switch {
				case size == 0:
					return &ProtocolError{"subscription", "empty message from a SUB peer"}
				case s.more:
					return &ProtocolError{"subscription", "multi-frame message from a SUB peer"}
				}
				s.checkSub = true
			case peerXSub:
				if size == 0 {
					return &ProtocolError{"subscription", "empty first frame from an XSUB peer"}
				}
			}
		}
		// remaining >= 0 always: total never exceeds maxMsg.
		remaining := uint64(s.maxMsg - s.total)
		if size > remaining || remaining-size < FrameOverhead {
			return &LimitError{What: "message", Size: addSaturate(s.total, size+FrameOverhead, size), Max: s.maxMsg}
		}
		s.total += int64(size) + FrameOverhead
		s.inMsg = s.more
	}
	s.st, s.n, s.left = stageBody, 0, size
	if size == 0 {
		return s.endFrame()
	}
	return nil
}

// endFrame finishes a frame whose body has been read.
func (s *stream) endFrame() error {
	s.st = stageHeader
	if !s.cmd {
		return nil
	}
	s.cmds++
	if !s.collect {
		return nil
	}
	s.collect = false
	return s.handshakeCommand(s.cmdBuf)
}

// handshakeCommand inspects one command the peer sent before its handshake
// completed: the last one (READY, or INITIATE under PLAIN) completes it, and
// its metadata must be something go-zeromq can parse without panicking and
// name a Socket-Type it knows.
func (s *stream) handshakeCommand(body []byte) error {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return &ProtocolError{"frame", "command name longer than its frame"}
	}
	name, data := body[1:1+int(body[0])], body[1+int(body[0]):]
	var meta bool
	switch s.mech {
	case "NULL":
		// go-zeromq's NULL handshake parses READY, and fails on anything else.
		meta = string(name) == "READY"
	case "PLAIN":
		// go-zeromq's PLAIN server parses its second command as INITIATE
		// whatever its name, so every command but these carries metadata.
		switch string(name) {
		case "HELLO", "WELCOME", "ERROR":
		default:
			meta = true
		}
	default:
		// Other mechanisms encrypt their metadata; only the end is known.
		s.ready = string(name) == "READY" || string(name) == "INITIATE"
		return nil
	}
	if !meta {
		return nil
	}
	kind, err := checkMetadata(data)
	if err != nil {
		return err
	}
	s.peer, s.ready = kind, true
	return nil
}

// checkMetadata validates a ZMTP metadata property list (name-length OCTET,
// name, value-length 4 OCTETs, value; repeated to the end) and returns the
// kind of socket its Socket-Type names. go-zeromq v0.17.0 indexes past the
// end of a malformed list, title-cases names with Unicode rules (so the
// non-ASCII "ſocket-type" becomes "Socket-Type") and panics on a missing or
// unknown Socket-Type, so the list must be well formed, names must be the
// ASCII the spec allows, and exactly one of them must be the Socket-Type
// the library will look up, with a value it knows.
func checkMetadata(data []byte) (peerKind, error) {
	var (
		typ   []byte
		found bool
	)
	for len(data) > 0 {
		nlen := int(data[0])
		if nlen == 0 {
			return 0, &ProtocolError{"metadata", "property with an empty name"}
		}
		if len(data) < 1+nlen+4 {
			return 0, &ProtocolError{"metadata", fmt.Sprintf("property header of %d bytes, only %d left", 1+nlen+4, len(data))}
		}
		name := data[1 : 1+nlen]
		for _, c := range name {
			if !nameChar(c) {
				return 0, &ProtocolError{"metadata", fmt.Sprintf("property name %q has a byte outside [A-Za-z0-9-_.+]", name)}
			}
		}
		vlen := uint64(binary.BigEndian.Uint32(data[1+nlen:]))
		rest := data[1+nlen+4:]
		if vlen > uint64(len(rest)) {
			return 0, &ProtocolError{"metadata", fmt.Sprintf("property %q value of %d bytes, only %d left", name, vlen, len(rest))}
		}
		if bytes.EqualFold(name, []byte("Socket-Type")) {
			// go-zeromq title-cases names (first letter of each word up)
			// and then looks up "Socket-Type" exactly.
			if name[0] != 's' && name[0] != 'S' || name[7] != 't' && name[7] != 'T' || string(name[1:7]) != "ocket-" || string(name[8:]) != "ype" {
				return 0, &ProtocolError{"socket-type", fmt.Sprintf("property %q is not spelled so that go-zeromq finds it", name)}
			}
			if found {
				return 0, &ProtocolError{"socket-type", "Socket-Type given twice"}
			}
			typ, found = rest[:vlen], true
		}
		data = rest[vlen:]
	}
	if !found {
		return 0, &ProtocolError{"socket-type", "no Socket-Type property"}
	}
	switch string(typ) {
	case "SUB":
		return peerSub, nil
	case "XSUB":
		return peerXSub, nil
	case "PAIR", "PUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB":
		return peerOther, nil
	}
	return 0, &ProtocolError{"socket-type", fmt.Sprintf("unknown Socket-Type %q", typ)}
}

// nameChar reports whether c may appear in a property name (ZMTP 3:
// ALPHA / DIGIT / "-" / "_" / "." / "+").
func nameChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '+'
}

func saturate(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// addSaturate returns total+cost as an int64, saturated; size is cost
// without the overhead, to detect that adding the overhead wrapped.
func addSaturate(total int64, cost, size uint64) int64 {
	if cost < size || cost > math.MaxInt64-uint64(total) {
		return math.MaxInt64
	}
	return total + int64(cost)
}
