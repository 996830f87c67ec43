package replica

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
	"google.golang.org/grpc/mem"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// Limits of the wire, checked before allocating.
const (
	// MaxMessageBytes bounds an encoded message (gRPC's receive limit).
	MaxMessageBytes = 4 << 20
	// MaxBatch bounds the deltas of one message.
	MaxBatch = 1024
	// MaxBlocks bounds the blocks of one admit (a 2M-token prompt in
	// 32-token blocks).
	MaxBlocks = 1 << 16
	// maxString bounds the strings of a message: ids, names.
	maxString = 4096
)

// Kind says what a Batch carries.
type Kind uint8

const (
	// KindLive: deltas as they happen, in Seq order.
	KindLive Kind = iota + 1
	// KindSnapshot: part of the snapshot a stream starts with: admits of
	// the live bookings as of Batch.Seq; Last marks its end.
	KindSnapshot
)

// Batch is one message of a sync stream.
type Batch struct {
	Origin string
	Kind   Kind
	// Seq is, in a snapshot, the Seq of the last delta it includes.
	Seq uint64
	// Last ends a snapshot.
	Last   bool
	Deltas []coordinator.BookingDelta
}

// Hello opens a stream: who subscribes.
type Hello struct {
	Replica string
}

var errTooBig = errors.New("over the limit")

// appendBatch encodes b; each delta is an array of 12.
func appendBatch(o []byte, b *Batch) []byte {
	o = msgp.AppendArrayHeader(o, 5)
	o = msgp.AppendString(o, b.Origin)
	o = msgp.AppendUint8(o, uint8(b.Kind))
	o = msgp.AppendUint64(o, b.Seq)
	o = msgp.AppendBool(o, b.Last)
	o = msgp.AppendArrayHeader(o, uint32(len(b.Deltas)))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		o = msgp.AppendArrayHeader(o, 11)
		o = msgp.AppendUint64(o, d.Seq)
		o = msgp.AppendUint8(o, uint8(d.Op))
		o = msgp.AppendString(o, d.ID)
		o = msgp.AppendString(o, d.Pool.Model)
		o = msgp.AppendString(o, d.Pool.Group)
		o = msgp.AppendUint8(o, uint8(d.Pool.Role))
		o = msgp.AppendUint64(o, d.Rank.WorkerID)
		o = msgp.AppendUint32(o, d.Rank.DPRank)
		o = msgp.AppendArrayHeader(o, uint32(len(d.Blocks)))
		for _, h := range d.Blocks {
			o = msgp.AppendUint64(o, h)
		}
		o = msgp.AppendInt(o, d.Private)
		o = msgp.AppendInt(o, d.PrefillTokens)
	}
	return o
}

// decodeBatch decodes a message, every count checked against the limits
// and the bytes left before allocating. Deltas carry b.Origin.
func decodeBatch(p []byte) (Batch, error) {
	var b Batch
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil || n != 5 {
		return b, fmt.Errorf("batch: want an array of 5: %w", orShape(err))
	}
	var kind uint8
	if b.Origin, p, err = readString(p); err != nil {
		return b, fmt.Errorf("batch origin: %w", err)
	}
	if kind, p, err = msgp.ReadUint8Bytes(p); err != nil {
		return b, fmt.Errorf("batch kind: %w", err)
	}
	b.Kind = Kind(kind)
	if b.Seq, p, err = msgp.ReadUint64Bytes(p); err != nil {
		return b, fmt.Errorf("batch seq: %w", err)
	}
	if b.Last, p, err = msgp.ReadBoolBytes(p); err != nil {
		return b, fmt.Errorf("batch last: %w", err)
	}
	if n, p, err = msgp.ReadArrayHeaderBytes(p); err != nil {
		return b, fmt.Errorf("batch deltas: %w", err)
	}
	// A delta takes at least 12 bytes.
	if n > MaxBatch || int(n) > len(p)/12 {
		return b, fmt.Errorf("batch: %d deltas in %d bytes (at most %d): %w", n, len(p), MaxBatch, errTooBig)
	}
	b.Deltas = make([]coordinator.BookingDelta, n)
	for i := range b.Deltas {
		if p, err = readDelta(p, &b.Deltas[i]); err != nil {
			return b, fmt.Errorf("batch delta %d: %w", i, err)
		}
		b.Deltas[i].Origin = b.Origin
	}
	if len(p) != 0 {
		return b, fmt.Errorf("batch: %d bytes after it", len(p))
	}
	return b, nil
}

