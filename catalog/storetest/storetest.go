// Package storetest is the conformance suite of catalog.Store: one set of
// tests that every implementation (storetest.MemoryStore, etcdstore.Store
// on a real etcd) must pass, covering records, revisions, lists at a
// revision, watches, compaction, leases, and the Session and Watcher
// built on them. It also starts embedded etcd servers for tests.
package storetest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/internal/testsupport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Testable is a Store with the test hooks the suite needs; both stores in
// package catalog have them.
type Testable interface {
	catalog.Store
	// Prefix is the key prefix the store uses.
	Prefix() string
	// PutRaw writes value under path with no validation (to plant bad
	// records).
	PutRaw(ctx context.Context, path string, value []byte) (int64, error)
	// Compact drops the history below rev.
	Compact(ctx context.Context, rev int64) error
}

// Run runs the suite. newStore returns an empty store for one subtest and
// arranges its cleanup.
func Run(t *testing.T, newStore func(t *testing.T) Testable) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s Testable)
	}{
		{"PutGet", testPutGet},
		{"PutRejectsInvalid", testPutRejectsInvalid},
		{"Delete", testDelete},
		{"Keys", testKeys},
		{"OneRecordPerID", testOneRecordPerID},
		{"Update", testUpdate},
		{"UpdateConcurrent", testUpdateConcurrent},
		{"UpdateRemove", testUpdateRemove},
		{"ListAtRevision", testListAtRevision},
		{"ListBadRecords", testListBadRecords},
		{"Watch", testWatch},
		{"WatchFromPast", testWatchFromPast},
		{"Compacted", testCompacted},
		{"Leases", testLeases},
		{"LeaseExpiry", testLeaseExpiry},
		{"SessionRegisterClose", testSessionRegisterClose},
		{"SessionReregisters", testSessionReregisters},
		{"SessionUpdate", testSessionUpdate},
		{"WatcherChanges", testWatcherChanges},
		{"WatcherBadRecords", testWatcherBadRecords},
		{"WatcherOneRecordPerID", testWatcherOneRecordPerID},
		{"WatcherCompaction", testWatcherCompaction},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newStore(t))
		})
	}
}

// Worker returns a valid record for tests (defaults applied).
func Worker(model, group string, id uint64) catalog.Worker {
	return catalog.Worker{
		WorkerID:       id,
		ModelName:      model,
		RoutingGroup:   group,
		Endpoint:       fmt.Sprintf("http://10.0.0.%d:8000", id%250+1),
		EventsEndpoint: fmt.Sprintf("tcp://10.0.0.%d:5557", id%250+1),
		ReplayEndpoint: fmt.Sprintf("tcp://10.0.0.%d:5657", id%250+1),
		BlockSize:      16,
	}.WithDefaults()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustPut(t *testing.T, s catalog.Registrar, w catalog.Worker, lease catalog.LeaseID) int64 {
	t.Helper()
	rev, err := s.Put(ctxT(t), w, lease)
	if err != nil {
		t.Fatalf("Put(%v): %v", w.Key(), err)
	}
	return rev
}

func testPutGet(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("meta-llama/Llama-3-8B", "team a/b", 7)
	w.DataParallelSize = 2
	w.Taints = []string{"gpu=h100"}
	r1 := mustPut(t, s, w, catalog.NoLease)
	got, err := s.Get(ctx, w.Key())
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !got.Equal(w) {
		t.Fatalf("Get = %+v, want %+v", got, w)
	}
	w.BlockSize = 32
	r2 := mustPut(t, s, w, catalog.NoLease)
	if r2 <= r1 {
		t.Fatalf("second Put revision %d, not after first %d", r2, r1)
	}
	if got, _ := s.Get(ctx, w.Key()); got.BlockSize != 32 {
		t.Fatalf("Get after replace: block size %d, want 32", got.BlockSize)
	}
	_, err = s.Get(ctx, catalog.Key{Model: w.ModelName, Group: w.RoutingGroup, WorkerID: 8})
	if !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get of a missing worker: %v, want ErrNotFound", err)
	}
	// A model whose escaped name is a prefix of another's is not confused.
	_, err = s.Get(ctx, catalog.Key{Model: "meta-llama", Group: w.RoutingGroup, WorkerID: 7})
	if !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get of model meta-llama: %v, want ErrNotFound", err)
	}
}

