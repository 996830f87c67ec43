// Package wiretest builds msgpack payloads by hand, for tests that need
// what the wire Encoder will not write: values of the wrong type or range,
// SGLang EAGLE's bigram token pairs, hostile headers, maps in any key order.
// It is test infrastructure: production code never imports it, and it does
// not import the codec, so the codec's own tests can use it.
package wiretest

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

type (
	// Raw is appended verbatim.
	Raw []byte
	// Map is alternating keys and values: a msgpack map in this order.
	Map []any
)

// Pack returns the msgpack encoding of vs, one after another.
func Pack(vs ...any) []byte {
	var b []byte
	for _, v := range vs {
		b = Append(b, v)
	}
	return b
}

// Append appends the msgpack encoding of v to b. v is nil, Raw, bool,
// float64, float32, int, int64, uint64, string, []byte, []any (an array)
// or Map; integers are written in msgspec's smallest form. Any other type
// panics.
func Append(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return msgp.AppendNil(b)
	case Raw:
		return append(b, x...)
	case bool:
		return msgp.AppendBool(b, x)
	case float64:
		return msgp.AppendFloat64(b, x)
	case float32:
		return msgp.AppendFloat32(b, x)
	case int:
		return appendInt(b, int64(x))
	case int64:
		return appendInt(b, x)
	case uint64:
		return msgp.AppendUint64(b, x)
	case string:
		return msgp.AppendString(b, x)
	case []byte:
		return msgp.AppendBytes(b, x)
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = Append(b, e)
		}
		return b
	case Map:
		b = msgp.AppendMapHeader(b, uint32(len(x)/2))
		for _, e := range x {
			b = Append(b, e)
		}
		return b
	}
	panic(fmt.Sprintf("wiretest.Append: unsupported %T", v))
}

// appendInt writes v as msgspec does: non-negative values as positive
// fixint/cc/cd/ce/cf, negative values as negative fixint/d0–d3.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}
