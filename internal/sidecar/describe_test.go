package sidecar

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// vllmMetrics is a vLLM /metrics page with two dp engines, in the shape
// PrometheusStatLogger writes it (labels are CacheConfig's fields as
// Python strs; each engine profiled its own num_gpu_blocks).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27000",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27104",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None"} 1.0
`

const vllmModels = `{"object":"list","data":[
 {"id":"meta-llama/Llama-3.1-8B","object":"model","created":1,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null,"max_model_len":131072,"permission":[]},
 {"id":"sql-lora","object":"model","created":1,"owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B","max_model_len":null,"permission":[]}]}`

// engine serves routes (path → body; others 404).
func engine(t *testing.T, routes map[string]string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

// TestDescribeVLLMWithoutDevMode: vLLM without VLLM_SERVER_DEV_MODE says
// its model, block size, capacity (the larger engine's), prefix caching
// and dp ranks (its engines) but not its event endpoints: those are the
// flags' or vLLM's default, and the record says so.
func TestDescribeVLLMWithoutDevMode(t *testing.T) {
	e := engine(t, map[string]string{"/metrics": vllmMetrics, "/v1/models": vllmModels, "/health": ""})
	d, err := Describe(context.Background(), nil, e.URL)
	if err != nil {
		t.Fatal(err)
	}
	if d.Flavor != "vllm" || d.Model.V != "meta-llama/Llama-3.1-8B" || len(d.Models) != 1 || d.BlockSize.V != 16 ||
		d.TotalKVBlocks.V != 27104 || !d.PrefixCaching.V || d.DPStart.V != 0 || d.DPSize.V != 2 ||
		d.MaxModelLen.V != 131072 || d.EventsEndpoint.Known() || d.KVEvents.Known() {
		t.Fatalf("Describe = %+v", d)
	}
	w, err := Resolve(catalog.Worker{WorkerID: 1, Endpoint: e.URL, BlockSize: 16, EventsEndpoint: "tcp://*:5557", DataParallelSize: 1},
		map[string]string{"replay_endpoint": "--replay-endpoint"}, d)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"model_name": "engine: GET /v1/models", "block_size": "engine: GET /metrics vllm:cache_config_info",
		"total_kv_blocks": "engine: GET /metrics vllm:cache_config_info", "data_parallel_size": "engine: GET /metrics vllm:cache_config_info engine",
		"events_endpoint": "default", "replay_endpoint": "flag --replay-endpoint"}
	for k, v := range want {
		if w.Sources[k] != v {
			t.Errorf("sources[%s] = %q, want %q", k, w.Sources[k], v)
		}
	}
	if w.DataParallelSize != 2 || w.ModelName != "meta-llama/Llama-3.1-8B" {
		t.Errorf("record %+v", w)
	}
}

// TestDescribeVLLMDevMode: with VLLM_SERVER_DEV_MODE=1, /server_info's
// VllmConfig adds the event endpoints and the batch budget; a config that
// contradicts the metrics is refused as the engine contradicting itself.
func TestDescribeVLLMDevMode(t *testing.T) {
	info := `{"vllm_config":{"model_config":{"served_model_name":"meta-llama/Llama-3.1-8B","max_model_len":131072},
	 "cache_config":{"block_size":16,"num_gpu_blocks":27000,"enable_prefix_caching":true},
	 "parallel_config":{"data_parallel_size":2,"data_parallel_rank":0},
	 "scheduler_config":{"max_num_batched_tokens":8192},
	 "kv_events_config":{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600","buffer_steps":10000,"hwm":100000,"max_queue_size":100000,"topic":""}},
	 "vllm_env":{"VLLM_SERVER_DEV_MODE":true},"system_env":{"os":"Ubuntu"}}`
	e := engine(t, map[string]string{"/metrics": vllmMetrics, "/v1/models": vllmModels, "/server_info": info})
	d, err := Describe(context.Background(), nil, e.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !d.KVEvents.V || d.EventsEndpoint.V != "tcp://*:5557" || d.ReplayEndpoint.V != "tcp://*:5600" || d.MaxNumBatchedTokens.V != 8192 {
		t.Fatalf("Describe = %+v", d)
	}
	w, err := Resolve(catalog.Worker{WorkerID: 1, Endpoint: e.URL, EventsEndpoint: "tcp://0.0.0.0:5557"}, map[string]string{"events_endpoint": "--events-endpoint"}, d)
	if err != nil || w.Sources["events_endpoint"] != "flag --events-endpoint" || w.Sources["replay_endpoint"] != "engine: GET /server_info vllm_config kv_events_config.replay_endpoint" {
		t.Fatalf("Resolve = %+v, %v (a wildcard written another way is the same endpoint)", w.Sources, err)
	}
	_, err = Resolve(catalog.Worker{WorkerID: 1, Endpoint: e.URL, ReplayEndpoint: "tcp://*:6000"}, map[string]string{"replay_endpoint": "--replay-endpoint"}, d)
	if err == nil || !strings.Contains(err.Error(), `--replay-endpoint "tcp://*:6000" contradicts the engine's replay_endpoint "tcp://*:5600" (GET /server_info vllm_config kv_events_config.replay_endpoint)`) {
		t.Fatalf("Resolve with a contradicting replay endpoint: %v", err)
	}

	bad := engine(t, map[string]string{"/metrics": vllmMetrics, "/server_info": strings.Replace(info, `"block_size":16`, `"block_size":32`, 1)})
	_, err = Describe(context.Background(), nil, bad.URL)
	var perm *PermanentError
	if !errors.As(err, &perm) || !strings.Contains(err.Error(), "the engine contradicts itself: block_size 16 (GET /metrics vllm:cache_config_info), but 32 (GET /server_info vllm_config cache_config.block_size)") {
		t.Fatalf("Describe of a self-contradicting engine: %v", err)
	}
}

