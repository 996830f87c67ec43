package tokenize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// MaxPromptTokens bounds a prompt's token ids, as prefixd serve bounds
// the token ids it is sent.
const MaxPromptTokens = api.DefaultMaxTokens

// MaxAnswer bounds a /tokenize answer (a million token ids).
const MaxAnswer = 16 << 20

// Client turns a request's prompt into the engine's token ids with the
// engine's own tokenizer and chat template (vLLM's POST /tokenize),
// caching answers by the exact tokenize body: tokenizing is not prefix
// stable in general (a BPE merge or a chat template can change tokens
// before the end), so only an identical prompt — a retried or repeated
// request — is answered from the cache. Safe for concurrent use.
type Client struct {
	hc    *http.Client
	cache *Cache
}

// New returns a Client asking engines with hc and caching in cache.
func New(hc *http.Client, cache *Cache) *Client {
	return &Client{hc: hc, cache: cache}
}

// A PromptTooLong is a prompt prefixd would refuse to route: a 413.
type PromptTooLong struct{ Msg string }

func (e *PromptTooLong) Error() string { return e.Msg }

// Tokens returns body's token ids from the cache, or from the engine at
// base (and then caches them); hit says which. The ids are shared with
// the cache: the caller must not change them. A prompt of more ids than
// prefixd routes is a *PromptTooLong. body is not kept after Tokens
// returns (a miss sends a copy: net/http may read a request's body
// after the round trip returns), so it may come from a pool.
func (t *Client) Tokens(ctx context.Context, base string, body []byte) (ids []uint32, hit bool, err error) {
	key := xxh3.Hash128(body)
	if ids, ok := t.cache.Get(key); ok {
		return ids, true, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(bytes.Clone(body)))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.hc.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("POST %s/tokenize: HTTP %d: %s", base, resp.StatusCode, ClipBytes(raw))
	}
	if len(raw) > MaxAnswer {
		return nil, false, &PromptTooLong{fmt.Sprintf("prompt: more than %d tokens (the engine's tokenizer answered more than %d bytes)", MaxPromptTokens, MaxAnswer)}
	}
	ids, err = readTokens(raw)
	if le := (*jsonlex.Error)(nil); errors.As(err, &le) && le.Over {
		return nil, false, &PromptTooLong{fmt.Sprintf("prompt: more than %d tokens (by the engine's tokenizer)", MaxPromptTokens)}
	}
	if err != nil {
		return nil, false, fmt.Errorf("POST %s/tokenize: %w", base, err)
	}
	t.cache.Add(key, ids)
	return ids, false, nil
}

// readTokens reads the ids of a /tokenize answer ({"count", "max_model_len",
// "tokens"}) with jsonlex, counting them as it reads: more than
// MaxPromptTokens is a *jsonlex.Error with Over.
func readTokens(answer []byte) ([]uint32, error) {
	var ids []uint32
	found := false
	l := jsonlex.New(answer, "tokens")
	err := l.Document(func(key string) error {
		if key != "tokens" {
			return l.Skip(clip.String(key), 1)
		}
		found = true
		var err error
		ids, err = l.Tokens(key, ids[:0], MaxPromptTokens)
		return err
	})
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, errors.New("no tokens in the answer")
	case ids == nil:
		ids = []uint32{}
	}
	return ids, nil
}

// ClipBytes shortens an answer quoted in an error.
func ClipBytes(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// Cache is the cache of tokenize answers: least recently used first
// out, bounded in entries and in bytes (the ids' arrays and a fixed cost
// per entry). An answer larger than a sixteenth of the byte bound is not
// kept: it would push out many others. Safe for concurrent use: one
// mutex over golang-lru's single-threaded LRU.
type Cache struct {
	maxBytes int64
	// evictions and refusals count answers pushed out and answers too
	// large to keep.
	evictions, refusals prometheus.Counter

	mu    sync.Mutex // guards lru and bytes
	lru   *simplelru.LRU[xxh3.Uint128, []uint32]
	bytes int64
}

// EntryBytes is what an answer of ids costs in the cache: its array,
// and the key, list element and map entry, rounded up.
func EntryBytes(ids []uint32) int64 { return 4*int64(cap(ids)) + 128 }

// NewCache returns a cache of at most entries answers (at least 1) and
// maxBytes bytes; evictions and refusals count what it pushes out and
// what it does not keep.
func NewCache(entries int, maxBytes int64, evictions, refusals prometheus.Counter) *Cache {
	c := &Cache{maxBytes: maxBytes, evictions: evictions, refusals: refusals}
	// Called under c.mu, by Add (the entry bound) and RemoveOldest (the
	// byte bound): accounting only.
	lru, err := simplelru.NewLRU(max(entries, 1), func(_ xxh3.Uint128, ids []uint32) {
		c.bytes -= EntryBytes(ids)
		c.evictions.Inc()
	})
	if err != nil {
		panic(err) // entries ≥ 1
	}
	c.lru = lru
	return c
}

// Get returns the ids cached for key, making them the most recently used.
func (c *Cache) Get(key xxh3.Uint128) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Get(key)
}

// Add caches a copy of ids under key, evicting the least recently used
// answers until the cache is within its bounds again; an answer larger
// than a sixteenth of the byte bound is refused.
func (c *Cache) Add(key xxh3.Uint128, ids []uint32) {
	if EntryBytes(ids[:len(ids):len(ids)]) > c.maxBytes/16 {
		c.refusals.Inc()
		return
	}
	ids = slices.Clone(ids) // no spare capacity held
	n := EntryBytes(ids)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Contains(key) { // a concurrent miss added it first
		return
	}
	c.bytes += n
	c.lru.Add(key, ids)
	for c.bytes > c.maxBytes {
		c.lru.RemoveOldest()
	}
}

// Size returns the bytes and the entries the cache holds.
func (c *Cache) Size() (bytes int64, entries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, c.lru.Len()
}
