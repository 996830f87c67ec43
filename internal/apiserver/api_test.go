package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
)

var mDefault = indexer.PartitionKey{Model: "m", Group: "default"}

// newIndex returns an index with partition m:default of block size 16.
func newIndex(t testing.TB) *indexer.Index {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	if err := ix.AddPartition(mDefault, 16); err != nil {
		t.Fatal(err)
	}
	return ix
}

// dynamoExample builds the score-response example of Dynamo's standalone
// indexer (its /query answer shape, with the Mooncake RFC #1403 per-tier
// instances): block size 16;
// instance 1 holds 2 device blocks on rank 0 (and the next block in host
// memory) and 1 device block on rank 1.
func dynamoExample(t testing.TB) (*indexer.Index, []uint32) {
	ix := newIndex(t)
	p := prompt(64, 1000)
	base := indexer.BaseSeed
	store(t, ix, mDefault, indexer.Rank{WorkerID: 1, DPRank: 0}, 1, indexer.TierDevice, base, 0, seq(100, 2), p[:32])
	store(t, ix, mDefault, indexer.Rank{WorkerID: 1, DPRank: 0}, 2, indexer.TierHost, base, 101, seq(102, 1), p[32:48])
	store(t, ix, mDefault, indexer.Rank{WorkerID: 1, DPRank: 1}, 1, indexer.TierDevice, base, 0, seq(200, 1), p[:16])
	return ix, p
}

func TestQueryDynamoExample(t *testing.T) {
	ix, p := dynamoExample(t)
	s := newServer(t, Config{Index: ix})
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).expect(t, 200,
		`{"scores":{"1":{"0":32,"1":16}},"frequencies":[],"instances":{"1":{"longest_matched":48,"gpu":32,"dp":{"0":32,"1":16},"cpu":48,"disk":48}}}`)
	// The same through the exported response type.
	var got api.ScoreResponse
	r := s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m","routing_group":"default"}`)
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatal(err)
	}
	want := api.ScoreResponse{
		Scores:      map[uint64]map[uint32]uint64{1: {0: 32, 1: 16}},
		Frequencies: []uint64{},
		Instances:   map[uint64]api.InstanceScore{1: {LongestMatched: 48, GPU: 32, DP: map[uint32]uint64{0: 32, 1: 16}, CPU: 48, Disk: 48}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestQueryTiersAndOrder(t *testing.T) {
	ix := newIndex(t)
	p := prompt(80, 7)
	base := indexer.BaseSeed
	// Instance 10: rank 3 holds block 0 only on disk → instances only.
	store(t, ix, mDefault, indexer.Rank{WorkerID: 10, DPRank: 3}, 1, indexer.TierDisk, base, 0, seq(1, 1), p[:16])
	// Instance 2: rank 0 holds 3 device blocks, then 1 host, then 1 disk.
	r := indexer.Rank{WorkerID: 2}
	store(t, ix, mDefault, r, 1, indexer.TierDevice, base, 0, seq(10, 3), p[:48])
	store(t, ix, mDefault, r, 2, indexer.TierHost, base, 12, seq(13, 1), p[48:64])
	store(t, ix, mDefault, r, 3, indexer.TierDisk, base, 13, seq(14, 1), p[64:80])
	s := newServer(t, Config{Index: ix})
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).expect(t, 200,
		`{"scores":{"2":{"0":48}},"frequencies":[],"instances":{"2":{"longest_matched":80,"gpu":48,"dp":{"0":48},"cpu":64,"disk":80},"10":{"longest_matched":16,"gpu":0,"dp":{},"cpu":0,"disk":16}}}`)
	// A partial tail block is ignored; fewer tokens than a block match nothing.
	s.post("/query", `{"token_ids":`+tokensJSON(p[:47])+`,"model_name":"m"}`).expect(t, 200,
		`{"scores":{"2":{"0":32}},"frequencies":[],"instances":{"2":{"longest_matched":32,"gpu":32,"dp":{"0":32},"cpu":32,"disk":32},"10":{"longest_matched":16,"gpu":0,"dp":{},"cpu":0,"disk":16}}}`)
	empty := `{"scores":{},"frequencies":[],"instances":{}}`
	s.post("/query", `{"token_ids":`+tokensJSON(p[:15])+`,"model_name":"m"}`).expect(t, 200, empty)
	s.post("/query", `{"token_ids":[],"model_name":"m"}`).expect(t, 200, empty)
	s.post("/query", `{"token_ids":`+tokensJSON(prompt(64, 5000))+`,"model_name":"m"}`).expect(t, 200, empty)
}

// TestQueryHybrid: a hybrid model's ranks report the hit vLLM would
// grant; one granted nothing is absent, as one that matches nothing.
func TestQueryHybrid(t *testing.T) {
	ix := newIndex(t)
	p := prompt(64, 9)
	sw := indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 18} // ceil(17/16): the 2 blocks before a hit's end
	fa := indexer.Group{Idx: 1, Kind: "full_attention"}
	for w, ops := range map[uint64][]indexer.Op{
		// Worker 1's sliding-window group holds blocks 0, 1 and 3: a hit
		// of 2 blocks. Worker 2's holds block 3 only: none.
		1: {{Kind: indexer.OpStore, Group: fa, Store: indexer.Stored{Hashes: seq(10, 4), Tokens: p, BlockSize: 16, Seed: indexer.BaseSeed}},
			{Kind: indexer.OpStore, Group: sw, Store: indexer.Stored{Hashes: []uint64{10, 11, 13}, Tokens: p, BlockSize: 16, Seed: indexer.BaseSeed}}},
		2: {{Kind: indexer.OpStore, Group: fa, Store: indexer.Stored{Hashes: seq(10, 4), Tokens: p, BlockSize: 16, Seed: indexer.BaseSeed}},
			{Kind: indexer.OpStore, Group: sw, Store: indexer.Stored{Hashes: []uint64{13}, Tokens: p, BlockSize: 16, Seed: indexer.BaseSeed}}},
	} {
		if res, err := ix.Apply(mDefault, indexer.Rank{WorkerID: w}, 1, ops); err != nil || len(res.Errs) > 0 {
			t.Fatal(err, res.Errs)
		}
	}
	s := newServer(t, Config{Index: ix, Workers: &fakeWorkers{list: []WorkerState{{
		Record:  catalog.Worker{WorkerID: 1, ModelName: "m", RoutingGroup: "default", BlockSize: 16, EventsEndpoint: "tcp://h:1", DataParallelSize: 1},
		Streams: map[uint32]stream.Rank{0: {Running: true, State: stream.State{Connected: true, Synced: true}}}}}}})
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).expect(t, 200,
		`{"scores":{"1":{"0":32}},"frequencies":[],"instances":{"1":{"longest_matched":32,"gpu":32,"dp":{"0":32},"cpu":32,"disk":32}}}`)
	// /workers lists the groups the index learned, by group_idx.
	s.get("/workers").expect(t, 200, `[{"instance_id":1,"source":"zmq","status":"active","model_name":"m","routing_group":"default","block_size":16,`+
		`"endpoints":{"0":"tcp://h:1"},"listeners":{"0":{"endpoint":"tcp://h:1","status":"active","degraded":false,"last_seq":1,"blocks":4,"last_seen_seq":null,`+
		`"kv_cache_groups":[{"group_idx":0,"attention":"sliding_window","kind":"sliding_window","sliding_window":18,"tracked":true,"blocks":3},`+
		`{"group_idx":1,"attention":"full","kind":"full_attention","main":true,"tracked":true,"blocks":4}]}},"data_parallel_size":1}]`)
}