// TestDescribeSGLang: an older SGLang (GET /get_server_info, no kv_events
// block) and a newer one (GET /server_info with the block) say page size,
// dp size, capacity, budget and endpoints; one without a publisher is
// refused unless an events endpoint is given.
func TestDescribeSGLang(t *testing.T) {
	args := `"model_path":"Qwen/Qwen3-8B","served_model_name":"Qwen/Qwen3-8B","page_size":32,"dp_size":2,"disable_radix_cache":false,
	 "context_length":40960,"chunked_prefill_size":4096,"max_total_num_tokens":320000,"version":"0.5.0"`
	old := engine(t, map[string]string{"/get_server_info": `{` + args + `,"kv_events_config":"{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:6000\",\"replay_endpoint\":\"tcp://*:6100\",\"topic\":\"kv\"}"}`})
	d, err := Describe(context.Background(), nil, old.URL)
	if err != nil {
		t.Fatal(err)
	}
	if d.Flavor != "sglang" || d.Model.V != "Qwen/Qwen3-8B" || d.BlockSize.V != 32 || d.DPSize.V != 2 || d.TotalKVBlocks.V != 10000 ||
		d.MaxNumBatchedTokens.V != 4096 || d.EventsEndpoint.V != "tcp://*:6000" || d.ReplayEndpoint.V != "tcp://*:6100" || d.Topic.V != "kv" ||
		d.BlockSize.From != "GET /get_server_info page_size" {
		t.Fatalf("Describe (old SGLang) = %+v", d)
	}
	newer := engine(t, map[string]string{"/server_info": `{` + args + `,"kv_events_config":"{\"publisher\":\"zmq\",\"endpoint\":\"tcp://0.0.0.0:6000\"}",
	 "kv_events":{"publisher":"zmq","endpoint_host":"0.0.0.0","endpoint_port_base":6000,"topic":"","block_size":32,"dp_size":2}}`})
	d, err = Describe(context.Background(), nil, newer.URL)
	if err != nil {
		t.Fatal(err)
	}
	if d.EventsEndpoint.V != "tcp://0.0.0.0:6000" || d.ReplayEndpoint.Known() && d.ReplayEndpoint.V != "" || d.DPSize.V != 2 {
		t.Fatalf("Describe (SGLang with kv_events) = %+v", d)
	}
	silent := engine(t, map[string]string{"/server_info": `{` + args + `,"kv_events_config":null,"kv_events":null}`})
	d, err = Describe(context.Background(), nil, silent.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(catalog.Worker{WorkerID: 1}, nil, d); err == nil || !strings.Contains(err.Error(), "the engine publishes no KV events (GET /server_info kv_events_config)") {
		t.Fatalf("Resolve of an engine without events: %v", err)
	}
	if _, err := Resolve(catalog.Worker{WorkerID: 1, EventsEndpoint: "tcp://*:6000"}, map[string]string{"events_endpoint": "--events-endpoint"}, d); err == nil ||
		!strings.Contains(err.Error(), `--events-endpoint "tcp://*:6000" contradicts the engine, which publishes no KV events (GET /server_info kv_events_config)`) {
		t.Fatalf("Resolve of an events endpoint the engine does not publish on: %v", err)
	}
}

// TestDescribeRefusesNonEngines: a server that describes itself on none
// of the routes, or answers them with garbage, is a permanent error.
func TestDescribeRefusesNonEngines(t *testing.T) {
	for name, routes := range map[string]map[string]string{
		"nothing":     {},
		"bad metrics": {"/metrics": "vllm:cache_config_info{block_size=\"16\" 1\n"},
		"bad labels":  {"/metrics": "vllm:cache_config_info{block_size=\"sixteen\"} 1\n"},
		"gaps in dp":  {"/metrics": "vllm:cache_config_info{block_size=\"16\",engine=\"0\"} 1\nvllm:cache_config_info{block_size=\"16\",engine=\"2\"} 1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Describe(context.Background(), nil, engine(t, routes).URL)
			var perm *PermanentError
			if !errors.As(err, &perm) {
				t.Fatalf("Describe = %v, want a permanent error", err)
			}
		})
	}
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := []byte(strings.Repeat("# padding\n", 1000))
		for n := 0; n <= MaxDescribeBytes; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer huge.Close()
	if _, err := Describe(context.Background(), nil, huge.URL); err == nil || !strings.Contains(err.Error(), "larger than 8388608 bytes") {
		t.Fatalf("Describe of a huge /metrics: %v", err)
	}
}

