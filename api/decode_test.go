package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

func TestHashListAcceptsSignedAndUnsigned(t *testing.T) {
	var h HashList
	if err := json.Unmarshal([]byte(`[-2, 18446744073709551614, 7]`), &h); err != nil {
		t.Fatal(err)
	}
	if len(h) != 3 || h[0] != h[1] || h[0] != 1<<64-2 || h[2] != 7 {
		t.Fatalf("decoded %v", h)
	}
	for _, bad := range []string{`[18446744073709551616]`, `[1.5]`, `"x"`} {
		if err := json.Unmarshal([]byte(bad), &h); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestListsDecode: the wire's lists decode with encoding/json alone, as a
// router's own code would, and refuse what the server refuses, naming the
// element; a list over its bound is refused before it is allocated, as
// an error marked Over (the server's 413).
func TestListsDecode(t *testing.T) {
	var req SelectRequest
	body := `{"model_name":"m","token_ids":[1,2,3],"allowed_worker_ids":[7,18446744073709551615],` +
		`"routing_constraints":{"required_taints":["gpu"],"preferred_taints":{"zone-a":0.5}}}`
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if len(req.TokenIDs) != 3 || len(req.AllowedWorkerIDs) != 2 || req.AllowedWorkerIDs[1] != 1<<64-1 ||
		req.RoutingConstraints.RequiredTaints[0] != "gpu" || req.RoutingConstraints.PreferredTaints["zone-a"] != 0.5 {
		t.Fatalf("decoded %+v", req)
	}
	for _, c := range []struct {
		body, want string
		over       bool
	}{
		{`{"token_ids":[1,-1]}`, "token_ids[1]: -1 is out of range [0, 4294967295]", false},
		{`{"token_ids":` + list(DefaultMaxTokens+1) + `}`, "token_ids: more than 1000000 tokens", true},
		{`{"allowed_worker_ids":[1,"2"]}`, "allowed_worker_ids[1]: must be a non-negative integer, got a string", false},
		{`{"allowed_worker_ids":` + list(MaxAllowedWorkerIDs+1) + `}`, "allowed_worker_ids: more than 4096 worker ids", true},
		{`{"routing_constraints":{"preferred_taints":{"a":2000}}}`, "routing_constraints.preferred_taints.a: 2000 is out of range [-1000, 1000]", false},
		{`{"routing_constraints":{"required_taints":["` + strings.Repeat("x", MaxTaintBytes+1) + `"]}}`, "routing_constraints.required_taints[0]: ", false},
	} {
		var req SelectRequest
		err := json.Unmarshal([]byte(c.body), &req)
		var le *jsonlex.Error
		if !errors.As(err, &le) || !strings.HasPrefix(err.Error(), c.want) || le.Over != c.over {
			t.Errorf("%.60s: %v (over %v), want %q (over %v)", c.body, err, le != nil && le.Over, c.want, c.over)
		}
	}
}

// list is a JSON array of n ones.
func list(n int) string { return "[" + strings.Repeat("1,", n-1) + "1]" }
