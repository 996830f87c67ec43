package jsonlex

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readTokenIDs reads data as an object, its "token_ids" with Tokens
// (within limit) and every other key with Skip, as the API's /query does.
func readTokenIDs(data []byte, limit int) ([]uint32, error) {
	var ids []uint32
	l := New(data, "token_ids")
	err := l.Document(func(key string) error {
		if key != "token_ids" {
			return l.Skip(key, 1)
		}
		var err error
		ids, err = l.Tokens(key, ids[:0], limit)
		return err
	})
	return ids, err
}

// doc is what readDoc read of a document's known keys.
type doc struct {
	tokens []uint32
	hashes []uint64
	str    map[string]string
	bools  map[string]bool
}

// readDoc reads data as an object: "token_ids" with Tokens,
// "block_hashes" with Hashes, "model_name" with String, "routing_group"
// with String (null allowed), "stream" with Bool, and every other key
// with Skip.
func readDoc(data []byte) (doc, error) {
	d := doc{str: map[string]string{}, bools: map[string]bool{}}
	l := New(data, "token_ids", "block_hashes", "model_name")
	err := l.Document(func(key string) error {
		var err error
		switch key {
		case "token_ids":
			d.tokens, err = l.Tokens(key, d.tokens[:0], 1<<20)
		case "block_hashes":
			d.hashes, err = l.Hashes(key, d.hashes[:0], 1<<20)
		case "model_name":
			d.str[key], err = l.String(key, false)
		case "routing_group":
			d.str[key], err = l.String(key, true)
		case "stream":
			d.bools[key], err = l.Bool(key)
		default:
			err = l.Skip(key, 1)
		}
		return err
	})
	return d, err
}

