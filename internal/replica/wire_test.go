package replica

import (
	"errors"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"google.golang.org/grpc/mem"

	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

func sampleBatch() Batch {
	pool := coordinator.PoolKey{Model: "meta-llama/Llama-3-8B", Group: "default", Role: coordinator.RoleDecode}
	return Batch{Origin: "a", Kind: KindLive, Seq: 0, Deltas: []coordinator.BookingDelta{
		{Origin: "a", Seq: 7, Op: coordinator.BookingAdmit, ID: "req-1/decode", Pool: pool, Rank: indexer.Rank{WorkerID: 1 << 60, DPRank: 3},
			Blocks: []uint64{0, 1, 1 << 63}, Private: 2, PrefillTokens: 1 << 40},
		{Origin: "a", Seq: 8, Op: coordinator.BookingFree, ID: "x", Pool: pool},
	}}
}

func TestBatchRoundTrip(t *testing.T) {
	for _, b := range []Batch{sampleBatch(), {Origin: "b", Kind: KindSnapshot, Seq: 99, Last: true, Deltas: []coordinator.BookingDelta{}}} {
		bufs, err := codec{}.Marshal(&b)
		if err != nil {
			t.Fatal(err)
		}
		var got Batch
		if err := (codec{}).Unmarshal(bufs, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("round trip:\n%+v\nwant\n%+v", got, b)
		}
	}
	var h Hello
	bufs, _ := codec{}.Marshal(&Hello{Replica: "r"})
	if err := (codec{}).Unmarshal(bufs, &h); err != nil || h.Replica != "r" {
		t.Fatalf("hello: %+v %v", h, err)
	}
}

// TestBatchLimits: counts over the limits, or over what the bytes left
// could hold, fail before anything is allocated.
func TestBatchLimits(t *testing.T) {
	head := func(n uint32) []byte {
		o := msgp.AppendArrayHeader(nil, 5)
		o = msgp.AppendString(o, "a")
		o = msgp.AppendUint8(o, uint8(KindLive))
		o = msgp.AppendUint64(o, 0)
		o = msgp.AppendBool(o, false)
		return msgp.AppendArrayHeader(o, n)
	}
	if _, err := decodeBatch(head(1 << 31)); !errors.Is(err, errTooBig) {
		t.Fatalf("2^31 deltas: %v", err)
	}
	if _, err := decodeBatch(head(MaxBatch + 1)); !errors.Is(err, errTooBig) {
		t.Fatalf("MaxBatch+1 deltas: %v", err)
	}
	b := sampleBatch()
	b.Deltas = b.Deltas[:1]
	p := appendBatch(nil, &b)
	// The blocks header of the first delta, raised to 2^30.
	big := appendBatch(nil, &Batch{Origin: "a", Kind: KindLive, Deltas: []coordinator.BookingDelta{{ID: "x", Blocks: make([]uint64, 17)}}})
	i := len(big) - 2 - 17 - 3 // a 3-byte array16 header, 17 one-byte blocks, two one-byte ints
	if big[i] != 0xdc {
		t.Fatalf("layout: %x at %d", big[i], i)
	}
	big = append(big[:i:i], append([]byte{0xdd, 0x40, 0, 0, 0}, big[i+3:]...)...)
	if _, err := decodeBatch(big); !errors.Is(err, errTooBig) {
		t.Fatalf("2^30 blocks: %v", err)
	}
	long := sampleBatch()
	long.Deltas[0].ID = string(make([]byte, maxString+1))
	if _, err := decodeBatch(appendBatch(nil, &long)); !errors.Is(err, errTooBig) {
		t.Fatalf("a long id: %v", err)
	}
	if _, err := decodeBatch(append(p, 0)); err == nil {
		t.Fatal("trailing bytes accepted")
	}
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(make([]byte, MaxMessageBytes+1))}, &Batch{}); !errors.Is(err, errTooBig) {
		t.Fatalf("an oversized message: %v", err)
	}
}

// FuzzDecodeBatch: any input decodes or fails, without panicking, and a
// decoded batch encodes back to its input.
func FuzzDecodeBatch(f *testing.F) {
	b := sampleBatch()
	f.Add(appendBatch(nil, &b))
	f.Add([]byte{0x95, 0xa1, 'a', 1, 0, 0xc2, 0x90})
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := decodeBatch(p)
		if err != nil {
			return
		}
		for i := range got.Deltas {
			if len(got.Deltas[i].Blocks) > MaxBlocks {
				t.Fatalf("delta %d: %d blocks", i, len(got.Deltas[i].Blocks))
			}
		}
		again, err := decodeBatch(appendBatch(nil, &got))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("re-encoded: %+v %v, want %+v", again, err, got)
		}
	})
}
