// Package jsonlex is a strict JSON reader for documents held in memory,
// for the API's hot request bodies: it reads a document once, token ids
// and block hashes straight into caller-owned []uint32 and []uint64 (a
// word at a time, and token ids 64 bytes at a time by scanBlocks, SSE2
// assembly on amd64; the purego build tag and other platforms read a word
// at a time), never through []any, float64 or json.Number, and checks
// every count against its limit before it allocates for it.
// encoding/json's scanner reads a body twice before an UnmarshalJSON
// method sees it; BenchmarkDecodeQuery8K in internal/apiserver measures
// what this saves on an 8,192-token /query.
//
// A Lexer accepts exactly the documents encoding/json accepts (FuzzLexer
// checks it against json.Valid and json.Unmarshal), except that nesting
// deeper than 64 levels is refused. Every error is an *Error naming the
// field concerned ("token_ids[3]: -1 is out of range …"), with the byte
// offset for syntax errors. Strings with escapes or non-ASCII bytes are
// decoded by encoding/json itself.
//
// Callers read a document by its keys: Document calls back for each
// top-level key with the Lexer at the value, and the callback reads the
// value with one of the typed readers (Tokens, Hashes, Uint, Float, Bool,
// String, Strings, StringMap, Object, Array, Null) or passes over it with
// Skip. A repeated key is read each time, so the last value wins, as in
// encoding/json; keys match exactly (encoding/json ignores case).
package jsonlex