func TestQueryUnknownPartition(t *testing.T) {
	s := newServer(t, Config{Index: newIndex(t)})
	s.post("/query", `{"token_ids":[1],"model_name":"m","routing_group":"g"}`).expect(t, 404,
		`{"error":"no indexer for model=m routing_group=g"}`)
	s.post("/query", `{"token_ids":[1],"model_name":"x"}`).expect(t, 404,
		`{"error":"no indexer for model=x routing_group=default"}`)
	s.post("/query_by_hash", `{"block_hashes":[1],"model_name":"x","routing_group":null}`).expect(t, 404,
		`{"error":"no indexer for model=x routing_group=default"}`)
}

// TestQuerySalt checks that a LoRA adapter and a cache salt each change the
// block hashes: the same tokens stored under one salt never match a query
// under another.
func TestQuerySalt(t *testing.T) {
	ix := newIndex(t)
	p := prompt(32, 1)
	salts := []struct{ lora, salt string }{{"", ""}, {"lora-a", ""}, {"", "salt-x"}, {"lora-a", "salt-x"}, {"lora-b", ""}}
	for i, sl := range salts {
		store(t, ix, mDefault, indexer.Rank{WorkerID: uint64(i + 1)}, 1, indexer.TierDevice, indexer.Seed(sl.lora, sl.salt), 0, seq(1, 2), p)
	}
	s := newServer(t, Config{Index: ix})
	for i, sl := range salts {
		body := fmt.Sprintf(`{"token_ids":%s,"model_name":"m","lora_name":%q,"cache_salt":%q}`, tokensJSON(p), sl.lora, sl.salt)
		want := fmt.Sprintf(`{"scores":{"%d":{"0":32}},"frequencies":[],"instances":{"%d":{"longest_matched":32,"gpu":32,"dp":{"0":32},"cpu":32,"disk":32}}}`, i+1, i+1)
		s.post("/query", body).expect(t, 200, want)
	}
	// null and absent mean unsalted.
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m","lora_name":null,"cache_salt":null}`).expect(t, 200,
		`{"scores":{"1":{"0":32}},"frequencies":[],"instances":{"1":{"longest_matched":32,"gpu":32,"dp":{"0":32},"cpu":32,"disk":32}}}`)
}

