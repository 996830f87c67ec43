package mocker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// openAIEngine starts an engine serving model "m" behind a real HTTP
// server.
func openAIEngine(t *testing.T, cfg Config) (*Engine, string) {
	t.Helper()
	if cfg.TotalBlocks == 0 {
		cfg.TotalBlocks, cfg.BlockSize = 64, testBS
	}
	if cfg.Worker.ModelName == "" {
		cfg.Worker.ModelName = "m"
	}
	e := startEngine(t, cfg)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func postJSON(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		b = mustJSON(v)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// obj decodes a JSON object, failing the test otherwise.
func obj(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

func keys(m map[string]any) string {
	ks := slices.Sorted(maps.Keys(m))
	return fmt.Sprint(len(ks), " ", strings.Join(ks, ","))
}

// expectText is what the mock model answers to prompt in n tokens.
func expectText(prompt []uint32, n int) string {
	var b strings.Builder
	seed := OutputSeed(prompt)
	for i := range n {
		_, p := OutputToken(seed, i)
		b.WriteString(p)
	}
	return b.String()
}

func TestOpenAIModelsAndTokenize(t *testing.T) {
	t.Parallel()
	_, url := openAIEngine(t, Config{MaxModelLen: 200})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := obj(t, body)
	data, _ := m["data"].([]any)
	if m["object"] != "list" || len(data) != 1 {
		t.Fatalf("models %s", body)
	}
	card := data[0].(map[string]any)
	if card["id"] != "m" || card["object"] != "model" || card["owned_by"] != "vllm" || card["root"] != "m" ||
		card["max_model_len"] != 200.0 || card["created"] == nil {
		t.Fatalf("model card %v", card)
	}

	for _, tc := range []struct {
		body any
		want []uint32
	}{
		{map[string]any{"model": "m", "prompt": "Hello world", "add_special_tokens": true}, Tokenize("Hello world")},
		{map[string]any{"messages": []map[string]string{{"role": "user", "content": "Hi"}}},
			Tokenize("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")},
		{map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": "a"}, {"type": "text", "text": "b"}}}},
			"add_generation_prompt": false}, Tokenize("<|im_start|>user\na\nb<|im_end|>\n")},
	} {
		resp, body := postJSON(t, url+"/tokenize", tc.body)
		var got struct {
			Count       int      `json:"count"`
			MaxModelLen int      `json:"max_model_len"`
			Tokens      []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 || got.Count != len(tc.want) ||
			got.MaxModelLen != 200 || fmt.Sprint(got.Tokens) != fmt.Sprint(tc.want) {
			t.Errorf("tokenize %v: %d %s", tc.body, resp.StatusCode, body)
		}
	}
	for body, param := range map[string]string{
		`{"prompt": "a", "messages": []}`: "prompt",
		`{}`:                              "prompt",
		`{"prompt": 3}`:                   "prompt",
		`{"messages": [{"role": "", "content": "x"}]}`:      "messages[0].role",
		`{"model": "other", "prompt": "x"}`:                 "model",
		`{"messages": [{"role": "u", "content": {"a":1}}]}`: "messages[0].content",
	} {
		resp, b := postJSON(t, url+"/tokenize", body)
		checkError(t, resp, b, param)
	}
}

// checkError asserts an OpenAI-shaped error naming param.
func checkError(t *testing.T, resp *http.Response, body []byte, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if resp.StatusCode < 400 || e.Error.Code != resp.StatusCode || e.Error.Type == "" {
		t.Errorf("status %d, error %+v", resp.StatusCode, e.Error)
	}
	if param != "" && (e.Error.Param == nil || *e.Error.Param != param || !strings.Contains(e.Error.Message, param)) {
		t.Errorf("error %+v (param %v), want param %q named in the message", e.Error, e.Error.Param, param)
	}
}

func TestOpenAICompletion(t *testing.T) {
	t.Parallel()
	_, url := openAIEngine(t, Config{})
	prompt := "The quick brown fox jumps over the lazy dog and keeps running far away"
	ptoks := Tokenize(prompt)
	var texts []string
	for i := range 2 {
		resp, body := postJSON(t, url+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 5, "temperature": 0.7, "extra": map[string]int{"x": 1}})
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		m := obj(t, body)
		if keys(m) != "6 choices,created,id,model,object,usage" || !strings.HasPrefix(m["id"].(string), "cmpl-") || m["object"] != "text_completion" || m["model"] != "m" {
			t.Fatalf("response %s", body)
		}
		c := m["choices"].([]any)[0].(map[string]any)
		if c["index"] != 0.0 || c["finish_reason"] != "length" || c["text"] != expectText(ptoks, 5) {
			t.Fatalf("choice %v, want text %q", c, expectText(ptoks, 5))
		}
		texts = append(texts, c["text"].(string))
		u := m["usage"].(map[string]any)
		cached := u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
		want := 0.0
		if i == 1 {
			want = float64(len(ptoks) / testBS * testBS)
		}
		if u["prompt_tokens"] != float64(len(ptoks)) || u["completion_tokens"] != 5.0 || u["total_tokens"] != float64(len(ptoks)+5) || cached != want {
			t.Fatalf("request %d usage %v, want %v cached", i, u, want)
		}
	}
	if texts[0] != texts[1] {
		t.Fatal("the same request answered two texts")
	}
	// A prompt of token ids, and the default of 16 tokens.
	resp, body := postJSON(t, url+"/v1/completions", `{"prompt": [1, 2, 3, 4, 5]}`)
	if m := obj(t, body); resp.StatusCode != 200 || m["usage"].(map[string]any)["completion_tokens"] != 16.0 ||
		m["choices"].([]any)[0].(map[string]any)["text"] != expectText([]uint32{1, 2, 3, 4, 5}, 16) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestOpenAIChatCompletion(t *testing.T) {
	t.Parallel()
	_, url := openAIEngine(t, Config{})
	msgs := []map[string]string{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}}
	ptoks := Tokenize(ChatPrompt([]Message{{"system", "Be brief."}, {"user", "Why is the sky blue?"}}, true))
	resp, body := postJSON(t, url+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 99, "max_completion_tokens": 3})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	m := obj(t, body)
	c := m["choices"].([]any)[0].(map[string]any)
	msg := c["message"].(map[string]any)
	if m["object"] != "chat.completion" || !strings.HasPrefix(m["id"].(string), "chatcmpl-") || msg["role"] != "assistant" ||
		msg["content"] != expectText(ptoks, 3) || c["finish_reason"] != "length" || m["usage"].(map[string]any)["prompt_tokens"] != float64(len(ptoks)) {
		t.Fatalf("chat response %s", body)
	}
	// Without a limit, vLLM generates what the context has room for.
	resp, body = postJSON(t, url+"/v1/chat/completions", map[string]any{"messages": msgs})
	if u := obj(t, body)["usage"].(map[string]any); resp.StatusCode != 200 || u["completion_tokens"] != float64(64*testBS-len(ptoks)) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// sse reads server-sent events ("data: ...\n\n") from r.
type sse struct{ r *bufio.Reader }

func (s sse) next() (string, error) {
	var data string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\n")
		if line == "" {
			return data, nil
		}
		if !strings.HasPrefix(line, "data: ") {
			return "", fmt.Errorf("line %q is not an SSE data line", line)
		}
		data = strings.TrimPrefix(line, "data: ")
	}
}

// completionText reads a streamed completion to its [DONE]: the text of
// its choices and its usage chunk (nil if none).
func completionText(t *testing.T, s sse) (string, map[string]any) {
	t.Helper()
	var text strings.Builder
	var usage map[string]any
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if ev == "[DONE]" {
			return text.String(), usage
		}
		m := obj(t, []byte(ev))
		if u, ok := m["usage"].(map[string]any); ok {
			usage = u
			continue
		}
		text.WriteString(m["choices"].([]any)[0].(map[string]any)["text"].(string))
	}
}

