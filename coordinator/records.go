package coordinator

import (
	"cmp"
	"errors"
	"slices"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/indexer"
)

// EngineOf is the engine of a catalog record: one worker per dp rank, in
// the pool of its model, routing group and role. The catalog's roles are
// the coordinator's names ("" is aggregated) but for encoder, whose
// workers join no pool (false).
func EngineOf(w catalog.Worker) (Engine, bool) {
	var role Role
	if err := role.UnmarshalText([]byte(cmp.Or(w.Role, catalog.RoleAggregated))); err != nil {
		return Engine{}, false
	}
	cw := Worker{Rank: indexer.Rank{WorkerID: w.WorkerID}, Model: w.ModelName, Group: w.RoutingGroup, Role: role,
		TotalKVBlocks: int(min(w.TotalKVBlocks, 1<<40)), MaxNumBatchedTokens: int(min(w.MaxNumBatchedTokens, 1<<40)),
		Taints: slices.Clone(w.Taints), TopologyDomains: w.TopologyDomains, KVTransferDomain: w.KVTransferDomain,
		KVTransferPreferredWeight: w.KVTransferPreferredWeight, Endpoint: w.Endpoint}
	switch w.KVTransferEnforcement {
	case catalog.EnforcementRequired:
		cw.KVTransferEnforcement = EnforcementRequired
	case catalog.EnforcementPreferred:
		cw.KVTransferEnforcement = EnforcementPreferred
	}
	return Engine{Worker: cw, DPRanks: w.Ranks(), BlockSize: int(w.BlockSize)}, true
}

// KeyOf is the engine key of a catalog record's key.
func KeyOf(k catalog.Key) EngineKey {
	return EngineKey{Model: k.Model, Group: k.Group, WorkerID: k.WorkerID}
}

// SetRecord brings the service in step with a catalog record: its engine
// (SetEngine), or, for a role no pool has, none (RemoveEngine).
func (s *Service) SetRecord(w catalog.Worker) error {
	e, ok := EngineOf(w)
	if !ok {
		s.RemoveEngine(KeyOf(w.Key()))
		return nil
	}
	return s.SetEngine(e)
}

// RemoveRecord removes the engine of the record under k (RemoveEngine).
func (s *Service) RemoveRecord(k catalog.Key) { s.RemoveEngine(KeyOf(k)) }

// IndexOverlaps is OverlapSource and HashOverlapSource over an index. A
// partition the index does not have yet (no events) has no overlaps and
// block size 0: the service then uses the engines' block size.
type IndexOverlaps struct{ Index *indexer.Index }

// Overlaps implements OverlapSource.
func (s IndexOverlaps) Overlaps(model, group string, tokens []uint32, lora, salt string) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.Index.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	ov, err := s.Index.MatchTokens(k, tokens, indexer.Seed(lora, salt), nil)
	return ov, bs, err
}

// OverlapsByHash implements HashOverlapSource.
func (s IndexOverlaps) OverlapsByHash(model, group string, hashes []uint64) ([]indexer.Overlap, int, error) {
	k := indexer.PartitionKey{Model: model, Group: group}
	bs, err := s.Index.BlockSize(k)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, 0, nil
	}
	if err != nil || bs == 0 {
		return nil, bs, err
	}
	ov, err := s.Index.Match(k, hashes, nil)
	if errors.Is(err, indexer.ErrNoPartition) {
		return nil, bs, nil
	}
	return ov, bs, err
}