// TestQueryByHash sends the local hashes of a prompt whose hashes include
// values ≥ 2^63, once as int64 bit patterns (Dynamo's form) and once as
// plain unsigned integers; both must answer exactly as /query does.
func TestQueryByHash(t *testing.T) {
	ix := newIndex(t)
	seed := indexer.Seed("", "tenant-1")
	var p []uint32
	var hs []uint64
	for base := uint32(0); ; base += 1000 {
		p = prompt(64, base)
		hs = indexer.HashBlocks(nil, p, 16, seed)
		hi, lo := 0, 0
		for _, h := range hs {
			if h >= 1<<63 {
				hi++
			} else {
				lo++
			}
		}
		if hi > 0 && lo > 0 {
			break
		}
	}
	store(t, ix, mDefault, indexer.Rank{WorkerID: 5, DPRank: 1}, 1, indexer.TierDevice, seed, 0, seq(1, 4), p)
	store(t, ix, mDefault, indexer.Rank{WorkerID: 6}, 1, indexer.TierDevice, seed, 0, seq(1, 2), p[:32])
	s := newServer(t, Config{Index: ix})
	want := `{"scores":{"5":{"1":64},"6":{"0":32}},"frequencies":[],"instances":{"5":{"longest_matched":64,"gpu":64,"dp":{"1":64},"cpu":64,"disk":64},"6":{"longest_matched":32,"gpu":32,"dp":{"0":32},"cpu":32,"disk":32}}}`
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m","cache_salt":"tenant-1"}`).expect(t, 200, want)

	signed, unsigned := make([]string, len(hs)), make([]string, len(hs))
	for i, h := range hs {
		signed[i] = strconv.FormatInt(int64(h), 10)
		unsigned[i] = strconv.FormatUint(h, 10)
	}
	if !strings.Contains(strings.Join(signed, ","), "-") {
		t.Fatal("no negative hash in the test prompt")
	}
	for _, form := range [][]string{signed, unsigned} {
		s.post("/query_by_hash", `{"block_hashes":[`+strings.Join(form, ",")+`],"model_name":"m","cache_salt":null}`).expect(t, 200, want)
	}
	// The exported request type marshals the signed form.
	req := api.QueryByHashRequest{ModelName: "m"}
	for _, h := range hs {
		req.BlockHashes = append(req.BlockHashes, int64(h))
	}
	b, _ := json.Marshal(req)
	s.post("/query_by_hash", string(b)).expect(t, 200, want)
	// Unsalted hashes of the same tokens match nothing.
	plain := indexer.HashBlocks(nil, p, 16, indexer.BaseSeed)
	b, _ = json.Marshal(map[string]any{"block_hashes": plain, "model_name": "m"})
	s.post("/query_by_hash", string(b)).expect(t, 200, `{"scores":{},"frequencies":[],"instances":{}}`)
	// Boundaries of the accepted range.
	for _, h := range []string{"-9223372036854775808", "18446744073709551615", "0", "-0"} {
		s.post("/query_by_hash", `{"block_hashes":[`+h+`],"model_name":"m"}`).expect(t, 200, `{"scores":{},"frequencies":[],"instances":{}}`)
	}
}

