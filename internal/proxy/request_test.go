package proxy

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

func TestParseRequest(t *testing.T) {
	for _, c := range []struct {
		kind kind
		body string
		err  string
	}{
		{completions, `{"model":"m","prompt":"hello"}`, ""},
		{completions, `{"model":"m","prompt":[1,2,3],"stream":true}`, ""},
		{completions, `{"model":"m","prompt":["a","b"]}`, ""},
		{completions, `{"model":"m","prompt":[[1,2],[3]],"stream":null}`, ""},
		{completions, `{"prompt":"hello"}`, "model: required"},
		{completions, `{"model":"m"}`, "prompt: required"},
		{completions, `{"model":"m","prompt":null}`, "prompt: required"},
		{completions, `{"model":"m","prompt":[1,-2]}`, "prompt[1]: -2 is out of range [0, 4294967295]"},
		{completions, `{"model":"m","prompt":[[1],[2,"x"]]}`, ""}, // the engine's to refuse: only the first prompt routes
		{completions, `{"model":"m","prompt":[[1,"x"]]}`, "prompt[0][1]: must be a non-negative integer, got a string"},
		{completions, `{"model":7,"prompt":"x"}`, "model: must be a string, got a number"},
		{completions, `{"model":"m","prompt":"x","stream":"yes"}`, "stream: must be a boolean, got a string"},
		{completions, `[1]`, "body: must be an object, got an array"},
		{completions, `{"model":"m",`, "body: invalid JSON at offset 13"},
		{completions, `{"model":"m","prompt":"x","n":[1,}`, "n: invalid JSON at offset 33: expected a value"},
		{chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{chat, `{"model":"m"}`, "messages: required"},
		{chat, `{"model":"m","messages":{"role":"user"}}`, "messages: must be an array of messages"},
	} {
		r, err := parseRequest(c.kind, []byte(c.body))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.err != "" && (err == nil || !strings.HasPrefix(err.Error(), c.err)):
			t.Errorf("%s: error %v, want %q", c.body, err, c.err)
		case err == nil && r.Model != "m":
			t.Errorf("%s: model %q", c.body, r.Model)
		}
	}
	r, err := parseRequest(completions, []byte(`{"model":"m","prompt":[1,2,3],"stream":true}`))
	if err != nil || !r.Stream || len(r.Tokens) != 3 || r.Tokens[2] != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = parseRequest(completions, []byte(`{"model":"m","prompt":[ [4, 5], [6]]}`))
	if err != nil || !slices.Equal(r.Tokens, []uint32{4, 5}) {
		t.Fatalf("a batch of token arrays: %+v %v", r, err)
	}
	r, err = parseRequest(completions, []byte(`{"model" : "m", "prompt" : "p", "x" : {"y": [1]} }`))
	if err != nil || string(r.Fields["prompt"]) != `"p"` || string(r.Fields["x"]) != `{"y": [1]}` || string(r.Fields["model"]) != `"m"` {
		t.Fatalf("fields: %q %v", r.Fields, err)
	}
}

// TestPromptTokensBounded: a prompt of token ids is refused past
// maxPromptTokens while it is read (a *jsonlex.Error with Over: a 413),
// for one prompt or the first of a batch.
func TestPromptTokensBounded(t *testing.T) {
	ids := func(n int) string { return strings.TrimSuffix(strings.Repeat("7,", n), ",") }
	for _, prompt := range []string{"[" + ids(maxPromptTokens) + "]", "[[" + ids(maxPromptTokens) + "]]"} {
		r, err := parseRequest(completions, []byte(`{"model":"m","prompt":`+prompt+`}`))
		if err != nil || len(r.Tokens) != maxPromptTokens {
			t.Fatalf("%d ids: %v", maxPromptTokens, err)
		}
	}
	for _, c := range []struct{ prompt, want string }{
		{"[" + ids(maxPromptTokens+1) + "]", "prompt: more than 1000000 tokens"},
		{"[[" + ids(maxPromptTokens+1) + "]]", "prompt[0]: more than 1000000 tokens"},
	} {
		_, err := parseRequest(completions, []byte(`{"model":"m","prompt":`+c.prompt+`}`))
		var le *jsonlex.Error
		if !errors.As(err, &le) || !le.Over || err.Error() != c.want {
			t.Errorf("%d ids: %v, want %q (over its limit)", maxPromptTokens+1, err, c.want)
		}
	}
}

