package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestDaemonDisaggPlan: decode and prefill workers registered over HTTP
// join the coordinator's pools; a decode-first plan books prefill inside
// the decode worker's kv-transfer domain; DELETE releases it (a second
// DELETE is a 404); unregistering a booked decode worker compensates its plan.
func TestDaemonDisaggPlan(t *testing.T) {
	t.Parallel()
	etcd := storetest.StartEtcd(t)
	d := startDaemon(t, etcd.Endpoints(), "tok")
	zone := map[uint64]string{1: "a", 2: "b", 3: "a", 4: "b"}
	for id := uint64(1); id <= 4; id++ {
		role := "decode"
		if id > 2 {
			role = "prefill"
		}
		reg := map[string]any{"instance_id": id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 1+id), "model_name": "m", "block_size": 16,
			"role": role, "engine_endpoint": fmt.Sprintf("http://w%d:8000", id), "total_kv_blocks": 1000, "max_num_batched_tokens": 4096,
			"topology_domains": map[string]string{"zone": zone[id]}, "kv_transfer_domain": "zone", "kv_transfer_enforcement": "required"}
		if code, body := call(t, "POST", d.url+"/register", "tok", reg); code != http.StatusCreated {
			t.Fatalf("register %d: %d %s", id, code, body)
		}
	}
	testsupport.Eventually(t, 20*time.Second, "4 workers in the catalog view", func() bool {
		_, body := call(t, "GET", d.url+"/workers?model_name=m", "", nil)
		var ws []api.WorkerInfo
		return json.Unmarshal(body, &ws) == nil && len(ws) == 4
	})
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	decodeOn := map[uint64]float64{} // decode bookings per worker
	plan := func(id string) api.PlanInfo {
		t.Helper()
		var p api.PlanInfo
		req := map[string]any{"request_id": id, "model_name": "m", "token_ids": tokens}
		if code, body := call(t, "POST", d.url+"/disagg/plans", "", req); code != http.StatusUnauthorized {
			t.Fatalf("plan without token: %d %s", code, body)
		}
		code, body := call(t, "POST", d.url+"/disagg/plans", "tok", req)
		if code != http.StatusCreated {
			t.Fatalf("plan %s: %d %s", id, code, body)
		}
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatal(err)
		}
		if p.Decode != nil {
			decodeOn[p.Decode.WorkerID]++
		}
		return p
	}
	for i := range 4 {
		p := plan(fmt.Sprintf("p%d", i))
		if p.State != "Linked" || p.Decode == nil || p.Prefill == nil || p.Decision == nil || p.Decision.Kind != "remote_prefill" {
			t.Fatalf("plan: %+v", p)
		}
		if p.Decode.WorkerID > 2 || p.Prefill.WorkerID < 3 || zone[p.Decode.WorkerID] != zone[p.Prefill.WorkerID] {
			t.Fatalf("decode %d (zone %s) with prefill %d (zone %s)", p.Decode.WorkerID, zone[p.Decode.WorkerID], p.Prefill.WorkerID, zone[p.Prefill.WorkerID])
		}
		if p.Decode.Endpoint != fmt.Sprintf("http://w%d:8000", p.Decode.WorkerID) || p.Decode.Tokens != 64 {
			t.Fatalf("decode booking %+v", p.Decode)
		}
		var trace []string
		for _, tr := range p.Transitions {
			trace = append(trace, tr.From+">"+tr.To)
		}
		if fmt.Sprint(trace) != "[Idle>DecodePreviewed DecodePreviewed>DecodeCommitted DecodeCommitted>Linked]" {
			t.Fatalf("transitions %v", p.Transitions)
		}
		if code, body := call(t, "DELETE", d.url+"/disagg/plans/"+p.ID, "tok", nil); code != 200 || !json.Valid(body) {
			t.Fatalf("delete: %d %s", code, body)
		}
		if code, body := call(t, "DELETE", d.url+"/disagg/plans/"+p.ID, "tok", nil); code != http.StatusNotFound {
			t.Fatalf("second delete: %d %s", code, body)
		}
	}

	// The same prompt given as local block hashes plans the same way.
	hashes := indexer.HashBlocks(nil, tokens, 16, indexer.BaseSeed)
	code, body := call(t, "POST", d.url+"/disagg/plans", "tok", map[string]any{"request_id": "by-hash", "model_name": "m", "block_hashes": hashes, "isl_tokens": len(tokens)})
	var hp api.PlanInfo
	if code != http.StatusCreated || json.Unmarshal(body, &hp) != nil || hp.State != "Linked" || hp.Decode == nil || hp.Decode.Tokens != len(tokens) {
		t.Fatalf("plan by hashes: %d %s", code, body)
	}
	decodeOn[hp.Decode.WorkerID]++
	if code, body := call(t, "DELETE", d.url+"/disagg/plans/by-hash", "tok", nil); code != 200 {
		t.Fatalf("delete: %d %s", code, body)
	}

	// A booked decode worker leaves: its plan is compensated.
	p := plan("lost")
	if code, body := call(t, "GET", d.url+"/disagg/plans/lost", "", nil); code != 200 || !json.Valid(body) {
		t.Fatalf("get: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/unregister", "tok", map[string]any{"instance_id": p.Decode.WorkerID, "model_name": "m"}); code != 200 {
		t.Fatalf("unregister: %d %s", code, body)
	}
	var got api.PlanInfo
	testsupport.Eventually(t, 20*time.Second, "the plan to be compensated", func() bool {
		code, body := call(t, "GET", d.url+"/disagg/plans/lost", "", nil)
		return code == 200 && json.Unmarshal(body, &got) == nil && got.State == "Compensated"
	})
	if got.Decode != nil || got.Prefill != nil {
		t.Fatalf("compensated plan still books: %+v", got)
	}
	if code, body := call(t, "DELETE", d.url+"/disagg/plans/lost", "tok", nil); code != http.StatusNotFound {
		t.Fatalf("delete compensated: %d %s", code, body)
	}
	// Six plans were linked; five were released and one compensated
	// when its decode worker left.
	_, metrics := call(t, "GET", d.url+"/metrics", "", nil)
	for _, want := range []string{
		`prefixd_plan_transitions_total{state="Linked"} 6`,
		`prefixd_plan_transitions_total{state="Released"} 5`,
		`prefixd_plan_compensations_total{reason="worker_removed"} 1`,
		`prefixd_plan_transitions_total{state="Compensated"} 1`,
		`prefixd_plans_live 0`,
		`prefixd_selection_overlap_tokens_count{kind="plan_decode"} 6`,
	} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Every plan booked a prefill worker (none left); the departed decode
	// worker's routed series are gone.
	routed := map[string]float64{}
	for _, line := range strings.Split(string(metrics), "\n") {
		if !strings.HasPrefix(line, "prefixd_routed_total{") {
			continue
		}
		var v float64
		fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
		kind := line[strings.Index(line, `kind="`)+6:]
		routed[kind[:strings.IndexByte(kind, '"')]] += v
		if strings.Contains(line, fmt.Sprintf(`worker="%d"`, p.Decode.WorkerID)) {
			t.Errorf("departed worker still has %s", line)
		}
	}
	if want := decodeOn[3-p.Decode.WorkerID]; routed["plan_prefill"] != 6 || routed["plan_decode"] != want {
		t.Errorf("routed %v: want 6 prefill bookings and %v decode bookings on the remaining decode worker", routed, want)
	}

	// Reservations: select, reserve explicitly, free twice.
	sel := map[string]any{"model_name": "m", "role": "prefill", "token_ids": tokens}
	code, body = call(t, "POST", d.url+"/select", "", sel)
	var s api.Selection
	if code != 200 || json.Unmarshal(body, &s) != nil || s.WorkerID < 3 || s.BlockSize != 16 {
		t.Fatalf("select: %d %s", code, body)
	}
	res := map[string]any{"selection_id": "r1", "model_name": "m", "role": "prefill", "worker_id": s.WorkerID, "dp_rank": 0, "token_ids": tokens}
	if code, body := call(t, "POST", d.url+"/reservations", "tok", res); code != http.StatusCreated {
		t.Fatalf("reserve: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/reservations", "tok", res); code != http.StatusConflict {
		t.Fatalf("duplicate reserve: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/reservations/r1/prefill_complete", "tok", nil); code != 200 {
		t.Fatalf("prefill_complete: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", d.url+"/reservations/r1", "tok", nil); code != 200 {
		t.Fatalf("free: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", d.url+"/reservations/r1", "tok", nil); code != http.StatusNotFound {
		t.Fatalf("second free: %d %s", code, body)
	}
	sel["selection_id"] = "r2"
	if code, body := call(t, "POST", d.url+"/select_and_reserve", "tok", sel); code != 200 {
		t.Fatalf("select_and_reserve: %d %s", code, body)
	}
	if code, body := call(t, "POST", d.url+"/select_and_reserve", "tok", sel); code != http.StatusConflict {
		t.Fatalf("duplicate select_and_reserve: %d %s", code, body)
	}
	// A model no worker serves is a 404 naming it and the known models (a
	// 503 logged as an error before).
	if code, body := call(t, "POST", d.url+"/select", "", map[string]any{"model_name": "other", "token_ids": tokens}); code != http.StatusNotFound ||
		!bytes.Contains(body, []byte(`model_name=other routing_group=default: no such model (known models: m)`)) {
		t.Fatalf("select of an unknown model: %d %s", code, body)
	}
}