func TestDumpRoundTrip(t *testing.T) {
	ix := newIndex(t)
	other := indexer.PartitionKey{Model: "org/llama:8b", Group: "tenant-a"}
	if err := ix.AddPartition(other, 32); err != nil {
		t.Fatal(err)
	}
	p := prompt(256, 3)
	for w := uint64(1); w <= 4; w++ {
		for rank := uint32(0); rank < 2; rank++ {
			r := indexer.Rank{WorkerID: w, DPRank: rank}
			n := int(w+uint64(rank)) * 16
			store(t, ix, mDefault, r, 10*w+uint64(rank), indexer.TierDevice, indexer.BaseSeed, 0, seq(1000*w, n/16), p[:n])
			if w%2 == 0 {
				store(t, ix, mDefault, r, 10*w+uint64(rank)+1, indexer.TierHost, indexer.BaseSeed, 1000*w+uint64(n/16)-1, seq(1000*w+uint64(n/16), 2), p[n:n+32])
			}
		}
		store(t, ix, other, indexer.Rank{WorkerID: w}, w, indexer.TierDevice, indexer.Seed("lora", ""), 0, seq(1, int(w)), p[:32*w])
	}
	s := newServer(t, Config{Index: ix})
	r := s.get("/dump")
	if r.status != 200 {
		t.Fatalf("dump: %d %s", r.status, r.body)
	}
	var parts map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.body), &parts); err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || parts["m:default"] == nil || parts["org/llama:8b:tenant-a"] == nil {
		t.Fatalf("dump partitions: %v", reflect.ValueOf(parts).MapKeys())
	}
	fresh := indexer.New(indexer.Options{})
	for name, raw := range parts {
		i := strings.LastIndexByte(name, ':')
		k := indexer.PartitionKey{Model: name[:i], Group: name[i+1:]}
		snap, err := UnmarshalSnapshot(raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := fresh.Restore(k, snap); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	s2 := newServer(t, Config{Index: fresh})
	queries := []string{
		`{"token_ids":` + tokensJSON(p) + `,"model_name":"m"}`,
		`{"token_ids":` + tokensJSON(p[:100]) + `,"model_name":"m"}`,
		`{"token_ids":` + tokensJSON(p) + `,"model_name":"org/llama:8b","routing_group":"tenant-a","lora_name":"lora"}`,
		`{"token_ids":` + tokensJSON(p) + `,"model_name":"org/llama:8b","routing_group":"tenant-a"}`,
	}
	for _, q := range queries {
		a, b := s.post("/query", q), s2.post("/query", q)
		if a.status != 200 || a.body != b.body {
			t.Errorf("query %.60s…: original %d %s, restored %d %s", q, a.status, a.body, b.status, b.body)
		}
	}
	for w := uint64(1); w <= 4; w++ {
		for rank := uint32(0); rank < 2; rank++ {
			r := indexer.Rank{WorkerID: w, DPRank: rank}
			a, _ := ix.Rank(mDefault, r)
			b, _ := fresh.Rank(mDefault, r)
			if a != b {
				t.Errorf("rank %v: original %+v, restored %+v", r, a, b)
			}
		}
	}
	// An empty index dumps as an empty object.
	newServer(t, Config{Index: indexer.New(indexer.Options{})}).get("/dump").expect(t, 200, `{}`)
}

func TestHealthReadyMetrics(t *testing.T) {
	var ready atomic.Bool
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixd_test_total", Help: "Test."})
	reg.MustRegister(c)
	c.Add(3)
	s := newServer(t, Config{
		Index:   newIndex(t),
		Ready:   func() (bool, string) { return ready.Load(), "catalog not synced" },
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}),
	})
	s.get("/health").expect(t, 200, `{"status":"ok"}`)
	s.get("/ready").expect(t, 503, `{"status":"not ready","reason":"catalog not synced"}`)
	ready.Store(true)
	s.get("/ready").expect(t, 200, `{"status":"ok"}`)
	if r := s.get("/metrics"); r.status != 200 || !strings.Contains(r.body, "prefixd_test_total 3") {
		t.Errorf("metrics: %d %s", r.status, r.body)
	}
	// Without Ready and Metrics.
	s = newServer(t, Config{Index: newIndex(t)})
	s.get("/ready").expect(t, 200, `{"status":"ok"}`)
	s.get("/metrics").expect(t, 404, `{"error":"metrics: not enabled"}`)
}

func TestRoutes(t *testing.T) {
	s := newServer(t, Config{Index: newIndex(t)})
	s.get("/nope").expect(t, 404, `{"error":"path: no endpoint /nope"}`)
	s.get("/query/").expect(t, 404, `{"error":"path: no endpoint /query/"}`)
	r := s.get("/query")
	r.expect(t, 405, `{"error":"method: GET not allowed on /query (allowed: POST)"}`)
	if a := r.header.Get("Allow"); a != "POST" {
		t.Errorf("Allow %q", a)
	}
	r = s.post("/health", "")
	r.expect(t, 405, `{"error":"method: POST not allowed on /health (allowed: GET, HEAD)"}`)
	if a := r.header.Get("Allow"); a != "GET, HEAD" {
		t.Errorf("Allow %q", a)
	}
	if r := s.do(http.MethodHead, "/health", ""); r.status != 200 {
		t.Errorf("HEAD /health: %d", r.status)
	}
	s.do(http.MethodDelete, "/register", "").expect(t, 405, `{"error":"method: DELETE not allowed on /register (allowed: POST)"}`)
}