func testPutRejectsInvalid(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 1)
	w.BlockSize = 0
	_, err := s.Put(ctx, w, catalog.NoLease)
	var ve *catalog.ValidationError
	if !errors.As(err, &ve) || ve.Fields[0].Field != "block_size" {
		t.Fatalf("Put of block_size 0: %v, want a ValidationError naming block_size", err)
	}
	if _, err := s.Get(ctx, w.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("an invalid record was written: Get = %v", err)
	}
	// Defaults are not applied by Put.
	raw := catalog.Worker{WorkerID: 2, ModelName: "m", BlockSize: 16}
	if _, err := s.Put(ctx, raw, catalog.NoLease); err == nil {
		t.Fatal("Put of a record without defaults succeeded")
	}
}

func testDelete(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 1)
	mustPut(t, s, w, catalog.NoLease)
	if ok, err := s.Delete(ctx, w.Key()); err != nil || !ok {
		t.Fatalf("Delete = %v, %v; want true", ok, err)
	}
	if ok, err := s.Delete(ctx, w.Key()); err != nil || ok {
		t.Fatalf("second Delete = %v, %v; want false", ok, err)
	}
	if _, err := s.Get(ctx, w.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
}

func testKeys(t *testing.T, s Testable) {
	ctx := ctxT(t)
	for _, w := range []catalog.Worker{Worker("m", "a", 8), Worker("m2", "a", 17), Worker("m/x", "a", 70), Worker("m", "b/c", 7)} {
		mustPut(t, s, w, catalog.NoLease)
	}
	got, err := s.Keys(ctx, "m", 7)
	if want := []catalog.Key{{Model: "m", Group: "b/c", WorkerID: 7}}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Keys(m, 7) = %v, %v; want %v", got, err, want)
	}
	if got, err := s.Keys(ctx, "m", 9); err != nil || len(got) != 0 {
		t.Fatalf("Keys(m, 9) = %v, %v; want none", got, err)
	}
}

// testOneRecordPerID: a worker id is registered under one key; a write
// under another is refused naming the holder, until the holder is gone
// (deleted, or its lease ended).
func testOneRecordPerID(t *testing.T, s Testable) {
	ctx := ctxT(t)
	a := Worker("m", "a", 7)
	mustPut(t, s, a, catalog.NoLease)
	mustPut(t, s, a, catalog.NoLease) // the holder itself may write again
	b := Worker("other-model", "default", 7)
	_, err := s.Put(ctx, b, catalog.NoLease)
	var inUse *catalog.IDInUseError
	if !errors.As(err, &inUse) || !errors.Is(err, catalog.ErrIDInUse) || inUse.Holder != a.Key() || inUse.ID != 7 {
		t.Fatalf("Put of id 7 under another model: %v, want an IDInUseError naming %v", err, a.Key())
	}
	if !strings.Contains(err.Error(), `model "m" routing group "a"`) {
		t.Fatalf("error %q does not name the holder", err)
	}
	_, err = s.Update(ctx, b.Key(), func(w *catalog.Worker, cur catalog.Current) error {
		*w = b
		return nil
	})
	if !errors.As(err, &inUse) {
		t.Fatalf("Update of id 7 under another model: %v, want an IDInUseError", err)
	}
	if _, err := s.Get(ctx, b.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("the refused record was written: Get = %v", err)
	}
	if ok, err := s.Delete(ctx, a.Key()); !ok || err != nil {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	mustPut(t, s, b, catalog.NoLease) // the id is free again
	// A lease that ends releases the id with its record.
	lease, err := s.Grant(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := Worker("m", "a", 9)
	mustPut(t, s, c, lease)
	if _, err := s.Put(ctx, Worker("m", "b", 9), catalog.NoLease); !errors.As(err, &inUse) || inUse.Lease != lease {
		t.Fatalf("Put over a leased id: %v, want an IDInUseError naming lease %x", err, lease)
	}
	if err := s.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, Worker("m", "b", 9), catalog.NoLease)
	snap, err := s.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(snap), []catalog.Key{{Model: "m", Group: "b", WorkerID: 9}, b.Key()}; !slices.Equal(got, want) {
		t.Fatalf("List = %v, want %v (id claims are not records)", got, want)
	}
}

func testUpdate(t *testing.T, s Testable) {
	ctx := ctxT(t)
	k := catalog.Key{Model: "m", Group: "g", WorkerID: 3}
	calls := 0
	rev, err := s.Update(ctx, k, func(w *catalog.Worker, cur catalog.Current) error {
		calls++
		if cur.Exists || w.Key() != k {
			t.Errorf("first Update saw %+v, %+v; want a new record for %v", cur, *w, k)
		}
		*w = Worker("m", "g", 3)
		return nil
	})
	if err != nil || calls != 1 {
		t.Fatalf("Update (create) = %d, %v after %d calls", rev, err, calls)
	}
	_, err = s.Update(ctx, k, func(w *catalog.Worker, cur catalog.Current) error {
		if !cur.Exists || cur.ModRevision != rev || cur.Lease != catalog.NoLease {
			t.Errorf("second Update saw %+v, want the record at revision %d", cur, rev)
		}
		w.Lifecycle = catalog.LifecycleDraining
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, k); got.Lifecycle != catalog.LifecycleDraining {
		t.Fatalf("Get after Update: %+v", got)
	}
	// fn's own errors come back as they are and change nothing.
	stop := errors.New("stop")
	if _, err := s.Update(ctx, k, func(w *catalog.Worker, _ catalog.Current) error { w.BlockSize = 64; return stop }); err != stop {
		t.Fatalf("Update returning an error: %v, want it as is", err)
	}
	// An invalid result is refused, naming the field.
	_, err = s.Update(ctx, k, func(w *catalog.Worker, _ catalog.Current) error { w.BlockSize = 0; return nil })
	var ve *catalog.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Update to an invalid record: %v, want a ValidationError", err)
	}
	if got, _ := s.Get(ctx, k); got.BlockSize != 16 {
		t.Fatalf("a failed Update changed the record: %+v", got)
	}
	// An update keeps the record's lease.
	lease, err := s.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, Worker("m", "g", 4), lease)
	if _, err := s.Update(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 4}, func(w *catalog.Worker, cur catalog.Current) error {
		if cur.Lease != lease {
			t.Errorf("Update saw lease %x, want %x", cur.Lease, lease)
		}
		w.Lifecycle = catalog.LifecycleDraining
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 4}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("the updated record outlived its lease: %v", err)
	}
}

