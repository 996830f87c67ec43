package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// The hot request bodies, /query and /query_by_hash, are read by lexer, a
// strict JSON reader over the whole body held in memory (bounded by
// Config.MaxBodyBytes). encoding/json takes about 860 µs to decode an
// 8,192-token /query body (50 KB) into a []uint32 on the benchmark machine,
// two orders of magnitude more than hashing and matching the prompt, and
// still about 520 µs with TokenIDs reading the array (its scanner reads the
// body twice before any UnmarshalJSON runs); lexer takes about 60 µs
// (BenchmarkDecodeQuery8K), reading the body once, most numbers a word at
// a time, and appending token ids straight into a reused []uint32, never
// through []any, float64 or json.Number, without allocating. Every error it returns names the field concerned
// ("token_ids[3]: -1 is out of range …"), with the byte offset for syntax
// errors.
//
// The cold bodies (/register, /unregister, the selection and plan routes)
// are decoded by encoding/json into the API types (decodeJSON); only their
// token and hash arrays (TokenIDs, HashList) and the bounded lists
// (WorkerIDs, RequiredTaints, TaintWeights, TaintList, Labels) read
// themselves with lexer, in their UnmarshalJSON, so that counts are
// checked before anything is allocated.
//
// lexer accepts exactly the documents encoding/json accepts (FuzzLexer
// checks this against json.Valid and json.Unmarshal), except that nesting
// deeper than maxDepth is rejected. Unknown object keys are skipped, for
// forward compatibility; a repeated key takes its last value, as in
// encoding/json, but keys match exactly (encoding/json ignores case).
// Strings with escapes or non-ASCII bytes are decoded by encoding/json
// itself.

// maxDepth bounds the nesting of skipped (unknown) values.
const maxDepth = 64

// httpError is an error with the status it maps to. msg is what the client
// sees: "<field>: <problem>".
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(field, format string, args ...any) *httpError {
	return &httpError{http.StatusBadRequest, field + ": " + fmt.Sprintf(format, args...)}
}

func tooLarge(field, format string, args ...any) *httpError {
	return &httpError{http.StatusRequestEntityTooLarge, field + ": " + fmt.Sprintf(format, args...)}
}

// readBody reads r's body into s's buffer, which keeps it for the next
// request, within the configured limits. The bytes read count against the
// handler's body budget until s returns to the pool (putScratch).
func (h *handler) readBody(w http.ResponseWriter, r *http.Request, s *scratch) ([]byte, *httpError) {
	body, herr := readBody(w, r, h.cfg.MaxBodyBytes, s.body, &h.bodies, &s.held)
	s.body = body
	return body, herr
}

// readBody reads r's body into buf (reused) and returns it. A body over
// limit bytes is a 413. buf grows only as bytes arrive, by doubling, and
// never beyond the claimed Content-Length (+1 to see the end) or limit+1:
// a client that claims 8 MiB and sends 10 bytes costs 4 KiB, not 8 MiB.
// Every byte buf grows by is taken from budget before it is allocated and
// added to *held, which the caller gives back when it is done with the
// body: the budget bounds the memory the bodies in flight hold, not only
// the bytes that arrived (doubling allocates up to twice those). A body
// that does not fit the budget is a 503. A body that is still arriving
// when the server's read deadline passes (ServerConfig.ReadTimeout) is a
// 408.
func readBody(w http.ResponseWriter, r *http.Request, limit int, buf []byte, budget *bodyBudget, held *int64) ([]byte, *httpError) {
	if r.ContentLength > int64(limit) {
		return buf[:0], tooLarge("body", "%d bytes exceeds the limit of %d", r.ContentLength, limit)
	}
	want := limit // the most the body can be
	if r.ContentLength >= 0 {
		want = int(r.ContentLength)
	}
	body := http.MaxBytesReader(w, r.Body, int64(limit))
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			// Full of bytes that did arrive: double, up to the room needed
			// to see the end of the longest body still possible.
			c := max(2*cap(buf), 4096)
			if c >= want {
				c = want + 1
			}
			c = max(c, len(buf)+1)
			if grow := c - cap(buf); !budget.take(grow) {
				w.Header().Set("Retry-After", "1")
				return buf, &httpError{http.StatusServiceUnavailable,
					fmt.Sprintf("body: request bodies in flight exceed the server's budget of %d bytes; retry later", budget.limit)}
			} else {
				*held += int64(grow)
			}
			nb := make([]byte, len(buf), c)
			copy(nb, buf)
			buf = nb
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			var ne net.Error
			switch {
			case errors.As(err, &mbe):
				return buf, tooLarge("body", "exceeds the limit of %d bytes", limit)
			case errors.As(err, &ne) && ne.Timeout():
				return buf, &httpError{http.StatusRequestTimeout, fmt.Sprintf("body: not received in time (%d bytes arrived)", len(buf))}
			}
			return buf, badRequest("body", "read: %v", err)
		}
	}
}

