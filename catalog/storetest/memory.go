package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prefixd/prefixd/catalog"
)

// DefaultMemoryHistory is how many past events a MemoryStore keeps for
// watches and lists at older revisions before compacting them away.
const DefaultMemoryHistory = 10000

// MemoryStore is an in-process catalog.Store with etcd's semantics: one revision
// counter bumped by every write (a multi-key delete or a lease expiry is
// one revision), lists at past revisions and watches from them while the
// history holds them, catalog.ErrCompacted after it does not, and leases that
// expire TTL after their last renewal. It is for tests and single-process
// use; it is safe for concurrent use.
//
// Lease expiry runs on time.AfterFunc timers (no goroutine lives between
// expiries); Close stops them.
type MemoryStore struct {
	prefix  string
	history int

	mu        sync.Mutex // guards everything below
	rev       int64
	compacted int64 // revisions below this are gone from history
	kvs       map[string]memKV
	events    []memEvent // revision order, all > compacted-1
	leases    map[catalog.LeaseID]*memLease
	nextLease catalog.LeaseID
	changed   chan struct{} // closed and replaced on every write
	closed    bool
}

type memKV struct {
	value  []byte
	modRev int64
	lease  catalog.LeaseID
}

type memEvent struct {
	rev     int64
	path    string
	value   []byte
	deleted bool
	lease   catalog.LeaseID
	prev    memKV // what the key held before
	hadPrev bool
}

type memLease struct {
	ttl      time.Duration
	deadline time.Time
	keys     map[string]bool
	timer    *time.Timer
}

var _ catalog.Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store whose keys live under prefix
// (catalog.DefaultPrefix if empty) and which keeps DefaultMemoryHistory events.
func NewMemoryStore(prefix string) *MemoryStore {
	return &MemoryStore{
		prefix:    catalog.NormPrefix(prefix),
		history:   DefaultMemoryHistory,
		rev:       1, // like etcd, a new store is at revision 1
		compacted: 0,
		kvs:       make(map[string]memKV),
		leases:    make(map[catalog.LeaseID]*memLease),
		nextLease: 0x1000,
		changed:   make(chan struct{}),
	}
}

// Prefix returns the key prefix.
func (s *MemoryStore) Prefix() string { return s.prefix }

// Close stops lease timers and ends open watches. The store must not be
// used afterwards.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, l := range s.leases {
		l.timer.Stop()
	}
	close(s.changed)
	return nil
}

// Put implements catalog.Registrar.
func (s *MemoryStore) Put(ctx context.Context, w catalog.Worker, lease catalog.LeaseID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b, err := catalog.EncodeRecord(w)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, catalog.ErrStoreClosed
	}
	if lease != catalog.NoLease {
		if _, ok := s.leases[lease]; !ok {
			return 0, fmt.Errorf("put %v with lease %x: %w", w.Key(), lease, catalog.ErrLeaseNotFound)
		}
	}
	if err := s.inUse(w.Key()); err != nil {
		return 0, err
	}
	s.rev++
	s.setRecord(w.Key(), b, lease)
	s.notify()
	return s.rev, nil
}

// Update implements catalog.Store. fn runs without the store's lock; the write
// happens only if the record is still the one fn saw.
func (s *MemoryStore) Update(ctx context.Context, k catalog.Key, fn catalog.UpdateFunc) (int64, error) {
	path := k.Path(s.prefix)
	for range catalog.MaxUpdateAttempts {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s.mu.Lock()
		kv, exists := s.kvs[path]
		s.mu.Unlock()
		w := catalog.Worker{ModelName: k.Model, RoutingGroup: k.Group, WorkerID: k.WorkerID}
		var cur catalog.Current
		if exists {
			rec := catalog.DecodeRecord(s.prefix, path, kv.value, false, kv.modRev, kv.lease)
			if rec.Err != nil {
				return 0, fmt.Errorf("update %v: stored record is bad: %w", k, rec.Err)
			}
			w, cur = rec.Worker, catalog.Current{Exists: true, Lease: kv.lease, ModRevision: kv.modRev}
		}
		var b []byte
		switch err := fn(&w, cur); {
		case errors.Is(err, catalog.RemoveRecord) && !exists:
			return 0, fmt.Errorf("update %v: %w", k, catalog.ErrNotFound)
		case errors.Is(err, catalog.RemoveRecord):
		case err != nil:
			return 0, err
		case w.Key() != k:
			return 0, fmt.Errorf("update %v: the update moved the record to %v", k, w.Key())
		default:
			var err error
			if b, err = catalog.EncodeRecord(w); err != nil {
				return 0, err
			}
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, catalog.ErrStoreClosed
		}
		if now, ok := s.kvs[path]; ok != exists || now.modRev != kv.modRev {
			s.mu.Unlock()
			continue // changed since read
		}
		if b != nil {
			if err := s.inUse(k); err != nil {
				s.mu.Unlock()
				return 0, err
			}
		}
		s.rev++
		if b == nil {
			s.delRecord(k)
		} else {
			s.setRecord(k, b, kv.lease)
		}
		s.notify()
		rev := s.rev
		s.mu.Unlock()
		return rev, nil
	}
	return 0, fmt.Errorf("update %v: %w", k, catalog.ErrContended)
}

