package mocker

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestDescribeRoutes: a vLLM-flavoured engine reports its cache config on
// GET /metrics and, with ServerInfo, its VllmConfig (bound endpoints,
// budget) on GET /server_info?config_format=json, 404 without (vLLM
// without its dev mode); an SGLang-flavoured one answers GET /server_info
// and GET /get_server_info with its server args and kv_events block, and
// no vllm:cache_config_info.
func TestDescribeRoutes(t *testing.T) {
	_, plain := openAIEngine(t, Config{Timing: Timing{MaxNumBatchedTokens: 512, MaxNumSeqs: 8}})
	if code, body := getBody(t, plain+"/metrics"); code != 200 ||
		!strings.Contains(body, `vllm:cache_config_info{block_size="4",cache_dtype="auto",enable_prefix_caching="True",engine="0",`) ||
		!strings.Contains(body, `num_gpu_blocks="64"`) {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	if code, _ := getBody(t, plain+"/server_info?config_format=json"); code != http.StatusNotFound {
		t.Fatalf("GET /server_info without ServerInfo: %d, want 404", code)
	}

	e, dev := openAIEngine(t, Config{ServerInfo: true, PrefixCachingOff: true, Timing: Timing{MaxNumBatchedTokens: 512, MaxNumSeqs: 8}})
	code, body := getBody(t, dev+"/server_info?config_format=json")
	var info struct {
		Config struct {
			Cache struct {
				BlockSize int  `json:"block_size"`
				Blocks    int  `json:"num_gpu_blocks"`
				Caching   bool `json:"enable_prefix_caching"`
			} `json:"cache_config"`
			Scheduler struct {
				Budget int `json:"max_num_batched_tokens"`
			} `json:"scheduler_config"`
			Events struct {
				Endpoint string  `json:"endpoint"`
				Replay   *string `json:"replay_endpoint"`
			} `json:"kv_events_config"`
		} `json:"vllm_config"`
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil || code != 200 {
		t.Fatalf("GET /server_info: %d %v\n%s", code, err, body)
	}
	c := info.Config
	if c.Cache.BlockSize != 4 || c.Cache.Blocks != 64 || c.Cache.Caching || c.Scheduler.Budget != 512 ||
		c.Events.Endpoint != e.Publisher().Endpoint() || c.Events.Replay == nil || *c.Events.Replay != e.Publisher().ReplayEndpoint() {
		t.Fatalf("vllm_config %+v, want the bound endpoints %s and %s", c, e.Publisher().Endpoint(), e.Publisher().ReplayEndpoint())
	}
	if code, body := getBody(t, dev+"/server_info"); code != 200 || !strings.Contains(body, `"vllm_config":"`) {
		t.Fatalf("GET /server_info (text format): %d %s", code, body)
	}

	s, sg := openAIEngine(t, Config{Flavor: FlavorSGLang, Timing: Timing{MaxNumBatchedTokens: 512, MaxNumSeqs: 8}})
	port := s.Publisher().Endpoint()[strings.LastIndex(s.Publisher().Endpoint(), ":")+1:]
	for _, path := range []string{"/server_info", "/get_server_info"} {
		code, body := getBody(t, sg+path)
		for _, want := range []string{`"page_size":4`, `"dp_size":1`, `"disable_radix_cache":false`, `"max_total_num_tokens":256`,
			`"kv_events":{"block_size":4,"dp_size":1,"endpoint_host":"127.0.0.1","endpoint_port_base":` + port + `,"publisher":"zmq","topic":""}`} {
			if code != 200 || !strings.Contains(body, want) {
				t.Fatalf("GET %s: %d, want %s in\n%s", path, code, want, body)
			}
		}
	}
	if _, body := getBody(t, sg+"/metrics"); strings.Contains(body, "vllm:") {
		t.Fatalf("an SGLang-flavoured engine reports vLLM's metrics:\n%s", body)
	} else {
		for _, want := range []string{`sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0`,
			`sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0`,
			`sglang:token_usage{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0`} {
			if !strings.Contains(body, want) {
				t.Fatalf("SGLang /metrics lacks %s:\n%s", want, body)
			}
		}
	}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("port %q", port)
	}
	if _, err := New(Config{TotalBlocks: 1, BlockSize: 1, Flavor: "trtllm"}); err == nil || !strings.Contains(err.Error(), `flavor "trtllm"`) {
		t.Fatalf("New with a bad flavor: %v", err)
	}
}
