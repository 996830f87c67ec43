package apiserver

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestTokens sends every class of route with no token, a wrong one, the
// read token and the API token, under each combination of configured
// tokens. The probes are always open; GET /dump and the writes need the
// API token; the other reads need the read token or the API token.
func TestTokens(t *testing.T) {
	const (
		open  = iota // no token needed
		read         // the read token or the API token
		write        // the API token
	)
	ix, p := dynamoExample(t)
	routes := []struct {
		method, path, body string
		class              int
	}{
		{"GET", "/health", "", open},
		{"GET", "/ready", "", open},
		{"HEAD", "/health", "", open},
		{"POST", "/query", `{"token_ids":` + tokensJSON(p) + `,"model_name":"m"}`, read},
		{"POST", "/query_by_hash", `{"block_hashes":[1],"model_name":"m"}`, read},
		{"GET", "/workers", "", read},
		{"GET", "/metrics", "", read},
		{"POST", "/select", `{"model_name":"m","token_ids":[1]}`, read},
		{"GET", "/disagg/plans/p", "", read},
		{"GET", "/dump", "", write},
		{"HEAD", "/dump", "", write},
		{"POST", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":16}`, write},
		{"POST", "/unregister", `{"instance_id":1,"model_name":"m"}`, write},
		{"POST", "/select_and_reserve", `{"model_name":"m","token_ids":[1],"selection_id":"s"}`, write},
		{"POST", "/reservations", `{"selection_id":"r","model_name":"m","worker_id":7,"token_ids":[1]}`, write},
		{"POST", "/reservations/r/prefill_complete", "", write},
		{"DELETE", "/reservations/r", "", write},
		{"POST", "/disagg/plans", `{"request_id":"p","model_name":"m","token_ids":[1]}`, write},
		{"POST", "/disagg/plans/p/prefill_complete", "", write},
		{"POST", "/disagg/plans/p/prefill_failed", "", write},
		{"POST", "/disagg/plans/p/decode", "", write},
		{"DELETE", "/disagg/plans/p", "", write},
	}
	for _, cfg := range []struct {
		name, api, read string
	}{{"both tokens", "api-tok", "read-tok"}, {"API token only", "api-tok", ""}, {"read token only", "", "read-tok"}, {"no tokens", "", ""}} {
		t.Run(cfg.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := newServer(t, Config{Index: ix, Workers: &fakeWorkers{}, Selector: newFakeSelector(), APIToken: cfg.api, ReadToken: cfg.read,
				Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
			for _, rt := range routes {
				// What each route needs under this configuration.
				class := rt.class
				if class == write && cfg.api == "" {
					class = read
				}
				if class == read && cfg.read == "" {
					class = open
				}
				for _, tok := range []string{"", "wrong", cfg.read, cfg.api} {
					var hdr []string
					if tok != "" {
						hdr = append(hdr, "Authorization: Bearer "+tok)
					}
					r := s.do(rt.method, rt.path, rt.body, hdr...)
					want := 0 // not refused
					switch {
					case class == open || (tok != "" && tok == cfg.api) || (class == read && tok != "" && tok == cfg.read):
					case tok != "" && tok == cfg.read:
						want = http.StatusForbidden
					default:
						want = http.StatusUnauthorized
					}
					if want == 0 {
						if r.status == http.StatusUnauthorized || r.status == http.StatusForbidden {
							t.Errorf("%s %s with %q: %d %.200s", rt.method, rt.path, tok, r.status, r.body)
						}
						continue
					}
					if r.status != want || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), `Bearer realm="prefixd"`) {
						t.Errorf("%s %s with %q: %d %.200s (WWW-Authenticate %q), want %d", rt.method, rt.path, tok, r.status, r.body, r.header.Get("WWW-Authenticate"), want)
					}
					if rt.method == "HEAD" {
						continue
					}
					msg := map[string]string{"": `{"error":"authorization: missing bearer token"}`, "wrong": `{"error":"authorization: invalid bearer token"}`}[tok]
					if want == http.StatusForbidden {
						msg = `{"error":"authorization: the read token does not allow ` + rt.method + ` `
						if !strings.HasPrefix(r.body, msg) || r.header.Get("WWW-Authenticate") != `Bearer realm="prefixd", error="insufficient_scope"` {
							t.Errorf("%s %s with the read token: %s (%q)", rt.method, rt.path, r.body, r.header.Get("WWW-Authenticate"))
						}
					} else if strings.TrimSpace(r.body) != msg {
						t.Errorf("%s %s with %q: %.200s, want %s", rt.method, rt.path, tok, r.body, msg)
					}
				}
			}
		})
	}
}
