package daemon

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestDaemonSessionAffinity: with --session-ttl, the requests of one
// session (session_id) go back to its worker, where two idle engines
// would otherwise be a tie broken at random; the metrics count one new
// session and the sticky bookings.
func TestDaemonSessionAffinity(t *testing.T) {
	f := startQueueFixture(t, 8, func(c *Config) { c.SessionTTL = time.Minute })
	f.logs.Wait(t, 20*time.Second, "session affinity on: a request naming a session goes back to its worker while that worker is not busy",
		"ttl=1m0s", "max_sessions=65536")
	var first uint64
	const n = 12
	for i := range n {
		id := f.id("sess")
		code, body := call(t, "POST", f.url+"/select_and_reserve", "", map[string]any{"selection_id": id, "model_name": "m",
			"token_ids": f.prompt(16), "session_id": "conversation-1"})
		if code != 200 {
			t.Fatalf("select_and_reserve %d: %d %s", i, code, body)
		}
		var sel api.Selection
		if err := json.Unmarshal(body, &sel); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = sel.WorkerID
		} else if sel.WorkerID != first {
			t.Fatalf("request %d of the session on worker %d, want %d (its session's)", i, sel.WorkerID, first)
		}
		f.free(id)
	}
	if got := testsupport.MetricSum(t, f.reg, "prefixd_session_bookings_total", "outcome", "sticky"); got != n-1 {
		t.Errorf("sticky bookings %v, want %d", got, n-1)
	}
	if got := testsupport.MetricSum(t, f.reg, "prefixd_session_bookings_total", "outcome", "new"); got != 1 {
		t.Errorf("new sessions %v, want 1", got)
	}
	if got := testsupport.MetricSum(t, f.reg, "prefixd_sessions"); got != 1 {
		t.Errorf("sessions %v, want 1", got)
	}
}
