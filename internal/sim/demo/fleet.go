package demo

import (
	"context"
	"strconv"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// engineSpec describes one mock engine of a pool.
type engineSpec struct {
	id     uint64
	group  string
	role   catalog.Role
	domain string // KV-transfer domain value (rack), "" for none
}

// fleet is the demo's mock engines: a mocker.Fleet, and how the demo
// configures an engine of a pool.
type fleet struct {
	*mocker.Fleet
	cfg Config
}

func newFleet(ctx context.Context, cfg Config, store *etcdstore.Store) *fleet {
	return &fleet{Fleet: mocker.NewFleet(ctx, store, cfg.Log), cfg: cfg}
}

// start runs an engine for s and returns once it is registered.
func (f *fleet) start(ctx context.Context, s engineSpec) (*mocker.Engine, error) {
	w := catalog.Worker{WorkerID: s.id, ModelName: model, RoutingGroup: s.group, Endpoint: "http://127.0.0.1:" + strconv.FormatUint(18000+s.id, 10), Attributes: catalog.Attributes{Role: s.role}}
	if s.domain != "" {
		w.TopologyDomains = map[string]string{"rack": s.domain}
		w.KVTransferDomain = "rack"
		w.KVTransferEnforcement = catalog.EnforcementRequired
	}
	return f.Start(ctx, mocker.Config{TotalBlocks: f.cfg.TotalBlocks, BlockSize: f.cfg.BlockSize,
		Publisher: mocker.PublisherConfig{DropLive: f.cfg.DropLive}, Worker: w, LeaseTTL: f.cfg.leaseTTL()}, nil)
}

func (c Config) leaseTTL() time.Duration {
	if c.LeaseTTL > 0 {
		return c.LeaseTTL
	}
	return 5 * time.Second
}
