// Package wire is the vLLM KV-event wire codec: every era of the msgpack
// KVEventBatch (and the SGLang, TensorRT-LLM and Dynamo variants), decoded
// into a Batch and encoded back; the ZMQ frames around a payload (live
// [topic, seq, payload], replay replies and requests); block-hash
// normalisation; and AppendOps, which turns a Batch into indexer ops with
// the filters that keep remote and unknown-medium events out of the index.
// It is pure wire ⇄ types: it does no I/O, and imports the standard
// library, msgp and indexer only (TestNoIOImports proves it).
//
// The codec is allocation-light: a Decoder reuses the Batch it decodes into
// and reads msgpack with zero-copy readers, never reflection.
//
// # Codec contract
//
// The codec does no I/O. Decoder.Decode turns one payload frame into a Batch;
// Encoder.AppendBatch does the reverse, byte-identical to vLLM's msgspec
// output for the supported layouts (golden vectors in testdata/vectors.json:
// msgspec 0.21.1 output for vLLM's structs, hex verbatim).
//
//   - Both event eras are accepted per event: tagged positional arrays (vLLM
//     before PR #42892, SGLang with or without its metadata map, the Dynamo
//     mocker's compact arrays) and tagged maps (vLLM v0.26+, newer SGLang,
//     TensorRT-LLM). Envelopes of 2, 3 or more elements and map envelopes
//     are accepted.
//   - Block hashes are normalised to uint64 whatever their msgpack form
//     (see docs/wire.md), so int-mode and bytes-mode engines and signed
//     (SGLang) producers yield the same keys.
//   - Unknown event tags are counted in Batch.Unknown and skipped; the
//     rest of the batch is decoded.
//   - Fail small: an event that is well-formed msgpack but cannot be
//     decoded (a value of the wrong type or range in a known position, an
//     event that is not a tagged array or map, an unreadable tag) is
//     skipped and counted in Batch.Skipped by kind and reason; the rest
//     of the batch is decoded. Skips.Lossy says whether a skipped event
//     may have removed blocks (a BlockRemoved, an AllBlocksCleared, an
//     untagged event). The stream's Subscriber applies a batch whose
//     skips are all BlockStored and marks the rank degraded (a strict
//     subset), and drops a lossy one, resetting the rank and marking it
//     degraded.
//   - Damage that leaves an event's end unknown (truncation, invalid
//     msgpack) and anything wrong outside the events (the envelope, ts,
//     the rank, trailing bytes) fail the whole batch with a *DecodeError
//     (errors.Is(err, ErrMalformed); Reason is a stable metric label). The
//     caller drops and counts the batch.
//   - Decode never panics and bounds its memory by the payload size, whatever
//     the headers claim.
//   - Semantic validation (block_size against the model, token coverage,
//     tier mapping, locality; see AppendOps and docs/wire.md) and the
//     KV-cache groups of hybrid models (indexer.Group) are the consumer's
//     job: the codec reports what was sent.
//
// Decoder and Batch are not safe for concurrent use. Slices in a Batch are
// overwritten by the next Decode into it; strings may be kept.
package wire
