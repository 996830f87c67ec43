package apiserver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/indexer"
)

// fakeWorkers records calls and answers with the configured errors.
type fakeWorkers struct {
	mu            sync.Mutex // guards every field
	registered    []catalog.Registration
	unregistered  []unregistration
	listArgs      [][2]string
	list          []WorkerState
	registerErr   error
	unregisterErr error
}

var _ Workers = (*fakeWorkers)(nil)

// unregistration is the arguments of one Unregister call.
type unregistration struct {
	model, group string
	id           uint64
	rank         *uint32
}

func (f *fakeWorkers) Register(_ context.Context, r catalog.Registration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registered = append(f.registered, r)
	return f.registerErr
}

func (f *fakeWorkers) Unregister(_ context.Context, model, group string, id uint64, rank *uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unregistered = append(f.unregistered, unregistration{model, group, id, rank})
	return f.unregisterErr
}

func (f *fakeWorkers) List(model, group string) []WorkerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listArgs = append(f.listArgs, [2]string{model, group})
	var out []WorkerState
	for _, w := range f.list {
		if (model == "" || w.Record.ModelName == model) && (group == "" || w.Record.RoutingGroup == group) {
			out = append(out, w)
		}
	}
	return out
}

// server is a handler behind a real loopback HTTP server.
type server struct {
	t   testing.TB
	srv *httptest.Server
}

func newServer(t testing.TB, cfg Config) *server {
	t.Helper()
	srv := httptest.NewServer(NewHandler(cfg))
	t.Cleanup(srv.Close)
	return &server{t: t, srv: srv}
}

type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request; headers come as "Name: value" strings.
func (s *server) do(method, path, body string, headers ...string) response {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.srv.URL+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

func (s *server) post(path, body string, headers ...string) response {
	s.t.Helper()
	return s.do(http.MethodPost, path, body, headers...)
}

func (s *server) get(path string) response {
	s.t.Helper()
	return s.do(http.MethodGet, path, "")
}

// expect checks the status and the exact body (without the final newline).
func (r response) expect(t testing.TB, status int, body string) {
	t.Helper()
	if r.status != status || strings.TrimSuffix(r.body, "\n") != body {
		t.Errorf("got %d %s\nwant %d %s", r.status, r.body, status, body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

// prompt returns n tokens base, base+1, ….
func prompt(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// store applies one Stored op for rank r: the blocks of tokens (engine
// hashes ext, one per block) after parent (0 = none), in tier.
func store(t testing.TB, ix *indexer.Index, k indexer.PartitionKey, r indexer.Rank, seq uint64, tier indexer.Tier, seed uint64, parent uint64, ext []uint64, tokens []uint32) {
	t.Helper()
	bs, err := ix.BlockSize(k)
	if err != nil {
		t.Fatal(err)
	}
	op := indexer.Op{Kind: indexer.OpStore, Store: indexer.Stored{
		Parent: parent, HasParent: parent != 0, Hashes: ext, Tokens: tokens, BlockSize: bs, Tier: tier, Seed: seed,
	}}
	res, err := ix.Apply(k, r, seq, []indexer.Op{op})
	if err != nil || len(res.Errs) > 0 {
		t.Fatalf("apply: %v %v", err, res.Errs)
	}
}

// seq returns n engine hashes from, from+1, ….
func seq(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// tokensJSON renders tokens as a JSON array.
func tokensJSON(tokens []uint32) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, tok := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(tok), 10))
	}
	b.WriteByte(']')
	return b.String()
}

// defaultHot reads p's hot arrays within the default limits.
func defaultHot(p *api.Prompt) []ownField {
	return promptFields(p, api.DefaultMaxTokens, api.DefaultMaxBlockHashes)
}
