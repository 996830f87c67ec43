package tokenize

import (
	"errors"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// TestRead: what routing reads of a body, and an error naming the field
// for each malformed one.
func TestRead(t *testing.T) {
	for _, c := range []struct {
		route    Route
		body     string
		model    string
		tokens   int
		tokenize string // the /tokenize body
		err      string
	}{
		{Completions, `{"model":"m","prompt":"hi","max_tokens":3}`, "m", 0, `{"model":"m","prompt":"hi"}`, ""},
		{Completions, `{"model":"m","prompt":[1,2,3]}`, "m", 3, `{"model":"m","prompt":[1,2,3]}`, ""},
		{Completions, `{"model":"m","prompt":["a","b"]}`, "m", 0, `{"model":"m","prompt":"a"}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"stream":true}`, "m", 0,
			`{"messages":[{"role":"user","content":"x"}],"model":"m","tools":[]}`, ""},
		{Completions, `{"prompt" : "hi", "add_special_tokens" : false, "model" : "m", "n" : 2}`, "m", 0, `{"add_special_tokens":false,"model":"m","prompt":"hi"}`, ""},
		{Chat, `{"tools":[ ],"messages":[ {"role":"user"} ],"model":"m","add_generation_prompt":true,"documents":null,"prompt":"p"}`, "m", 0,
			`{"add_generation_prompt":true,"documents":null,"messages":[ {"role":"user"} ],"model":"m","tools":[ ]}`, ""},
		{Chat, `{"messages":[]}`, "", 0, "", "model: required"},
		{Chat, `{"model":"m"}`, "", 0, "", "messages: required"},
		{Chat, `{"model":"m","messages":"x"}`, "", 0, "", "messages: must be an array"},
		{Completions, `{"model":"m","prompt":null}`, "", 0, "", "prompt: required"},
		{Completions, `{"model":"m","prompt":"x"`, "", 0, "", "invalid JSON"},
		{Completions, `{"model":7,"prompt":"x"}`, "", 0, "", "model"},
	} {
		r, err := Read(c.route, []byte(c.body))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.body, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		tb := r.AppendTokenizeBody([]byte("x"))[1:]
		if r.Model != c.model || len(r.Tokens) != c.tokens || string(tb) != c.tokenize {
			t.Errorf("%s: model %q, %d tokens, tokenize %s", c.body, r.Model, len(r.Tokens), tb)
		}
	}
}

// TestReadBoundsTokens: a prompt of more ids than prefixd routes is
// refused while it is read, with an error that says so (Over).
func TestReadBoundsTokens(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","prompt":[`)
	for i := range MaxPromptTokens + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1')
	}
	b.WriteString(`]}`)
	_, err := Read(Completions, []byte(b.String()))
	if le := (*jsonlex.Error)(nil); !errors.As(err, &le) || !le.Over || len(err.Error()) > 200 {
		t.Fatalf("error %v, want an Over error that does not repeat the body", err)
	}
}
