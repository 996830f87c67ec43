package wire

import (
	"errors"
	"slices"
	"testing"
)

// FuzzDecode: Decode never panics; errors are typed; a successful decode
// re-encodes (map era) to a payload that decodes to the same Batch; and
// decoding into a dirty, reused Batch gives the same result as a fresh one.
// Seeds: every golden vector, the typical batch in both eras, and
// constructed variants. Regression inputs live in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, v := range loadVectors(f) {
		f.Add(v.payload(f))
	}
	typ := typicalBatch()
	f.Add(mustEncode(f, Encoder{}, typ))
	f.Add(mustEncode(f, Encoder{Era: EraArray, Wide: true}, typ))
	f.Add(mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2}, 4, "GPU", 0}, []any{"BlockRemoved", []any{H}}}}))
	f.Add(mp(kvs{"events", []any{append(map91()[2:], "type", "BlockStored", "extra_keys", []any{[]any{CacheSaltPrefix + "x"}})}, "dp_rank", 1, "ts", 2}))
	f.Add(mp([]any{ts15, []any{kvs{"type", "BlockMoved", "x", 1}, kvs{"type", "BlockRemoved", "block_hashes", []any{raw{0xc4, 4, 1, 2, 3, 4}}, "locality", "REMOTE"}}, nil, 7}))
	f.Add(mp([]any{ts15, []any{[]any{"BlockStored", []any{-5}, nil, []any{1, 2}, 2, nil, "GPU", kvs{"cache_salt", "s", "session_id", "x"}},
		kvs{"type", "BlockStored", "token_ids", []any{-1}}, 5, []any{"BlockRemoved", []any{1.5}}, []any{"BlockRemoved", []any{1}, "DISK"}}, 3}))

	dirty := cloneBatch(typ)
	f.Fuzz(func(t *testing.T, p []byte) {
		var d Decoder
		var fresh Batch
		err := d.Decode(p, &fresh)

		reused := cloneBatch(dirty)
		err2 := d.Decode(p, reused)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("fresh err %v, reused err %v", err, err2)
		}
		if err != nil {
			var de *DecodeError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) {
				t.Fatalf("untyped error %v", err)
			}
			if de.Offset < 0 || de.Offset > len(p) {
				t.Fatalf("offset %d outside payload of %d bytes", de.Offset, len(p))
			}
			switch de.Reason {
			case ReasonTruncated, ReasonEnvelope, ReasonEvent, ReasonHash, ReasonToken, ReasonField, ReasonTrailing:
			default:
				t.Fatalf("unknown reason %q", de.Reason)
			}
			if len(reused.Events) != 0 {
				t.Fatal("batch not emptied after an error")
			}
			return
		}
		if diff := diffBatch(&fresh, reused); diff != "" {
			t.Fatalf("reused batch differs from fresh: %s", diff)
		}
		if fs, rs := fresh.Skipped, reused.Skipped; fs.N != rs.N || (fs.First == nil) != (rs.First == nil) ||
			(fs.First != nil && (fs.First.Reason != rs.First.Reason || fs.First.Offset != rs.First.Offset)) {
			t.Fatalf("skips: fresh %+v, reused %+v", fresh.Skipped, reused.Skipped)
		}
		if f := fresh.Skipped.First; (f == nil) != (fresh.Skipped.Total() == 0) ||
			(f != nil && (f.Offset < 0 || f.Offset > len(p) || !errors.Is(f, ErrMalformed) || !slices.Contains(SkipReasons[:], f.Reason))) {
			t.Fatalf("skips %+v, first %v", fresh.Skipped.N, f)
		}
		if len(fresh.Events)+fresh.Unknown+fresh.Skipped.Total() > len(p) {
			t.Fatalf("%d events, %d unknown, %d skipped from %d bytes", len(fresh.Events), fresh.Unknown, fresh.Skipped.Total(), len(p))
		}
		checkReencode(t, &fresh) // the re-encoding has only the decoded events
	})
}
