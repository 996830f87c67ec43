package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"unicode"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/httpbody"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// The hot request bodies, /query and /query_by_hash, are read by
// jsonlex, reading the body once and token ids straight into a reused
// []uint32 (BenchmarkDecodeQuery8K). The cold bodies (/register,
// /unregister, the selection and plan routes) are decoded by
// encoding/json into the API types (decodeJSON); only their token and
// hash arrays (api.TokenIDs, api.HashList) and the bounded lists
// (api.WorkerIDs, api.RequiredTaints, api.TaintWeights, the catalog's
// taints and topology domains) are read by jsonlex, so that counts are
// checked before anything is allocated.

// httpError is an error with the status it maps to. msg is what the client
// sees: "<field>: <problem>".
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// lexError is e with its status: 413 for a list over its limit, else 400.
func lexError(e *jsonlex.Error) *httpError {
	if e.Over {
		return &httpError{http.StatusRequestEntityTooLarge, e.Error()}
	}
	return &httpError{http.StatusBadRequest, e.Error()}
}

func badRequest(field, format string, args ...any) *httpError {
	return &httpError{http.StatusBadRequest, field + ": " + fmt.Sprintf(format, args...)}
}

func tooLarge(field, format string, args ...any) *httpError {
	return &httpError{http.StatusRequestEntityTooLarge, field + ": " + fmt.Sprintf(format, args...)}
}

// readBody reads r's body into s's buffer, which keeps it for the next
// request, within the configured limits (httpbody.Read). The bytes read
// count against the handler's body budget until s returns to the pool
// (putScratch).
func (h *handler) readBody(w http.ResponseWriter, r *http.Request, s *scratch) ([]byte, *httpError) {
	body, err := httpbody.Read(w, r, s.body, h.cfg.MaxBodyBytes, &h.bodies, &s.held)
	s.body = body
	if err != nil {
		return body, &httpError{err.Status, err.Msg}
	}
	return body, nil
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
	l := jsonlex.New(body)
	if err := l.Document(func(key string) error {
		if c := l.Peek(); c != 'n' {
			have[strings.ToLower(key)] = true
		}
		member := l.Member()
		for _, f := range own {
			if strings.EqualFold(key, f.name) {
				cut = true
				return f.read(&l)
			}
		}
		err := l.Skip(clip.N(key, maxEcho), 1)
		kept = append(kept, [2]int{member, l.Pos()})
		return err
	}); err != nil {
		return have, lexErrorOf(err)
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
	read func(l *jsonlex.Lexer) error
}

// promptFields are the hot arrays of a selection or plan body's prompt p,
// read within the route's limits.
func promptFields(p *api.Prompt, maxTokens, maxHashes int) []ownField {
	return []ownField{
		{"token_ids", func(l *jsonlex.Lexer) error {
			if isNull, err := l.Null(); isNull || err != nil {
				p.TokenIDs = nil
				return err
			}
			v, err := l.Tokens("token_ids", p.TokenIDs[:0], maxTokens)
			p.TokenIDs = v
			return err
		}},
		{"block_hashes", func(l *jsonlex.Lexer) error {
			if isNull, err := l.Null(); isNull || err != nil {
				p.BlockHashes = nil
				return err
			}
			v, err := l.Hashes("block_hashes", p.BlockHashes[:0], maxHashes)
			p.BlockHashes = v
			return err
		}},
	}
}

// jsonError maps an encoding/json error to "<field>: <problem>", worded as
// the lexer words it. Errors of UnmarshalJSON methods (*jsonlex.Error)
// keep their wording.
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
	if he := lexErrorOf(err); he != err {
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

// lexErrorOf returns err, a *jsonlex.Error among it as its *httpError.
func lexErrorOf(err error) error {
	var le *jsonlex.Error
	if errors.As(err, &le) {
		return lexError(le)
	}
	return err
}