// bodyBudget bounds the bytes of request bodies that requests in flight
// hold, over every request of the handler (one per process in the
// daemon). Bytes are taken as they arrive and given back when the request
// is done with its body. Safe for concurrent use.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

// take takes n bytes, or reports false (taking nothing) if they do not fit.
func (b *bodyBudget) take(n int) bool {
	if b.used.Add(int64(n)) > b.limit {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

// give gives back n bytes taken.
func (b *bodyBudget) give(n int64) { b.used.Add(-n) }

// lexer reads one JSON document. pos is the offset of the next unread byte.
type lexer struct {
	data   []byte
	pos    int
	member int // where the object member being read starts (its key)
}

// ws skips whitespace.
func (l *lexer) ws() {
	for l.pos < len(l.data) {
		switch l.data[l.pos] {
		case ' ', '\t', '\n', '\r':
			l.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, or 0 at the end.
func (l *lexer) peek() byte {
	l.ws()
	if l.pos < len(l.data) {
		return l.data[l.pos]
	}
	return 0
}

func (l *lexer) syntax(field, format string, args ...any) *httpError {
	return badRequest(field, "invalid JSON at offset %d: %s", l.pos, fmt.Sprintf(format, args...))
}

// end returns err, or a syntax error if anything but whitespace follows
// the value read (an UnmarshalJSON method is given exactly one value, so
// this only guards direct calls).
func (l *lexer) end(field string, err error) error {
	if err == nil {
		if l.ws(); l.pos != len(l.data) {
			return l.syntax(field, "data after the value")
		}
	}
	return err
}

// kind names the JSON value that starts with c, or "" if none does.
func kind(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || isDigit(c):
		return "a number"
	}
	return ""
}

func isDigit(c byte) bool { return c-'0' <= 9 }

// unexpected reports the value at pos as being of the wrong type (want),
// or a syntax error if no value starts there.
func (l *lexer) unexpected(field, want string) *httpError {
	c := l.peek()
	if k := kind(c); k != "" {
		return badRequest(field, "must be %s, got %s", want, k)
	}
	return l.valueExpected(field)
}

func (l *lexer) valueExpected(field string) *httpError {
	if l.pos >= len(l.data) {
		return l.syntax(field, "unexpected end of input")
	}
	return l.syntax(field, "expected a value, got %q", l.data[l.pos])
}

// document reads the whole body as one object, calling f for each key.
func (l *lexer) document(f func(key string) error) error {
	if l.peek() == 0 && l.pos == len(l.data) {
		return badRequest("body", "empty; expected a JSON object")
	}
	if err := l.object("body", 1, f); err != nil {
		return err
	}
	if l.ws(); l.pos != len(l.data) {
		return l.syntax("body", "data after the JSON object")
	}
	return nil
}

// object reads an object. For each key it calls f with pos at the value;
// f must consume exactly the value. field names the object in errors.
func (l *lexer) object(field string, depth int, f func(key string) error) error {
	if l.peek() != '{' {
		return l.unexpected(field, "an object")
	}
	if depth > maxDepth {
		return badRequest(field, "nested deeper than %d levels", maxDepth)
	}
	l.pos++
	if l.peek() == '}' {
		l.pos++
		return nil
	}
	for {
		if l.peek() != '"' {
			if l.pos >= len(l.data) {
				return l.syntax(field, "unexpected end of input")
			}
			return l.syntax(field, "expected a string key, got %q", l.data[l.pos])
		}
		l.member = l.pos
		key, err := l.key(field)
		if err != nil {
			return err
		}
		if l.peek() != ':' {
			return l.syntax(field, "expected ':' after key %q", clip.N(key, maxEcho))
		}
		l.pos++
		if err := f(key); err != nil {
			return err
		}
		switch l.peek() {
		case ',':
			l.pos++
		case '}':
			l.pos++
			return nil
		default:
			return l.syntax(field, "expected ',' or '}' after the value of %q", clip.N(key, maxEcho))
		}
	}
}

// array reads an array, calling f for element i with pos at the element.
func (l *lexer) array(field string, depth int, f func(i int) error) error {
	if l.peek() != '[' {
		return l.unexpected(field, "an array")
	}
	if depth > maxDepth {
		return badRequest(field, "nested deeper than %d levels", maxDepth)
	}
	l.pos++
	if l.peek() == ']' {
		l.pos++
		return nil
	}
	for i := 0; ; i++ {
		if err := f(i); err != nil {
			return err
		}
		if err := l.elemEnd(field); err != nil || l.data[l.pos-1] == ']' {
			return err
		}
	}
}

// elemEnd consumes the ',' or ']' after an array element.
func (l *lexer) elemEnd(field string) error {
	switch l.peek() {
	case ',':
		l.pos++
		return nil
	case ']':
		l.pos++
		return nil
	}
	if l.pos >= len(l.data) {
		return l.syntax(field, "unexpected end of input")
	}
	return l.syntax(field, "expected ',' or ']', got %q", l.data[l.pos])
}

// null consumes a null literal if one is next.
func (l *lexer) null() (bool, error) {
	if l.peek() != 'n' {
		return false, nil
	}
	return true, l.literal("", "null")
}

func (l *lexer) literal(field, lit string) error {
	if len(l.data)-l.pos < len(lit) || string(l.data[l.pos:l.pos+len(lit)]) != lit {
		return l.syntax(field, "invalid literal, expected %s", lit)
	}
	l.pos += len(lit)
	return nil
}

// skip consumes one value of any type, checking its syntax.
func (l *lexer) skip(field string, depth int) error {
	switch c := l.peek(); {
	case c == '{':
		return l.object(field, depth+1, func(string) error { return l.skip(field, depth+1) })
	case c == '[':
		return l.array(field, depth+1, func(int) error { return l.skip(field, depth+1) })
	case c == '"':
		_, err := l.strEnd(field, l.pos)
		return err
	case c == 't':
		return l.literal(field, "true")
	case c == 'f':
		return l.literal(field, "false")
	case c == 'n':
		return l.literal(field, "null")
	case c == '-' || isDigit(c):
		if _, _, p := l.number(); p != "" {
			return l.syntax(field, "%s", p)
		}
		return nil
	}
	return l.valueExpected(field)
}

// str reads a string (pos at its opening quote).
func (l *lexer) str(field string) (string, error) {
	start := l.pos + 1
	for i := start; i < len(l.data); i++ {
		switch c := l.data[i]; {
		case c == '"':
			l.pos = i + 1
			return string(l.data[start:i]), nil
		case c == '\\' || c >= 0x80:
			end, err := l.strEnd(field, start-1)
			if err != nil {
				return "", err
			}
			var s string
			if err := json.Unmarshal(l.data[start-1:end], &s); err != nil {
				return "", badRequest(field, "invalid JSON string at offset %d: %v", start-1, err)
			}
			return s, nil
		case c < 0x20:
			l.pos = i
			return "", l.syntax(field, "control character %#02x in string", c)
		}
	}
	l.pos = len(l.data)
	return "", l.syntax(field, "unterminated string")
}

// hotKeys are the keys of the hot bodies, which key returns without
// allocating.
var hotKeys = [...]string{"token_ids", "model_name", "block_hashes", "routing_group", "lora_name", "cache_salt"}

// key reads an object key (pos at its opening quote) as str does. A key
// whose bytes are those of a hot key (so it has no escapes) is that
// string of hotKeys, not a copy.
func (l *lexer) key(field string) (string, error) {
	start := l.pos + 1
	if n := bytes.IndexByte(l.data[start:], '"'); n >= 0 {
		k := l.data[start : start+n]
		for _, h := range hotKeys {
			if string(k) == h {
				l.pos = start + n + 1
				return h, nil
			}
		}
	}
	return l.str(field)
}

// strEnd checks the string starting at the quote at offset q, moves past
// it and returns the offset after its closing quote.
func (l *lexer) strEnd(field string, q int) (int, error) {
	for i := q + 1; i < len(l.data); i++ {
		switch c := l.data[i]; {
		case c == '"':
			l.pos = i + 1
			return l.pos, nil
		case c < 0x20:
			l.pos = i
			return 0, l.syntax(field, "control character %#02x in string", c)
		case c == '\\':
			i++
			if i >= len(l.data) {
				break
			}
			switch l.data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for j := 1; j <= 4; j++ {
					if i+j >= len(l.data) || !isHex(l.data[i+j]) {
						l.pos = min(i+j, len(l.data))
						return 0, l.syntax(field, "invalid \\u escape in string")
					}
				}
				i += 4
			default:
				l.pos = i
				return 0, l.syntax(field, "invalid escape '\\%c' in string", l.data[i])
			}
		}
	}
	l.pos = len(l.data)
	return 0, l.syntax(field, "unterminated string")
}

func isHex(c byte) bool { return isDigit(c) || (c|0x20)-'a' < 6 }

// number reads a number and returns its text and whether it is an integer
// (no fraction or exponent). On a syntax error, problem describes it and
// pos is at the offending byte.
func (l *lexer) number() (raw []byte, isInt bool, problem string) {
	d, start := l.data, l.pos
	i := start
	if i < len(d) && d[i] == '-' {
		i++
	}
	digits := func() bool {
		j := i
		for i < len(d) && isDigit(d[i]) {
			i++
		}
		return i > j
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		l.pos = i
		return nil, false, "invalid number"
	}
	isInt = true
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			l.pos = i
			return nil, false, "invalid number: no digits after '.'"
		}
		isInt = false
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			l.pos = i
			return nil, false, "invalid number: no digits in the exponent"
		}
		isInt = false
	}
	l.pos = i
	return d[start:i], isInt, ""
}

