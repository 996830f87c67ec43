package daemon

import (
	"context"
	"fmt"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// Register checks that r's block size fits its partition, in the index
// and among the workers known, and writes r into the catalog
// (catalog.RegisterRanks). Every replica sees the record through the
// watch; none owns it.
func (v *workerView) Register(ctx context.Context, r catalog.Registration) error {
	group := r.Group
	if group == "" {
		group = catalog.DefaultRoutingGroup
	}
	key := catalog.Key{Model: r.Model, Group: group, WorkerID: r.WorkerID}
	conflict := func(format string, args ...any) error {
		return &catalog.ConflictError{Field: "block_size", Reason: fmt.Sprintf(format, args...)}
	}
	if bs, err := v.ix.BlockSize(indexer.PartitionKey{Model: r.Model, Group: group}); err == nil && bs != int(r.BlockSize) {
		return conflict("%d conflicts with block size %d of model=%s routing_group=%s", r.BlockSize, bs, clip.String(r.Model), clip.String(group))
	}
	v.mu.Lock()
	for k, w := range v.known {
		if k.Model == r.Model && k.Group == group && k != key && w.BlockSize != r.BlockSize {
			v.mu.Unlock()
			return conflict("%d conflicts with block size %d of worker %d in model=%s routing_group=%s", r.BlockSize, w.BlockSize, k.WorkerID, clip.String(r.Model), clip.String(group))
		}
	}
	v.mu.Unlock()
	return catalog.RegisterRanks(ctx, v.store, r)
}

// Unregister removes a worker, or one rank of it, from the catalog
// (catalog.UnregisterRanks).
func (v *workerView) Unregister(ctx context.Context, model, group string, id uint64, rank *uint32) error {
	return catalog.UnregisterRanks(ctx, v.store, model, group, id, rank)
}

// List returns the known workers with their streams' state.
func (v *workerView) List(model, group string) []apiserver.WorkerState {
	streams := map[uint64]map[uint32]stream.Rank{}
	for _, st := range v.streams.Status() {
		if streams[st.Worker] == nil {
			streams[st.Worker] = map[uint32]stream.Rank{}
		}
		streams[st.Worker][st.Rank] = st
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]apiserver.WorkerState, 0, len(v.known))
	for k, w := range v.known {
		if (model == "" || k.Model == model) && (group == "" || k.Group == group) {
			out = append(out, apiserver.WorkerState{Record: w, Streams: streams[w.WorkerID]})
		}
	}
	return out
}
