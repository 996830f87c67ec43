package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/api"
)

// Register writes (or extends) the worker's persistent catalog record:
// one POST /register names one engine endpoint for one dp rank (or, with
// data_parallel_size, consecutive ranks at vLLM's offset ports). Ranks may
// come in any order and leave holes. The record is changed with the
// catalog's compare-and-swap, so concurrent registrations of different
// ranks all land. A record a sidecar keeps under a lease is the
// sidecar's: Register refuses it (409) rather than detach the lease.
// Every replica sees the record through the watch; none owns it.
func (v *workerView) Register(ctx context.Context, r api.RegisterRequest) error {
	group := cmp.Or(r.RoutingGroup, api.DefaultRoutingGroup)
	key := catalog.Key{Model: r.ModelName, Group: group, WorkerID: r.InstanceID}
	part := indexer.PartitionKey{Model: r.ModelName, Group: group}
	if bs, err := v.ix.BlockSize(part); err == nil && bs != int(r.BlockSize) {
		return &conflict{fmt.Sprintf("block_size: %d conflicts with block size %d of model=%s routing_group=%s", r.BlockSize, bs, api.Clip(r.ModelName), api.Clip(group))}
	}
	v.mu.Lock()
	for k, w := range v.known {
		if k.Model == r.ModelName && k.Group == group && k != key && w.BlockSize != r.BlockSize {
			v.mu.Unlock()
			return &conflict{fmt.Sprintf("block_size: %d conflicts with block size %d of worker %d in model=%s routing_group=%s", r.BlockSize, w.BlockSize, k.WorkerID, api.Clip(r.ModelName), api.Clip(group))}
		}
	}
	v.mu.Unlock()

	size := max(r.DataParallelSize, 1)
	if size > catalog.MaxDataParallelSize {
		return api.Invalid("data_parallel_size", "%d exceeds %d", size, catalog.MaxDataParallelSize)
	}
	if uint64(r.DPRank)+uint64(size) > math.MaxUint32+1 {
		return api.Invalid("dp_rank", "%d + data_parallel_size %d overflows a dp rank", r.DPRank, size)
	}
	add, addReplay := make(map[uint32]string, size), make(map[uint32]string, size)
	for i := uint32(0); i < size; i++ {
		ep, err := stream.OffsetEndpoint(r.Endpoint, i)
		if err != nil {
			return api.Invalid("endpoint", "%v", err)
		}
		add[r.DPRank+i] = ep
		if r.ReplayEndpoint != "" {
			rp, err := stream.OffsetEndpoint(r.ReplayEndpoint, i)
			if err != nil {
				return api.Invalid("replay_endpoint", "%v", err)
			}
			addReplay[r.DPRank+i] = rp
		}
	}
	_, err := v.store.Update(ctx, key, func(w *catalog.Worker, cur catalog.Current) error {
		if err := sidecarOwned(key, cur); err != nil {
			return err
		}
		evs, reps := map[uint32]string{}, map[uint32]string{}
		if cur.Exists {
			if w.BlockSize != r.BlockSize {
				return &conflict{fmt.Sprintf("block_size: %d conflicts with the registered %d", r.BlockSize, w.BlockSize)}
			}
			var err error
			if evs, reps, err = rankEndpoints(*w); err != nil {
				return fmt.Errorf("%w: stored record: %v", api.ErrUnavailable, err)
			}
		}
		for rank, ep := range add {
			evs[rank] = ep
			delete(reps, rank)
			if rp, ok := addReplay[rank]; ok {
				reps[rank] = rp
			}
		}
		nw := catalog.Worker{WorkerID: r.InstanceID, ModelName: r.ModelName, RoutingGroup: group, Role: catalog.Role(r.Role),
			Endpoint: r.EngineEndpoint, Topic: r.Topic, BlockSize: r.BlockSize, TotalKVBlocks: r.TotalKVBlocks,
			HostKVBlocks: r.HostKVBlocks, DiskKVBlocks: r.DiskKVBlocks,
			MaxNumBatchedTokens: r.MaxNumBatchedTokens, TopologyDomains: r.TopologyDomains, KVTransferDomain: r.KVTransferDomain,
			KVTransferEnforcement: catalog.Enforcement(r.KVTransferEnforcement), Taints: r.Taints}
		if r.KVTransferPreferredWeight != 0 {
			pw := r.KVTransferPreferredWeight
			nw.KVTransferPreferredWeight = &pw
		}
		setRanks(&nw, evs, reps)
		*w = nw.WithDefaults()
		return nil
	})
	return catalogError(err)
}

// sidecarOwned refuses an API change to a record a sidecar keeps under a
// lease: writing it would detach the lease (the record would never
// expire), and deleting it would leave the sidecar renewing a lease that
// holds nothing, its engine invisible until the sidecar restarts.
func sidecarOwned(k catalog.Key, cur catalog.Current) error {
	if cur.Lease == catalog.NoLease {
		return nil
	}
	return &conflict{fmt.Sprintf("instance_id: %d in model=%s routing_group=%s is registered by a sidecar under lease %x; the record is the sidecar's (stop the sidecar to remove it)",
		k.WorkerID, api.Clip(k.Model), api.Clip(k.Group), cur.Lease)}
}