func startStream(t *testing.T, ctx context.Context, url string, body any) (*http.Response, sse) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(mustJSON(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, sse{bufio.NewReader(resp.Body)}
}

func TestOpenAIStream(t *testing.T) {
	t.Parallel()
	_, url := openAIEngine(t, Config{})
	prompt := "Stream me a few words please"
	ptoks := Tokenize(prompt)
	_, s := startStream(t, context.Background(), url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	var text strings.Builder
	var id string
	for i := range 4 {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		m := obj(t, []byte(ev))
		c := m["choices"].([]any)[0].(map[string]any)
		want := any(nil)
		if i == 3 {
			want = "length"
		}
		if m["object"] != "text_completion" || c["finish_reason"] != want || (id != "" && m["id"] != id) || m["usage"] != nil {
			t.Fatalf("chunk %d: %s", i, ev)
		}
		id = m["id"].(string)
		text.WriteString(c["text"].(string))
	}
	if text.String() != expectText(ptoks, 4) {
		t.Fatalf("streamed %q, want %q", text.String(), expectText(ptoks, 4))
	}
	ev, _ := s.next()
	if u := obj(t, []byte(ev)); len(u["choices"].([]any)) != 0 || u["usage"].(map[string]any)["completion_tokens"] != 4.0 {
		t.Fatalf("usage chunk %s", ev)
	}
	if ev, err := s.next(); ev != "[DONE]" || err != nil {
		t.Fatalf("last event %q (%v), want [DONE]", ev, err)
	}

	_, s = startStream(t, context.Background(), url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
		"max_tokens": 2, "stream": true})
	var events []map[string]any
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if ev == "[DONE]" {
			break
		}
		events = append(events, obj(t, []byte(ev)))
	}
	delta := func(i int) map[string]any {
		return events[i]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
	}
	if len(events) != 3 || events[0]["object"] != "chat.completion.chunk" || delta(0)["role"] != "assistant" || delta(0)["content"] != "" ||
		delta(1)["role"] != nil || delta(2)["content"] == "" || events[2]["choices"].([]any)[0].(map[string]any)["finish_reason"] != "length" {
		t.Fatalf("chat stream %v", events)
	}
}

