package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/api"
)

// Register writes (or extends) the worker's persistent catalog record:
// one POST /register names one engine endpoint for one dp rank (or, with
// data_parallel_size, consecutive ranks at vLLM's offset ports). Every
// replica sees it through the watch; none owns it.
func (v *workerView) Register(ctx context.Context, r api.RegisterRequest) error {
	group := cmp.Or(r.RoutingGroup, api.DefaultRoutingGroup)
	key := catalog.Key{Model: r.ModelName, Group: group, WorkerID: r.InstanceID}
	part := indexer.PartitionKey{Model: r.ModelName, Group: group}
	if bs, err := v.ix.BlockSize(part); err == nil && bs != int(r.BlockSize) {
		return &conflict{fmt.Sprintf("block_size: %d conflicts with block size %d of model=%s routing_group=%s", r.BlockSize, bs, r.ModelName, group)}
	}
	v.mu.Lock()
	for k, w := range v.known {
		if k.Model == r.ModelName && k.Group == group && k != key && w.BlockSize != r.BlockSize {
			v.mu.Unlock()
			return &conflict{fmt.Sprintf("block_size: %d conflicts with block size %d of worker %d in model=%s routing_group=%s", r.BlockSize, w.BlockSize, k.WorkerID, r.ModelName, group)}
		}
	}
	v.mu.Unlock()

	old, err := v.store.Get(ctx, key)
	found := err == nil
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
	}
	evs, reps := map[uint32]string{}, map[uint32]string{}
	if found {
		if old.BlockSize != r.BlockSize {
			return &conflict{fmt.Sprintf("block_size: %d conflicts with the registered %d", r.BlockSize, old.BlockSize)}
		}
		if evs, reps, err = rankEndpoints(old); err != nil {
			return fmt.Errorf("%w: stored record: %v", api.ErrUnavailable, err)
		}
	}
	size := max(r.DataParallelSize, 1)
	for i := uint32(0); i < size; i++ {
		ep, err := events.OffsetEndpoint(r.Endpoint, i)
		if err != nil {
			return api.Invalid("endpoint", "%v", err)
		}
		evs[r.DPRank+i] = ep
		delete(reps, r.DPRank+i)
		if r.ReplayEndpoint != "" {
			rp, err := events.OffsetEndpoint(r.ReplayEndpoint, i)
			if err != nil {
				return api.Invalid("replay_endpoint", "%v", err)
			}
			reps[r.DPRank+i] = rp
		}
	}
	w := catalog.Worker{WorkerID: r.InstanceID, ModelName: r.ModelName, RoutingGroup: group, Role: catalog.Role(r.Role),
		Endpoint: r.EngineEndpoint, Topic: r.Topic, BlockSize: r.BlockSize, TotalKVBlocks: r.TotalKVBlocks,
		MaxNumBatchedTokens: r.MaxNumBatchedTokens, TopologyDomains: r.TopologyDomains, KVTransferDomain: r.KVTransferDomain,
		KVTransferEnforcement: catalog.Enforcement(r.KVTransferEnforcement), Taints: r.Taints}
	if r.KVTransferPreferredWeight != 0 {
		pw := r.KVTransferPreferredWeight
		w.KVTransferPreferredWeight = &pw
	}
	if err := setRanks(&w, evs, reps); err != nil {
		return err
	}
	w = w.WithDefaults()
	if err := w.Validate(); err != nil {
		var ve *catalog.ValidationError
		if errors.As(err, &ve) && len(ve.Fields) > 0 {
			return api.Invalid(ve.Fields[0].Field, "%s", ve.Fields[0].Reason)
		}
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	if _, err := v.store.Put(ctx, w, catalog.NoLease); err != nil {
		return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
	}
	return nil
}

type conflict struct{ msg string }

func (c *conflict) Error() string        { return c.msg }
func (c *conflict) Is(target error) bool { return target == api.ErrConflict }

// rankEndpoints expands a record's endpoints into one per rank.
func rankEndpoints(w catalog.Worker) (evs, reps map[uint32]string, err error) {
	evs, reps = map[uint32]string{}, map[uint32]string{}
	for _, r := range w.Ranks() {
		if evs[r], err = w.EventsEndpointFor(r); err != nil {
			return nil, nil, err
		}
		rp, err := w.ReplayEndpointFor(r)
		if err != nil {
			return nil, nil, err
		}
		if rp != "" {
			reps[r] = rp
		}
	}
	return evs, reps, nil
}