// parseDigits parses a run of decimal digits; ok is false on overflow.
// Up to 19 digits cannot overflow (10^19 − 1 < 2^64), so they take no
// check; longer runs (a block hash is often 20) check each step with
// bits.Mul64 and bits.Add64 rather than a division per digit.
func parseDigits(b []byte) (v uint64, ok bool) {
	if len(b) <= 19 {
		for _, c := range b {
			v = v*10 + uint64(c-'0')
		}
		return v, true
	}
	for _, c := range b {
		hi, lo := bits.Mul64(v, 10)
		lo, carry := bits.Add64(lo, uint64(c-'0'), 0)
		if hi|carry != 0 {
			return 0, false
		}
		v = lo
	}
	return v, true
}

// The token and hash arrays are read a word at a time (SWAR) where at
// least 8 bytes remain: digitRun finds where a number's digits end and
// digitsValue converts up to 8 of them, without a branch per digit (the
// lengths of token ids vary, and a loop exiting at a varying digit
// mispredicts about once a number).
const (
	lowBytes  = 0x0101010101010101 // 0x01 in every byte
	highBytes = 0x8080808080808080 // every byte's high bit
)

// le64 loads 8 bytes of b, the first the lowest.
func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// digitRun returns how many bytes of w, from its lowest (the first in
// memory), are ASCII digits before the first that is not: 0–8.
func digitRun(w uint64) int {
	low := w &^ highBytes                 // each byte's low 7 bits: adding below never carries out of a byte
	atLeast0 := low + (0x80-'0')*lowBytes // high bit set where low ≥ '0'
	above9 := low + (0x80-'9'-1)*lowBytes // high bit set where low > '9'
	digits := atLeast0 &^ above9 &^ w & highBytes
	return bits.TrailingZeros64(^digits&highBytes) >> 3
}

