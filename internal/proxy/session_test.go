package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/proxy"
)

// recordSessions is a transport to prefixd serve that records the
// session_id of every /select_and_reserve body it passes on.
type recordSessions struct {
	http.RoundTripper
	mu  sync.Mutex
	ids []string
}

func (rs *recordSessions) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/select_and_reserve" && r.Body != nil {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(b))
		var sr api.SelectRequest
		if err := json.Unmarshal(b, &sr); err != nil {
			return nil, err
		}
		rs.mu.Lock()
		rs.ids = append(rs.ids, sr.SessionID)
		rs.mu.Unlock()
	}
	return rs.RoundTripper.RoundTrip(r)
}

func (rs *recordSessions) last() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.ids) == 0 {
		return "<none>"
	}
	return rs.ids[len(rs.ids)-1]
}

// TestSessionFromRequest: the proxy names a request's session to
// prefixd serve from the x-session-id header, else the body's "user",
// else its "session_id"; a long id goes hashed, a non-string is ignored.
func TestSessionFromRequest(t *testing.T) {
	rs := &recordSessions{RoundTripper: http.DefaultTransport}
	s := startStack(t, proxy.Config{Prefixd: &client.Client{HTTP: &http.Client{Transport: rs}}}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	long := strings.Repeat("u", 300)
	for _, tc := range []struct {
		name string
		hdr  []string
		body map[string]any
		want string
	}{
		{"none", nil, nil, ""},
		{"header", []string{api.SessionHeader, "h1"}, nil, "h1"},
		{"header over user", []string{api.SessionHeader, "h2"}, map[string]any{"user": "u1"}, "h2"},
		{"user", nil, map[string]any{"user": "u2", "session_id": "s1"}, "u2"},
		{"session_id", nil, map[string]any{"session_id": "s2"}, "s2"},
		{"not a string", nil, map[string]any{"user": 7, "session_id": "s3"}, "s3"},
		{"long", nil, map[string]any{"user": long}, "sha256:"},
	} {
		body := map[string]any{"model": model, "prompt": "hello there " + tc.name, "max_tokens": 2}
		for k, v := range tc.body {
			body[k] = v
		}
		if code, out := s.post("/v1/completions", body, tc.hdr...); code != 200 {
			t.Fatalf("%s: %d %s", tc.name, code, out)
		}
		got := rs.last()
		if tc.want == "sha256:" {
			if !strings.HasPrefix(got, "sha256:") || len(got) != len("sha256:")+64 {
				t.Errorf("%s: session %q, want a SHA-256", tc.name, got)
			}
		} else if got != tc.want {
			t.Errorf("%s: session %q, want %q", tc.name, got, tc.want)
		}
	}
}