// testUpdateConcurrent: read-modify-write from many goroutines loses
// nothing (each adds one rank).
func testUpdateConcurrent(t *testing.T, s Testable) {
	ctx := ctxT(t)
	k := catalog.Key{Model: "m", Group: "g", WorkerID: 5}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for r := range uint32(n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Update(ctx, k, func(w *catalog.Worker, cur catalog.Current) error {
				eps := maps.Clone(w.EventsEndpoints)
				if eps == nil {
					eps = map[uint32]string{}
				}
				eps[r] = fmt.Sprintf("tcp://10.0.0.5:%d", 6000+r)
				*w = catalog.Worker{WorkerID: 5, ModelName: "m", RoutingGroup: "g", BlockSize: 16, EventsEndpoints: eps,
					DataParallelStartRank: slices.Min(slices.Collect(maps.Keys(eps))), DataParallelSize: uint32(len(eps))}.WithDefaults()
				return nil
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Ranks()) != n {
		t.Fatalf("after %d concurrent updates the record has ranks %v", n, got.Ranks())
	}
}

func testUpdateRemove(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 6)
	mustPut(t, s, w, catalog.NoLease)
	if _, err := s.Update(ctx, w.Key(), func(*catalog.Worker, catalog.Current) error { return catalog.RemoveRecord }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, w.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get after a removing Update: %v", err)
	}
	if _, err := s.Update(ctx, w.Key(), func(*catalog.Worker, catalog.Current) error { return catalog.RemoveRecord }); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("removing a missing record: %v, want ErrNotFound", err)
	}
	mustPut(t, s, Worker("m", "h", 6), catalog.NoLease) // the id went with the record
}

func keysOf(snap catalog.Snapshot) []catalog.Key {
	var ks []catalog.Key
	for _, r := range snap.Records {
		ks = append(ks, r.Key)
	}
	slices.SortFunc(ks, cmpKey)
	return ks
}

func cmpKey(a, b catalog.Key) int {
	return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID))
}

