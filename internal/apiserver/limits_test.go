package apiserver

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/indexer"
)

// TestLimitsMatchCatalog: the API refuses what the catalog would.
func TestLimitsMatchCatalog(t *testing.T) {
	if api.MaxDataParallelSize != catalog.MaxDataParallelSize {
		t.Errorf("MaxDataParallelSize %d, catalog.MaxDataParallelSize %d", api.MaxDataParallelSize, catalog.MaxDataParallelSize)
	}
}

// list renders n copies of elem as a JSON array.
func list(n int, elem string) string {
	return "[" + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]"
}

// object renders n keys "<prefix>0" … with value v as a JSON object.
func object(n int, prefix, v string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", fmt.Sprint(prefix, i), v)
	}
	b.WriteByte('}')
	return b.String()
}

// TestRegisterBounds: data_parallel_size, the dp ranks it spans, taints and
// topology domains are bounded while the body is read, before the catalog
// builds anything per rank.
func TestRegisterBounds(t *testing.T) {
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw})
	reg := func(fields string) string {
		return `{"instance_id":1,"endpoint":"tcp://h:5557","model_name":"m","block_size":16` + fields + `}`
	}
	for _, c := range []struct {
		fields string
		status int
		want   string
	}{
		{`,"data_parallel_size":4096`, 201, `{"status":"ok"}`},
		{`,"data_parallel_size":4097`, 400, `{"error":"data_parallel_size: 4097 is out of range [0, 4096]"}`},
		{`,"data_parallel_size":4194304`, 400, `{"error":"data_parallel_size: 4194304 is out of range [0, 4096]"}`},
		{`,"data_parallel_size":4294967295`, 400, `{"error":"data_parallel_size: 4294967295 is out of range [0, 4096]"}`},
		{`,"data_parallel_size":4294967296`, 400, `{"error":"data_parallel_size: 4294967296 is out of range [0, 4096]"}`},
		{`,"data_parallel_size":-2`, 400, `{"error":"data_parallel_size: -2 is out of range [0, 4096]"}`},
		{`,"dp_rank":4294967295`, 201, `{"status":"ok"}`},
		{`,"dp_rank":4294967295,"data_parallel_size":1`, 201, `{"status":"ok"}`},
		{`,"dp_rank":4294967295,"data_parallel_size":2`, 400, `{"error":"data_parallel_size: 2 ranks from dp_rank 4294967295 run past the last dp rank, 4294967295"}`},
		{`,"dp_rank":4294963200,"data_parallel_size":4096`, 201, `{"status":"ok"}`},
		{`,"dp_rank":4294963201,"data_parallel_size":4096`, 400, `{"error":"data_parallel_size: 4096 ranks from dp_rank 4294963201 run past the last dp rank, 4294967295"}`},
		{`,"taints":` + list(api.MaxTaints, `"t"`), 201, `{"status":"ok"}`},
		{`,"taints":` + list(api.MaxTaints+1, `"t"`), 413, `{"error":"taints: more than 256 strings"}`},
		{`,"topology_domains":` + object(api.MaxTaints, "d", `"v"`), 201, `{"status":"ok"}`},
		{`,"topology_domains":` + object(api.MaxTaints+1, "d", `"v"`), 413, `{"error":"topology_domains: more than 256 entries"}`},
	} {
		s.post("/register", reg(c.fields)).expect(t, c.status, c.want)
	}
}

