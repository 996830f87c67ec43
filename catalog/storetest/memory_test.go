package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/prefixd/prefixd/catalog"
)

// TestMemoryHistoryLimit: past the history limit the oldest revisions
// are compacted away, never the current one (even mid-way through a
// multi-key write: a record and its id claim).
func TestMemoryHistoryLimit(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore("")
	defer s.Close()
	s.history = 1
	w := func(id uint64) catalog.Worker {
		return catalog.Worker{WorkerID: id, ModelName: "m", BlockSize: 16}.WithDefaults()
	}
	var revs []int64
	for id := uint64(1); id <= 3; id++ {
		rev, err := s.Put(ctx, w(id), catalog.NoLease)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	if _, err := s.List(ctx, revs[0]); !errors.Is(err, catalog.ErrCompacted) {
		t.Fatalf("List at an evicted revision: %v, want catalog.ErrCompacted", err)
	}
	if snap, err := s.List(ctx, revs[2]); err != nil || len(snap.Records) != 3 {
		t.Fatalf("List at the current revision: %+v, %v", snap, err)
	}
	if ok, err := s.Delete(ctx, w(1).Key()); err != nil || !ok { // the record and its id claim: two deletes in one revision
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	snap, err := s.List(ctx, 0)
	if err != nil || len(snap.Records) != 2 {
		t.Fatalf("List after a multi-delete with history 1: %+v, %v", snap, err)
	}
	ws, err := s.Watch(ctx, revs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if _, err := ws.Next(ctx); !errors.Is(err, catalog.ErrCompacted) {
		t.Fatalf("Watch from an evicted revision: %v, want catalog.ErrCompacted", err)
	}
	ws2, err := s.Watch(ctx, snap.Revision)
	if err != nil {
		t.Fatal(err)
	}
	defer ws2.Close()
	evs, err := ws2.Next(ctx)
	if err != nil || len(evs) != 1 || evs[0].Type != catalog.EventDelete || evs[0].Record.Key != w(1).Key() {
		t.Fatalf("Watch from the current revision: %+v, %v; want the record's delete (its id claim is not a record)", evs, err)
	}
}
