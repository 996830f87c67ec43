package mocker

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// This file is how an engine describes itself over HTTP, as vLLM and
// SGLang do, so that `prefixd sidecar --engine-url` can learn the engine's
// model, block size, capacity and event endpoints from it:
//
//   - vLLM: GET /metrics carries the info gauge vllm:cache_config_info
//     (CacheConfig's fields as labels, one sample per engine:
//     vllm/v1/metrics/loggers.py, log_metrics_info); with
//     Config.ServerInfo (vLLM's VLLM_SERVER_DEV_MODE=1) GET
//     /server_info?config_format=json answers {"vllm_config": VllmConfig}
//     (vllm/entrypoints/serve/instrumentator/server_info.py);
//   - SGLang: GET /server_info (and the older GET /get_server_info)
//     answers the server args flat, the scheduler's max_total_num_tokens
//     and the "kv_events" block of newer releases
//     (python/sglang/srt/entrypoints/http_server.py).

// The flavors an engine's HTTP API describes itself as.
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
)

// prefixCaching is what the engine says of its prefix caching.
func (e *Engine) prefixCaching() bool { return !e.cfg.PrefixCachingOff }

// eventEndpoints are the configured KV-event endpoints, as the engine's
// config names them: the base that rank r offsets by r (so this rank's
// bound port minus its rank), the replay endpoint likewise ("" without
// one).
func (e *Engine) eventEndpoints() (events, replay string) {
	base := func(ep string) string {
		rest, ok := strings.CutPrefix(ep, "tcp://")
		if !ok {
			return ep
		}
		host, p, err := net.SplitHostPort(rest)
		port, perr := strconv.Atoi(p)
		if err != nil || perr != nil || port-int(e.cfg.DPRank) < 1 {
			return ep
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port-int(e.cfg.DPRank)))
	}
	events = base(e.pub.Endpoint())
	if r := e.pub.ReplayEndpoint(); r != "" {
		replay = base(r)
	}
	return events, replay
}

// writeCacheConfigInfo writes vLLM's vllm:cache_config_info: a gauge set
// to 1 whose labels are CacheConfig's fields as Python strs.
func (e *Engine) writeCacheConfigInfo(w io.Writer) {
	caching := "False"
	if e.prefixCaching() {
		caching = "True"
	}
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"+
		"# TYPE vllm:cache_config_info gauge\n"+
		"vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=%q,engine=\"%d\",gpu_memory_utilization=\"0.9\","+
		"num_cpu_blocks=\"None\",num_gpu_blocks=\"%d\",prefix_caching_hash_algo=\"sha256\"} 1.0\n",
		e.cfg.BlockSize, caching, e.cfg.DPRank, e.cfg.TotalBlocks)
}

// serveServerInfo serves GET /server_info: vLLM's (with Config.ServerInfo;
// 404 otherwise, as vLLM without its dev mode) or SGLang's.
func (e *Engine) serveServerInfo(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, http.MethodGet)
		return
	}
	events, replay := e.eventEndpoints()
	var body any
	switch e.cfg.Flavor {
	case FlavorSGLang:
		body = e.sglangServerInfo(events, replay)
	default:
		if !e.cfg.ServerInfo || r.URL.Path != "/server_info" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Query().Get("config_format") != "json" {
			body = map[string]any{"vllm_config": fmt.Sprintf("model=%q, block_size=%d (the mocker's text format)", e.servedModel(), e.cfg.BlockSize),
				"vllm_env": map[string]any{}, "system_env": map[string]any{}}
			break
		}
		replayField := any(nil)
		if replay != "" {
			replayField = replay
		}
		body = map[string]any{
			"vllm_config": map[string]any{
				"model_config": map[string]any{"model": e.servedModel(), "served_model_name": e.servedModel(), "max_model_len": e.cfg.MaxModelLen},
				"cache_config": map[string]any{"block_size": e.cfg.BlockSize, "num_gpu_blocks": e.cfg.TotalBlocks,
					"enable_prefix_caching": e.prefixCaching(), "prefix_caching_hash_algo": "sha256", "cache_dtype": "auto"},
				"parallel_config":  map[string]any{"data_parallel_size": 1, "data_parallel_rank": e.cfg.DPRank, "tensor_parallel_size": 1},
				"scheduler_config": map[string]any{"max_num_batched_tokens": e.cfg.Timing.MaxNumBatchedTokens, "max_num_seqs": e.cfg.Timing.MaxNumSeqs},
				"kv_events_config": map[string]any{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": events,
					"replay_endpoint": replayField, "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": e.cfg.Publisher.Topic},
			},
			"vllm_env":   map[string]any{"VLLM_SERVER_DEV_MODE": true},
			"system_env": map[string]any{},
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// sglangServerInfo is SGLang's server info: ServerArgs' fields flat (those
// a KV-aware router reads), the scheduler's info and the kv_events block.
func (e *Engine) sglangServerInfo(events, replay string) map[string]any {
	cfg := map[string]any{"publisher": "zmq", "endpoint": events, "topic": e.cfg.Publisher.Topic}
	if replay != "" {
		cfg["replay_endpoint"] = replay
	}
	raw, _ := json.Marshal(cfg)
	var block any // null when the endpoint is not tcp, as SGLang's
	if rest, ok := strings.CutPrefix(events, "tcp://"); ok {
		if host, p, err := net.SplitHostPort(rest); err == nil {
			if port, err := strconv.Atoi(p); err == nil {
				block = map[string]any{"publisher": "zmq", "endpoint_host": host, "endpoint_port_base": port,
					"topic": e.cfg.Publisher.Topic, "block_size": e.cfg.BlockSize, "dp_size": 1}
			}
		}
	}
	return map[string]any{
		"model_path": e.servedModel(), "served_model_name": e.servedModel(), "page_size": e.cfg.BlockSize, "dp_size": 1,
		"tp_size": 1, "disable_radix_cache": !e.prefixCaching(), "context_length": e.cfg.MaxModelLen,
		"chunked_prefill_size": e.cfg.Timing.MaxNumBatchedTokens, "kv_events_config": string(raw), "kv_events": block,
		"max_total_num_tokens": e.cfg.TotalBlocks * e.cfg.BlockSize, "max_req_input_len": e.cfg.MaxModelLen,
		"internal_states": []any{map[string]any{"max_total_num_tokens": e.cfg.TotalBlocks * e.cfg.BlockSize}},
		"version":         "mocker",
	}
}