// digitsValue returns the value of the ASCII digits in the first n bytes
// (1–8) of w, the first byte the most significant digit: the digits are
// shifted to the top, below them zero bytes counting as leading zeros,
// then combined pairwise (2, 4, then 8 digits per lane) by three
// multiplications.
func digitsValue(w uint64, n int) uint64 {
	w <<= (64 - 8*uint(n)) & 63
	w = (w & 0x0F0F0F0F0F0F0F0F) * (10<<8 + 1) >> 8
	w = (w & 0x00FF00FF00FF00FF) * (100<<16 + 1) >> 16
	return (w & 0x0000FFFF0000FFFF) * (10000<<32 + 1) >> 32
}

// pow10 holds 10^n for the digit counts of one word.
var pow10 = [9]uint64{1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000}

// hashAt reads the block hash at d[i:] and the comma after it, on the
// fast path: an optional '-' and 1–19 digits without a leading zero
// (every int64, as Dynamo sends them, and unsigned values below 10^19),
// a negative value no lower than -2^63, then ',', all in words of d. It
// returns the hash and the offset after the comma; ok is false for
// anything else, which the caller reads on the checked path
// (lexer.hash).
func hashAt(d []byte, i int) (v uint64, next int, ok bool) {
	j := i
	neg := j < len(d) && d[j] == '-'
	if neg {
		j++
	}
	first := j
	for {
		if len(d)-j < 8 {
			return 0, i, false
		}
		w := le64(d[j:])
		n := digitRun(w)
		if n > 0 {
			v = v*pow10[n] + digitsValue(w, n) // wraps only past 19 digits, refused below
		}
		j += n
		if j-first > 19 {
			return 0, i, false
		}
		if n < 8 {
			if byte(w>>(8*n)) != ',' {
				return 0, i, false
			}
			break
		}
	}
	switch {
	case j == first, j-first > 1 && d[first] == '0':
		return 0, i, false
	case neg && v > 1<<63:
		return 0, i, false
	case neg:
		return -v, j + 1, true // two's complement: the int64 bit pattern of -v
	}
	return v, j + 1, true
}