func testListAtRevision(t *testing.T, s Testable) {
	ctx := ctxT(t)
	a, b := Worker("m", "g", 1), Worker("m", "g", 2)
	r1 := mustPut(t, s, a, catalog.NoLease)
	r2 := mustPut(t, s, b, catalog.NoLease)
	a2 := a
	a2.BlockSize = 64
	r3 := mustPut(t, s, a2, catalog.NoLease)
	if _, err := s.Delete(ctx, b.Key()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rev  int64
		want []catalog.Worker
	}{
		{r1, []catalog.Worker{a}},
		{r2, []catalog.Worker{a, b}},
		{r3, []catalog.Worker{a2, b}},
		{0, []catalog.Worker{a2}},
	} {
		snap, err := s.List(ctx, tc.rev)
		if err != nil {
			t.Fatalf("List(%d): %v", tc.rev, err)
		}
		if tc.rev != 0 && snap.Revision != tc.rev {
			t.Fatalf("List(%d).Revision = %d", tc.rev, snap.Revision)
		}
		if tc.rev == 0 && snap.Revision <= r3 {
			t.Fatalf("List(0).Revision = %d, want after the delete (> %d)", snap.Revision, r3)
		}
		if len(snap.Records) != len(tc.want) {
			t.Fatalf("List(%d) = %d records, want %d", tc.rev, len(snap.Records), len(tc.want))
		}
		for i, rec := range snap.Records {
			if rec.Err != nil || !rec.Worker.Equal(tc.want[i]) || rec.Key != tc.want[i].Key() || rec.Path != rec.Key.Path(s.Prefix()) {
				t.Fatalf("List(%d)[%d] = %+v, want %+v", tc.rev, i, rec, tc.want[i])
			}
			if rec.ModRevision <= 0 || rec.ModRevision > snap.Revision {
				t.Fatalf("List(%d)[%d].ModRevision = %d", tc.rev, i, rec.ModRevision)
			}
		}
	}
}

// badRecords plants one good and five bad records; it returns the bad
// paths.
func badRecords(t *testing.T, s Testable) (good catalog.Worker, bad []string) {
	ctx := ctxT(t)
	good = Worker("m", "g", 1)
	mustPut(t, s, good, catalog.NoLease)
	wrongBody := Worker("m", "g", 3)
	invalid := Worker("m", "g", 4)
	invalid.BlockSize = 0
	future := Worker("m", "g", 5)
	future.Version = 2
	plants := []struct {
		path  string
		value string
	}{
		{catalog.Key{Model: "m", Group: "g", WorkerID: 2}.Path(s.Prefix()), `{"version": 1, "worker_id": 2,`},
		{catalog.Key{Model: "m", Group: "g", WorkerID: 9}.Path(s.Prefix()), mustJSON(t, wrongBody)},
		{invalid.Key().Path(s.Prefix()), mustJSON(t, invalid)},
		{future.Key().Path(s.Prefix()), mustJSON(t, future)},
		{s.Prefix() + "/workers/not-a-worker-key", mustJSON(t, good)},
	}
	for _, p := range plants {
		if _, err := s.PutRaw(ctx, p.path, []byte(p.value)); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, p.path)
	}
	return good, bad
}

func testListBadRecords(t *testing.T, s Testable) {
	ctx := ctxT(t)
	good, bad := badRecords(t, s)
	snap, err := s.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Records) != 1+len(bad) {
		t.Fatalf("List = %d records, want %d", len(snap.Records), 1+len(bad))
	}
	for _, rec := range snap.Records {
		if rec.Path == good.Key().Path(s.Prefix()) {
			if rec.Err != nil || !rec.Worker.Equal(good) {
				t.Errorf("good record: %+v", rec)
			}
			continue
		}
		if rec.Err == nil || !slices.Contains(bad, rec.Path) {
			t.Errorf("record %s: Err = %v, want a bad record", rec.Path, rec.Err)
		}
	}
	if _, err := s.Get(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 4}); err == nil || errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("Get of an invalid record: %v, want a validation error", err)
	}
}

func mustJSON(t *testing.T, w catalog.Worker) string {
	t.Helper()
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// next reads one batch from ws with a deadline.
func next(t *testing.T, ws catalog.WatchStream) []catalog.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := ws.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return evs
}

// collect reads events until it has n.
func collect(t *testing.T, ws catalog.WatchStream, n int) []catalog.Event {
	t.Helper()
	var all []catalog.Event
	for len(all) < n {
		all = append(all, next(t, ws)...)
	}
	if len(all) != n {
		t.Fatalf("got %d events, want %d: %+v", len(all), n, all)
	}
	return all
}

func testWatch(t *testing.T, s Testable) {
	ctx := ctxT(t)
	ws, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	a, b := Worker("m", "g", 1), Worker("m", "h", 2)
	ra := mustPut(t, s, a, catalog.NoLease)
	mustPut(t, s, b, catalog.NoLease)
	for _, k := range []catalog.Key{a.Key(), b.Key()} {
		if ok, err := s.Delete(ctx, k); !ok || err != nil {
			t.Fatalf("Delete(%v) = %v, %v", k, ok, err)
		}
	}
	evs := collect(t, ws, 4)
	want := []struct {
		typ catalog.EventType
		key catalog.Key
	}{{catalog.EventPut, a.Key()}, {catalog.EventPut, b.Key()}, {catalog.EventDelete, a.Key()}, {catalog.EventDelete, b.Key()}}
	for i, ev := range evs {
		if ev.Type != want[i].typ || ev.Record.Key != want[i].key || ev.Record.Err != nil {
			t.Fatalf("event %d = %v %+v, want %v %v", i, ev.Type, ev.Record, want[i].typ, want[i].key)
		}
		if i > 0 && ev.Record.ModRevision <= evs[i-1].Record.ModRevision {
			t.Fatalf("event %d at revision %d, not after %d", i, ev.Record.ModRevision, evs[i-1].Record.ModRevision)
		}
	}
	if evs[0].Record.ModRevision != ra || !evs[0].Record.Worker.Equal(a) {
		t.Fatalf("first event %+v, want the put at %d", evs[0].Record, ra)
	}
	// A closed stream or an ended context ends Next.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ws.Next(cctx); err == nil {
		t.Fatal("Next with a cancelled context returned no error")
	}
}