// TestOpenAIStreamAsProduced: a token is streamed when the step that
// produces it ends, not when the request does: time to first token is
// the real (here virtual) prefill time.
func TestOpenAIStreamAsProduced(t *testing.T) {
	t.Parallel()
	clk := NewVirtualClock(epoch)
	e, url := openAIEngine(t, Config{Clock: clk, Timing: Timing{PrefillPerToken: time.Millisecond, DecodePerSeq: 10 * time.Millisecond}})
	prompt := []uint32{1, 2, 3, 4, 5, 6}
	_, s := startStream(t, context.Background(), url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3, "stream": true})
	if d := advance(t, clk); d != 6*time.Millisecond {
		t.Fatalf("the prefill step took %v, want 6ms", d)
	}
	if ev, err := s.next(); err != nil || !strings.Contains(ev, expectText(prompt, 1)) {
		t.Fatalf("first event %q (%v)", ev, err)
	}
	if got := clk.Now().Sub(epoch); got != 6*time.Millisecond || e.Load().Running != 1 {
		t.Fatalf("the first token arrived at %v with %+v, want at 6ms with the request still running", got, e.Load())
	}
	autoAdvance(t, clk)
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if ev == "[DONE]" {
			break
		}
	}
	if got := clk.Now().Sub(epoch); got != 26*time.Millisecond {
		t.Fatalf("the stream ended at %v, want 26ms", got)
	}
}

