package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// LeaseID identifies a lease. NoLease (0) writes a persistent record.
type LeaseID int64

// NoLease, passed to Put, writes a record that stays until it is deleted.
const NoLease LeaseID = 0

// Sentinel errors callers branch on; stores wrap them with the operation
// and identifiers, so test with errors.Is.
var (
	// ErrNotFound: no record under the key.
	ErrNotFound = errors.New("catalog: worker not found")
	// ErrLeaseNotFound: the lease expired, was revoked or never existed.
	ErrLeaseNotFound = errors.New("catalog: lease not found")
	// ErrCompacted: the revision asked for (List or Watch) was compacted
	// away; list at the current revision instead.
	ErrCompacted = errors.New("catalog: revision compacted")
	// ErrInterrupted: a watch lost its connection to the store and may
	// have missed changes; list again and diff.
	ErrInterrupted = errors.New("catalog: watch interrupted")

	// ErrIDInUse: the worker id is registered under another key (another
	// model or routing group). A worker id names one engine everywhere —
	// streams, index ranks, pools, bookings, metrics — so it has one
	// record. The error is an *IDInUseError naming the holder.
	ErrIDInUse = errors.New("catalog: worker id in use")

	// ErrStoreClosed: the store was closed.
	ErrStoreClosed = errors.New("catalog: store closed")

	// ErrUnavailable: the store did not answer before the operation's
	// context ended, or said it cannot answer now (etcd down, cut off,
	// without a leader, or too slow). A write that fails so was cut at
	// its deadline: it may still land, whole (each write is one
	// transaction), or not at all; retry it.
	ErrUnavailable = errors.New("catalog: store unavailable")
)

// IDInUseError says which record holds a worker id that a write wanted
// under another key. errors.Is(err, ErrIDInUse) holds.
type IDInUseError struct {
	ID     uint64
	Holder Key     // the record that holds the id
	Lease  LeaseID // the holder's lease (NoLease: a persistent record)
}

func (e *IDInUseError) Error() string {
	lease := "persistent"
	if e.Lease != NoLease {
		lease = fmt.Sprintf("lease %x", e.Lease)
	}
	return fmt.Sprintf("worker id %d is registered for model %q routing group %q (%s); unregister it there first", e.ID, e.Holder.Model, e.Holder.Group, lease)
}

func (e *IDInUseError) Is(target error) bool { return target == ErrIDInUse }

// ErrContended is returned (wrapped) by Update when its compare-and-swap
// lost MaxUpdateAttempts times to concurrent writers.
var ErrContended = errors.New("catalog: too many concurrent changes; try again")

// RemoveRecord, returned by an Update function, deletes the record
// instead of writing it (as filepath.SkipDir changes what a walk does).
//
//lint:ignore ST1012 a signal from the caller's function, not a failure: named like filepath.SkipDir
var RemoveRecord = errors.New("catalog: remove the record")

// Current is what Update read under its key.
type Current struct {
	Exists      bool
	Lease       LeaseID // the record's lease; NoLease for a persistent record
	ModRevision int64   // 0 when the record does not exist
}

// UpdateFunc changes the record w in place. w is the record Update read
// (or, when cur.Exists is false, a Worker holding only the key's model,
// group and id). Returning RemoveRecord deletes the record; any other
// error aborts the update and is returned by Update as it is. It may be
// called more than once (after a concurrent change), so it must have no
// side effects.
type UpdateFunc func(w *Worker, cur Current) error

// MaxUpdateAttempts bounds how often Update retries after concurrent
// changes (each retry means another writer succeeded).
const MaxUpdateAttempts = 64

// Store is the worker catalog: records keyed by Key, optionally attached
// to leases, with revisions, lists at a revision and watches from one. It
// is the package's contract, implemented by etcdstore.Store (and, for tests, storetest.MemoryStore) and
// checked for both by catalog/storetest. Implementations are safe for
// concurrent use. Consumers that need less declare less: a Watcher takes a
// WatchSource, a Session a Registrar.
type Store interface {
	WatchSource
	Registrar
	// Get returns the record under k: ErrNotFound if there is none, an
	// error wrapping the decode or validation error if it is bad.
	Get(ctx context.Context, k Key) (Worker, error)
	// Update changes the record under k with compare-and-swap: it reads
	// the record, calls fn, and writes the result (validated; keeping the
	// record's lease) — or deletes the record if fn returned RemoveRecord —
	// only if the record has not changed since it was read; after a
	// concurrent change it reads again and calls fn again. It returns the
	// store revision of the write, fn's error as it is, an *IDInUseError
	// when k's worker id is registered under another key,
	// ErrNotFound when fn removes a record that does not exist, or an
	// error wrapping ErrUnavailable when the store did not answer before
	// ctx ended. Without a deadline on ctx it waits for an unreachable
	// store for as long as ctx lasts.
	Update(ctx context.Context, k Key, fn UpdateFunc) (int64, error)
	// Delete removes the record under k, reporting whether there was one.
	Delete(ctx context.Context, k Key) (bool, error)
	// Keys returns the keys of the records of worker id under model (the
	// routing groups /unregister without a routing_group removes it from),
	// sorted by path.
	Keys(ctx context.Context, model string, id uint64) ([]Key, error)
}