// uint reads a non-negative integer no larger than max.
func (l *lexer) uint(field string, max uint64) (uint64, error) {
	if c := l.peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(field, "a non-negative integer")
	}
	raw, isInt, p := l.number()
	if p != "" {
		return 0, l.syntax(field, "%s", p)
	}
	if !isInt {
		return 0, badRequest(field, "%s is not an integer", clip.N(raw, maxEcho))
	}
	if raw[0] != '-' {
		if v, ok := parseDigits(raw); ok && v <= max {
			return v, nil
		}
	}
	return 0, badRequest(field, "%s is out of range [0, %d]", clip.N(raw, maxEcho), max)
}

// at names element i of field (or field itself when i < 0); it is only
// formatted on error paths.
func at(field string, i int) string {
	if i < 0 {
		return field
	}
	return fmt.Sprintf("%s[%d]", field, i)
}

// hash reads a block hash, element i of field: an integer in
// [-2^63, 2^64-1]; negative values are int64 bit patterns (Dynamo sends
// hashes ≥ 2^63 that way).
func (l *lexer) hash(field string, i int) (uint64, error) {
	if c := l.peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(at(field, i), "an integer")
	}
	raw, isInt, p := l.number()
	if p != "" {
		return 0, l.syntax(at(field, i), "%s", p)
	}
	if !isInt {
		return 0, badRequest(at(field, i), "%s is not an integer", clip.N(raw, maxEcho))
	}
	if raw[0] != '-' {
		if v, ok := parseDigits(raw); ok {
			return v, nil
		}
	} else if v, ok := parseDigits(raw[1:]); ok && v <= 1<<63 {
		return -v, nil // two's complement: the int64 bit pattern of -v
	}
	return 0, badRequest(at(field, i), "%s is out of range [-2^63, 2^64-1]", clip.N(raw, maxEcho))
}

// float reads a finite number.
func (l *lexer) float(field string) (float64, error) {
	if c := l.peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(field, "a number")
	}
	raw, _, p := l.number()
	if p != "" {
		return 0, l.syntax(field, "%s", p)
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, badRequest(field, "%s is out of range", clip.N(raw, maxEcho))
	}
	return f, nil
}

// string reads a string; null counts as "" when nullOK.
func (l *lexer) string(field string, nullOK bool) (string, error) {
	switch c := l.peek(); {
	case c == '"':
		return l.str(field)
	case c == 'n' && nullOK:
		return "", l.literal(field, "null")
	}
	return "", l.unexpected(field, "a string")
}