func TestRegister(t *testing.T) {
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw})
	s.post("/register", `{"instance_id": 2, "endpoint": "tcp://10.0.0.2:5557", "model_name": "llama-3-8b",
		"routing_group": "customer-a", "block_size": 16, "dp_rank": 0, "replay_endpoint": "tcp://10.0.0.2:5560",
		"additional_salt": "x", "additionalsalt": null, "tenant_id": "t", "future_field": {"a": [1, 2.5, true]}}`).
		expect(t, 201, `{"status":"ok"}`)
	s.post("/register", `{"instance_id":18446744073709551615,"endpoint":"ipc:///tmp/kv.sock","model_name":"m","block_size":32,"dp_rank":3}`).
		expect(t, 201, `{"status":"ok"}`)
	s.post("/register", `{"instance_id":3,"endpoint":"tcp://[::1]:5557","model_name":"m","block_size":16,"routing_group":null}`).
		expect(t, 201, `{"status":"ok"}`)
	want := []catalog.Registration{
		{Key: catalog.Key{Model: "llama-3-8b", Group: "customer-a", WorkerID: 2}, EventsEndpoint: "tcp://10.0.0.2:5557", BlockSize: 16, ReplayEndpoint: "tcp://10.0.0.2:5560"},
		{Key: catalog.Key{Model: "m", Group: "default", WorkerID: math.MaxUint64}, EventsEndpoint: "ipc:///tmp/kv.sock", BlockSize: 32, Rank: 3},
		{Key: catalog.Key{Model: "m", Group: "default", WorkerID: 3}, EventsEndpoint: "tcp://[::1]:5557", BlockSize: 16},
	}
	if !reflect.DeepEqual(fw.registered, want) {
		t.Errorf("registered %+v\nwant %+v", fw.registered, want)
	}
}

