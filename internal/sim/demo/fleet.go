package demo

import (
	"context"
	"net"
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
	cfg    Config
	timing mocker.Timing // the engines' (zero: no engine time)
}

func newFleet(ctx context.Context, cfg Config, store *etcdstore.Store) *fleet {
	return &fleet{Fleet: mocker.NewFleet(ctx, store, cfg.Log), cfg: cfg}
}

// scaled is mocker.H100Llama8B with every cost times scale.
func scaled(scale float64) mocker.Timing {
	t := mocker.H100Llama8B
	for _, d := range []*time.Duration{&t.StepOverhead, &t.PrefillPerToken, &t.DecodePerSeq, &t.TransferPerBlock} {
		*d = time.Duration(float64(*d) * scale)
	}
	return t
}

// start runs an engine for s, serving vLLM's OpenAI API on a loopback
// port, and returns once it is registered.
func (f *fleet) start(ctx context.Context, s engineSpec) (*mocker.Engine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	w := catalog.Worker{WorkerID: s.id, ModelName: model, RoutingGroup: s.group, Endpoint: "http://" + ln.Addr().String(), Attributes: catalog.Attributes{Role: s.role}}
	if s.domain != "" {
		w.TopologyDomains = map[string]string{"rack": s.domain}
		w.KVTransferDomain = "rack"
		w.KVTransferEnforcement = catalog.EnforcementRequired
	}
	return f.Start(ctx, mocker.Config{TotalBlocks: f.cfg.TotalBlocks, BlockSize: f.cfg.BlockSize, Timing: f.timing,
		Publisher: mocker.PublisherConfig{DropLive: f.cfg.DropLive}, Worker: w, LeaseTTL: f.cfg.leaseTTL()}, ln)
}

func (c Config) leaseTTL() time.Duration {
	if c.LeaseTTL > 0 {
		return c.LeaseTTL
	}
	return 5 * time.Second
}