// TestSelectionBounds: every list and number of the selection and plan
// bodies is bounded while the body is read; a refusal is a 400 (a value)
// or a 413 (a count) naming the field.
func TestSelectionBounds(t *testing.T) {
	s, _ := newSelServer(t, "")
	hashes := func(n int) string { return `"block_hashes":` + list(n, "7") }
	maxU64 := fmt.Sprint(uint64(math.MaxUint64))
	for _, c := range []struct {
		fields string // added to a valid body
		status int
		want   string
	}{
		{`"token_ids":` + list(api.DefaultMaxTokens, "1"), 0, ""},
		{`"token_ids":` + list(api.DefaultMaxTokens+1, "1"), 413, `token_ids: more than 1000000 tokens`},
		{hashes(api.DefaultMaxBlockHashes), 0, ""},
		{hashes(api.DefaultMaxBlockHashes + 1), 413, `block_hashes: more than 65536 hashes`},
		{hashes(4) + `,"isl_tokens":1000000`, 0, ""},
		{hashes(4) + `,"isl_tokens":1000001`, 400, `isl_tokens: 1000001 is out of range [0, 1000000]`},
		{hashes(4) + `,"isl_tokens":9223372036854775807`, 400, `isl_tokens: 9223372036854775807 is out of range [0, 1000000]`},
		{hashes(4) + `,"isl_tokens":-1`, 400, `isl_tokens: -1 is out of range [0, 1000000]`},
		{hashes(4) + `,"isl_tokens":99999999999999999999`, 400, `isl_tokens: 99999999999999999999 is out of range [0, 1000000]`},
		{hashes(4) + `,"isl_tokens":"64"`, 400, `isl_tokens: must be a non-negative integer, got a string`},
		{`"token_ids":[1],"allowed_worker_ids":` + list(api.MaxAllowedWorkerIDs, maxU64), 0, ""},
		{`"token_ids":[1],"allowed_worker_ids":` + list(api.MaxAllowedWorkerIDs+1, "1"), 413, `allowed_worker_ids: more than 4096 worker ids`},
		{`"token_ids":[1],"allowed_worker_ids":[1,-1]`, 400, `allowed_worker_ids[1]: -1 is out of range [0, 18446744073709551615]`},
		{`"token_ids":[1],"routing_constraints":{"required_taints":` + list(api.MaxTaints, `"t"`) + `}`, 0, ""},
		{`"token_ids":[1],"routing_constraints":{"required_taints":` + list(api.MaxTaints+1, `"t"`) + `}`, 413, `routing_constraints.required_taints: more than 256 strings`},
		{`"token_ids":[1],"routing_constraints":{"required_taints":["` + strings.Repeat("t", api.MaxTaintBytes+1) + `"]}`, 400, `routing_constraints.required_taints[0]: \"tttt`},
		{`"token_ids":[1],"routing_constraints":{"preferred_taints":` + object(api.MaxTaints, "t", "-1000") + `}`, 0, ""},
		{`"token_ids":[1],"routing_constraints":{"preferred_taints":` + object(api.MaxTaints+1, "t", "1") + `}`, 413, `routing_constraints.preferred_taints: more than 256 taints`},
		{`"token_ids":[1],"routing_constraints":{"preferred_taints":{"gpu":1000.5}}`, 400, `routing_constraints.preferred_taints.gpu: 1000.5 is out of range [-1000, 1000]`},
		{`"token_ids":[1],"routing_constraints":{"preferred_taints":{"gpu":1e999}}`, 400, `routing_constraints.preferred_taints.gpu: 1e999 is out of range`},
		{`"token_ids":[1],"routing_constraints":{"preferred_taints":{"` + strings.Repeat("t", api.MaxTaintBytes+1) + `":1}}`, 400, `routing_constraints.preferred_taints.tttt`},
		{`"token_ids":[1],"pinned_worker":{"worker_id":` + maxU64 + `,"dp_rank":4294967295}`, 0, ""},
		{`"token_ids":[1],"pinned_worker":{"worker_id":1,"dp_rank":4294967296}`, 400, `pinned_worker.dp_rank: 4294967296 is out of range [0, 4294967295]`},
		{`"token_ids":[1],"pinned_worker":{"worker_id":18446744073709551616}`, 400, `pinned_worker.worker_id: 18446744073709551616 is out of range [0, 18446744073709551615]`},
		{`"token_ids":[1],"router_temperature":1e999`, 400, `router_temperature: 1e999 is out of range`},
		{`"token_ids":[1],"router_temperature":-0.5`, 400, `router_temperature: must not be negative`},
	} {
		body := `{"model_name":"m","selection_id":"s",` + c.fields + `}`
		r := s.post("/select", body)
		if c.status == 0 {
			if r.status != 200 {
				t.Errorf("%.80s…: %d %.200s", c.fields, r.status, r.body)
			}
			continue
		}
		if r.status != c.status || !strings.HasPrefix(r.body, `{"error":"`+c.want) {
			t.Errorf("%.80s…: %d %.200s, want %d %s", c.fields, r.status, r.body, c.status, c.want)
		}
	}
	// The same decoding serves the other routes.
	for _, c := range []struct{ path, body, want string }{
		{"/select_and_reserve", `{"model_name":"m","selection_id":"s",` + hashes(api.DefaultMaxBlockHashes+1) + `}`, `{"error":"block_hashes: more than 65536 hashes"}`},
		{"/reservations", `{"model_name":"m","selection_id":"s","worker_id":7,` + hashes(4) + `,"isl_tokens":9223372036854775807}`, `{"error":"isl_tokens: 9223372036854775807 is out of range [0, 1000000]"}`},
		{"/reservations", `{"model_name":"m","selection_id":"s","worker_id":7,"dp_rank":4294967296,"token_ids":[1]}`, `{"error":"dp_rank: 4294967296 is out of range [0, 4294967295]"}`},
		{"/disagg/plans", `{"model_name":"m","request_id":"p",` + hashes(api.DefaultMaxBlockHashes+1) + `}`, `{"error":"block_hashes: more than 65536 hashes"}`},
		{"/disagg/plans", `{"model_name":"m","request_id":"p","token_ids":[1],"allowed_worker_ids":` + list(api.MaxAllowedWorkerIDs+1, "1") + `}`, `{"error":"allowed_worker_ids: more than 4096 worker ids"}`},
		{"/disagg/plans", `{"model_name":"m","request_id":"p","token_ids":[1],"pinned_prefill_worker":{"dp_rank":-1}}`, `{"error":"pinned_prefill_worker.dp_rank: -1 is out of range [0, 4294967295]"}`},
		{"/disagg/plans", `{"model_name":"m","request_id":"p","token_ids":[1],"policy":{"kind":"isl_bounding","eff_isl_threshold":1e999}}`, `{"error":"policy.eff_isl_threshold: 1e999 is out of range"}`},
		{"/disagg/plans", `{"model_name":"m","request_id":"p","token_ids":[1],"routing_constraints":{"preferred_taints":{"x":-2000}}}`, `{"error":"routing_constraints.preferred_taints.x: -2000 is out of range [-1000, 1000]"}`},
	} {
		r := s.post(c.path, c.body)
		status := 400
		if strings.Contains(c.want, "more than") {
			status = 413
		}
		r.expect(t, status, c.want)
	}
}

// TestSelectionHashesNotAllocated: 900,000 block hashes (the 1.8 MB body
// that cost 58 MB through encoding/json) are refused while they are read,
// for no more than the body and the bounded hash list.
func TestSelectionHashesNotAllocated(t *testing.T) {
	s := newServer(t, Config{Index: indexer.New(indexer.Options{}), Selector: newFakeSelector()})
	body := `{"model_name":"m",` + `"block_hashes":` + list(900_000, "7") + `}`
	for _, path := range []string{"/select", "/select_and_reserve", "/disagg/plans"} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := s.post(path, body)
		runtime.ReadMemStats(&after)
		if r.status != 413 || !strings.Contains(r.body, "block_hashes: more than 65536 hashes") {
			t.Errorf("%s: %d %.200s", path, r.status, r.body)
		}
		// Client and server: the body (1.8 MB) read by doubling, 64Ki
		// hashes, and the client's copy of the body.
		if a := after.TotalAlloc - before.TotalAlloc; a > 12<<20 {
			t.Errorf("%s: allocated %.1f MiB", path, float64(a)/(1<<20))
		} else {
			t.Logf("%s: allocated %.1f MiB for a %.1f MB body", path, float64(a)/(1<<20), float64(len(body))/1e6)
		}
	}
}