// inUse returns an *catalog.IDInUseError if k's id is claimed by another record
// that still exists. Called with s.mu held.
func (s *MemoryStore) inUse(k catalog.Key) error {
	c, ok := s.kvs[catalog.IDClaimPath(s.prefix, k.WorkerID)]
	if !ok || string(c.value) == k.Path(s.prefix) {
		return nil
	}
	holder, ok := s.kvs[string(c.value)]
	if !ok {
		return nil // stale claim
	}
	hk, err := catalog.ParseKey(s.prefix, string(c.value))
	if err != nil {
		return nil
	}
	return &catalog.IDInUseError{ID: k.WorkerID, Holder: hk, Lease: holder.lease}
}

// setRecord writes k's record and its id claim at s.rev. Called with
// s.mu held.
func (s *MemoryStore) setRecord(k catalog.Key, value []byte, lease catalog.LeaseID) {
	path := k.Path(s.prefix)
	s.set(catalog.IDClaimPath(s.prefix, k.WorkerID), []byte(path), lease)
	s.set(path, value, lease)
}

// delRecord deletes k's record and, if it names the record, its claim.
// Called with s.mu held.
func (s *MemoryStore) delRecord(k catalog.Key) bool {
	path := k.Path(s.prefix)
	claim := catalog.IDClaimPath(s.prefix, k.WorkerID)
	if c, ok := s.kvs[claim]; ok && string(c.value) == path {
		s.del(claim)
	}
	return s.del(path)
}

// set writes path at s.rev. Called with s.mu held.
func (s *MemoryStore) set(path string, value []byte, lease catalog.LeaseID) {
	prev, had := s.kvs[path]
	if had && prev.lease != catalog.NoLease {
		if l := s.leases[prev.lease]; l != nil {
			delete(l.keys, path)
		}
	}
	s.kvs[path] = memKV{value: value, modRev: s.rev, lease: lease}
	if lease != catalog.NoLease {
		s.leases[lease].keys[path] = true
	}
	s.record(memEvent{rev: s.rev, path: path, value: value, lease: lease, prev: prev, hadPrev: had})
}

// del deletes path at s.rev. Called with s.mu held.
func (s *MemoryStore) del(path string) bool {
	prev, had := s.kvs[path]
	if !had {
		return false
	}
	if prev.lease != catalog.NoLease {
		if l := s.leases[prev.lease]; l != nil {
			delete(l.keys, path)
		}
	}
	delete(s.kvs, path)
	s.record(memEvent{rev: s.rev, path: path, deleted: true, prev: prev, hadPrev: true})
	return true
}

// record appends to the history, compacting the oldest revisions beyond
// the limit. Called with s.mu held.
func (s *MemoryStore) record(e memEvent) {
	s.events = append(s.events, e)
	if over := len(s.events) - s.history; over > 0 {
		// Compact whole revisions, never the current one.
		s.compactLocked(min(s.events[over-1].rev+1, s.rev))
	}
}

