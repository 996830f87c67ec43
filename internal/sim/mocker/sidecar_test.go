package mocker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/indexer"
)

// postWith posts body to url with the given headers and returns the
// status and the body.
func postWith(t *testing.T, url string, header http.Header, body any) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(mustJSON(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func hostPort(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// rawField is field of the JSON object b.
func rawField(t *testing.T, b []byte, field string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m[field]
}

func prefillerHeader(addr string) http.Header {
	return http.Header{PrefillerHeader: {addr}}
}

// pdEngine is an engine of a P/D pair, in one rack.
func pdEngine(t *testing.T, id uint64) (*Engine, string) {
	return openAIEngine(t, Config{TotalBlocks: 64, BlockSize: testBS,
		Worker: catalog.Worker{WorkerID: id, ModelName: "m", Endpoint: "http://10.0.0.1:8000",
			Attributes: catalog.Attributes{TopologyDomains: map[string]string{"rack": "r1"}, KVTransferDomain: "rack"}}})
}

// TestSidecarPrefill: a decode engine given x-prefiller-host-port runs the
// prefill on that engine first, then decodes with its KV, for a streamed
// completion and a chat completion. Both engines' caches, and the indexes
// their KV events build, are exactly those of a P/D pair driven by a
// router with kv_transfer_params (as prefixd proxy --disagg drives it).
func TestSidecarPrefill(t *testing.T) {
	t.Parallel()
	pre, preURL := pdEngine(t, 1)
	dec, decURL := pdEngine(t, 2)
	preSub, preIx := startSubscriber(t, pre, indexer.Rank{WorkerID: 1})
	decSub, decIx := startSubscriber(t, dec, indexer.Rank{WorkerID: 2})
	refPre, refPreURL := pdEngine(t, 3)
	refDec, refDecURL := pdEngine(t, 4)

	completion := "Disaggregated serving splits prefill and decode across engines"
	ctoks := Tokenize(completion)
	msgs := []map[string]string{{"role": "user", "content": "Which engine computes my prompt, and which decodes it?"}}
	chatToks := Tokenize(ChatPrompt([]Message{{Role: "user", Content: msgs[0]["content"]}}, true))

	// Through the sidecar: a streamed completion, then a chat completion.
	req, err := http.NewRequest(http.MethodPost, decURL+"/v1/completions", bytes.NewReader(mustJSON(map[string]any{
		"model": "m", "prompt": completion, "max_tokens": 3, "stream": true, "stream_options": map[string]bool{"include_usage": true}})))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(PrefillerHeader, hostPort(t, preURL))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("completion through the sidecar: %d %s", resp.StatusCode, b)
	}
	s := sse{bufio.NewReader(resp.Body)}
	text, usage := completionText(t, s)
	if text != expectText(ctoks, 3) {
		t.Fatalf("decoded %q, want %q", text, expectText(ctoks, 3))
	}
	if cached := usage["prompt_tokens_details"].(map[string]any)["cached_tokens"]; cached != float64(len(ctoks)) || usage["completion_tokens"] != 3.0 {
		t.Fatalf("usage %v: want 3 tokens and the whole prompt cached (its KV came from the prefill engine)", usage)
	}

	status, body := postWith(t, decURL+"/v1/chat/completions", prefillerHeader(hostPort(t, preURL)),
		map[string]any{"model": "m", "messages": msgs, "max_completion_tokens": 2})
	if status != 200 {
		t.Fatalf("chat through the sidecar: %d %s", status, body)
	}
	var chat struct {
		Choices []struct {
			Message struct{ Content string }
		}
		Usage struct {
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Content != expectText(chatToks, 2) || chat.Usage.CompletionTokens != 2 ||
		chat.Usage.PromptTokensDetails.CachedTokens != len(chatToks) || chat.KVTransferParams != nil {
		t.Fatalf("chat answer %s", body)
	}
	if got := dec.Sidecar(); got != (SidecarStats{Prefills: 2}) {
		t.Fatalf("sidecar stats %+v", got)
	}
	// The prefill engine computed both prompts, the decode engine none.
	if l := pre.Load(); l.PrefixQueries != uint64(len(ctoks)+len(chatToks)) {
		t.Fatalf("prefill engine computed %d prompt tokens, want %d", l.PrefixQueries, len(ctoks)+len(chatToks))
	}
	if l := dec.Load(); l.PrefixQueries != 0 {
		t.Fatalf("decode engine computed %d prompt tokens, want 0 (the KV is transferred)", l.PrefixQueries)
	}

	// The same two requests between a router and a P/D pair.
	for _, r := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"model": "m", "prompt": completion, "max_tokens": 3}},
		{"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_completion_tokens": 2}},
	} {
		p := maps.Clone(r.body)
		p["max_tokens"], p["stream"] = 1, false
		if r.path == "/v1/chat/completions" {
			p["max_completion_tokens"] = 1
		}
		p["kv_transfer_params"] = json.RawMessage(prefillTransfer)
		status, body := postWith(t, refPreURL+r.path, nil, p)
		if status != 200 {
			t.Fatalf("reference prefill: %d %s", status, body)
		}
		d := maps.Clone(r.body)
		d["kv_transfer_params"] = rawField(t, body, "kv_transfer_params")
		if status, body := postWith(t, refDecURL+r.path, nil, d); status != 200 {
			t.Fatalf("reference decode: %d %s", status, body)
		}
	}
	for _, c := range []struct {
		name      string
		got, want *Engine
	}{{"prefill", pre, refPre}, {"decode", dec, refDec}} {
		if got, want := c.got.Holds(), c.want.Holds(); !maps.Equal(got, want) || len(got) == 0 {
			t.Fatalf("%s engine caches %v, a P/D pair's %v", c.name, got, want)
		}
	}
	if dec.Hit(ctoks) != len(ctoks)/testBS || dec.Hit(chatToks) != len(chatToks)/testBS {
		t.Fatal("the decode engine did not cache the transferred blocks")
	}
	// Their events: each index holds exactly its engine's cache.
	caughtUp(t, preSub, pre)
	checkEqual(t, preIx, pre, indexer.Rank{WorkerID: 1})
	caughtUp(t, decSub, dec)
	checkEqual(t, decIx, dec, indexer.Rank{WorkerID: 2})
}

