package zmtp

import "encoding/binary"

// Builders of ZMTP 3 bytes, for the rogue peers and the stream tests.

// greeting returns a ZMTP 3.0 greeting with the given mechanism.
func greeting(mech string) []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], mech)
	return g
}

// header returns a frame header; long forces the 9-byte form.
func header(flags byte, size uint64, long bool) []byte {
	if long || size > 255 {
		h := make([]byte, longHeaderLen)
		h[0] = flags | flagLong
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	return []byte{flags, byte(size)}
}

// frame returns a whole frame.
func frame(flags byte, body []byte) []byte {
	return append(header(flags, uint64(len(body)), false), body...)
}

// command returns a command frame.
func command(name string, data []byte) []byte {
	body := append([]byte{byte(len(name))}, name...)
	return frame(flagCommand, append(body, data...))
}

// property returns one metadata property.
func property(name, value string) []byte {
	p := append([]byte{byte(len(name))}, name...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(value)))
	return append(p, value...)
}

// readyMeta returns a READY command with metadata made of props.
func readyMeta(props ...[]byte) []byte {
	var data []byte
	for _, p := range props {
		data = append(data, p...)
	}
	return command("READY", data)
}

// ready returns the READY a socket of type typ sends.
func ready(typ string) []byte {
	return readyMeta(property("Socket-Type", typ), property("Identity", ""))
}

// message returns a message of frames, MORE set on all but the last.
func message(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = flagMore
		}
		b = append(b, frame(fl, f)...)
	}
	return b
}
