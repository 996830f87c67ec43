package proxy

import (
	"encoding/json"
	"strings"
	"testing"
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
		{completions, `{"prompt":"hello"}`, "model: required"},
		{completions, `{"model":"m"}`, "prompt: required"},
		{completions, `{"model":"m","prompt":[1,-2]}`, "prompt[1]: -2 is not a token id"},
		{completions, `{"model":7,"prompt":"x"}`, "model: must be string, got number"},
		{completions, `{"model":"m","prompt":"x","stream":"yes"}`, "stream: must be bool, got string"},
		{completions, `[1]`, "body: not a JSON object"},
		{completions, `{"model":"m",`, "body: not a JSON object: invalid JSON at offset"},
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
		case err == nil && r.model != "m":
			t.Errorf("%s: model %q", c.body, r.model)
		}
	}
	r, err := parseRequest(completions, []byte(`{"model":"m","prompt":[1,2,3],"stream":true}`))
	if err != nil || !r.stream || len(r.tokens) != 3 || r.tokens[2] != 3 {
		t.Fatalf("%+v %v", r, err)
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
	b, err := r.prefillBody()
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
	b, err = r.decodeBody(json.RawMessage(`{"do_remote_prefill":true,"remote_engine_id":"e1","remote_block_ids":[1,2]}`))
	if err != nil || json.Unmarshal(b, &dec) != nil {
		t.Fatal(err)
	}
	if dec["stream"] != true || dec["max_tokens"] != 50.0 || dec["min_tokens"] != 10.0 || dec["kv_transfer_params"].(map[string]any)["remote_engine_id"] != "e1" {
		t.Errorf("decode body %v", dec)
	}
	var tok map[string]any
	b, err = r.tokenizeBody()
	if err != nil || json.Unmarshal(b, &tok) != nil {
		t.Fatal(err)
	}
	if tok["model"] != "m" || tok["messages"] == nil || tok["add_generation_prompt"] != true || tok["temperature"] != nil || len(tok) != 3 {
		t.Errorf("tokenize body %v", tok)
	}
	if _, err := transferParams([]byte(`{"choices":[]}`)); err == nil || !strings.Contains(err.Error(), "no kv_transfer_params") {
		t.Errorf("answer without params: %v", err)
	}
	c, _ := parseRequest(completions, []byte(`{"model":"m","prompt":["first","second"]}`))
	b, _ = c.tokenizeBody()
	if string(b) != `{"model":"m","prompt":"first"}` {
		t.Errorf("batch tokenize body %s", b)
	}
}
