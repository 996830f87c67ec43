package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/zeebo/xxh3"
)

// tokenizer turns a request's prompt into the engine's token ids with
// the engine's own tokenizer and chat template (vLLM's POST /tokenize),
// caching answers by the exact tokenize body: tokenizing is not prefix
// stable in general (a BPE merge or a chat template can change tokens
// before the end), so only an identical prompt — a retried or repeated
// request — is answered from the cache.
type tokenizer struct {
	hc    *http.Client
	cache *lru.Cache[xxh3.Uint128, []uint32]
}

func newTokenizer(hc *http.Client, size int) *tokenizer {
	c, err := lru.New[xxh3.Uint128, []uint32](max(size, 1))
	if err != nil {
		panic(err) // size ≥ 1
	}
	return &tokenizer{hc: hc, cache: c}
}

// maxTokenizeAnswer bounds a /tokenize answer (a million token ids).
const maxTokenizeAnswer = 16 << 20

// tokens returns body's token ids from the cache, or from the engine at
// base (and then caches them); hit says which.
func (t *tokenizer) tokens(ctx context.Context, base string, body []byte) (ids []uint32, hit bool, err error) {
	key := xxh3.Hash128(body)
	if ids, ok := t.cache.Get(key); ok {
		return ids, true, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.hc.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeAnswer+1))
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("POST %s/tokenize: HTTP %d: %s", base, resp.StatusCode, clipBytes(raw))
	}
	if len(raw) > maxTokenizeAnswer {
		return nil, false, errors.New("tokenize answer too long")
	}
	var a struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, false, fmt.Errorf("POST %s/tokenize: %v", base, shortErr(err))
	}
	if a.Tokens == nil {
		return nil, false, fmt.Errorf("POST %s/tokenize: no tokens in the answer", base)
	}
	t.cache.Add(key, a.Tokens)
	return a.Tokens, false, nil
}

// clipBytes shortens an answer quoted in an error.
func clipBytes(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
