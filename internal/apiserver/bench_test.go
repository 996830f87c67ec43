package apiserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport/openloop"
	"github.com/prometheus/client_golang/prometheus"
)

// benchIndex builds an index in which an 8,192-token prompt (512 blocks of
// 16) is held by 16 ranks to different depths and tiers, among 64 other
// 8K-token prompts that share its first 64 blocks (a system prompt).
func benchIndex(b *testing.B) (*indexer.Index, []uint32) {
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(mDefault, 16); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	gen := func(n int) []uint32 {
		p := make([]uint32, n)
		for i := range p {
			p[i] = uint32(rng.IntN(150_000))
		}
		return p
	}
	system := gen(1024)
	mk := func() []uint32 { return append(slices.Clone(system), gen(8192-1024)...) }
	target := mk()
	ext := uint64(1)
	put := func(r indexer.Rank, p []uint32, blocks int, tier indexer.Tier, parent uint64) uint64 {
		hs := seq(ext, blocks)
		ext += uint64(blocks)
		store(b, ix, mDefault, r, 1, tier, indexer.BaseSeed, parent, hs, p[:blocks*16])
		return hs[len(hs)-1]
	}
	for w := uint64(1); w <= 8; w++ {
		for rank := uint32(0); rank < 2; rank++ {
			r := indexer.Rank{WorkerID: w, DPRank: rank}
			dev := 512 * int(w) / 8 >> rank // 32 … 512 blocks on the device
			last := put(r, target, dev, indexer.TierDevice, 0)
			if w%3 == 0 && dev < 512 { // some ranks hold more in host memory
				n := min(64, 512-dev)
				hs := seq(ext, n)
				ext += uint64(n)
				store(b, ix, mDefault, r, 2, indexer.TierHost, indexer.BaseSeed, last, hs, target[dev*16:(dev+n)*16])
			}
		}
	}
	for i := 0; i < 64; i++ {
		put(indexer.Rank{WorkerID: uint64(100 + i)}, mk(), 512, indexer.TierDevice, 0)
	}
	return ix, target
}

func benchBody(b *testing.B, p []uint32) []byte {
	body := []byte(`{"model_name":"m","token_ids":` + tokensJSON(p) + `}`)
	b.Logf("request body %d bytes", len(body))
	return body
}

// BenchmarkQuery8K measures POST /query of an 8,192-token prompt (a 50 KB
// body) over a real loopback HTTP server. Each sub-benchmark runs for a
// fixed 2 s whatever b.N (run it with the default -benchtime):
//
//	go test -run '^$' -bench Query8K ./internal/apiserver/
//
// The server is the daemon's: NewServer.
//
// rate=N: open loop (openloop.Run) through net/http's client: a request due
// every 1/N s, its latency from then to the last byte of the response,
// so a late hand-out or a wait for one of the 64 openloop.Senders counts;
// "dropped" counts requests that found 1 s of backlog queued; req/s is
// the rate answered and sent-req/s the rate the generator reached. A run
// that sent under 99 % of N says so (short=1, and a line in the log).
//
// clients=N: closed loop, N clients back to back: the maximum sustained
// rate. Client and server share the machine's cores, so every figure
// includes the client's own HTTP and JSON costs.
func BenchmarkQuery8K(b *testing.B) {
	ix, p := benchIndex(b)
	body := benchBody(b, p)
	addr := liveServer(b, NewHandler(Config{Index: ix}), ServerConfig{}) // the daemon's server
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, DisableCompression: true}}
	defer client.CloseIdleConnections()
	url := "http://" + addr + "/query"

	const window = 2 * time.Second
	for _, rate := range []int{1000, 2000, 5000, 7500, 10000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			r := openloop.Run(func() (openloop.Sender, error) { return openloop.HTTPSender{Client: client, URL: url, Body: body}, nil }, rate, 0, window)
			if r.Failed > 0 {
				b.Fatalf("%d requests failed", r.Failed)
			}
			r.Report(b)
		})
	}

	for _, clients := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			var lat openloop.Latencies
			var failed atomic.Int64
			start := time.Now()
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					var mine []time.Duration
					for time.Since(start) < window {
						t0 := time.Now()
						if err := openloop.Post(client, url, body); err != nil {
							failed.Add(1)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					lat.Add(mine)
				})
			}
			wg.Wait()
			if failed.Load() > 0 {
				b.Fatalf("%d requests failed", failed.Load())
			}
			lat.Report(b, time.Since(start))
		})
	}
}

// BenchmarkQuery8KHandler is the handler alone, without the network:
// read the body, decode, hash, match and encode the scores.
func BenchmarkQuery8KHandler(b *testing.B) {
	ix, p := benchIndex(b)
	body := benchBody(b, p)
	h := NewHandler(Config{Index: ix})
	w := httptest.NewRecorder()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/query", bytes.NewReader(body))
		w.Body.Reset()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code, w.Body)
		}
	}
}