// tokens appends the token ids of an array to dst: integers in
// [0, 2^32-1], at most limit of them (more is a 413).
//
// Most of an array is read by tokenBlocks, 64 bytes at a time, and what
// it leaves by fastTokens, a word at a time; what they leave — an id of
// 8 or more digits, whitespace other than one space after a comma, the
// last element, the room in dst exhausted, or an error — takes one
// element on the general path here, then they resume.
func (l *lexer) tokens(field string, dst []uint32, limit int) ([]uint32, error) {
	if l.peek() != '[' {
		return dst, l.unexpected(field, "an array of token ids")
	}
	l.pos++
	if l.peek() == ']' {
		l.pos++
		return dst, nil
	}
	d, i := l.data, l.pos
	// Blocks are tried from blocksFrom on; each block off their path in a
	// row doubles the bytes read without them (a pretty-printed array
	// would otherwise classify a block for every element).
	blocksFrom, misses := i, 0
	for n := 0; ; n++ {
		var k int
		if i >= blocksFrom {
			var stuck bool
			dst, i, k, stuck = tokenBlocks(d, i, dst, limit-n)
			n += k
			if k > 0 {
				misses = 0
			}
			if stuck {
				misses++
				blocksFrom = i + 64<<min(misses, 16)
			}
		}
		dst, i, k = fastTokens(d, i, dst, limit-n)
		n += k
		for i < len(d) && d[i] <= ' ' && isSpace(d[i]) {
			i++
		}
		// 1–10 digits, no leading zero, ≤ 2^32-1, not followed by a
		// fraction or exponent. Anything else takes the checked path (v
		// may have wrapped past 20 digits; the length test rejects it).
		j := i
		var v uint64
		for ; j < len(d); j++ {
			c := d[j] - '0'
			if c > 9 {
				break
			}
			v = v*10 + uint64(c)
		}
		ok := j > i && j-i <= 10 && v <= math.MaxUint32 && (d[i] != '0' || j == i+1)
		if ok && j < len(d) && (d[j] == '.' || d[j]|0x20 == 'e') {
			ok = false
		}
		if !ok {
			l.pos = i
			var err error
			if v, err = l.uint(at(field, n), math.MaxUint32); err != nil {
				return dst, err
			}
			j = l.pos
		}
		if n == limit {
			l.pos = j
			return dst, tooLarge(field, "more than %d tokens", limit)
		}
		if len(dst) == cap(dst) { // double (append grows large slices by 1.25×)
			nd := make([]uint32, len(dst), min(max(2*cap(dst), 1024), limit))
			copy(nd, dst)
			dst = nd
		}
		dst = append(dst, uint32(v))
		next, done, err := l.elemNext(field, j)
		if done || err != nil {
			return dst, err
		}
		i = next
	}
}

// fastTokens appends to dst, within its capacity and at most max, the
// token ids at d[i:] that each fit a word of d with the comma after
// them: 1–7 digits, no leading zero, then ',' (and one space after it
// is skipped, as Python's json.dumps writes ", "). It returns dst, the
// offset of the first byte it did not read and how many ids it read.
func fastTokens(d []byte, i int, dst []uint32, max int) ([]uint32, int, int) {
	spare := dst[len(dst):cap(dst)]
	spare = spare[:min(len(spare), max)]
	k := 0
	for k < len(spare) && len(d)-i >= 8 {
		w := le64(d[i:])
		n := digitRun(w)
		if uint(n-1) < 7 && byte(w>>(8*uint(n)&63)) == ',' && (n == 1 || byte(w) != '0') {
			spare[k] = uint32(digitsValue(w, n))
			k++
			i += n + 1
			continue
		}
		if n == 0 && byte(w) == ' ' && d[i-1] == ',' {
			i++
			continue
		}
		break
	}
	return dst[:len(dst)+k], i, k
}

