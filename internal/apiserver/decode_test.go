package apiserver

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/api"
)

// TestMalformed sends malformed requests; each must get the right 4xx and
// an error that starts with the field at fault.
func TestMalformed(t *testing.T) {
	ix, _ := dynamoExample(t)
	s := newServer(t, Config{Index: ix, Workers: &fakeWorkers{}, MaxBodyBytes: 4096, MaxTokens: 100, MaxBlockHashes: 100})
	const q = `"model_name":"m"`
	reg := func(fields string) string {
		return `{"instance_id":1,"endpoint":"tcp://h:5557","model_name":"m","block_size":16` + fields + `}`
	}
	for _, c := range []struct {
		name, path, body string
		status           int
		field            string // the error must start with field + ": "
	}{
		// Body level.
		{"empty body", "/query", ``, 400, "body"},
		{"whitespace body", "/query", " \n", 400, "body"},
		{"not an object", "/query", `[1,2]`, 400, "body"},
		{"null body", "/query", `null`, 400, "body"},
		{"trailing data", "/query", `{"token_ids":[1],` + q + `} x`, 400, "body"},
		{"two objects", "/query", `{"token_ids":[1],` + q + `}{}`, 400, "body"},
		{"trailing comma in object", "/query", `{"token_ids":[1],` + q + `,}`, 400, "body"},
		{"missing colon", "/query", `{"token_ids" [1]}`, 400, "body"},
		{"unquoted key", "/query", `{token_ids:[1]}`, 400, "body"},
		{"body over the limit", "/query", `{"token_ids":[1],` + q + `,"pad":"` + strings.Repeat("x", 4096) + `"}`, 413, "body"},
		// token_ids.
		{"token_ids missing", "/query", `{` + q + `}`, 400, "token_ids"},
		{"token_ids null", "/query", `{"token_ids":null,` + q + `}`, 400, "token_ids"},
		{"token_ids a string", "/query", `{"token_ids":"1 2 3",` + q + `}`, 400, "token_ids"},
		{"token_ids an object", "/query", `{"token_ids":{"0":1},` + q + `}`, 400, "token_ids"},
		{"token_ids a number", "/query", `{"token_ids":5,` + q + `}`, 400, "token_ids"},
		{"token negative", "/query", `{"token_ids":[1,-1],` + q + `}`, 400, "token_ids[1]"},
		{"token over 2^32-1", "/query", `{"token_ids":[4294967296],` + q + `}`, 400, "token_ids[0]"},
		{"token far over", "/query", `{"token_ids":[1,2,99999999999999999999999],` + q + `}`, 400, "token_ids[2]"},
		{"token fraction", "/query", `{"token_ids":[1.5],` + q + `}`, 400, "token_ids[0]"},
		{"token 1.0", "/query", `{"token_ids":[1.0],` + q + `}`, 400, "token_ids[0]"},
		{"token exponent", "/query", `{"token_ids":[1e3],` + q + `}`, 400, "token_ids[0]"},
		{"token leading zero", "/query", `{"token_ids":[01],` + q + `}`, 400, "token_ids"},
		{"token a string", "/query", `{"token_ids":["5"],` + q + `}`, 400, "token_ids[0]"},
		{"token null", "/query", `{"token_ids":[1,null],` + q + `}`, 400, "token_ids[1]"},
		{"token bool", "/query", `{"token_ids":[true],` + q + `}`, 400, "token_ids[0]"},
		{"token_ids trailing comma", "/query", `{"token_ids":[1,2,],` + q + `}`, 400, "token_ids[2]"},
		{"token_ids unterminated", "/query", `{"token_ids":[1,2`, 400, "token_ids"},
		{"token_ids missing comma", "/query", `{"token_ids":[1 2],` + q + `}`, 400, "token_ids"},
		{"too many tokens", "/query", `{"token_ids":` + tokensJSON(prompt(101, 0)) + `,` + q + `}`, 413, "token_ids"},
		// Other /query fields.
		{"model_name missing", "/query", `{"token_ids":[1]}`, 400, "model_name"},
		{"model_name empty", "/query", `{"token_ids":[1],"model_name":""}`, 400, "model_name"},
		{"model_name a number", "/query", `{"token_ids":[1],"model_name":7}`, 400, "model_name"},
		{"model_name null", "/query", `{"token_ids":[1],"model_name":null}`, 400, "model_name"},
		{"model_name unterminated", "/query", `{"token_ids":[1],"model_name":"m`, 400, "model_name"},
		{"model_name control character", "/query", "{\"token_ids\":[1],\"model_name\":\"a\nb\"}", 400, "model_name"},
		{"model_name bad escape", "/query", `{"token_ids":[1],"model_name":"a\qb"}`, 400, "model_name"},
		{"model_name short unicode escape", "/query", `{"token_ids":[1],"model_name":"a\u12"}`, 400, "model_name"},
		{"routing_group an array", "/query", `{"token_ids":[1],` + q + `,"routing_group":["a"]}`, 400, "routing_group"},
		{"lora_name a bool", "/query", `{"token_ids":[1],` + q + `,"lora_name":false}`, 400, "lora_name"},
		{"cache_salt an object", "/query", `{"token_ids":[1],` + q + `,"cache_salt":{}}`, 400, "cache_salt"},
		{"unknown field invalid", "/query", `{"token_ids":[1],` + q + `,"extra":[1,}`, 400, "extra"},
		{"unknown field bad literal", "/query", `{"token_ids":[1],` + q + `,"extra":nul}`, 400, "extra"},
		{"unknown field too deep", "/query", `{"token_ids":[1],` + q + `,"extra":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, 400, "extra"},
		// /query_by_hash.
		{"block_hashes missing", "/query_by_hash", `{` + q + `}`, 400, "block_hashes"},
		{"block_hashes a string", "/query_by_hash", `{"block_hashes":"abc",` + q + `}`, 400, "block_hashes"},
		{"hash over 2^64-1", "/query_by_hash", `{"block_hashes":[18446744073709551616],` + q + `}`, 400, "block_hashes[0]"},
		{"hash under -2^63", "/query_by_hash", `{"block_hashes":[1,-9223372036854775809],` + q + `}`, 400, "block_hashes[1]"},
		{"hash fraction", "/query_by_hash", `{"block_hashes":[1.5],` + q + `}`, 400, "block_hashes[0]"},
		{"hash a string", "/query_by_hash", `{"block_hashes":["0x1f"],` + q + `}`, 400, "block_hashes[0]"},
		{"too many hashes", "/query_by_hash", `{"block_hashes":` + tokensJSON(prompt(101, 0)) + `,` + q + `}`, 413, "block_hashes"},
		{"cache_salt empty", "/query_by_hash", `{"block_hashes":[1],` + q + `,"cache_salt":""}`, 400, "cache_salt"},
		{"cache_salt set", "/query_by_hash", `{"block_hashes":[1],` + q + `,"cache_salt":"tenant"}`, 400, "cache_salt"},
		{"by hash model_name missing", "/query_by_hash", `{"block_hashes":[1]}`, 400, "model_name"},
		// /register.
		{"instance_id missing", "/register", `{"endpoint":"tcp://h:1","model_name":"m","block_size":16}`, 400, "instance_id"},
		{"instance_id negative", "/register", `{"instance_id":-1,"endpoint":"tcp://h:1","model_name":"m","block_size":16}`, 400, "instance_id"},
		{"instance_id a string", "/register", `{"instance_id":"1","endpoint":"tcp://h:1","model_name":"m","block_size":16}`, 400, "instance_id"},
		{"instance_id over 2^64-1", "/register", `{"instance_id":18446744073709551616,"endpoint":"tcp://h:1","model_name":"m","block_size":16}`, 400, "instance_id"},
		{"block_size missing", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m"}`, 400, "block_size"},
		{"block_size 0", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":0}`, 400, "block_size"},
		{"block_size over 2^32-1", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":4294967296}`, 400, "block_size"},
		{"block_size fraction", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":16.5}`, 400, "block_size"},
		{"endpoint missing", "/register", `{"instance_id":1,"model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint empty", "/register", `{"instance_id":1,"endpoint":"","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint http", "/register", `{"instance_id":1,"endpoint":"http://h:1","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint no scheme", "/register", `{"instance_id":1,"endpoint":"h:5557","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint no port", "/register", `{"instance_id":1,"endpoint":"tcp://h","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint port 0", "/register", `{"instance_id":1,"endpoint":"tcp://h:0","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint port 70000", "/register", `{"instance_id":1,"endpoint":"tcp://h:70000","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint wildcard host", "/register", `{"instance_id":1,"endpoint":"tcp://*:5557","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"endpoint empty ipc", "/register", `{"instance_id":1,"endpoint":"ipc://","model_name":"m","block_size":16}`, 400, "endpoint"},
		{"model_name missing on register", "/register", `{"instance_id":1,"endpoint":"tcp://h:1","block_size":16}`, 400, "model_name"},
		{"replay_endpoint invalid", "/register", reg(`,"replay_endpoint":"h:6000"`), 400, "replay_endpoint"},
		{"dp_rank negative", "/register", reg(`,"dp_rank":-1`), 400, "dp_rank"},
		{"dp_rank a string", "/register", reg(`,"dp_rank":"0"`), 400, "dp_rank"},
		{"additional_salt a number", "/register", reg(`,"additional_salt":5`), 400, "additional_salt"},
		{"tenant_id an object", "/register", reg(`,"tenant_id":{}`), 400, "tenant_id"},
		{"kv_transfer_preferred_weight overflow", "/register", reg(`,"kv_transfer_preferred_weight":1e999`), 400, "kv_transfer_preferred_weight"},
		{"kv_transfer_preferred_weight a string", "/register", reg(`,"kv_transfer_preferred_weight":"0.5"`), 400, "kv_transfer_preferred_weight"},
		{"role a number", "/register", reg(`,"role":1`), 400, "role"},
		{"data_parallel_size negative", "/register", reg(`,"data_parallel_size":-2`), 400, "data_parallel_size"},
		{"total_kv_blocks a fraction", "/register", reg(`,"total_kv_blocks":10.5`), 400, "total_kv_blocks"},
		{"taints not strings", "/register", reg(`,"taints":["a",1]`), 400, "taints[1]"},
		{"topology_domains value a number", "/register", reg(`,"topology_domains":{"zone":1}`), 400, "topology_domains.zone"},
		{"topology_domains an array", "/register", reg(`,"topology_domains":["zone"]`), 400, "topology_domains"},
		// /unregister.
		{"unregister instance_id missing", "/unregister", `{"model_name":"m"}`, 400, "instance_id"},
		{"unregister model_name missing", "/unregister", `{"instance_id":1}`, 400, "model_name"},
		{"unregister dp_rank a string", "/unregister", `{"instance_id":1,"model_name":"m","routing_group":"g","dp_rank":"0"}`, 400, "dp_rank"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := s.post(c.path, c.body)
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != c.status || !strings.HasPrefix(e.Error, c.field+": ") {
				t.Errorf("got %d %s; want %d and an error about %q", r.status, r.body, c.status, c.field)
			}
		})
	}
}

func TestSyntaxErrorOffset(t *testing.T) {
	s := newServer(t, Config{Index: newIndex(t)})
	s.post("/query", `{"token_ids":[1,2,}`).expect(t, 400, `{"error":"token_ids[2]: invalid JSON at offset 18: expected a value, got '}'"}`)
	s.post("/query", `{"token_ids":[1],"model_name":"m" "x"}`).expect(t, 400, `{"error":"body: invalid JSON at offset 34: expected ',' or '}' after the value of \"model_name\""}`)
	s.post("/query", `{"token_ids":[-1]}`).expect(t, 400, `{"error":"token_ids[0]: -1 is out of range [0, 4294967295]"}`)
}

// TestBodyLimit checks the exact boundary of MaxBodyBytes, with and without
// a Content-Length.
func TestBodyLimit(t *testing.T) {
	ix, _ := dynamoExample(t)
	const limit = 1000
	s := newServer(t, Config{Index: ix, MaxBodyBytes: limit})
	body := `{"token_ids":[1],"model_name":"m"}`
	atLimit := body + strings.Repeat(" ", limit-len(body))
	s.post("/query", atLimit).expect(t, 200, `{"scores":{},"frequencies":[],"instances":{}}`)
	s.post("/query", atLimit+" ").expect(t, 413, `{"error":"body: 1001 bytes exceeds the limit of 1000"}`)
	// Chunked (no Content-Length): the limit is found while reading.
	for _, c := range []struct {
		body   string
		status int
	}{{atLimit, 200}, {atLimit + " ", 413}} {
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/query", io.MultiReader(strings.NewReader(c.body)))
		req.ContentLength = -1
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("chunked %d bytes: %d %s", len(c.body), resp.StatusCode, b)
		}
	}
}

// hostile generates {"token_ids":[1,1,1,…],"model_name":"m"} with n
// tokens without holding it in memory.
type hostile struct {
	n   int
	pos int // bytes produced so far
}

const (
	hostileHead = `{"token_ids":[`
	hostileTail = `],"model_name":"m"}`
)

func (h *hostile) size() int { return len(hostileHead) + 2*h.n - 1 + len(hostileTail) }

var ones = []byte(strings.Repeat("1,", 2048))

func (h *hostile) Read(p []byte) (int, error) {
	mid := 2*h.n - 1 // "1,1,…,1"
	w := 0
	for w < len(p) && h.pos < h.size() {
		var c int
		switch i := h.pos - len(hostileHead); {
		case i < 0:
			c = copy(p[w:], hostileHead[h.pos:])
		case i < mid:
			c = copy(p[w:], ones[i%2:min(len(ones), i%2+mid-i)])
		default:
			c = copy(p[w:], hostileTail[i-mid:])
		}
		w, h.pos = w+c, h.pos+c
	}
	if w == 0 {
		return 0, io.EOF
	}
	return w, nil
}

// TestHostileTokenIDs sends 10M token ids: MaxBodyBytes, and then
// MaxTokens, must reject them without allocating anything near the size
// of the decoded array (40 MB as []uint32, far more as []any).
func TestHostileTokenIDs(t *testing.T) {
	ix, _ := dynamoExample(t)
	const n = 10_000_000 // 20 MB of JSON
	for _, c := range []struct {
		name     string
		cfg      Config
		length   int64 // Content-Length; -1: unknown
		want     string
		maxAlloc uint64
	}{
		{"declared length", Config{}, int64((&hostile{n: n}).size()), `{"error":"body: 20000032 bytes exceeds the limit of 8388608"}`, 1 << 20},
		// The body buffer doubles as bytes arrive (it is never sized by
		// what a client claims), so reading b bytes allocates the
		// doublings below b (< 2b together) and then b: at most 16 MiB
		// for the 8 MiB limit.
		{"chunked", Config{}, -1, `{"error":"body: exceeds the limit of 8388608 bytes"}`, 16<<20 + 1<<16},
		// With room for the body, MaxTokens stops the decoding: the 20 MB
		// body read as above (< 3 × 20 MB) plus at most 1M tokens (4 MB,
		// 8 MB with growth).
		{"token limit", Config{MaxBodyBytes: 1 << 30}, int64((&hostile{n: n}).size()), `{"error":"token_ids: more than 1000000 tokens"}`, 3*20e6 + 8<<20 + 1<<16},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.Index = ix
			h := NewHandler(cfg)
			req := httptest.NewRequest(http.MethodPost, "/query", &hostile{n: n})
			req.ContentLength = c.length
			w := httptest.NewRecorder()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			h.ServeHTTP(w, req)
			runtime.ReadMemStats(&after)
			if w.Code != 413 || strings.TrimSpace(w.Body.String()) != c.want {
				t.Errorf("got %d %s, want 413 %s", w.Code, w.Body, c.want)
			}
			if a := after.TotalAlloc - before.TotalAlloc; a > c.maxAlloc {
				t.Errorf("allocated %d bytes, want ≤ %d", a, c.maxAlloc)
			} else {
				t.Logf("allocated %.1f MiB", float64(a)/(1<<20))
			}
		})
	}
}

// FuzzDecode checks the request decoders against encoding/json: what they
// accept, encoding/json decodes to the same values (jsonlex's FuzzLexer
// checks the syntax they share).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"token_ids":[1,2,3],"model_name":"m"}`,
		`{"token_ids":[4294967295,0],"model_name":"m\u00e9","routing_group":"g","lora_name":null,"cache_salt":"s\"x"}`,
		`{"block_hashes":[-1,18446744073709551615,-9223372036854775808,0],"model_name":"m"}`,
		`{"token_ids":[1.0,-0,1e3],"model_name":"m"}`,
		`{"token_ids":[01]}`, `[]`, `{}`, `null`, `"\ud800"`, "\"\xff\"", `{"a":{"b":[true,false,null,-1.5e-3]}}`,
		`{"token_ids" : [ 1 , 2 ] , "model_name" : "m" , "x" : { } }`,
		`{"token_ids":[1,22,333,4444,55555,666666,7777777,88888888,4294967295, 10, 200,01],"model_name":"mmmmmmmm"}`,
		// Long enough for the 64-byte blocks: compact, with ", ", and with
		// ids the blocks leave to the general path.
		`{"model_name":"m","token_ids":[` + strings.Repeat("12,345,6789,101112,", 12) + `7]}`,
		`{"model_name":"m","token_ids":[` + strings.Repeat("12, 345, 6789, 101112, ", 12) + `7]}`,
		`{"model_name":"m","token_ids":[` + strings.Repeat("12,345,6789,101112,", 6) + `123456789,01,` + strings.Repeat("1,0,", 30) + `7]}`,
		`{"block_hashes":[-9223372036854775808,9223372036854775807,18446744073709551615,-1, 0,-0,1.5],"model_name":"mmmmmmmm"}`,
		`{"token_ids":[1],"model_name":"a","MODEL_NAME":"b","model_name":"c"}`,
		`{"model_name":"m","token_ids":[1,2],"role":"decode","selection_id":"s","pinned_worker":{"worker_id":3,"dp_rank":1},` +
			`"allowed_worker_ids":[1,18446744073709551615],"routing_constraints":{"required_taints":["a"],"preferred_taints":{"b":-0.5}},"router_temperature":0.7}`,
		`{"request_id":"r","model_name":"m","block_hashes":[-1,2],"isl_tokens":64,"prefill_routing_group":null,` +
			`"policy":{"kind":"isl_or_load","eff_isl_threshold":100,"prefill_busy_threshold":null},"pinned_prefill_worker":null,"prefill_failure":"free_decode"}`,
		`{"selection_id":"s","model_name":"m","worker_id":7,"dp_rank":2,"token_ids":null,"block_hashes":[1],"extra":{"x":[]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		// Values: compare with encoding/json on exact (case-sensitive)
		// keys, the last duplicate winning.
		var raw map[string]json.RawMessage
		if json.Unmarshal(data, &raw) != nil {
			return
		}
		str := func(key string) string {
			var s string
			if m, ok := raw[key]; ok && json.Unmarshal(m, &s) != nil {
				t.Fatalf("%q: accepted %s but encoding/json cannot decode it", data, key)
			}
			return s
		}
		if req, err := decodeQuery(data, nil, 1<<20); err == nil {
			var toks []uint32
			if json.Unmarshal(raw["token_ids"], &toks) != nil || !slices.Equal(toks, req.TokenIDs) {
				t.Fatalf("%q: tokens %v, encoding/json %v", data, req.TokenIDs, toks)
			}
			g := str("routing_group")
			if g == "" {
				g = api.DefaultRoutingGroup
			}
			if req.ModelName != str("model_name") || req.RoutingGroup != g || req.LoraName != str("lora_name") || req.CacheSalt != str("cache_salt") {
				t.Fatalf("%q: decoded %+v", data, req)
			}
		}
		if k, hs, err := decodeQueryByHash(data, nil, 1<<20); err == nil {
			var nums []json.Number
			if json.Unmarshal(raw["block_hashes"], &nums) != nil || len(nums) != len(hs) {
				t.Fatalf("%q: hashes %v, encoding/json %v", data, hs, nums)
			}
			for i, n := range nums {
				var want uint64
				if v, err := strconv.ParseInt(string(n), 10, 64); err == nil {
					want = uint64(v)
				} else if want, err = strconv.ParseUint(string(n), 10, 64); err != nil {
					t.Fatalf("%q: accepted hash %s", data, n)
				}
				if hs[i] != want {
					t.Fatalf("%q: hash %d = %d, want %d", data, i, hs[i], want)
				}
			}
			if k.Model != str("model_name") {
				t.Fatalf("%q: model %q", data, k.Model)
			}
		}
		// The selection bodies: what decodeJSON reads (the lexer's pass for
		// the hot arrays, encoding/json for the rest), encoding/json alone
		// reads the same, for documents whose keys are all lower case and unique
		// (encoding/json matches keys case-insensitively and merges
		// repeated objects).
		if plainKeys(data) {
			var sel api.SelectRequest
			if _, err := decodeJSON(data, &sel, nil, defaultHot(&sel.Prompt)...); err == nil {
				sameAsJSON(t, data, normalPrompt(sel, &sel.Prompt), &api.SelectRequest{}, func(v *api.SelectRequest) any { return normalPrompt(*v, &v.Prompt) })
			}
			var res api.ReserveRequest
			if _, err := decodeJSON(data, &res, nil, defaultHot(&res.Prompt)...); err == nil {
				sameAsJSON(t, data, normalPrompt(res, &res.Prompt), &api.ReserveRequest{}, func(v *api.ReserveRequest) any { return normalPrompt(*v, &v.Prompt) })
			}
			var plan api.PlanRequest
			if _, err := decodeJSON(data, &plan, nil, defaultHot(&plan.Prompt)...); err == nil {
				sameAsJSON(t, data, normalPrompt(plan, &plan.Prompt), &api.PlanRequest{}, func(v *api.PlanRequest) any { return normalPrompt(*v, &v.Prompt) })
			}
		}
		if req, err := decodeRegister(data); err == nil {
			// encoding/json matches keys case-insensitively; compare only
			// documents whose keys are all lower case.
			var want api.RegisterRequest
			if json.Unmarshal(data, &want) == nil && exactKeys(raw) {
				if want.RoutingGroup == "" {
					want.RoutingGroup = api.DefaultRoutingGroup
				}
				if !reflect.DeepEqual(req, want) {
					t.Fatalf("%q: decoded %+v, encoding/json %+v", data, req, want)
				}
			}
		}
	})
}

// sameAsJSON fails t unless encoding/json, decoding data into fresh,
// either fails or yields got (both normalised by norm).
func sameAsJSON[T any](t *testing.T, data []byte, got any, fresh *T, norm func(*T) any) {
	t.Helper()
	if json.Unmarshal(data, fresh) != nil {
		return
	}
	if want := norm(fresh); !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %+v, encoding/json %+v", data, got, want)
	}
}

// normalPrompt returns v with the empty lists of p (a field of v) and of
// the request's other lists made nil, where encoding/json and the lexer
// differ only in nil versus empty.
func normalPrompt[T any](v T, p *api.Prompt) T {
	if len(p.TokenIDs) == 0 {
		p.TokenIDs = nil
	}
	if len(p.BlockHashes) == 0 {
		p.BlockHashes = nil
	}
	switch r := any(&v).(type) {
	case *api.SelectRequest:
		r.Prompt = *p
		r.AllowedWorkerIDs = normalIDs(r.AllowedWorkerIDs)
	case *api.ReserveRequest:
		r.Prompt = *p
	case *api.PlanRequest:
		r.Prompt = *p
		r.AllowedWorkerIDs = normalIDs(r.AllowedWorkerIDs)
	}
	return v
}

func normalIDs(ids []uint64) []uint64 {
	if len(ids) == 0 {
		return nil
	}
	return ids
}

// plainKeys reports whether data is JSON whose object keys, at every
// depth, are lower case and unique within their object.
func plainKeys(data []byte) bool {
	type frame struct {
		object, wantKey bool
		keys            map[string]bool
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	var stack []*frame
	value := func() { // a value ended: its object waits for a key again
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		top := (*frame)(nil)
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if top != nil && top.object {
					top.wantKey = false
				}
				stack = append(stack, &frame{object: tok == '{', wantKey: true, keys: map[string]bool{}})
			default:
				stack = stack[:len(stack)-1]
				value()
			}
		case string:
			if top != nil && top.object && top.wantKey {
				if strings.ToLower(tok) != tok || top.keys[tok] {
					return false
				}
				top.keys[tok] = true
				top.wantKey = false
				continue
			}
			value()
		default:
			value()
		}
	}
}

// exactKeys reports whether every key of a top-level object is lower case
// (so encoding/json's case-insensitive matching agrees with exact keys).
func exactKeys(raw map[string]json.RawMessage) bool {
	for k := range raw {
		if strings.ToLower(k) != k {
			return false
		}
	}
	return true
}