// setRanks stores per-rank endpoints, which must cover consecutive ranks.
func setRanks(w *catalog.Worker, evs, reps map[uint32]string) error {
	ranks := slices.Sorted(maps.Keys(evs))
	if len(ranks) == 0 {
		return api.Invalid("endpoint", "required")
	}
	lo, hi := ranks[0], ranks[len(ranks)-1]
	if int(hi-lo)+1 != len(ranks) {
		return api.Invalid("dp_rank", "registered ranks %v must be consecutive", ranks)
	}
	w.EventsEndpoints, w.DataParallelStartRank, w.DataParallelSize = evs, lo, uint32(len(ranks))
	if len(reps) > 0 {
		w.ReplayEndpoints = reps
	}
	return nil
}

// Unregister removes a worker from one group, from every group of its
// model (no routing_group), or just one rank (routing_group and dp_rank).
func (v *workerView) Unregister(ctx context.Context, r api.UnregisterRequest) error {
	if r.RoutingGroup == "" {
		n, err := v.store.DeleteAllGroups(ctx, r.ModelName, r.InstanceID)
		if err != nil {
			return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: instance_id: %d is not registered for model %s", api.ErrNotFound, r.InstanceID, r.ModelName)
		}
		return nil
	}
	key := catalog.Key{Model: r.ModelName, Group: r.RoutingGroup, WorkerID: r.InstanceID}
	if r.DPRank == nil {
		ok, err := v.store.Delete(ctx, key)
		if err != nil {
			return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
		}
		if !ok {
			return fmt.Errorf("%w: instance_id: %d is not registered in %s/%s", api.ErrNotFound, r.InstanceID, r.ModelName, r.RoutingGroup)
		}
		return nil
	}
	w, err := v.store.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("%w: instance_id: %d is not registered in %s/%s", api.ErrNotFound, r.InstanceID, r.ModelName, r.RoutingGroup)
	}
	if err != nil {
		return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
	}
	evs, reps, err := rankEndpoints(w)
	if err != nil {
		return fmt.Errorf("%w: stored record: %v", api.ErrUnavailable, err)
	}
	if _, ok := evs[*r.DPRank]; !ok {
		return fmt.Errorf("%w: dp_rank: %d is not registered for instance %d", api.ErrNotFound, *r.DPRank, r.InstanceID)
	}
	delete(evs, *r.DPRank)
	delete(reps, *r.DPRank)
	if len(evs) == 0 {
		if _, err := v.store.Delete(ctx, key); err != nil {
			return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
		}
		return nil
	}
	w.EventsEndpoint, w.ReplayEndpoint, w.ReplayEndpoints = "", "", nil
	if err := setRanks(&w, evs, reps); err != nil {
		return err
	}
	if _, err := v.store.Put(ctx, w, catalog.NoLease); err != nil {
		return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
	}
	return nil
}

// List returns the known workers with their streams' state.
func (v *workerView) List(model, group string) []api.WorkerInfo {
	status := map[streamKey]RankStatus{}
	for _, st := range v.streams.Status() {
		status[streamKey{st.Worker, st.Rank}] = st
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]api.WorkerInfo, 0, len(v.known))
	for k, w := range v.known {
		if (model != "" && k.Model != model) || (group != "" && k.Group != group) {
			continue
		}
		info := api.WorkerInfo{InstanceID: w.WorkerID, ModelName: w.ModelName, RoutingGroup: w.RoutingGroup,
			BlockSize: w.BlockSize, Lifecycle: string(w.Lifecycle), Listeners: map[uint32]api.Listener{},
			Extensions: api.Extensions{Role: string(w.Role), Topic: w.Topic, DataParallelSize: w.DataParallelSize,
				TotalKVBlocks: w.TotalKVBlocks, MaxNumBatchedTokens: w.MaxNumBatchedTokens, EngineEndpoint: w.Endpoint,
				KVTransferDomain: w.KVTransferDomain, KVTransferEnforcement: string(w.KVTransferEnforcement),
				TopologyDomains: w.TopologyDomains, Taints: w.Taints}}
		if w.KVTransferPreferredWeight != nil {
			info.KVTransferPreferredWeight = *w.KVTransferPreferredWeight
		}
		for _, r := range w.Ranks() {
			ep, _ := w.EventsEndpointFor(r)
			rp, _ := w.ReplayEndpointFor(r)
			l := api.Listener{Endpoint: ep, ReplayEndpoint: rp, Status: api.StatusPending}
			if info.ReplayEndpoint == "" {
				info.ReplayEndpoint = rp
			}
			if st, ok := status[streamKey{w.WorkerID, r}]; ok {
				l.Degraded = st.Degraded
				if st.HasLive {
					seen := st.LastLive
					l.LastSeenSeq = &seen
				}
				if st.Connected && st.Synced {
					l.Status = api.StatusActive
				}
			} else if ep != "" {
				l.Status = api.StatusFailed
				l.LastError = "stream not running (see the daemon log)"
			}
			info.Listeners[r] = l
		}
		out = append(out, info)
	}
	return out
}
