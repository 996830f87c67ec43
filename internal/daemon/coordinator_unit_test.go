package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/api"
)

// TestSelectorExpireAndRoleChange: expire releases stale plans (kept for
// GetPlan), and a worker that becomes an encoder leaves the pools.
func TestSelectorExpireAndRoleChange(t *testing.T) {
	s := newSelector(indexer.New(indexer.Options{}), coordinator.DefaultPoolConfig(), coordinator.CoordinatorConfig{}, slog.New(slog.DiscardHandler), nil)
	w := func(id uint64, role catalog.Role) catalog.Worker {
		return catalog.Worker{WorkerID: id, ModelName: "m", RoutingGroup: "default", Role: role, BlockSize: 16, DataParallelSize: 1,
			Endpoint: fmt.Sprintf("http://w%d:8000", id)}.WithDefaults()
	}
	s.setWorker(w(1, catalog.RoleDecode))
	s.setWorker(w(2, catalog.RolePrefill))
	ctx := context.Background()
	p, err := s.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 32)}, ID: "p", ModelName: "m", RoutingGroup: "default"})
	if err != nil || p.State != "Linked" {
		t.Fatalf("plan %+v %v", p, err)
	}
	s.expire(time.Now().Add(coordinator.DefaultPlanTTL + time.Second))
	if got, err := s.GetPlan(ctx, "p"); err != nil || got.State != "Expired" {
		t.Fatalf("after expiry: %+v %v", got, err)
	}
	if _, err := s.ReleasePlan(ctx, "p"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("release expired: %v", err)
	}
	s.setWorker(w(2, catalog.RoleEncoder))
	if _, err := s.CreatePlan(ctx, api.PlanRequest{Prompt: api.Prompt{TokenIDs: make([]uint32, 32)}, ID: "q", ModelName: "m", RoutingGroup: "default"}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("plan without prefill workers: %v", err)
	}
	if _, err := s.Select(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: []uint32{1}}, ModelName: "m", RoutingGroup: "default", Role: api.RoleDecode}); err != nil {
		t.Fatalf("select decode: %v", err)
	}
	s.removeWorker(catalog.Key{Model: "m", Group: "default", WorkerID: 1})
	if _, err := s.Select(ctx, api.SelectRequest{Prompt: api.Prompt{TokenIDs: []uint32{1}}, ModelName: "m", RoutingGroup: "default", Role: api.RoleDecode}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("select after removal: %v", err)
	}
}
