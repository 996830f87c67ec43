package catalog_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/catalog"
)

func valid() catalog.Worker {
	return catalog.Worker{
		WorkerID:       7,
		ModelName:      "meta-llama/Llama-3-8B",
		Endpoint:       "http://10.0.0.2:8000",
		EventsEndpoint: "tcp://10.0.0.2:5557",
		ReplayEndpoint: "tcp://10.0.0.2:5657",
		BlockSize:      16,
	}.WithDefaults()
}

func weight(f float64) *float64 { return &f }

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(w *catalog.Worker)
		field string // "" = valid
		msg   string // substring of the error
	}{
		{"valid", func(w *catalog.Worker) {}, "", ""},
		{"valid explicit per-rank endpoints", func(w *catalog.Worker) {
			w.DataParallelStartRank, w.DataParallelSize = 2, 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{2: "tcp://h:6000", 3: "tcp://h:6001"}
			w.ReplayEndpoints = map[uint32]string{2: "tcp://h:7000", 3: "tcp://h:7001"}
		}, "", ""},
		{"valid no events", func(w *catalog.Worker) { w.EventsEndpoint, w.ReplayEndpoint = "", "" }, "", ""},
		{"valid ipc single rank", func(w *catalog.Worker) { w.EventsEndpoint, w.ReplayEndpoint = "ipc:///tmp/kv", "ipc:///tmp/kv-replay" }, "", ""},
		{"valid preferred domain", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain, w.KVTransferEnforcement, w.KVTransferPreferredWeight = "rack", catalog.EnforcementPreferred, weight(0.5)
		}, "", ""},
		{"valid sources", func(w *catalog.Worker) {
			w.Sources = map[string]string{"block_size": "engine: GET /metrics vllm:cache_config_info", "model_name": "flag --model"}
		}, "", ""},
		{"too many sources", func(w *catalog.Worker) {
			w.Sources = map[string]string{}
			for i := range catalog.MaxSources + 1 {
				w.Sources[fmt.Sprint("f", i)] = "flag"
			}
		}, "sources", "more than 32"},
		{"empty source", func(w *catalog.Worker) { w.Sources = map[string]string{"block_size": ""} }, "sources", "not printable"},
		{"control char in source", func(w *catalog.Worker) { w.Sources = map[string]string{"block_size": "a\nb"} }, "sources", "not printable"},
		{"huge source", func(w *catalog.Worker) { w.Sources = map[string]string{"block_size": strings.Repeat("x", 257)} }, "sources", "longer than 256"},
		{"version missing", func(w *catalog.Worker) { w.Version = 0 }, "version", "missing"},
		{"version future", func(w *catalog.Worker) { w.Version = 2 }, "version", "unsupported record version 2"},
		{"empty model", func(w *catalog.Worker) { w.ModelName = "" }, "model_name", "must not be empty"},
		{"control char in model", func(w *catalog.Worker) { w.ModelName = "llama\n" }, "model_name", "control character"},
		{"empty group", func(w *catalog.Worker) { w.RoutingGroup = "" }, "routing_group", "must not be empty"},
		{"bad role", func(w *catalog.Worker) { w.Role = "router" }, "role", `"router" is not one of`},
		{"engine endpoint not http", func(w *catalog.Worker) { w.Endpoint = "ftp://h:1" }, "endpoint", "not an http(s) URL"},
		{"block size zero", func(w *catalog.Worker) { w.BlockSize = 0 }, "block_size", "must be positive"},
		{"dp size zero", func(w *catalog.Worker) { w.DataParallelSize = 0 }, "data_parallel_size", "must be positive"},
		{"dp size huge", func(w *catalog.Worker) { w.DataParallelSize = 100000 }, "data_parallel_size", "exceeds 4096"},
		{"dp range overflows", func(w *catalog.Worker) { w.DataParallelStartRank, w.DataParallelSize = 1<<32-1, 2 }, "data_parallel_start_rank", "overflows"},
		{"udp events endpoint", func(w *catalog.Worker) { w.EventsEndpoint = "udp://x" }, "events_endpoint", `"udp://x" is not a tcp/ipc/inproc endpoint`},
		{"events endpoint without port", func(w *catalog.Worker) { w.EventsEndpoint = "tcp://h" }, "events_endpoint", "no port"},
		{"wildcard events endpoint", func(w *catalog.Worker) { w.EventsEndpoint = "tcp://*:5557" }, "events_endpoint", "wildcard"},
		{"wildcard ipv6", func(w *catalog.Worker) { w.EventsEndpoint = "tcp://[::]:5557" }, "events_endpoint", "wildcard"},
		{"ipc cannot be offset", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "ipc:///tmp/kv", ""
		}, "events_endpoint", "cannot be offset by dp rank 1"},
		{"port offset overflows", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "tcp://h:65535", ""
		}, "events_endpoint", "exceeds 65535"},
		{"replay base collides with rank 1", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "tcp://10.0.0.2:5557", "tcp://10.0.0.2:5558"
		}, "replay_endpoint", `dp rank 0 replay endpoint "tcp://10.0.0.2:5558" collides with dp rank 1 events endpoint`},
		{"replay equals events", func(w *catalog.Worker) { w.ReplayEndpoint = "tcp://10.0.0.2:5557" }, "replay_endpoint", "collides"},
		{"replay without events", func(w *catalog.Worker) { w.EventsEndpoint = "" }, "replay_endpoint", "without events_endpoint"},
		{"both endpoint forms", func(w *catalog.Worker) { w.EventsEndpoints = map[uint32]string{0: "tcp://h:1"} }, "events_endpoints", "set together with events_endpoint"},
		{"valid sparse per-rank endpoints", func(w *catalog.Worker) {
			w.DataParallelStartRank, w.DataParallelSize = 1, 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{1: "tcp://h:6001", 3: "tcp://h:6003"}
			w.ReplayEndpoints = map[uint32]string{3: "tcp://h:7003"} // rank 1 has no replay
		}, "", ""},
		{"per-rank size disagrees", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{0: "tcp://h:1"}
		}, "data_parallel_size", "2, but events_endpoints lists 1 ranks"},
		{"per-rank start disagrees", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{3: "tcp://h:1", 5: "tcp://h:2"}
		}, "data_parallel_start_rank", "0, but the lowest rank in events_endpoints is 3"},
		{"per-rank replay for an unknown rank", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{0: "tcp://h:1", 1: "tcp://h:2"}
			w.ReplayEndpoints = map[uint32]string{5: "tcp://h:3"}
		}, "replay_endpoints", "dp rank 5 is not one of the worker's ranks [0 1]"},
		{"per-rank duplicate", func(w *catalog.Worker) {
			w.DataParallelSize = 2
			w.EventsEndpoint, w.ReplayEndpoint = "", ""
			w.EventsEndpoints = map[uint32]string{0: "tcp://h:1", 1: "tcp://H:1"}
		}, "events_endpoints", "collides"},
		{"domain without value", func(w *catalog.Worker) {
			w.KVTransferDomain, w.KVTransferEnforcement = "rack", catalog.EnforcementRequired
		}, "kv_transfer_domain", `"rack" has no value in topology_domains`},
		{"domain without enforcement", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain = "rack"
		}, "kv_transfer_enforcement", "required when kv_transfer_domain is set"},
		{"bad enforcement", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain, w.KVTransferEnforcement = "rack", "maybe"
		}, "kv_transfer_enforcement", `"maybe" is not one of`},
		{"preferred without weight", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain, w.KVTransferEnforcement = "rack", catalog.EnforcementPreferred
		}, "kv_transfer_preferred_weight", "required when kv_transfer_enforcement is preferred"},
		{"weight out of range", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain, w.KVTransferEnforcement, w.KVTransferPreferredWeight = "rack", catalog.EnforcementPreferred, weight(1.5)
		}, "kv_transfer_preferred_weight", "outside [0, 1]"},
		{"weight with required", func(w *catalog.Worker) {
			w.TopologyDomains = map[string]string{"rack": "r1"}
			w.KVTransferDomain, w.KVTransferEnforcement, w.KVTransferPreferredWeight = "rack", catalog.EnforcementRequired, weight(0.5)
		}, "kv_transfer_preferred_weight", "only allowed with"},
		{"topology key with =", func(w *catalog.Worker) { w.TopologyDomains = map[string]string{"a=b": "c"} }, "topology_domains", `domain "a=b"`},
		{"duplicate taint", func(w *catalog.Worker) { w.Taints = []string{"a", "a"} }, "taints", "listed twice"},
		{"taint with space", func(w *catalog.Worker) { w.Taints = []string{"a b"} }, "taints", "whitespace"},
		{"bad lifecycle", func(w *catalog.Worker) { w.Lifecycle = "gone" }, "lifecycle", `"gone" is not one of active, draining`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := valid()
			tc.edit(&w)
			err := w.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *catalog.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			if ve.Fields[0].Field != tc.field || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Fatalf("Validate = %q (field %s), want field %s with %q", err, ve.Fields[0].Field, tc.field, tc.msg)
			}
		})
	}
}