// BenchmarkQueryByHash8KHandler is /query_by_hash's handler alone, with
// the 512 block hashes of the 8,192-token prompt: read the body, decode,
// match and encode the scores; metrics=on as the daemon serves it, with
// every request's latency observed (Config.Registerer).
func BenchmarkQueryByHash8KHandler(b *testing.B) {
	ix, p := benchIndex(b)
	body := byHashBody(p)
	for _, metrics := range []bool{false, true} {
		b.Run(map[bool]string{false: "metrics=off", true: "metrics=on"}[metrics], func(b *testing.B) {
			cfg := Config{Index: ix}
			if metrics {
				cfg.Registerer = prometheus.NewRegistry()
			}
			h := NewHandler(cfg)
			w := httptest.NewRecorder()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/query_by_hash", bytes.NewReader(body))
				w.Body.Reset()
				h.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatal(w.Code, w.Body)
				}
			}
		})
	}
}

// byHashBody is the /query_by_hash body of prompt p: its local block
// hashes as the signed int64 values Dynamo sends (19–20 characters each).
func byHashBody(p []uint32) []byte {
	var hs []string
	for _, h := range indexer.HashBlocks(nil, p, 16, indexer.BaseSeed) {
		hs = append(hs, strconv.FormatInt(int64(h), 10))
	}
	return []byte(`{"model_name":"m","block_hashes":[` + strings.Join(hs, ",") + `]}`)
}

// BenchmarkDecodeQuery8K is the body decoding alone (decodeQuery, as
// /query does), against encoding/json into QueryRequest (whose TokenIDs
// reads the array with the lexer: what the cold bodies cost per token) and
// into a plain []uint32 (the reason for lexer).
func BenchmarkDecodeQuery8K(b *testing.B) {
	_, p := benchIndex(b)
	body := benchBody(b, p)
	// lexer-spaced: as Python's json.dumps writes the array, ", " between
	// ids.
	spaced := bytes.ReplaceAll(body, []byte(","), []byte(", "))
	for _, c := range []struct {
		name string
		body []byte
	}{{"lexer", body}, {"lexer-spaced", spaced}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			var toks []uint32
			for b.Loop() {
				req, err := decodeQuery(c.body, toks[:0], api.DefaultMaxTokens)
				if err != nil || len(req.TokenIDs) != 8192 {
					b.Fatal(err)
				}
				toks = req.TokenIDs
			}
		})
	}
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req api.QueryRequest
			if err := json.Unmarshal(body, &req); err != nil || len(req.TokenIDs) != 8192 {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-plain", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req struct {
				TokenIDs  []uint32 `json:"token_ids"`
				ModelName string   `json:"model_name"`
			}
			if err := json.Unmarshal(body, &req); err != nil || len(req.TokenIDs) != 8192 {
				b.Fatal(err)
			}
		}
	})
}

// planBody is a /disagg/plans body with the 8K-token prompt of benchIndex
// and every optional field.
func planBody(b *testing.B) []byte {
	_, p := benchIndex(b)
	return []byte(`{"request_id":"p1","model_name":"m","routing_group":"g","prefill_routing_group":"pg",` +
		`"policy":{"kind":"isl_or_load","eff_isl_threshold":100,"decode_busy_threshold":0.8},"prefill_failure":"free_decode",` +
		`"pinned_prefill_worker":{"worker_id":3,"dp_rank":1},"allowed_worker_ids":[1,2,3,4],` +
		`"routing_constraints":{"required_taints":["gpu"],"preferred_taints":{"zone-a":0.5}},"token_ids":` + tokensJSON(p) + `}`)
}

// BenchmarkDecodePlan8K is a cold body's decoding alone: decodeJSON (the
// lexer's pass, which reads token_ids, then encoding/json for the rest).
func BenchmarkDecodePlan8K(b *testing.B) {
	body := planBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var req api.PlanRequest
		if _, err := decodeJSON(body, &req, nil, defaultHot(&req.Prompt)...); err != nil || len(req.TokenIDs) != 8192 {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeQueryByHash8K is /query_by_hash's body decoding alone:
// the 512 local block hashes of the 8,192-token prompt, as the signed
// int64 values Dynamo sends (19–20 characters each).
func BenchmarkDecodeQueryByHash8K(b *testing.B) {
	_, p := benchIndex(b)
	body := byHashBody(p)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var dst []uint64
	for b.Loop() {
		_, got, err := decodeQueryByHash(body, dst[:0], api.DefaultMaxBlockHashes)
		if err != nil || len(got) != 512 {
			b.Fatal(err)
		}
		dst = got
	}
}

// BenchmarkScores8K is the score response alone (appendScores): the 80
// ranks of 72 instances that match the 8,192-token prompt of benchIndex,
// in Match's order, encoded into a reused buffer (7.2 KB).
func BenchmarkScores8K(b *testing.B) {
	ix, p := benchIndex(b)
	ov, err := ix.MatchTokens(mDefault, p, indexer.BaseSeed, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d ranks match", len(ov))
	work := make([]indexer.Overlap, len(ov))
	var out []byte
	b.ReportAllocs()
	for b.Loop() {
		copy(work, ov) // appendScores sorts it
		out = appendScores(out[:0], work, nil, 16)
	}
	b.SetBytes(int64(len(out)))
}
