package catalog_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
)

// TestRegisterRanks merges registrations into one record on the in-memory
// store: ranks in any order with holes, a rank registered again taking
// its new endpoints, the other fields the last registration's.
func TestRegisterRanks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := storetest.NewMemoryStore("")
	defer s.Close()
	key := catalog.Key{Model: "m", Group: "g", WorkerID: 7}
	reg := func(rank, size uint32, ev, rp string, a catalog.Attributes) catalog.Registration {
		return catalog.Registration{Key: key, Rank: rank, Size: size, EventsEndpoint: ev, ReplayEndpoint: rp, BlockSize: 16, Attributes: a}
	}
	steps := []catalog.Registration{
		reg(4, 2, "tcp://h:5561", "tcp://h:6561", catalog.Attributes{Role: catalog.RolePrefill}), // ranks 4, 5 at offset ports
		reg(0, 0, "tcp://h:5557", "", catalog.Attributes{Role: catalog.RoleDecode, Taints: []string{"spot"}}),
		reg(5, 1, "tcp://h:7000", "", catalog.Attributes{Role: catalog.RoleDecode, Taints: []string{"spot"}}), // rank 5 again, no replay now
	}
	for _, r := range steps {
		if err := catalog.RegisterRanks(ctx, s, r); err != nil {
			t.Fatal(err)
		}
	}
	w, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint32]string{0: "tcp://h:5557", 4: "tcp://h:5561", 5: "tcp://h:7000"}; !maps.Equal(w.EventsEndpoints, want) {
		t.Errorf("events endpoints %v, want %v", w.EventsEndpoints, want)
	}
	if want := map[uint32]string{4: "tcp://h:6561"}; !maps.Equal(w.ReplayEndpoints, want) {
		t.Errorf("replay endpoints %v, want %v", w.ReplayEndpoints, want)
	}
	if w.Role != catalog.RoleDecode || len(w.Taints) != 1 || w.DataParallelStartRank != 0 || w.DataParallelSize != 3 {
		t.Errorf("record %+v", w)
	}

	// Another block size for the record is a conflict naming the field.
	r := reg(1, 1, "tcp://h:5558", "", catalog.Attributes{})
	r.BlockSize = 32
	var ce *catalog.ConflictError
	if err := catalog.RegisterRanks(ctx, s, r); !errors.As(err, &ce) || ce.Field != "block_size" {
		t.Errorf("block size 32: %v", err)
	}
	// A bad record names the field; an endpoint that cannot be offset too.
	var ve *catalog.ValidationError
	if err := catalog.RegisterRanks(ctx, s, reg(1, 1, "tcp://h:5558", "", catalog.Attributes{Role: "boss"})); !errors.As(err, &ve) || ve.Fields[0].Field != "role" {
		t.Errorf("role boss: %v", err)
	}
	if err := catalog.RegisterRanks(ctx, s, reg(1, 2, "ipc:///tmp/kv", "", catalog.Attributes{})); !errors.As(err, &ve) || ve.Fields[0].Field != "endpoint" {
		t.Errorf("ipc for 2 ranks: %v", err)
	}

	// Unregistering rank by rank; the last takes the record with it.
	for _, rank := range []uint32{4, 0} {
		if err := catalog.UnregisterRanks(ctx, s, "m", "g", 7, &rank); err != nil {
			t.Fatal(err)
		}
	}
	four := uint32(4)
	var nr *catalog.NotRegisteredError
	if err := catalog.UnregisterRanks(ctx, s, "m", "g", 7, &four); !errors.As(err, &nr) || nr.Error() != "dp_rank: 4 is not registered for instance 7" {
		t.Errorf("rank 4 again: %v", err)
	}
	five := uint32(5)
	if err := catalog.UnregisterRanks(ctx, s, "m", "g", 7, &five); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("record after its last rank: %v", err)
	}
	if err := catalog.UnregisterRanks(ctx, s, "m", "g", 7, nil); !errors.As(err, &nr) || nr.Error() != "instance_id: 7 is not registered in m/g" {
		t.Errorf("gone: %v", err)
	}
	if err := catalog.UnregisterRanks(ctx, s, "m", "", 7, nil); !errors.As(err, &nr) || nr.Error() != "instance_id: 7 is not registered for model m" {
		t.Errorf("gone from every group: %v", err)
	}
}

// TestRegisterRanksLeased: a record a sidecar keeps under a lease is the
// sidecar's; the API's writes and deletes are refused and leave it alone.
func TestRegisterRanksLeased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := storetest.NewMemoryStore("")
	defer s.Close()
	sess, err := catalog.Register(ctx, s, storetest.Worker("m", "g", 3), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	r := catalog.Registration{Key: catalog.Key{Model: "m", Group: "g", WorkerID: 3}, EventsEndpoint: "tcp://h:1", BlockSize: 16}
	var ce *catalog.ConflictError
	if err := catalog.RegisterRanks(ctx, s, r); !errors.As(err, &ce) || ce.Field != "instance_id" {
		t.Errorf("register over the sidecar's record: %v", err)
	}
	if err := catalog.UnregisterRanks(ctx, s, "m", "", 3, nil); !errors.As(err, &ce) {
		t.Errorf("unregister the sidecar's record: %v", err)
	}
	if w, err := s.Get(ctx, r.Key); err != nil || !w.Equal(storetest.Worker("m", "g", 3)) {
		t.Errorf("the sidecar's record changed: %+v, %v", w, err)
	}
}
