package wire

import (
	"testing"
)

// BenchmarkDecodeTypical: 4 BlockStored × 16 blocks × 16 tokens, as vLLM
// fills them (parent, extra_keys, group_idx, kv_cache_spec_kind), decoded
// into a reused Batch.
func BenchmarkDecodeTypical(b *testing.B) {
	typ := typicalBatch()
	blocks := 0
	for _, ev := range typ.Events {
		blocks += len(ev.BlockHashes)
	}
	for _, l := range []layout{
		{"map", Encoder{}},
		{"array", Encoder{Era: EraArray, Wide: true}},
		{"map-bytes-hash", Encoder{Hash: HashBytes}},
	} {
		b.Run(l.name, func(b *testing.B) {
			p := mustEncode(b, l.enc, typ)
			var d Decoder
			var batch Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(p, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkEncodeTypical encodes the same batch into a reused buffer.
func BenchmarkEncodeTypical(b *testing.B) {
	typ := typicalBatch()
	for _, l := range []layout{
		{"map", Encoder{}},
		{"array", Encoder{Era: EraArray, Wide: true}},
	} {
		b.Run(l.name, func(b *testing.B) {
			buf := mustEncode(b, l.enc, typ)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = l.enc.AppendBatch(buf[:0], typ); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