func testWatchFromPast(t *testing.T, s Testable) {
	ctx := ctxT(t)
	a := Worker("m", "g", 1)
	r1 := mustPut(t, s, a, catalog.NoLease)
	a.Lifecycle = catalog.LifecycleDraining
	r2 := mustPut(t, s, a, catalog.NoLease)
	ws, err := s.Watch(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	evs := collect(t, ws, 2)
	if evs[0].Record.ModRevision != r1 || evs[1].Record.ModRevision != r2 || evs[1].Record.Worker.Lifecycle != catalog.LifecycleDraining {
		t.Fatalf("replayed events %+v", evs)
	}
}

func testCompacted(t *testing.T, s Testable) {
	ctx := ctxT(t)
	r1 := mustPut(t, s, Worker("m", "g", 1), catalog.NoLease)
	mustPut(t, s, Worker("m", "g", 2), catalog.NoLease)
	r3 := mustPut(t, s, Worker("m", "g", 3), catalog.NoLease)
	if err := s.Compact(ctx, r3); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	if _, err := s.List(ctx, r1); !errors.Is(err, catalog.ErrCompacted) {
		t.Fatalf("List at a compacted revision: %v, want ErrCompacted", err)
	}
	if snap, err := s.List(ctx, r3); err != nil || len(snap.Records) != 3 {
		t.Fatalf("List at the compaction revision: %d records, %v", len(snap.Records), err)
	}
	ws, err := s.Watch(ctx, r1+1)
	if err == nil {
		defer ws.Close()
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = ws.Next(nctx)
	}
	if !errors.Is(err, catalog.ErrCompacted) {
		t.Fatalf("Watch from a compacted revision: %v, want ErrCompacted", err)
	}
}

func testLeases(t *testing.T, s Testable) {
	ctx := ctxT(t)
	lease, err := s.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a, b, p := Worker("m", "g", 1), Worker("m", "g", 2), Worker("m", "g", 3)
	mustPut(t, s, a, lease)
	mustPut(t, s, b, lease)
	mustPut(t, s, p, lease)
	mustPut(t, s, p, catalog.NoLease) // replaced by a persistent record: detached
	ttl, err := s.KeepAliveOnce(ctx, lease)
	if err != nil || ttl < 29*time.Second || ttl > 31*time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want 30s", ttl, err)
	}
	snap, _ := s.List(ctx, 0)
	for _, rec := range snap.Records {
		want := lease
		if rec.Key == p.Key() {
			want = catalog.NoLease
		}
		if rec.Lease != want {
			t.Fatalf("%v has lease %x, want %x", rec.Key, rec.Lease, want)
		}
	}
	ws, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := s.Revoke(ctx, lease); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	evs := collect(t, ws, 2)
	if evs[0].Type != catalog.EventDelete || evs[1].Type != catalog.EventDelete || evs[0].Record.ModRevision != evs[1].Record.ModRevision {
		t.Fatalf("revoke events %+v, want two deletes at one revision", evs)
	}
	if _, err := s.Get(ctx, a.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get after Revoke: %v", err)
	}
	if _, err := s.Get(ctx, p.Key()); err != nil {
		t.Fatalf("the detached record went with the lease: %v", err)
	}
	if _, err := s.KeepAliveOnce(ctx, lease); !errors.Is(err, catalog.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce after Revoke: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.Put(ctx, a, lease); !errors.Is(err, catalog.ErrLeaseNotFound) {
		t.Fatalf("Put with a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if err := s.Revoke(ctx, lease); !errors.Is(err, catalog.ErrLeaseNotFound) {
		t.Fatalf("second Revoke: %v, want ErrLeaseNotFound", err)
	}
}

func testLeaseExpiry(t *testing.T, s Testable) {
	ctx := ctxT(t)
	lease, err := s.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := s.KeepAliveOnce(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	w := Worker("m", "g", 1)
	mustPut(t, s, w, lease)
	start := time.Now()
	testsupport.Eventually(t, ttl+3*time.Second, "the record to expire", func() bool {
		_, err := s.Get(ctx, w.Key())
		return errors.Is(err, catalog.ErrNotFound)
	})
	t.Logf("record expired %v after the last renewal (TTL %v)", time.Since(start).Round(time.Millisecond), ttl)
	if _, err := s.KeepAliveOnce(ctx, lease); !errors.Is(err, catalog.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce of an expired lease: %v, want ErrLeaseNotFound", err)
	}
}

// runSession runs s.Run until the test ends, and checks what it returned.
func runSession(t *testing.T, sess *catalog.Session) (cancel func()) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sess.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancelCtx()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Session.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func testSessionRegisterClose(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 42)
	bad := w
	bad.DataParallelSize = 0
	if _, err := catalog.Register(ctx, s, bad, 5*time.Second); err == nil {
		t.Fatal("Register of an invalid record succeeded")
	}
	sess, err := catalog.Register(ctx, s, w, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	runSession(t, sess)
	snap, err := s.List(ctx, 0)
	if err != nil || len(snap.Records) != 1 || snap.Records[0].Lease != sess.Lease() || !snap.Records[0].Worker.Equal(w) {
		t.Fatalf("after Register: %+v, %v", snap, err)
	}
	done := sess.Done()
	if err := sess.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Get(ctx, w.Key()); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("Get right after Close: %v, want ErrNotFound", err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Done not closed by Close")
	}
	if err := sess.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func testSessionReregisters(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 42)
	sess, err := catalog.Register(ctx, s, w, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	runSession(t, sess)
	old, done := sess.Lease(), sess.Done()
	// The lease is lost behind the session's back (as when etcd expired it).
	if err := s.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the lease was revoked")
	}
	testsupport.Eventually(t, 10*time.Second, "re-registration", func() bool {
		got, err := s.Get(ctx, w.Key())
		return err == nil && got.Equal(w) && sess.Lease() != old
	})
	snap, _ := s.List(ctx, 0)
	if len(snap.Records) != 1 || snap.Records[0].Lease != sess.Lease() {
		t.Fatalf("after re-registration: %+v (session lease %x)", snap.Records, sess.Lease())
	}
	select {
	case <-sess.Done():
		t.Fatal("Done of the new lease is closed")
	default:
	}
}

func testSessionUpdate(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w := Worker("m", "g", 42)
	sess, err := catalog.Register(ctx, s, w, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	w.Lifecycle = catalog.LifecycleDraining
	if err := sess.Update(ctx, w); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, w.Key()); err != nil || got.Lifecycle != catalog.LifecycleDraining {
		t.Fatalf("after Update: %+v, %v", got, err)
	}
	moved := w
	moved.RoutingGroup = "other"
	if err := sess.Update(ctx, moved); err == nil {
		t.Fatal("Update moved the record to another group")
	}
}

// changeLog collects a Watcher's changes.
type changeLog struct {
	ch  chan catalog.Change
	bad chan string
}

func newChangeLog() *changeLog {
	return &changeLog{ch: make(chan catalog.Change, 1000), bad: make(chan string, 1000)}
}

func (l *changeLog) config() catalog.WatcherConfig {
	return catalog.WatcherConfig{
		OnChange:    func(c catalog.Change) { l.ch <- c },
		OnBadRecord: func(path string, err error) { l.bad <- path },
		RetryMin:    10 * time.Millisecond,
		RetryMax:    200 * time.Millisecond,
	}
}

// ChangeString is a compact form of a change for comparisons in tests:
// "added m/g/1".
func ChangeString(c catalog.Change) string {
	return fmt.Sprintf("%v %s/%s/%d", c.Kind, c.Key.Model, c.Key.Group, c.Key.WorkerID)
}

// expect reads len(want) changes and compares their ChangeStrings.
func (l *changeLog) expect(t *testing.T, want ...string) []catalog.Change {
	t.Helper()
	var got []catalog.Change
	var gotS []string
	timeout := time.After(15 * time.Second)
	for len(got) < len(want) {
		select {
		case c := <-l.ch:
			got = append(got, c)
			gotS = append(gotS, ChangeString(c))
		case <-timeout:
			t.Fatalf("changes %q, then nothing for 15s; want %q", gotS, want)
		}
	}
	if !slices.Equal(gotS, want) {
		t.Fatalf("changes %q, want %q", gotS, want)
	}
	return got
}

// runWatcher runs a Watcher until the test ends and waits for Synced.
func runWatcher(t *testing.T, src catalog.WatchSource, cfg catalog.WatcherConfig) *catalog.Watcher {
	t.Helper()
	w := catalog.NewWatcher(src, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watcher.Run returned %v, want context.Canceled", err)
		}
	})
	select {
	case <-w.Synced():
	case err := <-done:
		t.Fatalf("Watcher.Run returned before syncing: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("watcher not synced after 15s")
	}
	return w
}

func testWatcherChanges(t *testing.T, s Testable) {
	ctx := ctxT(t)
	a, b := Worker("m", "g", 1), Worker("m", "g", 2)
	mustPut(t, s, a, catalog.NoLease)
	mustPut(t, s, b, catalog.NoLease)
	log := newChangeLog()
	w := runWatcher(t, s, log.config())
	log.expect(t, "added m/g/1", "added m/g/2") // delivered before Synced
	if st := w.Stats(); st.Workers != 2 || st.Resyncs != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Rewriting an identical record is no change; a new endpoint is.
	mustPut(t, s, a, catalog.NoLease)
	a2 := a
	a2.EventsEndpoint = "tcp://10.9.9.9:5557"
	mustPut(t, s, a2, catalog.NoLease)
	c := log.expect(t, "updated m/g/1")[0]
	if !c.Worker.Equal(a2) || !c.Old.Equal(a) {
		t.Fatalf("update carried new %+v old %+v", c.Worker, c.Old)
	}
	if _, err := s.Delete(ctx, b.Key()); err != nil {
		t.Fatal(err)
	}
	c = log.expect(t, "removed m/g/2")[0]
	if !c.Worker.Equal(b) {
		t.Fatalf("removal carried %+v, want the last record", c.Worker)
	}
	// A leased record goes with its lease.
	lease, err := s.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, Worker("m", "h", 3), lease)
	log.expect(t, "added m/h/3")
	if err := s.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	log.expect(t, "removed m/h/3")
	if st := w.Stats(); st.Workers != 1 {
		t.Fatalf("stats %+v, want 1 worker", st)
	}
}

func testWatcherBadRecords(t *testing.T, s Testable) {
	ctx := ctxT(t)
	_, bad := badRecords(t, s)
	log := newChangeLog()
	w := runWatcher(t, s, log.config())
	log.expect(t, "added m/g/1")
	if st := w.Stats(); st.BadRecords != uint64(len(bad)) {
		t.Fatalf("BadRecords = %d, want %d", st.BadRecords, len(bad))
	}
	// A bad write over a good record is counted and ignored: the worker
	// keeps its record; the next good write is compared with that.
	good := Worker("m", "g", 1)
	path := good.Key().Path(s.Prefix())
	if _, err := s.PutRaw(ctx, path, []byte(`{"version":1}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-drain(log.bad, len(bad)):
		if p != path {
			t.Fatalf("bad record reported at %s, want %s", p, path)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bad write not reported")
	}
	good2 := good
	good2.BlockSize = 32
	mustPut(t, s, good2, catalog.NoLease)
	c := log.expect(t, "updated m/g/1")[0]
	if !c.Old.Equal(good) {
		t.Fatalf("Old = %+v, want the last good record", c.Old)
	}
	// Deleting a bad record's key delivers nothing (it was never delivered).
	if _, err := s.Delete(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 4}); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, Worker("m", "g", 100), catalog.NoLease)
	log.expect(t, "added m/g/100")
	if st := w.Stats(); st.BadRecords != uint64(len(bad))+1 {
		t.Fatalf("BadRecords = %d, want %d", st.BadRecords, len(bad)+1)
	}
}

// testWatcherOneRecordPerID: records that share a worker id (written
// around the store's id check, e.g. by an older version) are delivered
// one at a time: the first keeps the id, the others are bad records until
// it goes.
func testWatcherOneRecordPerID(t *testing.T, s Testable) {
	ctx := ctxT(t)
	plant := func(w catalog.Worker) {
		t.Helper()
		if _, err := s.PutRaw(ctx, w.Key().Path(s.Prefix()), []byte(mustJSON(t, w))); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := Worker("m", "b", 5), Worker("m", "a", 5), Worker("m", "c", 5)
	plant(a)
	plant(b)
	log := newChangeLog()
	w := runWatcher(t, s, log.config())
	log.expect(t, "added m/a/5") // after a list, the lowest path
	if p := <-log.bad; p != a.Key().Path(s.Prefix()) {
		t.Fatalf("bad record %s, want the shadowed %s", p, a.Key().Path(s.Prefix()))
	}
	plant(c) // while watching: the delivered record keeps the id
	if p := <-log.bad; p != c.Key().Path(s.Prefix()) {
		t.Fatalf("bad record %s, want %s", p, c.Key().Path(s.Prefix()))
	}
	if st := w.Stats(); st.Workers != 1 || st.BadRecords != 2 {
		t.Fatalf("Stats = %+v, want 1 worker and 2 bad records", st)
	}
	if _, err := s.Delete(ctx, b.Key()); err != nil {
		t.Fatal(err)
	}
	log.expect(t, "removed m/a/5", "added m/b/5") // the lowest shadowed record takes the id
	if _, err := s.Delete(ctx, a.Key()); err != nil {
		t.Fatal(err)
	}
	log.expect(t, "removed m/b/5", "added m/c/5")
}

// drain returns a channel that yields the element of ch after skipping n.
func drain(ch chan string, n int) <-chan string {
	for range n {
		<-ch
	}
	return ch
}

// gatedSource holds the Watcher's Watch calls until released.
type gatedSource struct {
	catalog.WatchSource
	waiting chan int64    // receives the revision of each held Watch call
	release chan struct{} // one receive per held call
	held    bool
	mu      sync.Mutex
}

func (g *gatedSource) Watch(ctx context.Context, rev int64) (catalog.WatchStream, error) {
	g.mu.Lock()
	hold := !g.held
	g.held = true
	g.mu.Unlock()
	if hold {
		g.waiting <- rev
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.WatchSource.Watch(ctx, rev)
}

func testWatcherCompaction(t *testing.T, s Testable) {
	ctx := ctxT(t)
	w1 := Worker("m", "g", 1)
	mustPut(t, s, w1, catalog.NoLease)
	g := &gatedSource{WatchSource: s, waiting: make(chan int64, 1), release: make(chan struct{})}
	log := newChangeLog()
	w := runWatcher(t, g, log.config())
	log.expect(t, "added m/g/1")
	var from int64
	select {
	case from = <-g.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("watcher never opened its watch")
	}
	// While the watcher is between its list and its watch: changes, then
	// a compaction past the revision it will watch from.
	w2, w3 := Worker("m", "g", 2), Worker("m", "g", 3)
	mustPut(t, s, w2, catalog.NoLease)
	mustPut(t, s, w3, catalog.NoLease)
	if _, err := s.Delete(ctx, w3.Key()); err != nil { // never seen by the watcher
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, w1.Key()); err != nil {
		t.Fatal(err)
	}
	rev := mustPut(t, s, Worker("other", "g", 9), catalog.NoLease)
	if err := s.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if from >= rev {
		t.Fatalf("watch from %d is not below the compaction at %d", from, rev)
	}
	close(g.release)
	log.expect(t, "removed m/g/1", "added m/g/2", "added other/g/9")
	// The watch after the re-list works, and nothing was delivered twice.
	mustPut(t, s, Worker("m", "g", 4), catalog.NoLease)
	log.expect(t, "added m/g/4")
	if st := w.Stats(); st.Resyncs != 1 || st.Workers != 3 {
		t.Fatalf("stats %+v, want 1 resync and 3 workers", st)
	}
}

// StartEtcd starts an embedded etcd for t in a temporary directory on
// free loopback ports (fsync off), stopped when t ends.
func StartEtcd(t testing.TB) *etcdstore.Embedded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	e, err := etcdstore.StartEmbedded(ctx, etcdstore.EmbeddedConfig{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Logf("embedded etcd on %s started in %v", e.Endpoints()[0], time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { e.Close() })
	return e
}

// EtcdStore is a etcdstore.Store with the suite's raw-write hook, on a
// client of its own: writing unvalidated records is for tests, so the
// production store has no such method.
type EtcdStore struct {
	*etcdstore.Store
	raw *clientv3.Client
}

// PutRaw writes value under path with no validation and no lease, to
// plant bad records.
func (s *EtcdStore) PutRaw(ctx context.Context, path string, value []byte) (int64, error) {
	resp, err := s.raw.Put(ctx, path, string(value))
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", path, err)
	}
	return resp.Header.Revision, nil
}

// NewEtcdStore connects a store to endpoints under prefix, closed when t
// ends.
func NewEtcdStore(t testing.TB, endpoints []string, prefix string) *EtcdStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: endpoints, Prefix: prefix})
	if err != nil {
		t.Fatalf("connect to etcd: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	raw, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("connect to etcd: %v", err)
	}
	t.Cleanup(func() { raw.Close() })
	return &EtcdStore{Store: s, raw: raw}
}
