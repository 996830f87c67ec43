package jsonlex

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"strconv"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// maxDepth bounds the nesting of skipped (unknown) values.
const maxDepth = 64

// Error is a problem with a document, naming the field at fault. Its text
// is "<field>: <problem>"; the problem quotes at most clip.Echo bytes of
// any value it repeats.
type Error struct {
	Field   string
	Problem string
	// Over is set when a list held more elements than its limit (the
	// document may be fine): an HTTP server answers 413 for it, 400 for
	// the rest.
	Over bool
}

func (e *Error) Error() string { return e.Field + ": " + e.Problem }

func invalid(field, format string, args ...any) *Error {
	return &Error{Field: field, Problem: fmt.Sprintf(format, args...)}
}

func over(field, format string, args ...any) *Error {
	return &Error{Field: field, Problem: fmt.Sprintf(format, args...), Over: true}
}

// New returns a Lexer over data. An object key whose bytes equal one of
// keys is returned as that string rather than a copy, so reading the
// keys a caller expects allocates nothing.
func New(data []byte, keys ...string) Lexer { return Lexer{data: data, hot: keys} }

// Pos is the offset of the next unread byte.
func (l *Lexer) Pos() int { return l.pos }

// Member is the offset of the key of the object member being read (valid
// in an Object or Document callback).
func (l *Lexer) Member() int { return l.member }

// At names element i of field (field itself when i < 0); it formats only
// when called, so callers build it on error paths.
func At(field string, i int) string {
	if i < 0 {
		return field
	}
	return fmt.Sprintf("%s[%d]", field, i)
}

// A Lexer reads one JSON document held in memory. The zero value reads
// an empty document; New returns one over data. A Lexer is not safe for
// concurrent use; it does not retain data beyond the document's read.
type Lexer struct {
	data   []byte
	pos    int
	member int // where the object member being read starts (its key)
	hot    []string
}

