package apiserver

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
)

// TestWorkersLoad: a rank's load is listed with every term, the engine's
// figure with its age; a rank without a figure has none, and a rank in
// no pool no load.
func TestWorkersLoad(t *testing.T) {
	at := time.Now().Add(-2 * time.Second)
	fw := &fakeWorkers{list: []WorkerState{{
		Record: catalog.Worker{WorkerID: 1, ModelName: "m", RoutingGroup: "default", BlockSize: 16, EventsEndpoint: "tcp://10.0.0.1:5557", DataParallelSize: 3},
		Loads: map[uint32]coordinator.RankLoad{
			0: {Engine: coordinator.EngineLoad{At: at, Running: 3, Waiting: 1, KVUsage: 0.5}, HasEngine: true,
				Booked: coordinator.Load{Blocks: 20, PrefillTokens: 512, Requests: 4}, Since: coordinator.Load{Blocks: 2, Requests: 1},
				Effective: coordinator.Load{Blocks: 502, PrefillTokens: 512, Requests: 5}},
			1: {Booked: coordinator.Load{Blocks: 7, Requests: 1}, Effective: coordinator.Load{Blocks: 7, Requests: 1}},
		},
	}}}
	s := newServer(t, Config{Index: newIndex(t), Workers: fw})
	var got []api.WorkerInfo
	if err := json.Unmarshal([]byte(s.get("/workers").body), &got); err != nil || len(got) != 1 {
		t.Fatalf("decode: %v %+v", err, got)
	}
	l0, l1, l2 := got[0].Listeners[0].Load, got[0].Listeners[1].Load, got[0].Listeners[2].Load
	if l0 == nil || l0.Engine == nil || l0.Engine.Running != 3 || l0.Engine.Waiting != 1 || l0.Engine.KVUsage != 0.5 ||
		l0.Engine.AgeSeconds < 2 || l0.Engine.AgeSeconds > 60 ||
		l0.Booked != (api.LoadTerms{Blocks: 20, PrefillTokens: 512, Requests: 4}) || l0.Since != (api.LoadTerms{Blocks: 2, Requests: 1}) ||
		l0.Effective != (api.LoadTerms{Blocks: 502, PrefillTokens: 512, Requests: 5}) {
		t.Errorf("rank 0 load %+v (engine %+v)", l0, l0.Engine)
	}
	if l1 == nil || l1.Engine != nil || l1.Effective != l1.Booked {
		t.Errorf("rank 1, bookings alone: %+v", l1)
	}
	if l2 != nil {
		t.Errorf("rank 2, in no pool: %+v", l2)
	}
}
