// Package events owns prefixd's side of the engine KV-event stream: the vLLM
// wire codec (every era of the msgpack KVEventBatch, decode and encode), and,
// as the stream issue lands, the per-stream sequence cursor, the ZMQ
// subscriber with verified replay, and the test publisher.
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
//     before PR #42892, SGLang, the Dynamo mocker's compact arrays) and
//     tagged maps (vLLM v0.26+). Envelopes of 2, 3 or more elements and map
//     envelopes are accepted.
//   - Block hashes are normalised to uint64 whatever their msgpack form
//     (see docs/wire.md), so int-mode and bytes-mode engines and signed
//     (SGLang) producers yield the same keys.
//   - Unknown event tags are counted in Batch.Unknown and skipped; the
//     rest of the batch is decoded.
//   - Any malformed element fails the whole batch with a *DecodeError
//     (errors.Is(err, ErrMalformed); Reason is a stable metric label). The
//     caller drops and counts the batch; it never applies part of one.
//   - Decode never panics and bounds its memory by the payload size, whatever
//     the headers claim.
//   - Semantic validation (block_size against the model, token coverage,
//     tier mapping, locality; see AppendOps and docs/wire.md) and the
//     KV-cache groups of hybrid models (indexer.Group) are the consumer's
//     job: the codec reports what was sent.
//
// Decoder and Batch are not safe for concurrent use. Slices in a Batch are
// overwritten by the next Decode into it; strings may be kept.
package events
