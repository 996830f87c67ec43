package mocker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ServeHTTP serves the engine's HTTP API:
//
//   - vLLM's OpenAI routes (openai.go): POST /v1/completions,
//     POST /v1/chat/completions, POST /tokenize, GET /v1/models;
//   - POST /generate with a JSON Request, answered with a JSON Result;
//   - GET /health (200 while running, as vLLM's) and GET /metrics (vLLM's
//     scheduler gauges in the Prometheus text format, and in the vLLM
//     flavor vllm:cache_config_info);
//   - GET /server_info (vLLM's with Config.ServerInfo, or SGLang's) and
//     GET /get_server_info (SGLang's), as describe.go says;
//   - the fault injections POST /faults/restart,
//     /faults/reset_prefix_cache, /faults/stall_replay?for=<duration>,
//     /faults/crash and /faults/fail?status=&count=&after_tokens=.
//
// Other paths are 404, other methods 405.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/faults/"):
		e.serveFault(w, r)
	case p == "/v1/completions":
		e.serveGeneration(w, r, false)
	case p == "/v1/chat/completions":
		e.serveGeneration(w, r, true)
	case p == "/tokenize":
		e.serveTokenize(w, r)
	case p == "/v1/models":
		e.serveModels(w, r)
	case p == "/health":
		// As vLLM's /health: 200 while the engine serves. A sidecar probes it.
		if !e.isRunning() {
			http.Error(w, ErrNotRunning.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case p == "/metrics":
		e.serveMetrics(w, r)
	case p == "/server_info", p == "/get_server_info":
		e.serveServerInfo(w, r)
	case p == "/generate":
		e.serveGenerate(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (e *Engine) isRunning() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running
}

func (e *Engine) serveGenerate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var req Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, max(e.cfg.MaxBodyBytes, 64<<20)))
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	res, err := e.Serve(r.Context(), req)
	switch {
	case errors.Is(err, ErrNoSpace):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case errors.Is(err, ErrNotRunning):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// serveMetrics writes the scheduler gauges KV-aware routers scrape, with
// the engine's names and labels: requests running and waiting (those
// waiting for a KV transfer included, as vLLM counts them) and KV-cache
// usage. vLLM labels each series with model_name and engine, the dp rank
// (vllm/v1/metrics/loggers.py), and adds the prefix-cache counters and,
// here, vllm:cache_config_info; SGLang names them sglang:num_running_reqs,
// sglang:num_queue_reqs and sglang:token_usage, labelled with model_name,
// engine_type, tp_rank and pp_rank (one mock engine is one dp rank, so
// the dp_rank label of data-parallel attention is absent).
func (e *Engine) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	l := e.Load()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	usage := strconv.FormatFloat(l.KVUsage, 'g', -1, 64)
	if e.cfg.Flavor == FlavorSGLang {
		label := `{engine_type="unified",model_name=` + strconv.Quote(e.servedModel()) + `,pp_rank="0",tp_rank="0"}`
		fmt.Fprintf(w, "# HELP sglang:num_running_reqs The number of running requests.\n"+
			"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs%s %d\n", label, l.Running)
		fmt.Fprintf(w, "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"+
			"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs%s %d\n", label, l.Queued())
		fmt.Fprintf(w, "# HELP sglang:token_usage The token usage.\n"+
			"# TYPE sglang:token_usage gauge\nsglang:token_usage%s %s\n", label, usage)
		return
	}
	label := `{engine="` + strconv.FormatUint(uint64(e.cfg.DPRank), 10) + `",model_name=` + strconv.Quote(e.servedModel()) + `}`
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"+
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running%s %d\n", label, l.Running)
	fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"+
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting%s %d\n", label, l.Queued())
	fmt.Fprintf(w, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"+
		"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc%s %s\n", label, usage)
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in prompt tokens (of requests computing their prompt here).\n"+
		"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total%s %d\n", label, l.PrefixQueries)
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in prompt tokens.\n"+
		"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total%s %d\n", label, l.PrefixHits)
	e.writeCacheConfigInfo(w)
}

// faultPlan is the failures POST /faults/fail injected into the OpenAI
// generation routes: the next count requests fail with status before
// their first byte, or, with afterTokens >= 0, have their response cut
// after that many tokens.
type faultPlan struct {
	count       int
	status      int
	afterTokens int
}

// maxFaultCount bounds POST /faults/fail's count.
const maxFaultCount = 1_000_000

// takeFault returns the fault the next generation request carries, if
// any.
func (e *Engine) takeFault() (faultPlan, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.faults.count == 0 {
		return faultPlan{}, false
	}
	e.faults.count--
	return e.faults, true
}

func (e *Engine) serveFault(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/faults/restart":
		e.Restart()
	case "/faults/reset_prefix_cache":
		if err := e.ResetPrefixCache(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	case "/faults/stall_replay":
		d, err := time.ParseDuration(r.URL.Query().Get("for"))
		if err != nil || d < 0 {
			http.Error(w, "for: want a non-negative duration such as 5s", http.StatusBadRequest)
			return
		}
		e.pub.Stall(d)
	case "/faults/fail":
		f, err := parseFailFault(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.faults = f
		e.mu.Unlock()
		e.log.Info("fault armed", "count", f.count, "status", f.status, "after_tokens", f.afterTokens)
	case "/faults/crash":
		e.Crash()
	default:
		http.NotFound(w, r)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseFailFault reads POST /faults/fail's query: count (default 1; 0
// disarms), status (default 503; 400 to 599) and after_tokens (absent:
// fail before the first byte).
func parseFailFault(r *http.Request) (faultPlan, error) {
	q := r.URL.Query()
	f := faultPlan{count: 1, status: http.StatusServiceUnavailable, afterTokens: -1}
	intParam := func(name string, lo, hi int, dst *int) error {
		s, ok := q[name]
		if !ok {
			return nil
		}
		v, err := strconv.Atoi(s[0])
		if err != nil || len(s) != 1 || v < lo || v > hi {
			return fmt.Errorf("%s: want one integer from %d to %d, got %q", name, lo, hi, strings.Join(s, ","))
		}
		*dst = v
		return nil
	}
	if err := intParam("count", 0, maxFaultCount, &f.count); err != nil {
		return f, err
	}
	if err := intParam("status", 400, 599, &f.status); err != nil {
		return f, err
	}
	if err := intParam("after_tokens", 0, 1<<30, &f.afterTokens); err != nil {
		return f, err
	}
	for name := range q {
		if name != "count" && name != "status" && name != "after_tokens" {
			return f, fmt.Errorf("%s: unknown parameter (want count, status, after_tokens)", name)
		}
	}
	return f, nil
}