// TestRegisterExtensions checks that every field survives encoding/json
// marshalling of RegisterRequest and the handler's decoding, and reaches
// the catalog's registration: a field added to catalog.Attributes is
// registered with no change here (reflect fills every attribute).
func TestRegisterExtensions(t *testing.T) {
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw})
	weight := 0.25
	req := api.RegisterRequest{
		InstanceID: 9, Endpoint: "inproc://w9", ModelName: "m", BlockSize: 64, RoutingGroup: "g", DPRank: 4,
		ReplayEndpoint: "tcp://w9:6000",
		Extensions: api.Extensions{
			DataParallelSize: 4, EngineEndpoint: "http://w9:8000",
			Attributes: catalog.Attributes{
				Role: "prefill", Topic: "kv", TotalKVBlocks: 123456, HostKVBlocks: 7, DiskKVBlocks: 8, MaxNumBatchedTokens: 8192,
				KVTransferDomain: "rack", KVTransferEnforcement: "preferred",
				KVTransferPreferredWeight: &weight, TopologyDomains: map[string]string{"zone": "a", "rack": "r\u00e97"},
				Taints: []string{"gpu=h100", "spot"},
			},
		},
	}
	// Every attribute is set: a new one must be added above.
	for i, a := 0, reflect.ValueOf(req.Attributes); i < a.NumField(); i++ {
		if a.Field(i).IsZero() {
			t.Fatalf("attribute %s not set in the test", a.Type().Field(i).Name)
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	s.post("/register", string(b)).expect(t, 201, `{"status":"ok"}`)
	want := catalog.Registration{Key: catalog.Key{Model: "m", Group: "g", WorkerID: 9}, Rank: 4, Size: 4,
		EventsEndpoint: "inproc://w9", ReplayEndpoint: "tcp://w9:6000", BlockSize: 64, Endpoint: "http://w9:8000", Attributes: req.Attributes}
	if len(fw.registered) != 1 || !reflect.DeepEqual(fw.registered[0], want) {
		t.Errorf("registered %+v\nwant %+v", fw.registered, want)
	}
}

func TestRegisterErrors(t *testing.T) {
	var logs bytes.Buffer
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	body := `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":32}`
	for _, c := range []struct {
		err    error
		status int
		want   string
	}{
		{fmt.Errorf("block_size: 32 conflicts with 16 of model=m routing_group=default: %w", ErrConflict), 409,
			`block_size: 32 conflicts with 16 of model=m routing_group=default: conflict`},
		{Invalid("endpoint", "already registered for instance %d rank %d", 4, 0), 400, `endpoint: already registered for instance 4 rank 0`},
		{fmt.Errorf("catalog: %w", Invalid("model_name", "too long")), 400, `catalog: model_name: too long`},
		{fmt.Errorf("etcd: %w", ErrUnavailable), 503, `etcd: temporarily unavailable`},
		{errors.New("etcd: put: boom"), 500, `etcd: put: boom`},
		// The catalog's errors.
		{&catalog.ConflictError{Field: "block_size", Reason: "32 conflicts with the registered 16"}, 409, `block_size: 32 conflicts with the registered 16`},
		{&catalog.ValidationError{Fields: []catalog.FieldError{{Field: "role", Reason: `"x" is not a role`}}}, 400, `role: "x" is not a role`},
		{&catalog.IDInUseError{ID: 1, Holder: catalog.Key{Model: "n", Group: "h", WorkerID: 1}}, 409,
			`instance_id: 1 is registered for model=n routing_group=h; a worker id names one engine, so unregister it there first`},
		{fmt.Errorf("update: %w", catalog.ErrContended), 503, `update: catalog: too many concurrent changes; try again`},
		{fmt.Errorf("catalog: etcd unreachable: update worker 1: no answer in time: %w", catalog.ErrUnavailable), 503,
			`catalog: etcd unreachable: update worker 1: no answer in time: catalog: store unavailable`},
	} {
		fw.registerErr = c.err
		want, _ := json.Marshal(map[string]string{"error": c.want})
		for _, route := range []string{"/register", "/unregister"} {
			fw.unregisterErr = c.err
			reqBody := body
			if route == "/unregister" {
				reqBody = `{"instance_id":1,"model_name":"m"}`
			}
			resp := s.post(route, reqBody)
			resp.expect(t, c.status, string(want))
			if ra := resp.header.Get("Retry-After"); (c.status == 503) != (ra == "1") {
				t.Errorf("%s %d %s: Retry-After %q", route, c.status, c.want, ra)
			}
		}
	}
	if !strings.Contains(logs.String(), "boom") || strings.Contains(logs.String(), "conflict") || strings.Contains(logs.String(), "unreachable") {
		t.Errorf("want the 500 logged, and neither the 4xx nor the store's unavailability (not per request), got:\n%s", logs.String())
	}
	// Without a catalog.
	s = newServer(t, Config{Index: newIndex(t)})
	s.post("/register", body).expect(t, 503, `{"error":"register: no worker catalog in this process"}`)
	s.post("/unregister", `{"instance_id":1,"model_name":"m"}`).expect(t, 503, `{"error":"unregister: no worker catalog in this process"}`)
	s.get("/workers").expect(t, 200, `[]`)
}

func TestUnregister(t *testing.T) {
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw})
	s.post("/unregister", `{"instance_id":7,"model_name":"m","routing_group":"g","dp_rank":2}`).expect(t, 200, `{"status":"ok"}`)
	s.post("/unregister", `{"instance_id":7,"model_name":"m","dp_rank":2,"tenant_id":"x"}`).expect(t, 200, `{"status":"ok"}`)
	s.post("/unregister", `{"instance_id":7,"model_name":"m","routing_group":"g","dp_rank":null}`).expect(t, 200, `{"status":"ok"}`)
	two := uint32(2)
	want := []unregistration{
		{"m", "g", 7, &two},
		{"m", "", 7, nil}, // dp_rank without routing_group is ignored
		{"m", "g", 7, nil},
	}
	if !reflect.DeepEqual(fw.unregistered, want) {
		t.Errorf("unregistered %+v\nwant %+v", fw.unregistered, want)
	}
	fw.unregisterErr = fmt.Errorf("instance 7 of model=m: %w", ErrNotFound)
	s.post("/unregister", `{"instance_id":7,"model_name":"m"}`).expect(t, 404, `{"error":"instance 7 of model=m: not found"}`)
}

