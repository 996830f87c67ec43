package daemon

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// TestSelectorExpireAndRoleChange: expire releases stale plans (kept for
// Get), and a worker that becomes an encoder leaves the pools.
func TestSelectorExpireAndRoleChange(t *testing.T) {
	t.Parallel()
	s := newTestSelector(indexer.New(indexer.Options{}))
	w := func(id uint64, role catalog.Role) catalog.Worker {
		return catalog.Worker{WorkerID: id, ModelName: "m", RoutingGroup: "default", BlockSize: 16, DataParallelSize: 1,
			Endpoint:   fmt.Sprintf("http://w%d:8000", id),
			Attributes: catalog.Attributes{Role: role},
		}.WithDefaults()
	}
	s.setWorker(w(1, catalog.RoleDecode))
	s.setWorker(w(2, catalog.RolePrefill))
	req := func(id string) coordinator.Request {
		return coordinator.Request{ID: id, Model: "m", DecodeGroup: "default", PrefillGroup: "default", Tokens: make([]uint32, 32)}
	}
	p, err := s.svc.Plan(req("p"))
	if err != nil || p.State != coordinator.Linked {
		t.Fatalf("plan %+v %v", p, err)
	}
	s.expire(time.Now().Add(coordinator.DefaultPlanTTL + time.Second))
	if got, ok := s.svc.Get("p"); !ok || got.State != coordinator.Expired {
		t.Fatalf("after expiry: %+v %v", got, ok)
	}
	if _, err := s.svc.Release("p"); !errors.Is(err, coordinator.ErrPlanNotFound) {
		t.Fatalf("release expired: %v", err)
	}
	s.setWorker(w(2, catalog.RoleEncoder))
	if _, err := s.svc.Plan(req("q")); !errors.Is(err, coordinator.ErrNoWorkers) {
		t.Fatalf("plan without prefill workers: %v", err)
	}
	dec := coordinator.SelectRequest{Pool: coordinator.PoolKey{Model: "m", Group: "default", Role: coordinator.RoleDecode}, Tokens: []uint32{1}}
	if _, err := s.svc.Select(dec); err != nil {
		t.Fatalf("select decode: %v", err)
	}
	s.removeWorker(catalog.Key{Model: "m", Group: "default", WorkerID: 1})
	if _, err := s.svc.Select(dec); !errors.Is(err, coordinator.ErrNoWorkers) {
		t.Fatalf("select after removal: %v", err)
	}
}