// TestResolveSeveralModels: an engine serving several models needs
// --model, one of them.
func TestResolveSeveralModels(t *testing.T) {
	d := Description{Flavor: "vllm", Models: []string{"a", "b"}, BlockSize: Said[uint32]{16, routeVLLMMetrics}}
	if _, err := Resolve(catalog.Worker{WorkerID: 1}, nil, d); err == nil || !strings.Contains(err.Error(), `the engine serves several models, "a", "b" (GET /v1/models): say which with --model`) {
		t.Fatalf("Resolve without --model: %v", err)
	}
	w, err := Resolve(catalog.Worker{WorkerID: 1, ModelName: "b"}, map[string]string{"model_name": "--model"}, d)
	if err != nil || w.ModelName != "b" || w.BlockSize != 16 {
		t.Fatalf("Resolve --model b = %+v, %v", w, err)
	}
	if _, err := Resolve(catalog.Worker{WorkerID: 1, ModelName: "c"}, map[string]string{"model_name": "--model"}, d); err == nil ||
		!strings.Contains(err.Error(), `--model "c" contradicts the engine, which serves "a", "b" (GET /v1/models)`) {
		t.Fatalf("Resolve --model c: %v", err)
	}
	d.BlockSize = Said[uint32]{}
	if _, err := Resolve(catalog.Worker{WorkerID: 1, ModelName: "a", BlockSize: 16}, map[string]string{"model_name": "--model"}, d); err == nil ||
		!strings.Contains(err.Error(), "block_size: the engine did not say") {
		t.Fatalf("Resolve without a block size from anyone: %v", err)
	}
}

// TestRunWaitsForTheEngine: a sidecar started before its engine answers
// says it waits (once per kind of failure, not per attempt), then
// registers what the engine says with the sources.
func TestRunWaitsForTheEngine(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	var up atomic.Bool
	var asked atomic.Int64
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte(vllmMetrics))
		case "/v1/models":
			_, _ = w.Write([]byte(vllmModels))
		case "/health":
		default:
			http.NotFound(w, r)
		}
	}))
	defer e.Close()
	logs, log := testlog.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Etcd: etcdstore.Config{Endpoints: etcd.Endpoints()}, AskEngine: true, DescribeRetryMax: 20 * time.Millisecond,
			Worker:    catalog.Worker{WorkerID: 3, Endpoint: e.URL, EventsEndpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5600", DataParallelSize: 1},
			Given:     map[string]string{"events_endpoint": "--events-endpoint", "replay_endpoint": "--replay-endpoint"},
			HealthURL: e.URL + "/health", HealthInterval: 50 * time.Millisecond, AdvertiseHost: "10.0.0.3", TTL: 2 * time.Second, Logger: log})
	}()
	logs.Wait(t, 10*time.Second, "waiting for the engine to describe itself", "worker=3", "err=GET /metrics: HTTP 503 Service Unavailable")
	testsupport.Eventually(t, 10*time.Second, "a few attempts", func() bool { return asked.Load() >= 5 })
	if n := logs.Count("waiting for the engine to describe itself"); n != 1 {
		t.Fatalf("%d waiting lines for one kind of failure, want 1", n)
	}
	up.Store(true)
	rec := logs.Wait(t, 10*time.Second, "worker registered", "worker=3", "model=meta-llama/Llama-3.1-8B", "block_size=16", "total_kv_blocks=27104", "ranks=[0 1]",
		"events=[0=tcp://10.0.0.3:5557 1=tcp://10.0.0.3:5558]")
	for _, s := range []string{"block_size=engine: GET /metrics vllm:cache_config_info", "events_endpoint=flag --events-endpoint", "model_name=engine: GET /v1/models"} {
		if !strings.Contains(rec.Attrs["sources"], s) {
			t.Errorf("sources %q lack %q", rec.Attrs["sources"], s)
		}
	}
	logs.Wait(t, time.Second, "the engine answers: it described itself", "worker=3")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
