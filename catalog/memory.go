package catalog

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
)

// DefaultMemoryHistory is how many past events a MemoryStore keeps for
// watches and lists at older revisions before compacting them away.
const DefaultMemoryHistory = 10000

// MemoryStore is an in-process Store with etcd's semantics: one revision
// counter bumped by every write (a multi-key delete or a lease expiry is
// one revision), lists at past revisions and watches from them while the
// history holds them, ErrCompacted after it does not, and leases that
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
	leases    map[LeaseID]*memLease
	nextLease LeaseID
	changed   chan struct{} // closed and replaced on every write
	closed    bool
}

type memKV struct {
	value  []byte
	modRev int64
	lease  LeaseID
}

type memEvent struct {
	rev     int64
	path    string
	value   []byte
	deleted bool
	lease   LeaseID
	prev    memKV // what the key held before
	hadPrev bool
}

type memLease struct {
	ttl      time.Duration
	deadline time.Time
	keys     map[string]bool
	timer    *time.Timer
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store whose keys live under prefix
// (DefaultPrefix if empty) and which keeps DefaultMemoryHistory events.
func NewMemoryStore(prefix string) *MemoryStore {
	return &MemoryStore{
		prefix:    normPrefix(prefix),
		history:   DefaultMemoryHistory,
		rev:       1, // like etcd, a new store is at revision 1
		compacted: 0,
		kvs:       make(map[string]memKV),
		leases:    make(map[LeaseID]*memLease),
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

// Put implements Registrar.
func (s *MemoryStore) Put(ctx context.Context, w Worker, lease LeaseID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b, err := encodeForPut(w)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errStoreClosed
	}
	if lease != NoLease {
		if _, ok := s.leases[lease]; !ok {
			return 0, fmt.Errorf("put %v with lease %x: %w", w.Key(), lease, ErrLeaseNotFound)
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

// Update implements Store. fn runs without the store's lock; the write
// happens only if the record is still the one fn saw.
func (s *MemoryStore) Update(ctx context.Context, k Key, fn UpdateFunc) (int64, error) {
	path := k.Path(s.prefix)
	for range maxUpdateAttempts {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s.mu.Lock()
		kv, exists := s.kvs[path]
		s.mu.Unlock()
		w := Worker{ModelName: k.Model, RoutingGroup: k.Group, WorkerID: k.WorkerID}
		var cur Current
		if exists {
			rec := decodeRecord(s.prefix, path, kv.value, false, kv.modRev, kv.lease)
			if rec.Err != nil {
				return 0, fmt.Errorf("update %v: stored record is bad: %w", k, rec.Err)
			}
			w, cur = rec.Worker, Current{Exists: true, Lease: kv.lease, ModRevision: kv.modRev}
		}
		var b []byte
		switch err := fn(&w, cur); {
		case errors.Is(err, RemoveRecord) && !exists:
			return 0, fmt.Errorf("update %v: %w", k, ErrNotFound)
		case errors.Is(err, RemoveRecord):
		case err != nil:
			return 0, err
		case w.Key() != k:
			return 0, fmt.Errorf("update %v: the update moved the record to %v", k, w.Key())
		default:
			var err error
			if b, err = encodeForPut(w); err != nil {
				return 0, err
			}
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, errStoreClosed
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
	return 0, fmt.Errorf("update %v: %w", k, errContended)
}

// inUse returns an *IDInUseError if k's id is claimed by another record
// that still exists. Called with s.mu held.
func (s *MemoryStore) inUse(k Key) error {
	c, ok := s.kvs[idPath(s.prefix, k.WorkerID)]
	if !ok || string(c.value) == k.Path(s.prefix) {
		return nil
	}
	holder, ok := s.kvs[string(c.value)]
	if !ok {
		return nil // stale claim
	}
	hk, err := ParseKey(s.prefix, string(c.value))
	if err != nil {
		return nil
	}
	return &IDInUseError{ID: k.WorkerID, Holder: hk, Lease: holder.lease}
}

// setRecord writes k's record and its id claim at s.rev. Called with
// s.mu held.
func (s *MemoryStore) setRecord(k Key, value []byte, lease LeaseID) {
	path := k.Path(s.prefix)
	s.set(idPath(s.prefix, k.WorkerID), []byte(path), lease)
	s.set(path, value, lease)
}

// delRecord deletes k's record and, if it names the record, its claim.
// Called with s.mu held.
func (s *MemoryStore) delRecord(k Key) bool {
	path := k.Path(s.prefix)
	claim := idPath(s.prefix, k.WorkerID)
	if c, ok := s.kvs[claim]; ok && string(c.value) == path {
		s.del(claim)
	}
	return s.del(path)
}

// set writes path at s.rev. Called with s.mu held.
func (s *MemoryStore) set(path string, value []byte, lease LeaseID) {
	prev, had := s.kvs[path]
	if had && prev.lease != NoLease {
		if l := s.leases[prev.lease]; l != nil {
			delete(l.keys, path)
		}
	}
	s.kvs[path] = memKV{value: value, modRev: s.rev, lease: lease}
	if lease != NoLease {
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
	if prev.lease != NoLease {
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

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, k Key) (Worker, error) {
	if err := ctx.Err(); err != nil {
		return Worker{}, err
	}
	path := k.Path(s.prefix)
	s.mu.Lock()
	kv, ok := s.kvs[path]
	s.mu.Unlock()
	if !ok {
		return Worker{}, fmt.Errorf("get %v: %w", k, ErrNotFound)
	}
	rec := decodeRecord(s.prefix, path, kv.value, false, kv.modRev, kv.lease)
	if rec.Err != nil {
		return Worker{}, fmt.Errorf("get %v: %w", k, rec.Err)
	}
	return rec.Worker, nil
}

// Delete implements Store.
func (s *MemoryStore) Delete(ctx context.Context, k Key) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, errStoreClosed
	}
	if _, ok := s.kvs[k.Path(s.prefix)]; !ok {
		return false, nil
	}
	s.rev++
	s.delRecord(k)
	s.notify()
	return true, nil
}

// Keys implements Store.
func (s *MemoryStore) Keys(ctx context.Context, model string, id uint64) ([]Key, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mp := modelPrefix(s.prefix, model)
	s.mu.Lock()
	var paths []string
	for p := range s.kvs {
		if strings.HasPrefix(p, mp) {
			paths = append(paths, p)
		}
	}
	s.mu.Unlock()
	slices.Sort(paths)
	var out []Key
	for _, p := range paths {
		if k, err := ParseKey(s.prefix, p); err == nil && k.WorkerID == id {
			out = append(out, k)
		}
	}
	return out, nil
}

// List implements WatchSource.
func (s *MemoryStore) List(ctx context.Context, rev int64) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	if rev == 0 || rev >= s.rev {
		if rev > s.rev {
			cur := s.rev
			s.mu.Unlock()
			return Snapshot{}, fmt.Errorf("list at revision %d: future revision (current %d)", rev, cur)
		}
		rev = s.rev
	}
	if rev < s.compacted {
		compacted := s.compacted
		s.mu.Unlock()
		return Snapshot{}, fmt.Errorf("list at revision %d (compacted at %d): %w", rev, compacted, ErrCompacted)
	}
	wp := workersPrefix(s.prefix)
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
	snap := Snapshot{Revision: rev, Records: make([]Record, 0, len(state))}
	for _, p := range slices.Sorted(maps.Keys(state)) {
		kv := state[p]
		snap.Records = append(snap.Records, decodeRecord(s.prefix, p, kv.value, false, kv.modRev, kv.lease))
	}
	return snap, nil
}

// Compact drops the history below rev, as etcd's compaction does: lists
// and watches at revisions below rev then fail with ErrCompacted.
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
		return fmt.Errorf("compact at revision %d (compacted at %d): %w", rev, s.compacted, ErrCompacted)
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

// Watch implements WatchSource.
func (s *MemoryStore) Watch(ctx context.Context, rev int64) (WatchStream, error) {
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

func (w *memWatch) Next(ctx context.Context) ([]Event, error) {
	for {
		s := w.s
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errStoreClosed
		}
		if w.next < s.compacted {
			err := fmt.Errorf("watch from revision %d (compacted at %d): %w", w.next, s.compacted, ErrCompacted)
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
		var evs []Event
		wp := workersPrefix(s.prefix)
		for ; i < len(s.events); i++ {
			e := s.events[i]
			if !strings.HasPrefix(e.path, wp) {
				continue // an id claim
			}
			ev := Event{Type: EventPut}
			if e.deleted {
				ev.Type = EventDelete
			}
			ev.Record = decodeRecord(s.prefix, e.path, e.value, e.deleted, e.rev, e.lease)
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

// Grant implements Registrar. The TTL is rounded up to whole seconds.
func (s *MemoryStore) Grant(ctx context.Context, ttl time.Duration) (LeaseID, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errStoreClosed
	}
	s.nextLease++
	id := s.nextLease
	d := time.Duration(ttlSeconds(ttl)) * time.Second
	l := &memLease{ttl: d, deadline: time.Now().Add(d), keys: make(map[string]bool)}
	l.timer = time.AfterFunc(d, func() { s.expire(id) })
	s.leases[id] = l
	return id, nil
}

// expire runs on a lease's timer: it revokes the lease if its deadline
// has passed, or re-arms the timer for the rest.
func (s *MemoryStore) expire(id LeaseID) {
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

func (s *MemoryStore) revokeLocked(id LeaseID, l *memLease) {
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

// KeepAliveOnce implements Registrar.
func (s *MemoryStore) KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return 0, fmt.Errorf("keep lease %x alive: %w", id, ErrLeaseNotFound)
	}
	l.deadline = time.Now().Add(l.ttl)
	return l.ttl, nil
}

// Revoke implements Registrar.
func (s *MemoryStore) Revoke(ctx context.Context, id LeaseID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return fmt.Errorf("revoke lease %x: %w", id, ErrLeaseNotFound)
	}
	s.revokeLocked(id, l)
	return nil
}

// ExpireLease ends lease id at once as if its TTL had passed without a
// renewal (a crashed registrant), for tests that must not wait a TTL.
func (s *MemoryStore) ExpireLease(id LeaseID) error {
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
		return 0, errStoreClosed
	}
	s.rev++
	s.set(path, bytes.Clone(value), NoLease)
	s.notify()
	return s.rev, nil
}
