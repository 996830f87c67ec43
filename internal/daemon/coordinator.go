package daemon

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
)

// ExpireInterval is how often the coordinator service expires stale
// reservations and plans.
const ExpireInterval = 10 * time.Second

// indexSource is coordinator.OverlapSource and HashOverlapSource over the
// index. A partition the index does not have yet (no events) has no
// overlaps and block size 0: the service then uses the catalog's.
type indexSource struct{ ix *indexer.Index }

func (s indexSource) Overlaps(model, group string, tokens []uint32, lora, salt string) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.ix.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	ov, err := s.ix.MatchTokens(k, tokens, indexer.Seed(lora, salt), nil)
	return ov, bs, err
}

func (s indexSource) OverlapsByHash(model, group string, hashes []uint64) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.ix.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, 0, nil
	}
	if err != nil || bs == 0 {
		return nil, bs, err
	}
	ov, err := s.ix.Match(k, hashes, nil)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, bs, nil
	}
	return ov, bs, err
}

// catalogEngine maps a catalog record onto the coordinator's engine. The
// catalog's roles are the coordinator's names ("" is aggregated) but for
// encoder, whose workers join no pool (false).
func catalogEngine(w catalog.Worker) (coordinator.Engine, bool) {
	var role coordinator.Role
	if err := role.UnmarshalText([]byte(cmp.Or(w.Role, catalog.RoleAggregated))); err != nil {
		return coordinator.Engine{}, false
	}
	cw := coordinator.Worker{Rank: indexer.Rank{WorkerID: w.WorkerID}, Model: w.ModelName, Group: w.RoutingGroup, Role: role,
		TotalKVBlocks: int(min(w.TotalKVBlocks, 1<<40)), MaxNumBatchedTokens: int(min(w.MaxNumBatchedTokens, 1<<40)),
		Taints: slices.Clone(w.Taints), TopologyDomains: w.TopologyDomains, KVTransferDomain: w.KVTransferDomain,
		KVTransferPreferredWeight: w.KVTransferPreferredWeight, Endpoint: w.Endpoint}
	switch w.KVTransferEnforcement {
	case catalog.EnforcementRequired:
		cw.KVTransferEnforcement = coordinator.EnforcementRequired
	case catalog.EnforcementPreferred:
		cw.KVTransferEnforcement = coordinator.EnforcementPreferred
	}
	return coordinator.Engine{Worker: cw, DPRanks: w.Ranks(), BlockSize: int(w.BlockSize)}, true
}

func engineKey(k catalog.Key) coordinator.EngineKey {
	return coordinator.EngineKey{Model: k.Model, Group: k.Group, WorkerID: k.WorkerID}
}

// setWorker brings the service in step with a worker record: an engine
// of its pool, or, for a role no pool has, no engine.
func setWorker(svc *coordinator.Service, w catalog.Worker, log *slog.Logger) {
	e, ok := catalogEngine(w)
	if !ok {
		svc.RemoveEngine(engineKey(catalog.Key{Model: w.ModelName, Group: w.RoutingGroup, WorkerID: w.WorkerID}))
		return
	}
	if err := svc.SetEngine(e); err != nil {
		log.Error("worker not selectable", "worker", w.WorkerID, "err", err)
	}
}