func TestWorkers(t *testing.T) {
	ix := newIndex(t)
	p := prompt(48, 1)
	// The chain stored twice: a redundant store of its 3 blocks.
	store(t, ix, mDefault, indexer.Rank{WorkerID: 1, DPRank: 0}, 6, indexer.TierDevice, indexer.BaseSeed, 0, seq(1, 3), p)
	store(t, ix, mDefault, indexer.Rank{WorkerID: 1, DPRank: 0}, 7, indexer.TierDevice, indexer.BaseSeed, 0, seq(1, 3), p)
	seen := uint64(9) // two batches behind last_seq 7, waiting for a replay
	fw := &fakeWorkers{list: []WorkerState{
		{
			Record: catalog.Worker{WorkerID: 1, ModelName: "m", RoutingGroup: "default", BlockSize: 16, Lifecycle: "schedulable",
				EventsEndpoints:  map[uint32]string{0: "tcp://10.0.0.1:5557", 1: "tcp://10.0.0.1:5558"},
				ReplayEndpoints:  map[uint32]string{0: "tcp://10.0.0.1:6000", 1: "tcp://10.0.0.1:6001"},
				DataParallelSize: 2, Attributes: catalog.Attributes{Role: "decode", TotalKVBlocks: 1000}},
			Streams: map[uint32]stream.Rank{
				0: {Running: true, State: stream.State{Connected: true, Synced: true, HasLive: true, LastLive: seen}},
				1: {Running: true, State: stream.State{Degraded: true}},
			},
		},
		{Record: catalog.Worker{WorkerID: 4, ModelName: "other", RoutingGroup: "g", BlockSize: 32, EventsEndpoint: "tcp://10.0.0.4:5557", DataParallelSize: 1},
			Streams: map[uint32]stream.Rank{0: {Err: "block_size: 32 conflicts with block size 16 of model=other routing_group=g"}}},
	}}
	s := newServer(t, Config{Index: ix, Workers: fw})
	w1 := `{"instance_id":1,"source":"zmq","status":"pending","model_name":"m","routing_group":"default","block_size":16,` +
		`"endpoints":{"0":"tcp://10.0.0.1:5557","1":"tcp://10.0.0.1:5558"},` +
		`"listeners":{"0":{"endpoint":"tcp://10.0.0.1:5557","replay_endpoint":"tcp://10.0.0.1:6000","status":"active","degraded":false,"last_seq":7,"blocks":3,"redundant_store_blocks":3,"last_seen_seq":9,` +
		`"kv_cache_groups":[{"group_idx":0,"attention":"full","main":true,"tracked":true,"blocks":3}]},` +
		`"1":{"endpoint":"tcp://10.0.0.1:5558","replay_endpoint":"tcp://10.0.0.1:6001","status":"pending","degraded":true,"last_seq":null,"blocks":0,"last_seen_seq":null}},` +
		`"replay_endpoint":"tcp://10.0.0.1:6000","lifecycle":"schedulable","role":"decode","total_kv_blocks":1000,"data_parallel_size":2}`
	w4 := `{"instance_id":4,"source":"zmq","status":"failed","model_name":"other","routing_group":"g","block_size":32,"endpoints":{"0":"tcp://10.0.0.4:5557"},` +
		`"listeners":{"0":{"endpoint":"tcp://10.0.0.4:5557","status":"failed","last_error":"block_size: 32 conflicts with block size 16 of model=other routing_group=g","degraded":false,"last_seq":null,"blocks":0,"last_seen_seq":null}},"data_parallel_size":1}`
	s.get("/workers").expect(t, 200, `[`+w1+`,`+w4+`]`)
	s.get("/workers?model_name=m").expect(t, 200, `[`+w1+`]`)
	s.get("/workers?routing_group=g").expect(t, 200, `[`+w4+`]`)
	s.get("/workers?model_name=m&routing_group=g").expect(t, 200, `[]`)
	want := [][2]string{{"", ""}, {"m", ""}, {"", "g"}, {"m", "g"}}
	if !reflect.DeepEqual(fw.listArgs, want) {
		t.Errorf("list args %v, want %v", fw.listArgs, want)
	}
	// The response decodes into the exported type.
	var got []api.WorkerInfo
	if err := json.Unmarshal([]byte(s.get("/workers?model_name=m").body), &got); err != nil || len(got) != 1 || got[0].Listeners[0].Blocks != 3 || *got[0].Listeners[0].LastSeq != 7 ||
		*got[0].Listeners[0].LastSeenSeq != 9 || got[0].Listeners[1].LastSeenSeq != nil {
		t.Errorf("decode: %v %+v", err, got)
	}
}