// notify wakes watches. Called with s.mu held.
func (s *MemoryStore) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Get implements catalog.Store.
func (s *MemoryStore) Get(ctx context.Context, k catalog.Key) (catalog.Worker, error) {
	if err := ctx.Err(); err != nil {
		return catalog.Worker{}, err
	}
	path := k.Path(s.prefix)
	s.mu.Lock()
	kv, ok := s.kvs[path]
	s.mu.Unlock()
	if !ok {
		return catalog.Worker{}, fmt.Errorf("get %v: %w", k, catalog.ErrNotFound)
	}
	rec := catalog.DecodeRecord(s.prefix, path, kv.value, false, kv.modRev, kv.lease)
	if rec.Err != nil {
		return catalog.Worker{}, fmt.Errorf("get %v: %w", k, rec.Err)
	}
	return rec.Worker, nil
}

// Delete implements catalog.Store.
func (s *MemoryStore) Delete(ctx context.Context, k catalog.Key) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, catalog.ErrStoreClosed
	}
	if _, ok := s.kvs[k.Path(s.prefix)]; !ok {
		return false, nil
	}
	s.rev++
	s.delRecord(k)
	s.notify()
	return true, nil
}

// Keys implements catalog.Store.
func (s *MemoryStore) Keys(ctx context.Context, model string, id uint64) ([]catalog.Key, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mp := catalog.ModelPrefix(s.prefix, model)
	s.mu.Lock()
	var paths []string
	for p := range s.kvs {
		if strings.HasPrefix(p, mp) {
			paths = append(paths, p)
		}
	}
	s.mu.Unlock()
	slices.Sort(paths)
	var out []catalog.Key
	for _, p := range paths {
		if k, err := catalog.ParseKey(s.prefix, p); err == nil && k.WorkerID == id {
			out = append(out, k)
		}
	}
	return out, nil
}

// List implements catalog.WatchSource.
func (s *MemoryStore) List(ctx context.Context, rev int64) (catalog.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return catalog.Snapshot{}, err
	}
	s.mu.Lock()
	if rev == 0 || rev >= s.rev {
		if rev > s.rev {
			cur := s.rev
			s.mu.Unlock()
			return catalog.Snapshot{}, fmt.Errorf("list at revision %d: future revision (current %d)", rev, cur)
		}
		rev = s.rev
	}
	if rev < s.compacted {
		compacted := s.compacted
		s.mu.Unlock()
		return catalog.Snapshot{}, fmt.Errorf("list at revision %d (compacted at %d): %w", rev, compacted, catalog.ErrCompacted)
	}
	wp := catalog.WorkersPrefix(s.prefix)
	state := make(map[string]memKV, len(s.kvs))
	for p, kv := range s.kvs {
		if strings.HasPrefix(p, wp) {
			state[p] = kv
		}
	}
	// Undo the events after rev, newest first.
	for i := len(s.events) - 1; i >= 0 && s.events[i].rev > rev; i-- {
		e := s.events[i]
		if !strings.HasPrefix(e.path, wp) {
			continue
		}
		if e.hadPrev {
			state[e.path] = e.prev
		} else {
			delete(state, e.path)
		}
	}
	s.mu.Unlock()
	snap := catalog.Snapshot{Revision: rev, Records: make([]catalog.Record, 0, len(state))}
	for _, p := range slices.Sorted(maps.Keys(state)) {
		kv := state[p]
		snap.Records = append(snap.Records, catalog.DecodeRecord(s.prefix, p, kv.value, false, kv.modRev, kv.lease))
	}
	return snap, nil
}

// Compact drops the history below rev, as etcd's compaction does: lists
// and watches at revisions below rev then fail with catalog.ErrCompacted.
func (s *MemoryStore) Compact(ctx context.Context, rev int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev > s.rev {
		return fmt.Errorf("compact at revision %d: future revision (current %d)", rev, s.rev)
	}
	if rev <= s.compacted {
		return fmt.Errorf("compact at revision %d (compacted at %d): %w", rev, s.compacted, catalog.ErrCompacted)
	}
	s.compactLocked(rev)
	return nil
}

func (s *MemoryStore) compactLocked(rev int64) {
	i := 0
	for i < len(s.events) && s.events[i].rev < rev {
		i++
	}
	s.events = slices.Clone(s.events[i:])
	s.compacted = rev
}

// Watch implements catalog.WatchSource.
func (s *MemoryStore) Watch(ctx context.Context, rev int64) (catalog.WatchStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev == 0 {
		rev = s.rev + 1
	}
	ctx, cancel := context.WithCancel(ctx)
	return &memWatch{s: s, next: rev, ctx: ctx, cancel: cancel}, nil
}

