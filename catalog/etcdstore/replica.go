package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

var _ catalog.ReplicaStore = (*Store)(nil)

// PutReplica implements catalog.ReplicaStore: one put, attached to
// lease. A record of the same id is replaced (a replica that restarted
// takes its id back before its old lease runs out).
func (s *Store) PutReplica(ctx context.Context, r catalog.Replica, lease catalog.LeaseID) (int64, error) {
	b, err := catalog.EncodeReplica(r)
	if err != nil {
		return 0, err
	}
	resp, err := s.cli.Put(ctx, catalog.ReplicaPath(s.prefix, r.ID), string(b), clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		return 0, s.etcdErr(fmt.Sprintf("put replica %q lease %x", clip.String(r.ID), lease), err)
	}
	return resp.Header.Revision, nil
}

// Replicas implements catalog.ReplicaStore. Replica records are few (one
// per serving process): one read, no pages.
func (s *Store) Replicas(ctx context.Context) (catalog.ReplicaSnapshot, error) {
	rp := catalog.ReplicasPrefix(s.prefix)
	resp, err := s.cli.Get(ctx, rp, clientv3.WithPrefix())
	if err != nil {
		return catalog.ReplicaSnapshot{}, s.etcdErr("list "+rp, err)
	}
	snap := catalog.ReplicaSnapshot{Revision: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		r, err := catalog.DecodeReplica(s.prefix, string(kv.Key), kv.Value)
		if err != nil {
			snap.Bad++
			continue
		}
		snap.Replicas = append(snap.Replicas, r)
	}
	slices.SortFunc(snap.Replicas, func(a, b catalog.Replica) int { return strings.Compare(a.ID, b.ID) })
	return snap, nil
}

// WatchReplicas implements catalog.ReplicaStore. Its goroutine ends,
// closing the channel, when ctx ends or the watch fails (a compaction,
// no leader); the caller lists again then.
func (s *Store) WatchReplicas(ctx context.Context, rev int64) <-chan struct{} {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	wch := s.cli.Watch(wctx, catalog.ReplicasPrefix(s.prefix), opts...)
	out := make(chan struct{}, 1)
	go func() { // owned by ctx: it ends with ctx or the watch
		defer close(out)
		defer cancel()
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				return
			}
			if len(resp.Events) == 0 {
				continue
			}
			select {
			case out <- struct{}{}:
			default: // a change is already pending: the reader lists everything
			}
		}
	}()
	return out
}
