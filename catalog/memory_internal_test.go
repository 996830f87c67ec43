package catalog

import (
	"context"
	"errors"
	"testing"
)

// TestMemoryHistoryLimit: past the history limit the oldest revisions
// are compacted away, never the current one (even mid-way through a
// multi-key delete).
func TestMemoryHistoryLimit(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore("")
	defer s.Close()
	s.history = 1
	w := func(id uint64) Worker {
		return Worker{WorkerID: id, ModelName: "m", BlockSize: 16}.WithDefaults()
	}
	var revs []int64
	for id := uint64(1); id <= 3; id++ {
		rev, err := s.Put(ctx, w(id), NoLease)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	if _, err := s.List(ctx, revs[0]); !errors.Is(err, ErrCompacted) {
		t.Fatalf("List at an evicted revision: %v, want ErrCompacted", err)
	}
	if snap, err := s.List(ctx, revs[2]); err != nil || len(snap.Records) != 3 {
		t.Fatalf("List at the current revision: %+v, %v", snap, err)
	}
	if _, err := s.Put(ctx, Worker{WorkerID: 1, ModelName: "m", RoutingGroup: "g2", BlockSize: 16}.WithDefaults(), NoLease); err != nil {
		t.Fatal(err)
	}
	n, err := s.DeleteAllGroups(ctx, "m", 1) // two deletes in one revision
	if err != nil || n != 2 {
		t.Fatalf("DeleteAllGroups = %d, %v", n, err)
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
	if _, err := ws.Next(ctx); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Watch from an evicted revision: %v, want ErrCompacted", err)
	}
	ws2, err := s.Watch(ctx, snap.Revision)
	if err != nil {
		t.Fatal(err)
	}
	defer ws2.Close()
	evs, err := ws2.Next(ctx)
	if err != nil || len(evs) != 2 || evs[0].Type != EventDelete {
		t.Fatalf("Watch from the current revision: %+v, %v; want the two deletes", evs, err)
	}
}