// FuzzLexer checks the Lexer against encoding/json: it accepts exactly
// the documents json.Valid accepts (up to maxDepth nesting), and the
// values its typed readers accept, encoding/json decodes to the same.
func FuzzLexer(f *testing.F) {
	for _, s := range []string{
		`{"token_ids":[1,2,3],"model_name":"m"}`,
		`{"token_ids":[4294967295,0],"model_name":"m\u00e9","routing_group":"g","lora_name":null,"cache_salt":"s\"x"}`,
		`{"block_hashes":[-1,18446744073709551615,-9223372036854775808,0],"model_name":"m"}`,
		`{"token_ids":[1.0,-0,1e3],"model_name":"m"}`,
		`{"token_ids":[01]}`, `[]`, `{}`, `null`, `"\ud800"`, "\"\xff\"", `{"a":{"b":[true,false,null,-1.5e-3]}}`,
		`{"token_ids" : [ 1 , 2 ] , "model_name" : "m" , "x" : { } }`,
		`{"token_ids":[1,22,333,4444,55555,666666,7777777,88888888,4294967295, 10, 200,01],"model_name":"mmmmmmmm"}`,
		// Long enough for the 64-byte blocks: compact, with ", ", and with
		// ids the blocks leave to the general path.
		`{"model_name":"m","token_ids":[` + strings.Repeat("12,345,6789,101112,", 12) + `7]}`,
		`{"model_name":"m","token_ids":[` + strings.Repeat("12, 345, 6789, 101112, ", 12) + `7]}`,
		`{"model_name":"m","token_ids":[` + strings.Repeat("12,345,6789,101112,", 6) + `123456789,01,` + strings.Repeat("1,0,", 30) + `7]}`,
		`{"block_hashes":[-9223372036854775808,9223372036854775807,18446744073709551615,-1, 0,-0,1.5],"model_name":"mmmmmmmm"}`,
		`{"token_ids":[1],"model_name":"a","MODEL_NAME":"b","model_name":"c"}`,
		`{"stream":true,"model_name":"m"}`, `{"stream":false,"stream":true}`, `{"stream":fals}`, `{"stream":"true"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Syntax.
		l := New(data)
		err := l.Skip("x", 0)
		if err == nil {
			if l.ws(); l.pos != len(data) {
				err = errors.New("trailing data")
			}
		}
		valid := json.Valid(data)
		if err == nil && !valid {
			t.Fatalf("lexer accepts invalid JSON %q", data)
		}
		if err != nil && valid && !strings.Contains(err.Error(), "nested deeper") {
			t.Fatalf("lexer rejects valid JSON %q: %v", data, err)
		}
		if !valid {
			return
		}
		// Values: compare with encoding/json on exact (case-sensitive)
		// keys, the last duplicate winning.
		var raw map[string]json.RawMessage
		if json.Unmarshal(data, &raw) != nil {
			return
		}
		d, err := readDoc(data)
		if err != nil {
			return
		}
		if m, ok := raw["token_ids"]; ok {
			var toks []uint32
			if json.Unmarshal(m, &toks) != nil || !slices.Equal(toks, d.tokens) {
				t.Fatalf("%q: tokens %v, encoding/json %v", data, d.tokens, toks)
			}
		}
		if m, ok := raw["block_hashes"]; ok {
			var nums []json.Number
			if json.Unmarshal(m, &nums) != nil || len(nums) != len(d.hashes) {
				t.Fatalf("%q: hashes %v, encoding/json %v", data, d.hashes, nums)
			}
			for i, n := range nums {
				var want uint64
				if v, err := strconv.ParseInt(string(n), 10, 64); err == nil {
					want = uint64(v)
				} else if want, err = strconv.ParseUint(string(n), 10, 64); err != nil {
					t.Fatalf("%q: accepted hash %s", data, n)
				}
				if d.hashes[i] != want {
					t.Fatalf("%q: hash %d = %d, want %d", data, i, d.hashes[i], want)
				}
			}
		}
		for key, got := range d.str {
			var s string
			if m := raw[key]; json.Unmarshal(m, &s) != nil || s != got {
				t.Fatalf("%q: %s = %q, encoding/json %q", data, key, got, s)
			}
		}
		for key, got := range d.bools {
			var b bool
			if m := raw[key]; json.Unmarshal(m, &b) != nil || b != got {
				t.Fatalf("%q: %s = %v, encoding/json %v", data, key, got, b)
			}
		}
	})
}

func TestParseDigits(t *testing.T) {
	for _, c := range []struct {
		in string
		v  uint64
		ok bool
	}{{"0", 0, true}, {"18446744073709551615", math.MaxUint64, true}, {"18446744073709551616", 0, false}, {"99999999999999999999", 0, false},
		{"9999999999999999999", 9999999999999999999, true}, {"00000000000000000000001", 1, true}, {"184467440737095516150", 0, false}} {
		if v, ok := parseDigits([]byte(c.in)); v != c.v || ok != c.ok {
			t.Errorf("%s: %d %v", c.in, v, ok)
		}
	}
	// Against strconv on random runs of 1 to 24 digits, around 2^64.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b := make([]byte, 1+rng.IntN(24))
		for i := range b {
			b[i] = byte('0' + rng.IntN(10))
		}
		if len(b) == 20 && rng.IntN(2) == 0 {
			copy(b, "1844674407370955161") // near the limit
		}
		want, err := strconv.ParseUint(string(b), 10, 64)
		if v, ok := parseDigits(b); ok != (err == nil) || (ok && v != want) {
			t.Fatalf("%s: %d %v, strconv %d %v", b, v, ok, want, err)
		}
	}
}

// TestDigitsSWAR checks digitRun with every byte at every position of a
// word of digits, and digitsValue against strconv.
func TestDigitsSWAR(t *testing.T) {
	for p := range 8 {
		for b := range 256 {
			w := uint64(0x3939393939393939)&^(0xFF<<(8*p)) | uint64(b)<<(8*p) // "99999999" with b at p
			want := p
			if b >= '0' && b <= '9' {
				want = 8
			}
			if got := digitRun(w); got != want {
				t.Fatalf("digitRun(%#016x) = %d, want %d", w, got, want)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		var b [8]byte
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		n := 1 + rng.IntN(8)
		for i := range n {
			b[i] = '0' + byte(rng.IntN(10))
		}
		want, _ := strconv.ParseUint(string(b[:n]), 10, 64)
		if got := digitsValue(le64(b[:]), n); got != want {
			t.Fatalf("digitsValue(%q, %d) = %d, want %d", b, n, got, want)
		}
	}
}

// refTokens and refHashes read an array an element at a time with the
// lexer's checked readers, as tokens and hashes did before they read
// words: TestArraysWordAtATime holds them to the same values and the same
// errors.
func refTokens(l *Lexer, field string, limit int) ([]uint32, error) {
	var out []uint32
	if l.Peek() != '[' {
		return out, l.unexpected(field, "an array of token ids")
	}
	err := l.Array(field, 2, func(i int) error {
		v, err := l.Uint(At(field, i), math.MaxUint32)
		if err == nil && i == limit {
			err = over(field, "more than %d tokens", limit)
		}
		out = append(out, uint32(v))
		return err
	})
	return out, err
}

func refHashes(l *Lexer, field string, limit int) ([]uint64, error) {
	var out []uint64
	if l.Peek() != '[' {
		return out, l.unexpected(field, "an array of block hashes")
	}
	err := l.Array(field, 2, func(i int) error {
		if i == limit {
			return over(field, "more than %d hashes", limit)
		}
		h, err := l.hash(field, i)
		out = append(out, h)
		return err
	})
	return out, err
}

// TestArraysWordAtATime reads random token and hash arrays — every
// length of number, the separators clients write, elements that are
// wrong in each way, the limit, and tails of every length after the
// array — with tokens and hashes, and with refTokens and refHashes: the
// values read and the errors must be the same.
func TestArraysWordAtATime(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	digits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = '0' + byte(rng.IntN(10))
		}
		if n > 1 && b[0] == '0' {
			b[0] = '1'
		}
		return string(b)
	}
	bad := []string{"01", "00", "1.5", "1.0", "1e3", "2E-1", "-", "--1", `"5"`, "null", "true", "[1]", "{}", ""}
	badTokens := []string{"-1", "-0", "4294967296", "99999999999", strings.Repeat("9", 25)}
	badHashes := []string{"-9223372036854775809", "18446744073709551616", "-18446744073709551615", strings.Repeat("9", 25)}
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	tokenElems := func() string {
		switch r := rng.IntN(10000); {
		case r < 10:
			return pick(bad...)
		case r < 20:
			return pick(badTokens...)
		case r < 100:
			return pick("4294967295", "0", "1000000000", "10000000", "9999999")
		case r < 1000:
			return strconv.FormatUint(uint64(rng.Uint32()), 10)
		default:
			return digits(1 + rng.IntN(9))
		}
	}
	hashElems := func() string {
		switch r := rng.IntN(10000); {
		case r < 10:
			return pick(bad...)
		case r < 20:
			return pick(badHashes...)
		case r < 200:
			return pick("-9223372036854775808", "18446744073709551615", "9999999999999999999", "-9999999999999999999", "-0", "0", "1"+digits(19))
		case r < 5000:
			return strconv.FormatInt(int64(rng.Uint64()), 10)
		case r < 6000:
			return strconv.FormatUint(rng.Uint64(), 10)
		default:
			return digits(1 + rng.IntN(19))
		}
	}
	seps := []string{",", ",", ",", ", ", " ,", ",\n  ", "\t,\r\n", ",  "}
	array := func(elem func() string, n int) string {
		var b strings.Builder
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				if rng.IntN(20) == 0 {
					b.WriteString(seps[rng.IntN(len(seps))])
				} else {
					b.WriteByte(',')
				}
				if rng.IntN(20000) == 0 {
					b.WriteString([]string{",", "", ":", "]"}[rng.IntN(4)]) // a separator error
				}
			}
			b.WriteString(elem())
		}
		b.WriteString([]string{"]", "]", "]", "]", " ]", "", ","}[rng.IntN(7)])
		return b.String() + strings.Repeat(" ", rng.IntN(12))
	}
	var ok, failed int
	defer func() { t.Logf("%d arrays read whole, %d with an error", ok, failed) }()
	for range 3000 {
		n, limit := rng.IntN(300), 1<<20
		if rng.IntN(10) == 0 {
			limit = rng.IntN(300)
		}
		data := []byte(array(tokenElems, n))
		got, gerr := ptr(New(data)).Tokens("token_ids", nil, limit)
		want, werr := refTokens(ptr(New(data)), "token_ids", limit)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || (werr == nil && !slices.Equal(got, want)) {
			t.Fatalf("tokens(%q, limit %d):\n%v %v\nwant %v %v", data, limit, got, gerr, want, werr)
		}
		if werr == nil {
			ok++
		} else {
			failed++
		}
		data = []byte(array(hashElems, n))
		hs, gerr := ptr(New(data)).Hashes("block_hashes", nil, limit)
		whs, werr := refHashes(ptr(New(data)), "block_hashes", limit)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || (werr == nil && !slices.Equal(hs, whs)) {
			t.Fatalf("hashes(%q, limit %d):\n%v %v\nwant %v %v", data, limit, hs, gerr, whs, werr)
		}
		if werr == nil {
			ok++
		} else {
			failed++
		}
	}
}

func ptr[T any](v T) *T { return &v }