// Registrar writes records and manages their leases; Session uses it.
type Registrar interface {
	// Put validates w (it applies no defaults) and writes it under
	// w.Key(), attached to lease (NoLease: persistent). A record already
	// under the key is replaced, and its lease detached. It returns the
	// store revision of the write; ErrLeaseNotFound if lease is gone; an
	// *IDInUseError if w's worker id is registered under another key.
	Put(ctx context.Context, w Worker, lease LeaseID) (int64, error)
	// Grant creates a lease of ttl (rounded up to whole seconds; etcd may
	// raise it to its minimum, about 2 s by default).
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, error)
	// KeepAliveOnce renews the lease once and returns its TTL;
	// ErrLeaseNotFound if it has expired or was revoked.
	KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error)
	// Revoke ends the lease, deleting every record attached to it at once.
	Revoke(ctx context.Context, id LeaseID) error
}

// WatchSource lists and watches records; Watcher uses it.
type WatchSource interface {
	// List returns every record under the store's prefix at revision rev
	// (0: the current one), bad records included with Err set, sorted by
	// Path. ErrCompacted if rev was compacted.
	List(ctx context.Context, rev int64) (Snapshot, error)
	// Watch opens a stream of the changes at revisions >= rev (0: from
	// now). The stream ends when ctx ends or Close is called.
	Watch(ctx context.Context, rev int64) (WatchStream, error)
}

// WatchStream yields changes in revision order. It is used by one
// goroutine at a time.
type WatchStream interface {
	// Next blocks until there are changes and returns them (at least one,
	// all of a revision together). It returns ctx's error when ctx ends,
	// an error wrapping ErrCompacted when the stream's next revision was
	// compacted, one wrapping ErrInterrupted when changes may have been
	// missed, and other errors when the watch failed; after an error the
	// stream is done.
	Next(ctx context.Context) ([]Event, error)
	// Close releases the stream.
	Close()
}

// Record is one stored record as a consumer sees it.
type Record struct {
	Path string // the store key
	Key  Key    // parsed from Path; zero when Err says Path is bad
	// Worker is the decoded, validated record; zero in a delete event and
	// in a bad record.
	Worker Worker
	// Err is why the record is bad (a key that does not parse, JSON that
	// does not decode or validate, or a body whose model, group or id
	// differ from its key); nil for a good record. A delete event of a
	// well-formed key has no Err.
	Err         error
	ModRevision int64   // revision of the write (or, in a delete event, of the delete)
	Lease       LeaseID // NoLease for persistent records and deletes
}

// EventType says what happened to a key.
type EventType int

// The event types.
const (
	EventPut    EventType = iota // created or replaced
	EventDelete                  // deleted, revoked or expired
)

func (t EventType) String() string {
	if t == EventDelete {
		return "delete"
	}
	return "put"
}

// Event is one change to one key.
type Event struct {
	Type   EventType
	Record Record
}

// Snapshot is every record at one revision.
type Snapshot struct {
	Records  []Record
	Revision int64
}

// DecodeRecord builds the Record a store hands out for a stored key and
// value (value nil: a delete).
func DecodeRecord(prefix, path string, value []byte, deleted bool, modRev int64, lease LeaseID) Record {
	rec := Record{Path: path, ModRevision: modRev, Lease: lease}
	k, err := ParseKey(prefix, path)
	if err != nil {
		rec.Err = err
		return rec
	}
	rec.Key = k
	if deleted {
		return rec
	}
	w, err := DecodeWorker(value)
	if err != nil {
		rec.Err = fmt.Errorf("record %s: %w", clip.String(path), err)
		return rec
	}
	if w.Key() != k {
		rec.Err = fmt.Errorf("record %s: body is for %v", clip.String(path), w.Key())
		return rec
	}
	rec.Worker = w
	return rec
}

// EncodeRecord validates w and encodes it.
func EncodeRecord(w Worker) ([]byte, error) {
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("put %v: %w", w.Key(), err)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("put %v: encode: %w", w.Key(), err)
	}
	return b, nil
}

// TTLSeconds rounds a lease TTL up to whole seconds, at least 1, as etcd
// grants them.
func TTLSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}