func TestValidateListsEveryField(t *testing.T) {
	t.Parallel()
	err := catalog.Worker{Version: 1, Lifecycle: "y", Attributes: catalog.Attributes{Role: "x"}}.Validate()
	want := []string{"model_name", "routing_group", "role", "block_size", "data_parallel_size", "lifecycle"}
	var ve *catalog.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) != len(want) {
		t.Fatalf("Validate = %v, want %d fields", err, len(want))
	}
	for i, f := range ve.Fields {
		if f.Field != want[i] {
			t.Errorf("field %d = %s, want %s", i, f.Field, want[i])
		}
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	w := catalog.Worker{WorkerID: 1, ModelName: "m", BlockSize: 16, Attributes: catalog.Attributes{Taints: []string{"b", "a"}}}.WithDefaults()
	if w.Version != 1 || w.RoutingGroup != "default" || w.Role != catalog.RoleAggregated || w.DataParallelSize != 1 || w.Lifecycle != catalog.LifecycleActive {
		t.Fatalf("WithDefaults = %+v", w)
	}
	if w.Taints[0] != "a" || w.Taints[1] != "b" {
		t.Fatalf("taints %v not sorted", w.Taints)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStreams(t *testing.T) {
	t.Parallel()
	w := valid()
	w.DataParallelStartRank, w.DataParallelSize = 2, 3
	w.EventsEndpoint, w.ReplayEndpoint = "tcp://10.0.0.2:5557", "tcp://10.0.0.2:5657"
	ss, err := w.Streams()
	if err != nil {
		t.Fatal(err)
	}
	want := []catalog.Stream{
		{Rank: 2, Endpoint: "tcp://10.0.0.2:5559", ReplayEndpoint: "tcp://10.0.0.2:5659"},
		{Rank: 3, Endpoint: "tcp://10.0.0.2:5560", ReplayEndpoint: "tcp://10.0.0.2:5660"},
		{Rank: 4, Endpoint: "tcp://10.0.0.2:5561", ReplayEndpoint: "tcp://10.0.0.2:5661"},
	}
	if len(ss) != len(want) {
		t.Fatalf("Streams = %+v", ss)
	}
	for i := range want {
		if ss[i] != want[i] {
			t.Errorf("stream %d = %+v, want %+v", i, ss[i], want[i])
		}
	}
	if _, err := w.EventsEndpointFor(5); err == nil {
		t.Error("EventsEndpointFor a rank outside the worker's ranks succeeded")
	}

	w.EventsEndpoint, w.ReplayEndpoint = "inproc://kv", ""
	if ep, _ := w.EventsEndpointFor(3); ep != "inproc://kv_dp3" {
		t.Errorf("inproc rank 3 = %q", ep)
	}
	if ep, _ := w.ReplayEndpointFor(3); ep != "" {
		t.Errorf("replay without replay endpoints = %q, want empty", ep)
	}

	w.EventsEndpoint = ""
	w.EventsEndpoints = map[uint32]string{2: "tcp://a:1", 3: "tcp://b:1", 4: "tcp://c:1"}
	if ep, _ := w.EventsEndpointFor(3); ep != "tcp://b:1" {
		t.Errorf("explicit rank 3 = %q", ep)
	}

	w.EventsEndpoints = nil
	if ss, err := w.Streams(); err != nil || ss != nil {
		t.Errorf("Streams without events = %v, %v; want nil", ss, err)
	}
}

func TestJSONStableAndRoundTrips(t *testing.T) {
	t.Parallel()
	w := valid()
	w.DataParallelSize = 2
	w.EventsEndpoint, w.ReplayEndpoint = "", ""
	w.EventsEndpoints = map[uint32]string{1: "tcp://h:2", 0: "tcp://h:1"}
	w.TopologyDomains = map[string]string{"zone": "z", "rack": "r"}
	w.KVTransferDomain, w.KVTransferEnforcement, w.KVTransferPreferredWeight = "rack", catalog.EnforcementPreferred, weight(0)
	w.Taints = []string{"a", "gpu=h100"}
	w.TotalKVBlocks, w.MaxNumBatchedTokens, w.SeqBase = 1000, 8192, 1
	b1, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	// The attributes (role … taints) come together, after the identity.
	const want = `{"version":1,"worker_id":7,"model_name":"meta-llama/Llama-3-8B","routing_group":"default","role":"aggregated",` +
		`"total_kv_blocks":1000,"max_num_batched_tokens":8192,` +
		`"topology_domains":{"rack":"r","zone":"z"},"kv_transfer_domain":"rack","kv_transfer_enforcement":"preferred",` +
		`"kv_transfer_preferred_weight":0,"taints":["a","gpu=h100"],` +
		`"endpoint":"http://10.0.0.2:8000","events_endpoints":{"0":"tcp://h:1","1":"tcp://h:2"},"block_size":16,` +
		`"data_parallel_start_rank":0,"data_parallel_size":2,"lifecycle":"active","seq_base":1}`
	if string(b1) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", b1, want)
	}
	for range 20 { // map order must not leak into the encoding
		b2, _ := json.Marshal(w)
		if string(b2) != string(b1) {
			t.Fatal("encoding is not stable")
		}
	}
	got, err := catalog.DecodeWorker(b1)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(w) {
		t.Fatalf("round trip: %+v, want %+v", got, w)
	}
}

func TestDecodeWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json, err string
	}{
		{"defaults applied", `{"version":1,"worker_id":3,"model_name":"m","block_size":16}`, ""},
		{"unknown fields ignored", `{"version":1,"worker_id":3,"model_name":"m","block_size":16,"future":true}`, ""},
		{"with sources", `{"version":1,"worker_id":3,"model_name":"m","block_size":16,"sources":{"block_size":"engine: GET /metrics"}}`, ""},
		{"no version", `{"worker_id":3,"model_name":"m","block_size":16}`, "version: missing"},
		{"not json", `{"version":1,`, "decode worker record"},
		{"bad rank key", `{"version":1,"worker_id":3,"model_name":"m","block_size":16,"events_endpoints":{"x":"tcp://h:1"}}`, "decode worker record"},
		{"invalid", `{"version":1,"worker_id":3,"model_name":"m"}`, "block_size: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := catalog.DecodeWorker([]byte(tc.json))
			if tc.err == "" {
				if err != nil || w.RoutingGroup != "default" || w.DataParallelSize != 1 {
					t.Fatalf("DecodeWorker = %+v, %v", w, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("DecodeWorker error %v, want %q", err, tc.err)
			}
		})
	}
}

func TestKeyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		prefix string
		key    catalog.Key
		path   string
	}{
		{"", catalog.Key{Model: "meta-llama/Llama-3-8B", Group: "default", WorkerID: 7}, "/prefixd/v1/workers/meta-llama%2FLlama-3-8B/default/7"},
		{"/prefixd/v1/", catalog.Key{Model: "m", Group: "team a/b", WorkerID: 0}, "/prefixd/v1/workers/m/team%20a%2Fb/0"},
		{"/x", catalog.Key{Model: "Qwen/Qwen2.5-7B-Instruct:lora%1", Group: "g?#", WorkerID: 1<<64 - 1}, "/x/workers/Qwen%2FQwen2.5-7B-Instruct:lora%251/g%3F%23/18446744073709551615"},
		{"", catalog.Key{Model: "..", Group: "ünï", WorkerID: 42}, "/prefixd/v1/workers/../%C3%BCn%C3%AF/42"},
	} {
		got := tc.key.Path(tc.prefix)
		if got != tc.path {
			t.Errorf("%+v.Path(%q) = %q, want %q", tc.key, tc.prefix, got, tc.path)
		}
		back, err := catalog.ParseKey(tc.prefix, got)
		if err != nil || back != tc.key {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v", got, back, err, tc.key)
		}
	}
	for _, bad := range []string{
		"/prefixd/v1/workers/m/g",                      // no id
		"/prefixd/v1/workers/m/g/7/extra",              // too deep
		"/prefixd/v1/workers/m/g/07",                   // leading zero
		"/prefixd/v1/workers/m/g/-1",                   // not an id
		"/prefixd/v1/workers/%6D/g/7",                  // non-canonical escape of "m"
		"/prefixd/v1/workers/m/%zz/7",                  // bad escape
		"/prefixd/v1/workers//g/7",                     // empty model
		"/other/workers/m/g/7",                         // wrong prefix
		"/prefixd/v1/workersx/m/g/7",                   // not the workers directory
		"/prefixd/v1/workers/m/g/99999999999999999999", // overflows uint64
	} {
		if k, err := catalog.ParseKey("", bad); err == nil {
			t.Errorf("ParseKey(%q) = %+v, want an error", bad, k)
		}
	}
}
