package wire

import (
	"encoding/binary"
	"io"

	"github.com/tinylib/msgp/msgp"
)

// HashFromBytes normalises a byte-string block hash to uint64: for
// len(b) ≥ 8 the last 8 bytes read big-endian (for a 32-byte sha256 digest
// this equals vLLM's int mode, int.from_bytes(digest, "big") & (2**64-1) in
// vllm/v1/core/kv_cache_utils.py); for shorter input the big-endian value of
// the bytes (left-padded with zeros).
func HashFromBytes(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var h uint64
	for _, c := range b {
		h = h<<8 | uint64(c)
	}
	return h
}

// errShort reports input that ends inside an element, or a header that
// claims more elements than the remaining bytes can hold.
var errShort = io.ErrUnexpectedEOF

// wireTypeError reports a msgpack element of the wrong type.
type wireTypeError struct {
	want string
	got  byte // the element's first byte
}

func (e wireTypeError) Error() string {
	return "got msgpack " + typeName(e.got) + " (0x" + hex2(e.got) + "), want " + e.want
}

func typeName(c byte) string {
	if c == 0xc1 {
		return "invalid byte"
	}
	return msgp.NextType([]byte{c}).String()
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&15]})
}

// readInt reads a msgpack integer of any width and signedness: positive
// fixint, cc–cf (unsigned 8–64 bit), negative fixint and d0–d3 (signed 8–64
// bit). It returns the value's 64-bit two's-complement bits and whether the
// value is negative, so that callers can range-check as uint64 or int64.
//
// msgp's typed readers are not used here: ReadUint64Bytes rejects negative
// values and ReadInt64Bytes rejects values ≥ 2^63, and hashes need both in
// one path (vLLM's unsigned 64-bit hashes, SGLang's and old vLLM's signed
// ones).
func readInt(p []byte, want string) (bits uint64, neg bool, rest []byte, err error) {
	if len(p) == 0 {
		return 0, false, p, errShort
	}
	c := p[0]
	switch {
	case c <= 0x7f: // positive fixint
		return uint64(c), false, p[1:], nil
	case c >= 0xe0: // negative fixint
		return uint64(int64(int8(c))), true, p[1:], nil
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	default:
		return 0, false, p, wireTypeError{want: want, got: c}
	}
	if len(p) < 1+size {
		return 0, false, p, errShort
	}
	v := p[1 : 1+size]
	rest = p[1+size:]
	switch c {
	case 0xcc:
		return uint64(v[0]), false, rest, nil
	case 0xcd:
		return uint64(binary.BigEndian.Uint16(v)), false, rest, nil
	case 0xce:
		return uint64(binary.BigEndian.Uint32(v)), false, rest, nil
	case 0xcf:
		return binary.BigEndian.Uint64(v), false, rest, nil
	case 0xd0:
		s := int64(int8(v[0]))
		return uint64(s), s < 0, rest, nil
	case 0xd1:
		s := int64(int16(binary.BigEndian.Uint16(v)))
		return uint64(s), s < 0, rest, nil
	case 0xd2:
		s := int64(int32(binary.BigEndian.Uint32(v)))
		return uint64(s), s < 0, rest, nil
	default: // 0xd3
		s := int64(binary.BigEndian.Uint64(v))
		return uint64(s), s < 0, rest, nil
	}
}

// readHash reads one block hash and normalises it to uint64 (the same rules
// as docs/wire.md, "Block hashes"):
//
//   - positive fixint, cc, cd, ce, cf: the value, zero-extended;
//   - negative fixint, d0, d1, d2, d3: sign-extended to int64 and
//     reinterpreted as uint64 (-2 → 0xFFFFFFFFFFFFFFFE);
//   - bin8/16/32, and defensively str: HashFromBytes (last 8 bytes
//     big-endian, or the left-padded value of a shorter string);
//   - anything else (nil, float, bool, map, array, ext) is an error. The
//     caller handles nil where it is allowed (parent_block_hash).
func readHash(p []byte) (uint64, []byte, error) {
	if len(p) == 0 {
		return 0, p, errShort
	}
	c := p[0]
	switch {
	case c == 0xcf && len(p) >= 9: // u64: vLLM's common case
		return binary.BigEndian.Uint64(p[1:]), p[9:], nil
	case c <= 0x7f:
		return uint64(c), p[1:], nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), p[1:], nil
	case c >= 0xcc && c <= 0xd3:
		h, _, rest, err := readInt(p, "hash")
		return h, rest, err
	case c == 0xc4 || c == 0xc5 || c == 0xc6:
		b, rest, err := msgp.ReadBytesZC(p)
		if err != nil {
			return 0, p, errShort // the prefix is bin, so only length can fail
		}
		return HashFromBytes(b), rest, nil
	case (c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb:
		b, rest, err := msgp.ReadStringZC(p)
		if err != nil {
			return 0, p, errShort
		}
		return HashFromBytes(b), rest, nil
	}
	return 0, p, hashTypeErrs[c]
}

// hashTypeErrs are readHash's errors for each first byte, made once, so
// that a batch of events with bad hashes (each skipped) costs no
// allocation per event.
var hashTypeErrs = func() (errs [256]error) {
	for c := range errs {
		errs[c] = wireTypeError{want: "hash (int, bin or str)", got: byte(c)}
	}
	return errs
}()