// catalogError maps a catalog write error to the API's errors.
func catalogError(err error) error {
	var ve *catalog.ValidationError
	var inUse *catalog.IDInUseError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrConflict), errors.Is(err, api.ErrInvalid), errors.Is(err, api.ErrNotFound), errors.Is(err, api.ErrUnavailable):
		return err
	case errors.As(err, &inUse):
		return &conflict{fmt.Sprintf("instance_id: %d is registered for model=%s routing_group=%s; a worker id names one engine, so unregister it there first",
			inUse.ID, api.Clip(inUse.Holder.Model), api.Clip(inUse.Holder.Group))}
	case errors.As(err, &ve) && len(ve.Fields) > 0:
		return api.Invalid(ve.Fields[0].Field, "%s", ve.Fields[0].Reason)
	case errors.As(err, &ve):
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
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

// setRanks stores per-rank endpoints (any set of ranks, which evs must
// not leave empty) in the record's per-rank form.
func setRanks(w *catalog.Worker, evs, reps map[uint32]string) {
	w.EventsEndpoint, w.ReplayEndpoint = "", ""
	w.EventsEndpoints, w.ReplayEndpoints = evs, nil
	w.DataParallelStartRank, w.DataParallelSize = slices.Min(slices.Collect(maps.Keys(evs))), uint32(len(evs))
	if len(reps) > 0 {
		w.ReplayEndpoints = reps
	}
}

// Unregister removes a worker from one group, from every group of its
// model (no routing_group), or just one rank (routing_group and dp_rank).
// Like Register, it refuses records a sidecar keeps under a lease.
func (v *workerView) Unregister(ctx context.Context, r api.UnregisterRequest) error {
	remove := func(k catalog.Key) func(*catalog.Worker, catalog.Current) error {
		return func(_ *catalog.Worker, cur catalog.Current) error {
			if err := sidecarOwned(k, cur); err != nil {
				return err
			}
			return catalog.RemoveRecord
		}
	}
	if r.RoutingGroup == "" {
		keys, err := v.store.Keys(ctx, r.ModelName, r.InstanceID)
		if err != nil {
			return fmt.Errorf("%w: etcd: %v", api.ErrUnavailable, err)
		}
		n := 0
		for _, k := range keys {
			_, err := v.store.Update(ctx, k, remove(k))
			switch {
			case errors.Is(err, catalog.ErrNotFound): // gone meanwhile
			case err != nil:
				return catalogError(err)
			default:
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("%w: instance_id: %d is not registered for model %s", api.ErrNotFound, r.InstanceID, api.Clip(r.ModelName))
		}
		return nil
	}
	key := catalog.Key{Model: r.ModelName, Group: r.RoutingGroup, WorkerID: r.InstanceID}
	notFound := fmt.Errorf("%w: instance_id: %d is not registered in %s/%s", api.ErrNotFound, r.InstanceID, api.Clip(r.ModelName), api.Clip(r.RoutingGroup))
	fn := remove(key)
	if r.DPRank != nil {
		rank := *r.DPRank
		fn = func(w *catalog.Worker, cur catalog.Current) error {
			if !cur.Exists {
				return notFound
			}
			if err := sidecarOwned(key, cur); err != nil {
				return err
			}
			evs, reps, err := rankEndpoints(*w)
			if err != nil {
				return fmt.Errorf("%w: stored record: %v", api.ErrUnavailable, err)
			}
			if _, ok := evs[rank]; !ok {
				return fmt.Errorf("%w: dp_rank: %d is not registered for instance %d", api.ErrNotFound, rank, r.InstanceID)
			}
			delete(evs, rank)
			delete(reps, rank)
			if len(evs) == 0 {
				return catalog.RemoveRecord
			}
			setRanks(w, evs, reps)
			return nil
		}
	}
	_, err := v.store.Update(ctx, key, fn)
	if errors.Is(err, catalog.ErrNotFound) {
		return notFound
	}
	return catalogError(err)
}

// rankKey names one worker rank.
type rankKey struct {
	worker uint64
	rank   uint32
}

// List returns the known workers with their streams' state.
func (v *workerView) List(model, group string) []api.WorkerInfo {
	status := map[rankKey]stream.RankStatus{}
	for _, st := range v.streams.Status() {
		status[rankKey{st.Worker, st.Rank}] = st
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
				TotalKVBlocks: w.TotalKVBlocks, HostKVBlocks: w.HostKVBlocks, DiskKVBlocks: w.DiskKVBlocks,
				MaxNumBatchedTokens: w.MaxNumBatchedTokens, EngineEndpoint: w.Endpoint,
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
			switch st, ok := status[rankKey{w.WorkerID, r}]; {
			case ok && st.Running:
				l.Degraded = st.Degraded || st.Truncated
				switch {
				case !l.Degraded:
				case st.DegradedReason != "":
					l.DegradedReason = st.DegradedReason
				case st.Truncated:
					l.DegradedReason = "truncated: the index dropped some of its blocks (the memory cap, or more than its capacity)"
				}
				if st.HasLive {
					seen := st.LastLive
					l.LastSeenSeq = &seen
				}
				l.Replay = st.Replay.String()
				if st.Replay == stream.ReplayQueued {
					l.ReplayQueuedSeconds = time.Since(st.ReplayQueuedSince).Round(time.Millisecond).Seconds()
				}
				if st.Connected && st.Synced && st.Replay != stream.ReplayQueued {
					l.Status = api.StatusActive
				}
			case ok && st.Err != "":
				l.Status, l.LastError = api.StatusFailed, st.Err
			}
			info.Listeners[r] = l
		}
		out = append(out, info)
	}
	return out
}