// TestSidecarPrefillFailures: a bad x-prefiller-host-port or a request
// the engine refuses is a 400 before any prefill; a prefill engine that is
// unreachable, refuses, or answers no kv_transfer_params makes the decode
// engine answer an error object (the prefill's status, or 502), counted,
// and leaves it holding nothing.
func TestSidecarPrefillFailures(t *testing.T) {
	t.Parallel()
	_, preURL := pdEngine(t, 1)
	dec, decURL := pdEngine(t, 2)

	var plainHits atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"x"}]}`)
	}))
	t.Cleanup(plain.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	good := map[string]any{"model": "m", "prompt": "a prompt to prefill elsewhere", "max_tokens": 2}
	for _, tc := range []struct {
		name     string
		header   http.Header
		body     map[string]any
		arm      string // a fault armed on the prefill engine first
		status   int
		param    any
		contains string
		failure  bool
	}{
		{name: "not host:port", header: prefillerHeader("10.0.0.1"), body: good, status: 400, param: "x-prefiller-host-port", contains: "want host:port"},
		{name: "bad port", header: prefillerHeader("10.0.0.1:0"), body: good, status: 400, param: "x-prefiller-host-port", contains: "port from 1 to 65535"},
		{name: "twice", header: http.Header{PrefillerHeader: {hostPort(t, preURL), hostPort(t, preURL)}}, body: good, status: 400, param: "x-prefiller-host-port"},
		{name: "huge", header: prefillerHeader(strings.Repeat("h", 10_000) + ":80"), body: good, status: 400, param: "x-prefiller-host-port", contains: "10003 bytes"},
		{name: "bad request", header: prefillerHeader(hostPort(t, plain.URL)), body: map[string]any{"model": "m", "max_tokens": 2}, status: 400, param: "prompt"},
		{name: "other model", header: prefillerHeader(hostPort(t, plain.URL)), body: map[string]any{"model": "x", "prompt": "p"}, status: 404, param: "model"},
		{name: "unreachable", header: prefillerHeader(closed), body: good, status: 502, param: nil, contains: "unreachable", failure: true},
		{name: "prefill refuses", header: prefillerHeader(hostPort(t, preURL)), body: good, arm: "/faults/fail?status=503", status: 503, param: nil,
			contains: "answered 503: injected fault", failure: true},
		{name: "not a prefill engine", header: prefillerHeader(hostPort(t, plain.URL)), body: good, status: 502, param: nil,
			contains: "no kv_transfer_params", failure: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.arm != "" {
				if resp, body := postJSON(t, preURL+tc.arm, ""); resp.StatusCode != http.StatusNoContent {
					t.Fatalf("arm: %d %s", resp.StatusCode, body)
				}
			}
			before := dec.Sidecar().Failures
			status, body := postWith(t, decURL+"/v1/completions", tc.header, tc.body)
			var e struct {
				Error struct {
					Message string
					Type    string
					Param   any
					Code    int
				}
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%d %s: %v", status, body, err)
			}
			if status != tc.status || e.Error.Code != tc.status || e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.contains) {
				t.Fatalf("%d %s: want %d, param %v, a message with %q", status, body, tc.status, tc.param, tc.contains)
			}
			if len(body) > 1024 {
				t.Fatalf("the error repeats %d bytes", len(body))
			}
			if got := dec.Sidecar().Failures - before; got != map[bool]uint64{true: 1}[tc.failure] {
				t.Fatalf("failures counted %d", got)
			}
		})
	}
	if n := plainHits.Load(); n != 1 {
		t.Fatalf("the non-prefill server was asked %d times; want once (refused requests are not sent on)", n)
	}
	if h, l := dec.Holds(), dec.Load(); len(h) != 0 || l.Running+l.Waiting+l.Transferring != 0 || dec.Sidecar().Prefills != 0 {
		t.Fatalf("decode engine after failed prefills: holds %v, load %+v, %+v", h, l, dec.Sidecar())
	}
}