// TestOpenAIDisconnectFreesBlocks: a client that hangs up mid-stream has
// its request aborted at the next step and its blocks freed, as vLLM
// does.
func TestOpenAIDisconnectFreesBlocks(t *testing.T) {
	t.Parallel()
	rec, log := testlog.New(t)
	clk := NewVirtualClock(epoch)
	e, url := openAIEngine(t, Config{Clock: clk, Log: log, Timing: Timing{PrefillPerToken: time.Millisecond, DecodePerSeq: time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	_, s := startStream(t, ctx, url+"/v1/completions", map[string]any{"prompt": toks(0, 20), "max_tokens": 200, "stream": true})
	advance(t, clk)
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}
	if l := e.Load(); l.Running != 1 || l.KVUsage == 0 {
		t.Fatalf("load while streaming %+v", l)
	}
	cancel()
	// The handler sees the client go while the engine is in the next step
	// (the clock stands still) ...
	rec.Wait(t, 30*time.Second, "request aborted", "why=client gone")
	// ... and the step after it frees the blocks.
	autoAdvance(t, clk)
	testsupport.Eventually(t, 30*time.Second, "the aborted request's blocks freed", func() bool {
		l := e.Load()
		return l.Running == 0 && l.KVUsage == 0
	})
	if len(e.Holds()) != 5 {
		t.Fatalf("cache %d blocks: the prompt's 5 should stay cached", len(e.Holds()))
	}
}

func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	e, url := openAIEngine(t, Config{MaxModelLen: 100, MaxBodyBytes: 4096})
	long := `{"prompt": "` + strings.Repeat("x ", 3000) + `"}`
	fullKV := func(kv string) string { return `{"prompt": [1,2,3,4,5,6,7,8,9], "kv_transfer_params": ` + kv + `}` }
	okKV := `"do_remote_prefill": true, "remote_engine_id": "p", "remote_request_id": "r", "remote_host": "h", "remote_port": 1`
	for _, tc := range []struct {
		path, body, param string
		status            int
	}{
		{"/v1/completions", `{`, "body", 400},
		{"/v1/completions", `[]`, "body", 400},
		{"/v1/completions", ``, "body", 400},
		{"/v1/completions", `{"prompt": 5}`, "prompt", 400},
		{"/v1/completions", `{"prompt": null}`, "prompt", 400},
		{"/v1/completions", `{"prompt": ["a", "b"]}`, "prompt", 400},
		{"/v1/completions", `{"prompt": [[1], [2]]}`, "prompt", 400},
		{"/v1/completions", `{"prompt": [1, -2]}`, "prompt[1]", 400},
		{"/v1/completions", `{"prompt": [1, 2.5]}`, "prompt[1]", 400},
		{"/v1/completions", `{"prompt": [1, 999999999]}`, "prompt[1]", 400},
		{"/v1/completions", `{"prompt": [` + strings.Repeat("1,", 100) + `1]}`, "prompt", 400},
		{"/v1/completions", `{"prompt": ""}`, "prompt", 400},
		{"/v1/completions", `{"prompt": []}`, "prompt", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": "x"}`, "max_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 0}`, "max_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 100}`, "max_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 1e30}`, "max_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 9223372036854775807}`, "max_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "n": 2}`, "n", 400},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 5, "min_tokens": 6}`, "min_tokens", 400},
		{"/v1/completions", `{"prompt": "hi", "stream": "yes"}`, "stream", 400},
		{"/v1/completions", `{"prompt": "hi", "stream_options": {"include_usage": true}}`, "stream_options", 400},
		{"/v1/completions", `{"prompt": "hi", "stream": true, "stream_options": {"include_usage": 1}}`, "stream_options.include_usage", 400},
		{"/v1/completions", `{"model": "other", "prompt": "hi"}`, "model", 404},
		{"/v1/completions", long, "body", 413},
		{"/v1/completions", fullKV(`5`), "kv_transfer_params", 400},
		{"/v1/completions", fullKV(`{"do_remote_decode": "yes"}`), "kv_transfer_params.do_remote_decode", 400},
		{"/v1/completions", fullKV(`{"do_remote_decode": true, "do_remote_prefill": true}`), "kv_transfer_params", 400},
		{"/v1/completions", `{"prompt": "hi", "stream": true, "kv_transfer_params": {"do_remote_decode": true}}`, "stream", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true}`), "kv_transfer_params.remote_engine_id", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true, "remote_engine_id": ""}`), "kv_transfer_params.remote_engine_id", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true, "remote_engine_id": 7}`), "kv_transfer_params.remote_engine_id", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true, "remote_engine_id": "p"}`), "kv_transfer_params.remote_request_id", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true, "remote_engine_id": "p", "remote_request_id": "r"}`), "kv_transfer_params.remote_host", 400},
		{"/v1/completions", fullKV(`{"do_remote_prefill": true, "remote_engine_id": "p", "remote_request_id": "r", "remote_host": "h"}`), "kv_transfer_params.remote_port", 400},
		{"/v1/completions", fullKV(`{` + strings.Replace(okKV, `"remote_port": 1`, `"remote_port": 70000`, 1) + `}`), "kv_transfer_params.remote_port", 400},
		{"/v1/completions", fullKV(`{` + okKV + `}`), "kv_transfer_params.remote_block_ids", 400},
		{"/v1/completions", fullKV(`{` + okKV + `, "remote_block_ids": [1, 2]}`), "kv_transfer_params.remote_block_ids", 400},
		{"/v1/completions", fullKV(`{` + okKV + `, "remote_block_ids": [1, "x", 3]}`), "kv_transfer_params.remote_block_ids[1]", 400},
		{"/v1/completions", fullKV(`{` + okKV + `, "remote_block_ids": [1, 2, 3], "tp_size": 0}`), "kv_transfer_params.tp_size", 400},
		{"/v1/completions", fullKV(`{` + okKV + `, "remote_block_ids": [1, 2, 3], "remote_domain": 5}`), "kv_transfer_params.remote_domain", 400},
		{"/v1/chat/completions", `{"messages": []}`, "messages", 400},
		{"/v1/chat/completions", `{"messages": "hi"}`, "messages", 400},
		{"/v1/chat/completions", `{"messages": [{"content": "x"}]}`, "messages[0].role", 400},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, "messages[0].content[0].type", 400},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 99}`, "max_completion_tokens", 400},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1}`, "add_generation_prompt", 400},
	} {
		resp, body := postJSON(t, url+tc.path, tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %.80s: %d %s, want %d", tc.path, tc.body, resp.StatusCode, body, tc.status)
			continue
		}
		checkError(t, resp, body, tc.param)
	}
	resp, err := http.Get(url + "/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET /v1/completions: %d", resp.StatusCode)
	}
	checkError(t, resp, b, "")
	if l := e.Load(); l.Waiting+l.Running != 0 || len(e.Holds()) != 0 {
		t.Fatalf("bad requests reached the scheduler: %+v", l)
	}

	// An engine not running answers 503.
	idle, err := New(Config{TotalBlocks: 8, BlockSize: testBS})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(idle)
	defer srv.Close()
	resp, body := postJSON(t, srv.URL+"/v1/completions", `{"prompt": "hi"}`)
	if resp.StatusCode != 503 {
		t.Fatalf("an engine not running: %d %s", resp.StatusCode, body)
	}
	checkError(t, resp, body, "")
}