func TestAuth(t *testing.T) {
	fw := &fakeWorkers{}
	ix, p := dynamoExample(t)
	s := newServer(t, Config{Index: ix, Workers: fw, APIToken: "s3cret"})
	reg := `{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":16}`
	unreg := `{"instance_id":1,"model_name":"m"}`
	for _, c := range []struct {
		path, body, header string
		status             int
		want               string
	}{
		{"/register", reg, "", 401, `{"error":"authorization: missing bearer token"}`},
		{"/register", reg, "Authorization: Bearer wrong", 401, `{"error":"authorization: invalid bearer token"}`},
		{"/register", reg, "Authorization: Bearer s3cret2", 401, `{"error":"authorization: invalid bearer token"}`},
		{"/register", reg, "Authorization: Basic czNjcmV0", 401, `{"error":"authorization: missing bearer token"}`},
		{"/register", reg, "Authorization: Bearer", 401, `{"error":"authorization: missing bearer token"}`},
		{"/register", `{not json`, "", 401, `{"error":"authorization: missing bearer token"}`}, // auth before the body
		{"/unregister", unreg, "", 401, `{"error":"authorization: missing bearer token"}`},
		{"/unregister", unreg, "Authorization: Bearer nope", 401, `{"error":"authorization: invalid bearer token"}`},
		{"/register", reg, "Authorization: Bearer s3cret", 201, `{"status":"ok"}`},
		{"/register", reg, "Authorization: bearer s3cret", 201, `{"status":"ok"}`},
		{"/unregister", unreg, "Authorization: Bearer s3cret", 200, `{"status":"ok"}`},
	} {
		var hdr []string
		if c.header != "" {
			hdr = append(hdr, c.header)
		}
		r := s.post(c.path, c.body, hdr...)
		r.expect(t, c.status, c.want)
		if c.status == 401 && r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s %q: no WWW-Authenticate", c.path, c.header)
		}
	}
	if len(fw.registered) != 2 || len(fw.unregistered) != 1 {
		t.Errorf("calls reached the catalog: %d registers, %d unregisters", len(fw.registered), len(fw.unregistered))
	}
	// Reads stay open without a read token, but for /dump, which shows
	// which prompts are cached: it needs the API token.
	for _, r := range []response{
		s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`),
		s.post("/query_by_hash", `{"block_hashes":[1],"model_name":"m"}`),
		s.get("/workers"), s.get("/health"), s.get("/ready"),
	} {
		if r.status != 200 {
			t.Errorf("read without token: %d %s", r.status, r.body)
		}
	}
	s.get("/dump").expect(t, 401, `{"error":"authorization: missing bearer token"}`)
	if r := s.do("GET", "/dump", "", "Authorization: Bearer s3cret"); r.status != 200 {
		t.Errorf("dump with the API token: %d %s", r.status, r.body)
	}
	// Auth off: no header needed.
	s = newServer(t, Config{Index: ix, Workers: fw})
	s.post("/register", reg).expect(t, 201, `{"status":"ok"}`)
	s.post("/unregister", unreg).expect(t, 200, `{"status":"ok"}`)
}

// TestQueryPredicted: with booking predictions, /query and /query_by_hash
// show the predicted tokens per instance and rank under "predicted",
// apart from the scores the events made; expired predictions are gone.
func TestQueryPredicted(t *testing.T) {
	ix, p := dynamoExample(t)
	now := time.Unix(100, 0)
	pred := indexer.NewPredictions(time.Second, 0, 0)
	hashes := indexer.HashBlocks(nil, p, 16, indexer.BaseSeed)
	pred.Add(mDefault, indexer.Rank{WorkerID: 2, DPRank: 3}, hashes, now)
	pred.Add(mDefault, indexer.Rank{WorkerID: 1, DPRank: 0}, hashes[:1], now)
	s := newServer(t, Config{Index: ix, Predicted: pred, Now: func() time.Time { return now }})
	want := `{"scores":{"1":{"0":32,"1":16}},"frequencies":[],"instances":{"1":{"longest_matched":48,"gpu":32,"dp":{"0":32,"1":16},"cpu":48,"disk":48}},` +
		`"predicted":{"1":{"0":16},"2":{"3":64}}}`
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).expect(t, 200, want)
	var byHash strings.Builder
	for i, h := range hashes {
		if i > 0 {
			byHash.WriteByte(',')
		}
		byHash.WriteString(strconv.FormatInt(int64(h), 10))
	}
	s.post("/query_by_hash", `{"block_hashes":[`+byHash.String()+`],"model_name":"m"}`).expect(t, 200, want)
	var got api.ScoreResponse
	if err := json.Unmarshal([]byte(s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).body), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Predicted, map[uint64]map[uint32]uint64{1: {0: 16}, 2: {3: 64}}) {
		t.Errorf("Predicted = %v", got.Predicted)
	}
	now = now.Add(time.Second)
	s.post("/query", `{"token_ids":`+tokensJSON(p)+`,"model_name":"m"}`).expect(t, 200,
		`{"scores":{"1":{"0":32,"1":16}},"frequencies":[],"instances":{"1":{"longest_matched":48,"gpu":32,"dp":{"0":32,"1":16},"cpu":48,"disk":48}}}`)
}

// TestAppendUint checks appendUint against strconv at every digit count
// and its boundaries.
func TestAppendUint(t *testing.T) {
	vs := []uint64{0, math.MaxUint64}
	for p := uint64(1); p <= 1e19; p *= 10 {
		vs = append(vs, p-1, p, p+1, 2*p-1, 5*p)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 10000 {
		vs = append(vs, rng.Uint64()>>rng.IntN(64))
	}
	for _, v := range vs {
		if got, want := appendUint([]byte("x"), v), strconv.AppendUint([]byte("x"), v, 10); string(got) != string(want) {
			t.Fatalf("appendUint(%d) = %s, want %s", v, got, want)
		}
	}
}