// elemNext reads what follows an array element that ends at j:
// whitespace, then a comma (next is the offset after it) or the closing
// ']' (done, l.pos after it); anything else is the syntax error.
func (l *lexer) elemNext(field string, j int) (next int, done bool, err error) {
	d := l.data
	for j < len(d) && d[j] <= ' ' && isSpace(d[j]) {
		j++
	}
	if j < len(d) && d[j] == ',' {
		return j + 1, false, nil
	}
	l.pos = j
	if j < len(d) && d[j] == ']' {
		l.pos++
		return 0, true, nil
	}
	return 0, false, l.elemEnd(field)
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// hashes appends the block hashes of an array to dst, at most limit.
func (l *lexer) hashes(field string, dst []uint64, limit int) ([]uint64, error) {
	if l.peek() != '[' {
		return dst, l.unexpected(field, "an array of block hashes")
	}
	l.pos++
	if l.peek() == ']' {
		l.pos++
		return dst, nil
	}
	d, i := l.data, l.pos
	for n := 0; ; n++ {
		for n < limit { // the fast path
			v, next, ok := hashAt(d, i)
			if !ok {
				break
			}
			dst = append(dst, v)
			n++
			i = next
		}
		for i < len(d) && d[i] <= ' ' && isSpace(d[i]) {
			i++
		}
		if n == limit {
			l.pos = i
			return dst, tooLarge(field, "more than %d hashes", limit)
		}
		l.pos = i
		v, err := l.hash(field, n)
		if err != nil {
			return dst, err
		}
		j := l.pos
		dst = append(dst, v)
		next, done, err := l.elemNext(field, j)
		if done || err != nil {
			return dst, err
		}
		i = next
	}
}

// strings reads an array of at most maxItems strings (null → nil), each
// of at most maxBytes bytes if maxBytes > 0.
func (l *lexer) strings(field string, maxItems, maxBytes int) ([]string, error) {
	if isNull, err := l.null(); isNull || err != nil {
		return nil, err
	}
	out := []string{}
	err := l.array(field, 2, func(i int) error {
		if i == maxItems {
			return tooLarge(field, "more than %d strings", maxItems)
		}
		s, err := l.string(at(field, i), false)
		if err == nil && maxBytes > 0 && len(s) > maxBytes {
			return badRequest(at(field, i), "%q is longer than %d bytes", clip.N(s, maxEcho), maxBytes)
		}
		out = append(out, s)
		return err
	})
	return out, err
}

// stringMap reads an object of at most maxItems strings (null → nil).
func (l *lexer) stringMap(field string, maxItems int) (map[string]string, error) {
	if isNull, err := l.null(); isNull || err != nil {
		return nil, err
	}
	out := map[string]string{}
	n := 0
	err := l.object(field, 2, func(k string) error {
		if n++; n > maxItems {
			return tooLarge(field, "more than %d entries", maxItems)
		}
		s, err := l.string(field+"."+clip.N(k, maxEcho), false)
		out[k] = s
		return err
	})
	return out, err
}

// decodeJSON decodes a cold request body (/register, /unregister, the
// selection and plan routes) into v with encoding/json, v's JSON tags being
// the wire. A first pass of the lexer checks the syntax, so syntax errors
// read as on /query ("body: invalid JSON at offset N: …", or the field
// whose value is malformed), and returns the top-level keys given a value
// other than null, lower-cased (encoding/json matches keys regardless of
// case): the required-field checks that follow decoding use it. bounds
// gives the range [0, bound] of the integer fields checked after decoding
// (data_parallel_size, isl_tokens), for the wording of a value beyond their
// Go type's range.
//
// The top-level fields in own are read by that first pass itself (keys
// matched regardless of case, a repeated key taking its last value, as in
// encoding/json) and left out of what encoding/json is given: the token
// and hash arrays, because encoding/json's scanner reads every byte of a
// body twice before a field's UnmarshalJSON runs (for an 8,192-token plan
// body about 600 µs of the 700 µs it would take, BenchmarkDecodePlan8K);
// and lists whose length must be bounded before anything is allocated for
// them (a worker's taints and topology domains).
func decodeJSON(body []byte, v any, bounds map[string]uint64, own ...ownField) (have map[string]bool, err error) {
	have = map[string]bool{}
	var kept [][2]int // the members encoding/json reads, when some are not
	cut := false
	l := &lexer{data: body}
	if err := l.document(func(key string) error {
		if c := l.peek(); c != 'n' {
			have[strings.ToLower(key)] = true
		}
		member := l.member
		for _, f := range own {
			if strings.EqualFold(key, f.name) {
				cut = true
				return f.read(l)
			}
		}
		err := l.skip(clip.N(key, maxEcho), 1)
		kept = append(kept, [2]int{member, l.pos})
		return err
	}); err != nil {
		return have, err
	}
	if cut {
		rest := make([]byte, 0, 2+len(kept)+func() (n int) {
			for _, m := range kept {
				n += m[1] - m[0]
			}
			return n
		}())
		rest = append(rest, '{')
		for i, m := range kept {
			if i > 0 {
				rest = append(rest, ',')
			}
			rest = append(rest, body[m[0]:m[1]]...)
		}
		body = append(rest, '}')
	}
	return have, jsonError(json.Unmarshal(body, v), bounds)
}

// ownField is a top-level field decodeJSON reads with the lexer: read
// consumes its value (which may be null) at l.pos.
type ownField struct {
	name string
	read func(l *lexer) error
}

// promptFields are the hot arrays of a selection or plan body's prompt p,
// read within the route's limits.
func promptFields(p *Prompt, maxTokens, maxHashes int) []ownField {
	return []ownField{
		{"token_ids", func(l *lexer) error {
			if isNull, err := l.null(); isNull || err != nil {
				p.TokenIDs = nil
				return err
			}
			v, err := l.tokens("token_ids", p.TokenIDs[:0], maxTokens)
			p.TokenIDs = v
			return err
		}},
		{"block_hashes", func(l *lexer) error {
			if isNull, err := l.null(); isNull || err != nil {
				p.BlockHashes = nil
				return err
			}
			v, err := l.hashes("block_hashes", p.BlockHashes[:0], maxHashes)
			p.BlockHashes = v
			return err
		}},
	}
}

// jsonError maps an encoding/json error to "<field>: <problem>", worded as
// the lexer words it. Errors of UnmarshalJSON methods (*httpError) pass
// through.
func jsonError(err error, bounds map[string]uint64) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return typeError(te, bounds)
	case errors.As(err, &se):
		return badRequest("body", "invalid JSON at offset %d: %s", se.Offset, se)
	}
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	return badRequest("body", "%s", clip.N(err.Error(), maxEcho))
}