func TestOpenAIFaults(t *testing.T) {
	t.Parallel()
	rec, log := testlog.New(t)
	clk := NewVirtualClock(epoch)
	e, url := openAIEngine(t, Config{Log: log, Clock: clk, Timing: Timing{DecodePerSeq: time.Millisecond, PrefillPerToken: time.Millisecond}})
	fault := func(q string) int {
		resp, err := http.Post(url+"/faults/fail?"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, q := range []string{"status=200", "status=x", "count=-1", "count=1&count=2", "after_tokens=-3", "color=red"} {
		if c := fault(q); c != 400 {
			t.Errorf("POST /faults/fail?%s: %d, want 400", q, c)
		}
	}
	if c := fault("status=429&count=2"); c != 204 {
		t.Fatalf("arm: %d", c)
	}
	req := map[string]any{"prompt": "hi there", "max_tokens": 2}
	stop := autoAdvanceUntil(t, clk)
	for i := range 3 {
		resp, body := postJSON(t, url+"/v1/completions", req)
		if i < 2 {
			if resp.StatusCode != 429 {
				t.Fatalf("request %d: %d, want the injected 429", i, resp.StatusCode)
			}
			checkError(t, resp, body, "")
		} else if resp.StatusCode != 200 {
			t.Fatalf("request after the faults: %d %s", resp.StatusCode, body)
		}
	}
	if n := rec.Count("fault injected", "status=429"); n != 2 {
		t.Fatalf("%d fault lines, want 2", n)
	}

	stop()

	// Cut after 2 tokens: a stream stops without [DONE], the request is
	// aborted and its blocks freed.
	if c := fault("after_tokens=2"); c != 204 {
		t.Fatalf("arm: %d", c)
	}
	_, s := startStream(t, context.Background(), url+"/v1/completions", map[string]any{"prompt": toks(0, 9), "max_tokens": 50, "stream": true})
	advance(t, clk) // the prefill: token 1
	advance(t, clk) // a decode: token 2
	for i := range 2 {
		if ev, err := s.next(); err != nil || !strings.Contains(ev, `"text"`) {
			t.Fatalf("event %d: %q %v", i, ev, err)
		}
	}
	if ev, err := s.next(); err == nil {
		t.Fatalf("the stream went on after the cut: %q", ev)
	}
	rec.Wait(t, 30*time.Second, "request aborted", "why=injected fault")
	autoAdvance(t, clk)
	testsupport.Eventually(t, 30*time.Second, "the cut request freed", func() bool { return e.Load().Running == 0 && e.Load().KVUsage == 0 })

	// A non-streamed response is cut mid-body.
	fault("after_tokens=1")
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil || json.Valid(b) {
		t.Fatalf("cut response: %d, %d bytes (%v)", resp.StatusCode, len(b), err)
	}
}

// TestEngineMetrics: /metrics shows vLLM's gauges of running and waiting
// requests and KV usage.
func TestEngineMetrics(t *testing.T) {
	t.Parallel()
	clk := NewVirtualClock(epoch)
	e, url := openAIEngine(t, Config{TotalBlocks: 8, BlockSize: testBS, Clock: clk, Timing: Timing{DecodePerSeq: time.Millisecond}})
	done := make(chan error, 2)
	go func() {
		_, err := e.Serve(context.Background(), Request{TokenIDs: toks(0, 16), MaxTokens: 3})
		done <- err
	}()
	testsupport.Eventually(t, 30*time.Second, "the first request running", func() bool { return clk.Waiters() == 1 })
	go func() {
		_, err := e.Serve(context.Background(), Request{TokenIDs: toks(100, 32), MaxTokens: 1})
		done <- err
	}()
	testsupport.Eventually(t, 30*time.Second, "the second request waiting", func() bool { return e.Queued() == 1 })
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`vllm:num_requests_running{engine="0",model_name="m"} 1`, `vllm:num_requests_waiting{engine="0",model_name="m"} 1`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5`, "# TYPE vllm:kv_cache_usage_perc gauge"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	autoAdvance(t, clk)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// The second prompt again, from the cache (the counters are
	// cumulative, in tokens, as vLLM's).
	if _, err := e.Serve(context.Background(), Request{TokenIDs: toks(100, 32), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`vllm:prefix_cache_queries_total{engine="0",model_name="m"} 80`, `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if l := e.Load(); l.PrefixQueries != 80 || l.PrefixHits != 32 {
		t.Errorf("load %+v", l)
	}
}

// prefillEngine runs an engine for prefills, worker id, in KV-transfer
// domain rack (topology key "rack"), announcing http://10.0.0.<id>:8000.
func prefillEngine(t *testing.T, id uint64, rack string) (*Engine, string) {
	t.Helper()
	return openAIEngine(t, Config{TotalBlocks: 64, BlockSize: testBS,
		Worker: catalog.Worker{WorkerID: id, ModelName: "m", Endpoint: fmt.Sprintf("http://10.0.0.%d:8000", id),
			Attributes: catalog.Attributes{TopologyDomains: map[string]string{"rack": rack}, KVTransferDomain: "rack"}}})
}

// TestPDHandoff: a prefill run with do_remote_decode answers NIXL's
// kv_transfer_params; the decode engine given them verbatim receives the
// prompt's blocks (a transfer priced per block, slower across KV-transfer
// domains), stores and announces them on its own event stream, and
// decodes.
func TestPDHandoff(t *testing.T) {
	t.Parallel()
	pre, preURL := prefillEngine(t, 1, "r1")
	prompt := "Disaggregated serving splits prefill and decode across engines"
	ptoks := Tokenize(prompt)
	blocks := (len(ptoks) + testBS - 1) / testBS
	resp, body := postJSON(t, preURL+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
			"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
	if resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, body)
	}
	var preResp struct {
		ID               string          `json:"id"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &preResp); err != nil {
		t.Fatal(err)
	}
	kv := obj(t, preResp.KVTransferParams)
	ids, _ := kv["remote_block_ids"].([]any)
	if keys(kv) != "9 do_remote_decode,do_remote_prefill,remote_block_ids,remote_domain,remote_engine_id,remote_host,remote_port,remote_request_id,tp_size" ||
		kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false || kv["remote_engine_id"] != "mocker-1-dp0" ||
		kv["remote_request_id"] != preResp.ID || kv["remote_host"] != "10.0.0.1" || kv["remote_port"] != 8000.0 || kv["tp_size"] != 1.0 ||
		kv["remote_domain"] != "r1" || len(ids) != blocks {
		t.Fatalf("prefill kv_transfer_params %s", preResp.KVTransferParams)
	}
	if pre.Hit(ptoks) != len(ptoks)/testBS {
		t.Fatal("the prefill engine does not keep the prompt's blocks cached")
	}

	tm := Timing{PrefillPerToken: time.Millisecond, DecodePerSeq: time.Millisecond, TransferPerBlock: 10 * time.Millisecond, CrossDomainFactor: 4}
	for _, tc := range []struct {
		rack   string
		factor time.Duration
	}{{"r1", 1}, {"r2", 4}} {
		t.Run(tc.rack, func(t *testing.T) {
			clk := NewVirtualClock(epoch)
			rec, log := testlog.New(t)
			dec, decURL := openAIEngine(t, Config{TotalBlocks: 64, BlockSize: testBS, Clock: clk, Timing: tm, Log: log,
				Worker: catalog.Worker{WorkerID: 2, ModelName: "m", Attributes: catalog.Attributes{TopologyDomains: map[string]string{"rack": tc.rack}, KVTransferDomain: "rack"}}})
			rank := indexer.Rank{WorkerID: 2}
			sub, ix := startSubscriber(t, dec, rank)
			autoAdvance(t, clk)
			_, s := startStream(t, context.Background(), decURL+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 3,
				"stream": true, "stream_options": map[string]bool{"include_usage": true}, "kv_transfer_params": preResp.KVTransferParams})
			text, usage := completionText(t, s)
			if text != expectText(ptoks, 3) {
				t.Fatalf("decoded %q, want %q", text, expectText(ptoks, 3))
			}
			// Every block transferred (the last, partial one too), one token
			// computed, two decoded.
			want := time.Duration(blocks)*10*time.Millisecond*tc.factor + 3*time.Millisecond
			if got := clk.Now().Sub(epoch); got != want {
				t.Fatalf("the decode took %v, want %v", got, want)
			}
			if cached := usage["prompt_tokens_details"].(map[string]any)["cached_tokens"]; cached != float64(len(ptoks)) {
				t.Fatalf("usage %v: want the whole prompt counted cached, as vLLM does", usage)
			}
			rec.Wait(t, 30*time.Second, "kv transfer taken", fmt.Sprintf("blocks=%d", blocks), fmt.Sprintf("cross_domain=%v", tc.factor > 1),
				"remote_engine_id=mocker-1-dp0")
			if dec.Hit(ptoks) != len(ptoks)/testBS {
				t.Fatal("the decode engine did not cache the transferred blocks")
			}
			caughtUp(t, sub, dec)
			checkEqual(t, ix, dec, rank)
		})
	}
}

// TestEngineChunkedIndexMatchesCache: with a small step budget, prompts
// are prefilled in chunks across steps while other requests run; a
// subscriber following the engine over ZMQ still holds exactly its
// cache.
func TestEngineChunkedIndexMatchesCache(t *testing.T) {
	t.Parallel()
	e := startEngine(t, Config{TotalBlocks: 24, BlockSize: testBS, Timing: Timing{MaxNumBatchedTokens: 6, MaxNumSeqs: 3}})
	rank := indexer.Rank{WorkerID: 4}
	s, ix := startSubscriber(t, e, rank)
	errs := make(chan error, 4)
	for c := range 4 {
		go func() {
			for n := c; n < 200; n += 4 {
				if _, err := e.Serve(context.Background(), workload(n)); err != nil {
					errs <- fmt.Errorf("request %d: %w", n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil && !errors.Is(err, ErrNoSpace) {
			t.Fatal(err)
		}
	}
	caughtUp(t, s, e)
	checkEqual(t, ix, e, rank)
	if st := s.State(); st.Degraded {
		t.Fatalf("degraded: %+v", st)
	}
}

// FuzzGenerationRequest: no body makes the request parsers panic, and one
// they accept is within the engine's bounds.
func FuzzGenerationRequest(f *testing.F) {
	f.Add([]byte(`{"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}`), false)
	f.Add([]byte(`{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 2}`), true)
	f.Add([]byte(`{"prompt": "a b", "kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "p", "remote_request_id": "r",
		"remote_host": "h", "remote_port": 5600, "remote_block_ids": [0]}}`), false)
	e, err := New(Config{TotalBlocks: 16, BlockSize: testBS, MaxModelLen: 48, Worker: catalog.Worker{ModelName: "m"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		parse := e.parseCompletion
		if chat {
			parse = e.parseChat
		}
		g, rerr := parse(body)
		if rerr != nil {
			if rerr.status < 400 || rerr.msg == "" {
				t.Fatalf("error %+v", rerr)
			}
			return
		}
		if len(g.tokens) == 0 || g.maxTokens < 1 || len(g.tokens)+g.maxTokens > 48 {
			t.Fatalf("accepted %d prompt tokens and %d to generate", len(g.tokens), g.maxTokens)
		}
		if g.kv.doRemotePrefill && len(g.kv.remoteBlockIDs) != (len(g.tokens)+testBS-1)/testBS {
			t.Fatalf("accepted %d remote blocks for %d tokens", len(g.kv.remoteBlockIDs), len(g.tokens))
		}
	})
}
