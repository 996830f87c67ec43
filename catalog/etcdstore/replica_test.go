package etcdstore_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func replicaIDs(t *testing.T, s catalog.ReplicaStore) []string {
	t.Helper()
	snap, err := s.Replicas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range snap.Replicas {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestKeepReplica: a kept record is listed and watched; when its keeper
// stops, the record goes at once (revoked); a record whose process died
// without revoking goes with its lease.
func TestKeepReplica(t *testing.T) {
	t.Parallel()
	e := sharedEtcd(t)
	s := storetest.NewEtcdStore(t, e.Endpoints(), uniquePrefix()+"/prefixd/v1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snap, err := s.Replicas(ctx)
	if err != nil || len(snap.Replicas) != 0 {
		t.Fatalf("empty prefix: %+v %v", snap, err)
	}
	changed := s.WatchReplicas(ctx, snap.Revision+1)

	r := catalog.Replica{Version: catalog.RecordVersion, ID: "a", SyncAddress: "127.0.0.1:1234", StartedAt: time.Now().UTC()}
	kctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- catalog.KeepReplica(kctx, s, r, 2*time.Second, slog.New(slog.DiscardHandler)) }()
	<-changed
	testsupport.Eventually(t, 5*time.Second, "replica a listed", func() bool { ids := replicaIDs(t, s); return len(ids) == 1 && ids[0] == "a" })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("KeepReplica = %v", err)
	}
	<-changed
	if ids := replicaIDs(t, s); len(ids) != 0 {
		t.Fatalf("after stop: %v", ids)
	}

	// Killed: a lease nobody renews.
	lease, err := s.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r.ID = "killed"
	if _, err := s.PutReplica(ctx, r, lease); err != nil {
		t.Fatal(err)
	}
	<-changed
	start := time.Now()
	testsupport.Eventually(t, 10*time.Second, "the dead replica's record to expire", func() bool { return len(replicaIDs(t, s)) == 0 })
	t.Logf("expired %v after the put", time.Since(start).Round(time.Millisecond))
	if _, err := s.PutReplica(ctx, r, lease); !errors.Is(err, catalog.ErrLeaseNotFound) {
		t.Fatalf("put on an expired lease: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.PutReplica(ctx, catalog.Replica{ID: "bad"}, catalog.NoLease); err == nil {
		t.Fatal("an invalid record was written")
	}
	cancel()
	for range changed {
	}
}