func readDelta(p []byte, d *coordinator.BookingDelta) ([]byte, error) {
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil || n != 11 {
		return p, fmt.Errorf("want an array of 11: %w", orShape(err))
	}
	var op, role uint8
	if d.Seq, p, err = msgp.ReadUint64Bytes(p); err != nil {
		return p, fmt.Errorf("seq: %w", err)
	}
	if op, p, err = msgp.ReadUint8Bytes(p); err != nil {
		return p, fmt.Errorf("op: %w", err)
	}
	d.Op = coordinator.BookingOp(op)
	if d.ID, p, err = readString(p); err != nil {
		return p, fmt.Errorf("id: %w", err)
	}
	if d.Pool.Model, p, err = readString(p); err != nil {
		return p, fmt.Errorf("model: %w", err)
	}
	if d.Pool.Group, p, err = readString(p); err != nil {
		return p, fmt.Errorf("group: %w", err)
	}
	if role, p, err = msgp.ReadUint8Bytes(p); err != nil {
		return p, fmt.Errorf("role: %w", err)
	}
	d.Pool.Role = coordinator.Role(role)
	var r indexer.Rank
	if r.WorkerID, p, err = msgp.ReadUint64Bytes(p); err != nil {
		return p, fmt.Errorf("worker: %w", err)
	}
	if r.DPRank, p, err = msgp.ReadUint32Bytes(p); err != nil {
		return p, fmt.Errorf("dp rank: %w", err)
	}
	d.Rank = r
	if n, p, err = msgp.ReadArrayHeaderBytes(p); err != nil {
		return p, fmt.Errorf("blocks: %w", err)
	}
	if n > MaxBlocks || int(n) > len(p) { // a block takes at least a byte
		return p, fmt.Errorf("%d blocks in %d bytes (at most %d): %w", n, len(p), MaxBlocks, errTooBig)
	}
	if n > 0 {
		d.Blocks = make([]uint64, n)
		for i := range d.Blocks {
			if d.Blocks[i], p, err = msgp.ReadUint64Bytes(p); err != nil {
				return p, fmt.Errorf("block %d: %w", i, err)
			}
		}
	}
	if d.Private, p, err = msgp.ReadIntBytes(p); err != nil {
		return p, fmt.Errorf("private: %w", err)
	}
	if d.PrefillTokens, p, err = msgp.ReadIntBytes(p); err != nil {
		return p, fmt.Errorf("prefill tokens: %w", err)
	}
	return p, nil
}

func readString(p []byte) (string, []byte, error) {
	// ReadStringZC reads without copying, so the length is checked
	// before the string is allocated.
	v, o, err := msgp.ReadStringZC(p)
	if err != nil {
		return "", p, err
	}
	if len(v) > maxString {
		return "", p, fmt.Errorf("a string of %d bytes (at most %d): %w", len(v), maxString, errTooBig)
	}
	return string(v), o, nil
}

func orShape(err error) error {
	if err != nil {
		return err
	}
	return errors.New("wrong length")
}

func appendHello(o []byte, h *Hello) []byte {
	o = msgp.AppendArrayHeader(o, 1)
	return msgp.AppendString(o, h.Replica)
}

func decodeHello(p []byte) (Hello, error) {
	var h Hello
	n, p, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil || n != 1 {
		return h, fmt.Errorf("hello: want an array of 1: %w", orShape(err))
	}
	if h.Replica, _, err = readString(p); err != nil {
		return h, fmt.Errorf("hello replica: %w", err)
	}
	return h, nil
}

// codec is the gRPC codec of the sync service: MessagePack, for *Batch
// and *Hello only. It is forced on the service's server and client
// (grpc.ForceServerCodecV2, grpc.ForceCodecV2), never registered
// globally.
type codec struct{}

var _ interface {
	Marshal(any) (mem.BufferSlice, error)
	Unmarshal(mem.BufferSlice, any) error
	Name() string
} = codec{}

func (codec) Name() string { return "prefixd-msgpack" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	var b []byte
	switch m := v.(type) {
	case *Batch:
		b = appendBatch(nil, m)
	case *Hello:
		b = appendHello(nil, m)
	default:
		return nil, fmt.Errorf("replica codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if data.Len() > MaxMessageBytes {
		return fmt.Errorf("replica codec: a message of %d bytes: %w", data.Len(), errTooBig)
	}
	p := data.Materialize()
	var err error
	switch m := v.(type) {
	case *Batch:
		*m, err = decodeBatch(p)
	case *Hello:
		*m, err = decodeHello(p)
	default:
		err = fmt.Errorf("replica codec: cannot unmarshal %T", v)
	}
	return err
}
