package proxy

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/tokenize"
)

// tokenizer is the proxy's tokenize.Client over the engines, with its
// cache.
type tokenizer struct{ c *tokenize.Client }

func newTokenizer(hc *http.Client, cache *tokenCache) *tokenizer {
	return &tokenizer{c: tokenize.New(hc, cache)}
}

// tokenCache is the cache of tokenize answers (tokenize.Cache).
type tokenCache = tokenize.Cache

func newTokenCache(entries int, maxBytes int64, evictions, refusals prometheus.Counter) *tokenCache {
	return tokenize.NewCache(entries, maxBytes, evictions, refusals)
}

// entryBytes is what an answer costs in the cache.
func entryBytes(ids []uint32) int64 { return tokenize.EntryBytes(ids) }

// tokens returns body's token ids from the cache, or from the engine at
// base; hit says which. A prompt of more ids than prefixd routes is a
// *promptTooLong.
func (t *tokenizer) tokens(ctx context.Context, base string, body []byte) (ids []uint32, hit bool, err error) {
	return t.c.Tokens(ctx, base, body)
}

// clipBytes shortens an answer quoted in an error.
func clipBytes(b []byte) string { return tokenize.ClipBytes(b) }
