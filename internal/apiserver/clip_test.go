package apiserver

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestErrorsClipClientValues sends multi-megabyte values to every route
// whose errors quote what the client sent: each answer is short and names
// the value's length instead of repeating it.
func TestErrorsClipClientValues(t *testing.T) {
	const n = 3 << 20
	huge := strings.Repeat("x", n)
	digits := strings.Repeat("9", n)
	fw := &fakeWorkers{}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw, Selector: newFakeSelector()})
	reg := func(fields string) string {
		return `{"instance_id":1,"endpoint":"tcp://h:5557","model_name":"m","block_size":16` + fields + `}`
	}
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		field                    string
		size                     int // of the value cut; 0: n
	}{
		{"query model", "POST", "/query", `{"token_ids":[1],"model_name":"` + huge + `"}`, 404, "no indexer for model=xxx", 0},
		{"query group", "POST", "/query", `{"token_ids":[1],"model_name":"m","routing_group":"` + huge + `"}`, 404, "no indexer for model=m routing_group=xxx", 0},
		{"query_by_hash model", "POST", "/query_by_hash", `{"block_hashes":[1],"model_name":"` + huge + `"}`, 404, "no indexer for model=xxx", 0},
		{"token digits", "POST", "/query", `{"token_ids":[` + digits + `],"model_name":"m"}`, 400, "token_ids[0]: 999", 0},
		{"hash digits", "POST", "/query_by_hash", `{"block_hashes":[` + digits + `],"model_name":"m"}`, 400, "block_hashes[0]: 999", 0},
		{"unknown key", "POST", "/query", `{"token_ids":[1],"model_name":"m","` + huge + `":[1,}`, 400, "xxx", 0},
		{"key without colon", "POST", "/query", `{"` + huge + `" 1}`, 400, "body: invalid JSON", 0},
		{"register endpoint", "POST", "/register", `{"instance_id":1,"endpoint":"tcp://` + huge + `","model_name":"m","block_size":16}`, 400, "endpoint: \"tcp://xxx", n + 6},
		{"register replay endpoint", "POST", "/register", reg(`,"replay_endpoint":"` + huge + `"`), 400, "replay_endpoint: \"xxx", 0},
		{"register topology key", "POST", "/register", reg(`,"topology_domains":{"` + huge + `":1}`), 400, "topology_domains.xxx", 0},
		{"register weight digits", "POST", "/register", reg(`,"kv_transfer_preferred_weight":1` + digits + `e999`), 400, "kv_transfer_preferred_weight: 1999", n + 5},
		{"path", "GET", "/" + huge[:512<<10], "", 404, "path: no endpoint /xxx", 512<<10 + 1},
		{"method path", "PUT", "/reservations/" + huge[:512<<10], "", 405, "method: PUT not allowed on /reservations/xxx", 512<<10 + 14},
		{"select role", "POST", "/select", `{"model_name":"m","token_ids":[1],"role":"` + huge + `"}`, 400, "role: \"xxx", 0},
		{"selection id", "POST", "/select", `{"model_name":"m","token_ids":[1],"selection_id":"a/` + huge + `"}`, 400, "selection_id: \"a/xxx", n + 2},
		{"plan prefill_failure", "POST", "/disagg/plans", `{"request_id":"p","model_name":"m","token_ids":[1],"prefill_failure":"` + huge + `"}`, 400, "prefill_failure: \"xxx", 0},
		{"plan policy kind", "POST", "/disagg/plans", `{"request_id":"p","model_name":"m","token_ids":[1],"policy":{"kind":"` + huge + `"}}`, 400, "policy.kind: \"xxx", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkClipped(t, s.do(c.method, c.path, c.body), c.status, c.field, cmp.Or(c.size, n))
		})
	}
	// An implementation's error that quotes a huge value is cut too, and
	// so is the log line of a 5xx.
	fw.registerErr = Invalid("model_name", "%q is not a model this catalog serves", huge)
	checkClipped(t, s.post("/register", reg("")), 400, "model_name: \"xxx", len(fw.registerErr.Error()))
	var logs bytes.Buffer
	s = newServer(t, Config{Index: newIndex(t), Workers: fw, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	fw.registerErr = fmt.Errorf("etcd: put %s: boom", huge)
	checkClipped(t, s.post("/register", reg("")), 500, "etcd: put xxx", len(fw.registerErr.Error()))
	if logs.Len() > 2*maxErrorBytes || !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "bytes)") {
		t.Errorf("%d bytes logged: %.300s", logs.Len(), logs.String())
	}
}

// checkClipped checks that r is a short JSON error with the status that
// starts with prefix and states the size of the value it cut (n bytes).
func checkClipped(t *testing.T, r response, status int, prefix string, n int) {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != status {
		t.Fatalf("got %d %.200s, want %d", r.status, r.body, status)
	}
	if len(r.body) > maxErrorBytes+64 || !strings.HasPrefix(e.Error, prefix) || !strings.Contains(e.Error, fmt.Sprintf("(%d bytes)", n)) {
		t.Errorf("%d-byte answer %.300q: want a short error starting %q and stating (%d bytes)", len(r.body), e.Error, prefix, n)
	}
}
