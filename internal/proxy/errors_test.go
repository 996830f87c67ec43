package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// openAIErr is OpenAI's error body.
type openAIErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func decodeErr(t *testing.T, body string) openAIErr {
	t.Helper()
	var e openAIErr
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == 0 {
		t.Fatalf("not OpenAI's error object: %q (%v)", body, err)
	}
	return e
}

// direct posts body to an engine itself, for what it answers.
func direct(t *testing.T, url, path string, body any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestEngineRefusalsAsSent: requests an engine refuses (n 2, a negative
// or oversized max_tokens, no messages) reach the client with the
// engine's status and body, byte for byte, and are tried on no other
// engine.
func TestEngineRefusalsAsSent(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	msgs := []map[string]string{{"role": "user", "content": "hello"}}
	for _, c := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/v1/completions", map[string]any{"model": model, "prompt": "hello there", "n": 2}, "n"},
		{"/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": -1}, "max_tokens"},
		{"/v1/completions", map[string]any{"model": model, "prompt": "hello there", "max_tokens": 1 << 30}, "max_tokens"},
		{"/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "n": 2}, "n"},
		{"/v1/chat/completions", map[string]any{"model": model, "messages": []any{}}, "messages"},
	} {
		code, body := s.post(c.path, c.body)
		wantCode, wantBody := direct(t, s.urls[1], c.path, c.body)
		if wantCode != http.StatusBadRequest {
			t.Fatalf("%s %v: the engine itself answers %d %s", c.path, c.body, wantCode, wantBody)
		}
		if code != wantCode || body != wantBody {
			t.Errorf("%s %v: the proxy answers %d %s, the engine %d %s", c.path, c.body, code, body, wantCode, wantBody)
			continue
		}
		if e := decodeErr(t, body); e.Error.Type != "BadRequestError" || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s %v: %+v", c.path, c.body, e.Error)
		}
	}
	if n := s.logs.Count("proxy: engine failed before its first byte; retrying on the next-best engine"); n != 0 {
		t.Fatalf("%d refusals retried on another engine", n)
	}
	_, page := s.get("/metrics")
	for _, want := range []string{`prefixd_proxy_retries_total 0`, `prefixd_proxy_requests_total{outcome="engine_4xx",route="completions"} 3`,
		`prefixd_proxy_requests_total{outcome="engine_4xx",route="chat"} 2`} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The proxy's own errors are OpenAI's error object, with the status
	// and type vLLM would answer and the field at fault.
	code, body := s.post("/v1/chat/completions", map[string]any{"model": model})
	if e := decodeErr(t, body); code != http.StatusBadRequest || e.Error.Type != "BadRequestError" || e.Error.Code != 400 || e.Error.Param == nil || *e.Error.Param != "messages" {
		t.Fatalf("no messages: %d %s", code, body)
	}
	code, body = s.get("/v1/nowhere")
	if e := decodeErr(t, body); code != http.StatusNotFound || e.Error.Type != "NotFoundError" || e.Error.Param != nil {
		t.Fatalf("no such route: %d %s", code, body)
	}
}