// TestRewrites: the prefill request computes the KV and hands it over
// in one answer; the decode request carries the handoff; both keep the
// client's other fields.
func TestRewrites(t *testing.T) {
	r, err := parseRequest(chat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,`+
		`"stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":10,"temperature":0.5,"add_generation_prompt":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var pre map[string]any
	b, err := prefillBody(r)
	if err != nil || json.Unmarshal(b, &pre) != nil {
		t.Fatal(err)
	}
	kv := pre["kv_transfer_params"].(map[string]any)
	if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || kv["remote_engine_id"] != nil || len(kv) != 6 {
		t.Errorf("prefill kv_transfer_params %v", kv)
	}
	if pre["stream"] != false || pre["max_tokens"] != 1.0 || pre["max_completion_tokens"] != 1.0 || pre["stream_options"] != nil || pre["min_tokens"] != nil || pre["temperature"] != 0.5 {
		t.Errorf("prefill body %v", pre)
	}
	var dec map[string]any
	b, err = decodeBody(r, json.RawMessage(`{"do_remote_prefill":true,"remote_engine_id":"e1","remote_block_ids":[1,2]}`))
	if err != nil || json.Unmarshal(b, &dec) != nil {
		t.Fatal(err)
	}
	if dec["stream"] != true || dec["max_tokens"] != 50.0 || dec["min_tokens"] != 10.0 || dec["kv_transfer_params"].(map[string]any)["remote_engine_id"] != "e1" {
		t.Errorf("decode body %v", dec)
	}
	var tok map[string]any
	b = r.AppendTokenizeBody(nil)
	if err := json.Unmarshal(b, &tok); err != nil {
		t.Fatal(err)
	}
	if tok["model"] != "m" || tok["messages"] == nil || tok["add_generation_prompt"] != true || tok["temperature"] != nil || len(tok) != 3 {
		t.Errorf("tokenize body %v", tok)
	}
	if _, err := transferParams([]byte(`{"choices":[]}`)); err == nil || !strings.Contains(err.Error(), "no kv_transfer_params") {
		t.Errorf("answer without params: %v", err)
	}
	c, _ := parseRequest(completions, []byte(`{"model":"m","prompt":["first","second"]}`))
	b = c.AppendTokenizeBody(nil)
	if string(b) != `{"model":"m","prompt":"first"}` {
		t.Errorf("batch tokenize body %s", b)
	}
}

// TestPrefixdLimits: the proxy's caps are prefixd serve's, so that a
// prompt serve would refuse is refused by the proxy first.
func TestPrefixdLimits(t *testing.T) {
	if prefixdMaxBody != apiserver.DefaultMaxBodyBytes || maxPromptTokens != api.DefaultMaxTokens {
		t.Errorf("the proxy's limits (%d bytes, %d tokens) are not prefixd serve's (%d, %d)",
			prefixdMaxBody, maxPromptTokens, apiserver.DefaultMaxBodyBytes, api.DefaultMaxTokens)
	}
	// A million ids of the largest value do not fit in serve's body; a
	// million of a large vocabulary's (6 digits) do.
	big := make([]uint32, maxPromptTokens)
	for i := range big {
		big[i] = 4294967295
	}
	if err := routable(big); err == nil {
		t.Error("a million 10-digit ids are routable")
	}
	for i := range big {
		big[i] = 128255
	}
	if err := routable(big); err != nil {
		t.Error(err)
	}
}
