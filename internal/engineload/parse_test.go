package engineload

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/coordinator"
)

// vllmBody is vLLM's /metrics shape with two dp ranks (engine label), a
// histogram between the gauges as the real body has.
const vllmBody = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 0.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.0
`

// sglangBody is SGLang's shape with data-parallel attention: dp_rank,
// and several tp ranks reporting the same requests.
const sglangBody = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="4",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 7.0
sglang:num_running_reqs{dp_rank="4",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 6.0
sglang:num_running_reqs{dp_rank="5",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="4",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="5",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="4",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="5",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.125
`

func TestParse(t *testing.T) {
	figs, errs, problems, err := parse([]byte(vllmBody), []uint32{0, 1}, 100)
	if err != nil || len(errs) != 0 || len(problems) != 0 {
		t.Fatalf("vLLM: %v %v %v", err, errs, problems)
	}
	want := map[uint32]coordinator.EngineLoad{0: {Running: 3, Waiting: 2, KVUsage: 0.25}, 1: {}}
	if fmt.Sprint(figs) != fmt.Sprint(want) {
		t.Fatalf("vLLM figures %v, want %v", figs, want)
	}
	figs, errs, _, err = parse([]byte(sglangBody), []uint32{4, 5}, 100)
	if err != nil || len(errs) != 0 {
		t.Fatalf("SGLang: %v %v", err, errs)
	}
	want = map[uint32]coordinator.EngineLoad{4: {Running: 7, Waiting: 1, KVUsage: 0.5}, 5: {Running: 1, KVUsage: 0.125}}
	if fmt.Sprint(figs) != fmt.Sprint(want) {
		t.Fatalf("SGLang figures %v, want %v", figs, want)
	}
	// One registered rank takes the body's one rank, labelled or not.
	one := "vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.5\n"
	if figs, _, _, err := parse([]byte(one), []uint32{3}, 100); err != nil || figs[3] != (coordinator.EngineLoad{Running: 1, Waiting: 2, KVUsage: 0.5}) {
		t.Fatalf("one rank: %v %v", figs, err)
	}
}

func TestParseRefuses(t *testing.T) {
	gauges := func(run, wait, usage string) string {
		return fmt.Sprintf("vllm:num_requests_running{engine=\"0\"} %s\nvllm:num_requests_waiting{engine=\"0\"} %s\nvllm:kv_cache_usage_perc{engine=\"0\"} %s\n"+
			"vllm:num_requests_running{engine=\"1\"} 1\nvllm:num_requests_waiting{engine=\"1\"} 1\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.5\n", run, wait, usage)
	}
	for _, tc := range []struct {
		name, body string
		fatal      error // the whole body
		rank0      error // rank 0 only; rank 1 keeps its figure
		problem    error
	}{
		{"NaN", gauges("NaN", "0", "0"), nil, errBadValue, nil},
		{"negative", gauges("-1", "0", "0"), nil, errBadValue, nil},
		{"+Inf", gauges("+Inf", "0", "0"), nil, errBadValue, nil},
		{"usage over 1", gauges("0", "0", "1.5"), nil, errBadValue, nil},
		{"usage NaN", gauges("0", "0", "NaN"), nil, errBadValue, nil},
		{"absurd count", gauges("0", "1e12", "0"), nil, errBadValue, nil},
		{"missing gauge", "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 1\n", nil, errMissing, nil},
		{"garbage", "vllm:num_requests_running{engine=\"0\" 1 2 3\n", errParse, nil, nil},
		{"bad label", gauges("0", "0", "0") + "vllm:num_requests_running{engine=\"x\"} 1\n", nil, nil, errBadLabel},
		{"unknown rank", gauges("0", "0", "0") + "vllm:num_requests_running{engine=\"9\"} 1\n", nil, nil, errUnknownRank},
		{"unlabeled with two ranks", gauges("0", "0", "0") + "vllm:num_requests_running 1\n", nil, nil, errUnlabeled},
		{"too many series", strings.Repeat("vllm:num_requests_running{engine=\"0\"} 1\n", 101), errTooMany, nil, nil},
		{"nothing", "# nothing here\nother_metric 1\n", nil, errMissing, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			figs, errs, problems, err := parse([]byte(tc.body), []uint32{0, 1}, 100)
			if tc.fatal != nil {
				if !errors.Is(err, tc.fatal) {
					t.Fatalf("err %v, want %v", err, tc.fatal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.rank0 != nil && !errors.Is(errs[0], tc.rank0) {
				t.Fatalf("rank 0: %v, want %v (figures %v)", errs[0], tc.rank0, figs)
			}
			if _, ok := figs[0]; ok && tc.rank0 != nil {
				t.Fatalf("rank 0 kept a figure: %v", figs[0])
			}
			if tc.problem != nil && (len(problems) == 0 || !errors.Is(problems[0], tc.problem)) {
				t.Fatalf("problems %v, want %v", problems, tc.problem)
			}
			if tc.name != "nothing" && tc.name != "missing gauge" {
				if figs[1] != (coordinator.EngineLoad{Running: 1, Waiting: 1, KVUsage: 0.5}) {
					t.Fatalf("rank 1 lost its figure: %v %v", figs, errs)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(vllmBody))
	f.Add([]byte(sglangBody))
	f.Fuzz(func(t *testing.T, body []byte) {
		figs, _, _, _ := parse(body, []uint32{0, 1, 4, 5}, 1000)
		for r, l := range figs {
			l.At = l.At.Add(1)
			if err := l.Validate(); err != nil {
				t.Fatalf("rank %d: a figure the coordinator refuses: %v", r, err)
			}
		}
	})
}