// TestUnknownModel: a model no engine serves is a 404 naming the models
// served, as vLLM answers it (NotFoundError, param "model"); nothing is
// tokenized for it and nothing logged.
func TestUnknownModel(t *testing.T) {
	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		code, body := s.post(path, map[string]any{"model": "gpt-4o", "prompt": "hello", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		e := decodeErr(t, body)
		if code != http.StatusNotFound || e.Error.Type != "NotFoundError" || e.Error.Code != 404 || e.Error.Param == nil || *e.Error.Param != "model" ||
			!strings.Contains(e.Error.Message, "`gpt-4o` does not exist") || !strings.Contains(e.Error.Message, "serve m ") {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
	for _, rec := range s.logs.Records() {
		if rec.Level >= 0 && rec.Msg != "proxy: fleet view changed" && rec.Msg != "proxy: prefixd accepts the proxy's token" {
			t.Errorf("logged for an unknown model: %s", rec)
		}
	}
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_requests_total{outcome="error_4xx",route="chat"} 1`) ||
		strings.Contains(page, `prefixd_proxy_tokenize_total`) && strings.Contains(page, `source="unavailable"`) {
		t.Fatalf("metrics:\n%s", page)
	}
}

// tokenTransport sets the bearer token of prefixd's client per request,
// from token: a proxy whose token is fixed while it runs.
type tokenTransport struct{ token *atomic.Value }

func (tt tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if tok := tt.token.Load().(string); tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	} else {
		r.Header.Del("Authorization")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestTokenRefused: prefixd serve guards its booking routes with a
// token and the proxy has none. The proxy says so once, as an ERROR, at
// start, before any request; /health and the booking gauge show it;
// requests are served, routed by load, with no line each. Given the
// token, it says it books again, and does.
func TestTokenRefused(t *testing.T) {
	var token atomic.Value
	token.Store("")
	pc := &client.Client{HTTP: &http.Client{Transport: tokenTransport{&token}}}
	s := startStackToken(t, "s3cret", proxy.Config{Prefixd: pc}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	const refused = "proxy: prefixd refuses the proxy's token: nothing is booked, every request is routed by load; give prefixd proxy the API token prefixd serve was started with (--api-token, or PREFIXD_API_TOKEN)"
	rec := s.logs.Wait(t, 10*time.Second, refused)
	if rec.Level != slog.LevelError || !strings.Contains(rec.Attrs["answer"], "HTTP 401") || rec.Attrs["prefixd"] != s.prefixd.BaseURL {
		t.Fatalf("the refusal's line: %s", rec)
	}
	code, body := s.get("/health")
	if code != http.StatusOK || !strings.Contains(body, `"status":"degraded"`) || !strings.Contains(body, `"booking":"unauthorized"`) || !strings.Contains(body, "--api-token") {
		t.Fatalf("/health: %d %s", code, body)
	}
	for i := range 5 {
		if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(i), "max_tokens": 2}); code != http.StatusOK {
			t.Fatalf("without booking: %d %s", code, body)
		}
	}
	_, page := s.get("/metrics")
	for _, want := range []string{`prefixd_proxy_booking{state="unauthorized"} 1`, `prefixd_proxy_booking{state="ok"} 0`, `prefixd_proxy_fallbacks_total{reason="unauthorized"} 5`} {
		if !strings.Contains(page, want) {
			t.Fatalf("metrics lack %s:\n%s", want, page)
		}
	}
	if n := s.logs.Count(refused); n != 1 {
		t.Fatalf("the refusal logged %d times, want once", n)
	}
	if n := s.logs.Count("proxy: prefixd did not choose; routing by load"); n != 0 {
		t.Fatalf("%d lines for requests routed by load", n)
	}
	token.Store("s3cret")
	s.logs.Wait(t, 10*time.Second, "proxy: prefixd accepts the proxy's token again: booking")
	if code, body := s.get("/health"); !strings.Contains(body, `"status":"ok"`) || !strings.Contains(body, `"booking":"ok"`) {
		t.Fatalf("/health: %d %s", code, body)
	}
	if code, body := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(9), "max_tokens": 2}); code != http.StatusOK {
		t.Fatalf("with the token: %d %s", code, body)
	}
	if _, page := s.get("/metrics"); !strings.Contains(page, `prefixd_proxy_booking{state="ok"} 1`) || !strings.Contains(page, `prefixd_proxy_fallbacks_total{reason="unauthorized"} 5`) ||
		!strings.Contains(page, `prefixd_proxy_tokenize_total{source="engine"} 6`) {
		t.Fatalf("metrics after the token:\n%s", page)
	}
}

// TestTokenAccepted: with prefixd's token the proxy says once that it
// books, and /health says so.
func TestTokenAccepted(t *testing.T) {
	pc := &client.Client{Token: "s3cret", HTTP: http.DefaultClient}
	s := startStackToken(t, "s3cret", proxy.Config{Prefixd: pc}, coordinator.CoordinatorConfig{}, spec{id: 1, role: catalog.RoleAggregated})
	rec := s.logs.Wait(t, 10*time.Second, "proxy: prefixd accepts the proxy's token")
	if rec.Attrs["token"] != "given" {
		t.Fatalf("%s", rec)
	}
	if code, body := s.get("/health"); code != http.StatusOK || body != `{"status":"ok","booking":"ok"}`+"\n" {
		t.Fatalf("/health: %d %q", code, body)
	}
	testsupport.Eventually(t, 5*time.Second, "one booking", func() bool {
		code, _ := s.post("/v1/completions", map[string]any{"model": model, "prompt": longPrompt(3), "max_tokens": 2})
		return code == http.StatusOK
	})
	if _, page := s.get("/metrics"); strings.Contains(page, `prefixd_proxy_fallbacks_total`) && strings.Contains(page, `reason="`) {
		t.Fatalf("a request routed by load:\n%s", page)
	}
}