// typeError words a value of the wrong type, or a number out of its
// field's range (bounds, or its type's).
func typeError(e *json.UnmarshalTypeError, bounds map[string]uint64) *httpError {
	// e.Field is the path of wire names, with the Go names of embedded
	// structs (Prompt, Extensions, …) among them: wire names are lower case.
	var parts []string
	for p := range strings.SplitSeq(e.Field, ".") {
		if p != "" && !unicode.IsUpper(rune(p[0])) {
			parts = append(parts, p)
		}
	}
	field := strings.Join(parts, ".")
	if field == "" {
		field = "body"
	}
	t := e.Type
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	bound, bounded := bounds[field]
	if lit, ok := strings.CutPrefix(e.Value, "number "); ok {
		lit = clip.N(lit, maxEcho)
		switch {
		case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
			return badRequest(field, "%s is out of range", lit)
		case strings.ContainsAny(lit, ".eE"):
			return badRequest(field, "%s is not an integer", lit)
		case bounded:
			return badRequest(field, "%s is out of range [0, %d]", lit, bound)
		case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr:
			return badRequest(field, "%s is out of range [0, %d]", lit, uint64(1)<<(t.Bits()-1)*2-1)
		case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
			return badRequest(field, "%s is out of range [%d, %d]", lit, -int64(1)<<(t.Bits()-1), int64(1)<<(t.Bits()-1)-1)
		}
	}
	got := map[string]string{"string": "a string", "number": "a number", "array": "an array", "object": "an object", "bool": "a boolean"}[e.Value]
	if got == "" {
		got = clip.N(e.Value, maxEcho)
	}
	want := wantKind(t)
	if bounded {
		want = "a non-negative integer"
	}
	return badRequest(field, "must be %s, got %s", want, got)
}

// wantKind names the JSON value a Go type decodes from.
func wantKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a non-negative integer"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}