// ws skips whitespace.
func (l *Lexer) ws() {
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
func (l *Lexer) Peek() byte {
	l.ws()
	if l.pos < len(l.data) {
		return l.data[l.pos]
	}
	return 0
}

func (l *Lexer) syntax(field, format string, args ...any) *Error {
	return invalid(field, "invalid JSON at offset %d: %s", l.pos, fmt.Sprintf(format, args...))
}

// end returns err, or a syntax error if anything but whitespace follows
// the value read (an UnmarshalJSON method is given exactly one value, so
// this only guards direct calls).
func (l *Lexer) End(field string, err error) error {
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
func (l *Lexer) unexpected(field, want string) *Error {
	c := l.Peek()
	if k := kind(c); k != "" {
		return invalid(field, "must be %s, got %s", want, k)
	}
	return l.valueExpected(field)
}

func (l *Lexer) valueExpected(field string) *Error {
	if l.pos >= len(l.data) {
		return l.syntax(field, "unexpected end of input")
	}
	return l.syntax(field, "expected a value, got %q", l.data[l.pos])
}

// document reads the whole body as one object, calling f for each key.
func (l *Lexer) Document(f func(key string) error) error {
	if l.Peek() == 0 && l.pos == len(l.data) {
		return invalid("body", "empty; expected a JSON object")
	}
	if err := l.Object("body", 1, f); err != nil {
		return err
	}
	if l.ws(); l.pos != len(l.data) {
		return l.syntax("body", "data after the JSON object")
	}
	return nil
}

// object reads an object. For each key it calls f with pos at the value;
// f must consume exactly the value. field names the object in errors.
func (l *Lexer) Object(field string, depth int, f func(key string) error) error {
	if l.Peek() != '{' {
		return l.unexpected(field, "an object")
	}
	if depth > maxDepth {
		return invalid(field, "nested deeper than %d levels", maxDepth)
	}
	l.pos++
	if l.Peek() == '}' {
		l.pos++
		return nil
	}
	for {
		if l.Peek() != '"' {
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
		if l.Peek() != ':' {
			return l.syntax(field, "expected ':' after key %q", clip.N(key, clip.Echo))
		}
		l.pos++
		if err := f(key); err != nil {
			return err
		}
		switch l.Peek() {
		case ',':
			l.pos++
		case '}':
			l.pos++
			return nil
		default:
			return l.syntax(field, "expected ',' or '}' after the value of %q", clip.N(key, clip.Echo))
		}
	}
}

// array reads an array, calling f for element i with pos at the element.
func (l *Lexer) Array(field string, depth int, f func(i int) error) error {
	if l.Peek() != '[' {
		return l.unexpected(field, "an array")
	}
	if depth > maxDepth {
		return invalid(field, "nested deeper than %d levels", maxDepth)
	}
	l.pos++
	if l.Peek() == ']' {
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
func (l *Lexer) elemEnd(field string) error {
	switch l.Peek() {
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
func (l *Lexer) Null() (bool, error) {
	if l.Peek() != 'n' {
		return false, nil
	}
	return true, l.literal("", "null")
}

func (l *Lexer) literal(field, lit string) error {
	if len(l.data)-l.pos < len(lit) || string(l.data[l.pos:l.pos+len(lit)]) != lit {
		return l.syntax(field, "invalid literal, expected %s", lit)
	}
	l.pos += len(lit)
	return nil
}

// skip consumes one value of any type, checking its syntax.
func (l *Lexer) Skip(field string, depth int) error {
	switch c := l.Peek(); {
	case c == '{':
		return l.Object(field, depth+1, func(string) error { return l.Skip(field, depth+1) })
	case c == '[':
		return l.Array(field, depth+1, func(int) error { return l.Skip(field, depth+1) })
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
func (l *Lexer) str(field string) (string, error) {
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
				return "", invalid(field, "invalid JSON string at offset %d: %v", start-1, err)
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

// key reads an object key (pos at its opening quote) as str does. A key
// whose bytes are those of one of New's keys (so it has no escapes) is
// that string, not a copy.
func (l *Lexer) key(field string) (string, error) {
	start := l.pos + 1
	if n := bytes.IndexByte(l.data[start:], '"'); n >= 0 {
		k := l.data[start : start+n]
		for _, h := range l.hot {
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
func (l *Lexer) strEnd(field string, q int) (int, error) {
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
func (l *Lexer) number() (raw []byte, isInt bool, problem string) {
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
func (l *Lexer) Uint(field string, max uint64) (uint64, error) {
	if c := l.Peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(field, "a non-negative integer")
	}
	raw, isInt, p := l.number()
	if p != "" {
		return 0, l.syntax(field, "%s", p)
	}
	if !isInt {
		return 0, invalid(field, "%s is not an integer", clip.N(raw, clip.Echo))
	}
	if raw[0] != '-' {
		if v, ok := parseDigits(raw); ok && v <= max {
			return v, nil
		}
	}
	return 0, invalid(field, "%s is out of range [0, %d]", clip.N(raw, clip.Echo), max)
}

// hash reads a block hash, element i of field: an integer in
// [-2^63, 2^64-1]; negative values are int64 bit patterns (Dynamo sends
// hashes ≥ 2^63 that way).
func (l *Lexer) hash(field string, i int) (uint64, error) {
	if c := l.Peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(At(field, i), "an integer")
	}
	raw, isInt, p := l.number()
	if p != "" {
		return 0, l.syntax(At(field, i), "%s", p)
	}
	if !isInt {
		return 0, invalid(At(field, i), "%s is not an integer", clip.N(raw, clip.Echo))
	}
	if raw[0] != '-' {
		if v, ok := parseDigits(raw); ok {
			return v, nil
		}
	} else if v, ok := parseDigits(raw[1:]); ok && v <= 1<<63 {
		return -v, nil // two's complement: the int64 bit pattern of -v
	}
	return 0, invalid(At(field, i), "%s is out of range [-2^63, 2^64-1]", clip.N(raw, clip.Echo))
}

// float reads a finite number.
func (l *Lexer) Float(field string) (float64, error) {
	if c := l.Peek(); c != '-' && !isDigit(c) {
		return 0, l.unexpected(field, "a number")
	}
	raw, _, p := l.number()
	if p != "" {
		return 0, l.syntax(field, "%s", p)
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, invalid(field, "%s is out of range", clip.N(raw, clip.Echo))
	}
	return f, nil
}

// Bool reads true or false.
func (l *Lexer) Bool(field string) (bool, error) {
	switch l.Peek() {
	case 't':
		return true, l.literal(field, "true")
	case 'f':
		return false, l.literal(field, "false")
	}
	return false, l.unexpected(field, "a boolean")
}

// string reads a string; null counts as "" when nullOK.
func (l *Lexer) String(field string, nullOK bool) (string, error) {
	switch c := l.Peek(); {
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
func (l *Lexer) Tokens(field string, dst []uint32, limit int) ([]uint32, error) {
	if l.Peek() != '[' {
		return dst, l.unexpected(field, "an array of token ids")
	}
	l.pos++
	if l.Peek() == ']' {
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
			if v, err = l.Uint(At(field, n), math.MaxUint32); err != nil {
				return dst, err
			}
			j = l.pos
		}
		if n == limit {
			l.pos = j
			return dst, over(field, "more than %d tokens", limit)
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
func (l *Lexer) elemNext(field string, j int) (next int, done bool, err error) {
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
func (l *Lexer) Hashes(field string, dst []uint64, limit int) ([]uint64, error) {
	if l.Peek() != '[' {
		return dst, l.unexpected(field, "an array of block hashes")
	}
	l.pos++
	if l.Peek() == ']' {
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
			return dst, over(field, "more than %d hashes", limit)
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
func (l *Lexer) Strings(field string, maxItems, maxBytes int) ([]string, error) {
	if isNull, err := l.Null(); isNull || err != nil {
		return nil, err
	}
	out := []string{}
	err := l.Array(field, 2, func(i int) error {
		if i == maxItems {
			return over(field, "more than %d strings", maxItems)
		}
		s, err := l.String(At(field, i), false)
		if err == nil && maxBytes > 0 && len(s) > maxBytes {
			return invalid(At(field, i), "%q is longer than %d bytes", clip.N(s, clip.Echo), maxBytes)
		}
		out = append(out, s)
		return err
	})
	return out, err
}

// stringMap reads an object of at most maxItems strings (null → nil).
func (l *Lexer) StringMap(field string, maxItems int) (map[string]string, error) {
	if isNull, err := l.Null(); isNull || err != nil {
		return nil, err
	}
	out := map[string]string{}
	n := 0
	err := l.Object(field, 2, func(k string) error {
		if n++; n > maxItems {
			return over(field, "more than %d entries", maxItems)
		}
		s, err := l.String(field+"."+clip.N(k, clip.Echo), false)
		out[k] = s
		return err
	})
	return out, err
}