type memWatch struct {
	s      *MemoryStore
	next   int64 // first revision not yet delivered
	ctx    context.Context
	cancel context.CancelFunc
}

func (w *memWatch) Close() { w.cancel() }

func (w *memWatch) Next(ctx context.Context) ([]catalog.Event, error) {
	for {
		s := w.s
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, catalog.ErrStoreClosed
		}
		if w.next < s.compacted {
			err := fmt.Errorf("watch from revision %d (compacted at %d): %w", w.next, s.compacted, catalog.ErrCompacted)
			s.mu.Unlock()
			return nil, err
		}
		i, _ := slices.BinarySearchFunc(s.events, w.next, func(e memEvent, rev int64) int {
			switch {
			case e.rev < rev:
				return -1
			case e.rev > rev:
				return 1
			}
			return 0
		})
		var evs []catalog.Event
		wp := catalog.WorkersPrefix(s.prefix)
		for ; i < len(s.events); i++ {
			e := s.events[i]
			if !strings.HasPrefix(e.path, wp) {
				continue // an id claim
			}
			ev := catalog.Event{Type: catalog.EventPut}
			if e.deleted {
				ev.Type = catalog.EventDelete
			}
			ev.Record = catalog.DecodeRecord(s.prefix, e.path, e.value, e.deleted, e.rev, e.lease)
			evs = append(evs, ev)
		}
		if len(s.events) > 0 {
			w.next = max(w.next, s.events[len(s.events)-1].rev+1)
		}
		if len(evs) > 0 {
			s.mu.Unlock()
			return evs, nil
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.ctx.Done():
			return nil, fmt.Errorf("watch closed: %w", w.ctx.Err())
		case <-changed:
		}
	}
}

// Grant implements catalog.Registrar. The TTL is rounded up to whole seconds.
func (s *MemoryStore) Grant(ctx context.Context, ttl time.Duration) (catalog.LeaseID, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, catalog.ErrStoreClosed
	}
	s.nextLease++
	id := s.nextLease
	d := time.Duration(catalog.TTLSeconds(ttl)) * time.Second
	l := &memLease{ttl: d, deadline: time.Now().Add(d), keys: make(map[string]bool)}
	l.timer = time.AfterFunc(d, func() { s.expire(id) })
	s.leases[id] = l
	return id, nil
}

// expire runs on a lease's timer: it revokes the lease if its deadline
// has passed, or re-arms the timer for the rest.
func (s *MemoryStore) expire(id catalog.LeaseID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil || s.closed {
		return
	}
	if left := time.Until(l.deadline); left > 0 {
		l.timer.Reset(left)
		return
	}
	s.revokeLocked(id, l)
}

func (s *MemoryStore) revokeLocked(id catalog.LeaseID, l *memLease) {
	l.timer.Stop()
	delete(s.leases, id)
	if len(l.keys) == 0 {
		return
	}
	s.rev++
	for _, p := range slices.Sorted(maps.Keys(l.keys)) {
		s.del(p)
	}
	s.notify()
}

// KeepAliveOnce implements catalog.Registrar.
func (s *MemoryStore) KeepAliveOnce(ctx context.Context, id catalog.LeaseID) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return 0, fmt.Errorf("keep lease %x alive: %w", id, catalog.ErrLeaseNotFound)
	}
	l.deadline = time.Now().Add(l.ttl)
	return l.ttl, nil
}

// Revoke implements catalog.Registrar.
func (s *MemoryStore) Revoke(ctx context.Context, id catalog.LeaseID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return fmt.Errorf("revoke lease %x: %w", id, catalog.ErrLeaseNotFound)
	}
	s.revokeLocked(id, l)
	return nil
}

// ExpireLease ends lease id at once as if its TTL had passed without a
// renewal (a crashed registrant), for tests that must not wait a TTL.
func (s *MemoryStore) ExpireLease(id catalog.LeaseID) error {
	return s.Revoke(context.Background(), id)
}

// PutRaw writes value under path with no validation and no lease, for
// tests that plant bad records.
func (s *MemoryStore) PutRaw(ctx context.Context, path string, value []byte) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, catalog.ErrStoreClosed
	}
	s.rev++
	s.set(path, bytes.Clone(value), catalog.NoLease)
	s.notify()
	return s.rev, nil
}
