package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/engineload"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// Register checks that r's block size fits its partition, in the index
// and among the workers known, and that the ranks it adds fit under the
// rank cap (rankCap.Reserve; both *catalog.ConflictError), and writes r
// into the catalog (catalog.RegisterRanks), waiting for the store at most
// the write timeout. Every replica sees the record through the watch;
// none owns it.
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
	old, _ := v.ranks.Registered(key)
	now := time.Now()
	id, err := v.ranks.Reserve(key, newRanks(old, r), now, now.Add(reserveFor))
	v.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := v.writeContext(ctx)
	defer cancel()
	if err := catalog.RegisterRanks(ctx, v.store, r); err != nil {
		v.mu.Lock()
		v.ranks.Release(id)
		v.mu.Unlock()
		return err
	}
	return nil
}

// reserveFor is how long a registration's ranks count against the rank
// cap before the watch delivers its record: the write, then the watch's
// delivery, normally milliseconds; a record removed before the watch saw
// it is never delivered, and its reservation lapses.
const reserveFor = 30 * time.Second

// newRanks counts the ranks r registers that record old (zero: none) does
// not hold yet.
func newRanks(old catalog.Worker, r catalog.Registration) int {
	size := max(r.Size, 1)
	if old.DataParallelSize == 0 || size > catalog.MaxDataParallelSize { // too many is RegisterRanks's to refuse
		return int(size)
	}
	n := 0
	for i := range size {
		if !old.HasRank(r.Rank + i) {
			n++
		}
	}
	return n
}

// DefaultCatalogWriteTimeout is Config.CatalogWriteTimeout's default:
// well past what a registration takes through a healthy etcd under load,
// and past a leader election (a few of etcd's election timeouts), so that
// it ends only writes etcd does not answer.
const DefaultCatalogWriteTimeout = 5 * time.Second

// writeContext bounds a catalog write by the view's write timeout: the
// etcd client waits for an unreachable etcd for as long as its context
// lasts, and a request's context lasts as long as its client waits.
func (v *workerView) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if v.writeTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, v.writeTimeout)
}

// Unregister removes a worker, or one rank of it, from the catalog
// (catalog.UnregisterRanks).
func (v *workerView) Unregister(ctx context.Context, model, group string, id uint64, rank *uint32) error {
	ctx, cancel := v.writeContext(ctx)
	defer cancel()
	return catalog.UnregisterRanks(ctx, v.store, model, group, id, rank)
}

// List returns the known workers with their streams' state and their
// ranks' loads.
func (v *workerView) List(model, group string) []apiserver.WorkerState {
	streams := map[uint64]map[uint32]stream.Rank{}
	for _, st := range v.streams.Status() {
		if streams[st.Worker] == nil {
			streams[st.Worker] = map[uint32]stream.Rank{}
		}
		streams[st.Worker][st.Rank] = st
	}
	v.mu.Lock()
	out := make([]apiserver.WorkerState, 0, len(v.known))
	for k, w := range v.known {
		if (model == "" || k.Model == model) && (group == "" || k.Group == group) {
			ss := streams[w.WorkerID]
			for _, r := range w.Ranks() {
				if _, ok := ss[r]; !ok {
					// Known here before the manager follows it: the
					// index's word still holds (a rank restored degraded
					// from a peer is listed degraded from the start).
					if ss == nil {
						ss = map[uint32]stream.Rank{}
					}
					ss[r] = v.streams.Unfollowed(indexer.PartitionKey{Model: w.ModelName, Group: w.RoutingGroup}, w.WorkerID, r)
				}
			}
			out = append(out, apiserver.WorkerState{Record: w, Streams: ss})
		}
	}
	v.mu.Unlock()
	// The loads after the view's lock: the coordinator has its own.
	if v.svc != nil {
		for i := range out {
			w := out[i].Record
			k := coordinator.KeyOf(catalog.Key{Model: w.ModelName, Group: w.RoutingGroup, WorkerID: w.WorkerID})
			for _, r := range w.Ranks() {
				if rl, ok := v.svc.RankLoad(k, r); ok {
					if out[i].Loads == nil {
						out[i].Loads = map[uint32]coordinator.RankLoad{}
					}
					out[i].Loads[r] = rl
				}
			}
		}
	}
	return out
}

// engineTargets are the engines to scrape for their load: every known
// worker with an HTTP endpoint whose role has a pool, with its ranks.
func (v *workerView) engineTargets() []engineload.Target {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]engineload.Target, 0, len(v.known))
	for k, w := range v.known {
		if _, pooled := coordinator.EngineOf(w); pooled && w.Endpoint != "" {
			out = append(out, engineload.Target{Key: coordinator.KeyOf(k), Endpoint: w.Endpoint, Ranks: w.Ranks()})
		}
	}
	return out
}
