package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// maxLoggedErr is the most of a bad record's error a log line repeats,
// as much as the HTTP API's errors.
const maxLoggedErr = 1024

// ChangeKind says how a worker record changed.
type ChangeKind int

// The change kinds.
const (
	Added   ChangeKind = iota + 1 // a record appeared
	Updated                       // a record's content changed
	Removed                       // a record is gone (deleted, revoked, expired)
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Removed:
		return "removed"
	}
	return "unknown"
}

// Change is one worker coming, changing or going.
type Change struct {
	Kind ChangeKind
	Key  Key
	// Worker is the record now (Added, Updated), or the last one delivered
	// (Removed).
	Worker Worker
	// Old is the record before an Update; zero otherwise.
	Old Worker
	// Lease is the record's lease (NoLease: persistent, or Removed).
	Lease LeaseID
	// Revision is the store revision the change was seen at.
	Revision int64
}

// WatcherConfig configures a Watcher. Zero fields take the defaults noted.
type WatcherConfig struct {
	// OnChange receives every change, in order, on Run's goroutine; it is
	// required. Run waits for it, and does not watch ctx meanwhile, so it
	// must return promptly (hand long work to another goroutine).
	OnChange func(Change)
	// OnBadRecord is told about each bad record written (once per key and
	// revision: a record that does not decode, does not validate, or whose
	// body disagrees with its key), on Run's goroutine, for metrics. A bad
	// write changes nothing: a worker already delivered keeps its last
	// good record until its key is deleted. May be nil.
	OnBadRecord func(path string, err error)
	// Logger receives resyncs and store failures (default slog.Default()).
	Logger *slog.Logger
	// ListTimeout bounds one List (default 10 s).
	ListTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed attempts
	// (defaults 100 ms and 2 s).
	RetryMin, RetryMax time.Duration
}

// Watcher turns a WatchSource into a stream of worker Changes. It lists
// the records at a revision, delivers the difference from what it
// delivered before, then watches from the next revision. When the watch
// fails — compaction (ErrCompacted), a lost connection or restarted etcd
// (ErrInterrupted), any other error — it lists again and delivers only
// the difference, so each real change is delivered once and a consumer's
// view converges on the store.
//
// A worker id names one engine, so the Watcher delivers at most one
// record per id. Stores refuse a second record for an id (ErrIDInUse),
// but records written by older versions or by hand may still share one:
// the record already delivered keeps it (after a list, the lowest key
// path), the others are reported as bad records and ignored until it
// goes, when the lowest of them takes its place.
type Watcher struct {
	src WatchSource
	cfg WatcherConfig

	synced     chan struct{}
	syncedOnce sync.Once
	bad        atomic.Uint64
	resyncs    atomic.Uint64
	revision   atomic.Int64
	workers    atomic.Int64

	// Owned by Run's goroutine.
	delivered map[Key]Worker
	leases    map[Key]LeaseID  // the lease of each delivered record
	owner     map[uint64]Key   // worker id → the delivered key that has it
	shadowed  map[Key]Record   // good records whose id another delivered key has
	badSeen   map[string]int64 // path → mod revision already counted
}

// WatcherStats are a Watcher's counters, for metrics.
type WatcherStats struct {
	BadRecords uint64 // bad record writes seen
	Resyncs    uint64 // lists after the first (after compaction, reconnects, failures)
	Revision   int64  // store revision of the last change or list applied
	Workers    int    // records delivered and not removed
}

// NewWatcher returns a Watcher of src. It does nothing until Run.
func NewWatcher(src WatchSource, cfg WatcherConfig) *Watcher {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ListTimeout <= 0 {
		cfg.ListTimeout = 10 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 2 * time.Second
	}
	return &Watcher{
		src:       src,
		cfg:       cfg,
		synced:    make(chan struct{}),
		delivered: make(map[Key]Worker),
		leases:    make(map[Key]LeaseID),
		owner:     make(map[uint64]Key),
		shadowed:  make(map[Key]Record),
		badSeen:   make(map[string]int64),
	}
}

// Synced returns a channel closed once the first full list has been
// delivered (OnChange returned for each of its records).
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Stats returns the counters. Safe for concurrent use.
func (w *Watcher) Stats() WatcherStats {
	return WatcherStats{
		BadRecords: w.bad.Load(),
		Resyncs:    w.resyncs.Load(),
		Revision:   w.revision.Load(),
		Workers:    int(w.workers.Load()),
	}
}

// Run lists, watches and re-lists until ctx ends, retrying with backoff
// while the store is unreachable. It returns ctx's error. Call it once.
func (w *Watcher) Run(ctx context.Context) error {
	if w.cfg.OnChange == nil {
		return errors.New("catalog watcher: OnChange is required")
	}
	bo := retry.Backoff(w.cfg.RetryMin, w.cfg.RetryMax)
	first := true
	for {
		rev, n, err := w.sync(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			delay := bo.NextBackOff()
			w.cfg.Logger.Warn("catalog: list workers failed", "err", err, "retry_in", delay)
			if !w.wait(ctx, delay) {
				return ctx.Err()
			}
			continue
		}
		if !first {
			// The store answers again (etcd back, a connection restored,
			// a compaction passed): say what the list changed.
			w.cfg.Logger.Info("catalog: resynced: listed the workers again", "resyncs", w.resyncs.Add(1), "workers", len(w.delivered),
				"added", n[Added], "updated", n[Updated], "removed", n[Removed], "revision", rev)
		}
		first = false
		start := time.Now()
		err = w.follow(ctx, rev)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case errors.Is(err, ErrCompacted):
			w.cfg.Logger.Info("catalog: watch revision compacted; listing again", "err", err)
			bo.Reset()
			continue
		}
		if time.Since(start) > w.cfg.RetryMax {
			bo.Reset() // the watch lasted: this failure is a new one
		}
		delay := bo.NextBackOff()
		if errors.Is(err, ErrInterrupted) {
			w.cfg.Logger.Info("catalog: watch interrupted; listing again", "err", err)
		} else {
			w.cfg.Logger.Warn("catalog: watch failed; listing again", "err", err, "retry_in", delay)
		}
		if !w.wait(ctx, delay) {
			return ctx.Err()
		}
	}
}

func (w *Watcher) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sync lists and delivers the difference from what was delivered:
// removals first, then additions and updates, each in key order. It
// returns the list's revision and how many changes of each kind it
// delivered.
func (w *Watcher) sync(ctx context.Context) (int64, [Removed + 1]int, error) {
	var n [Removed + 1]int
	lctx, cancel := context.WithTimeout(ctx, w.cfg.ListTimeout)
	snap, err := w.src.List(lctx, 0)
	cancel()
	if err != nil {
		return 0, n, err
	}
	present := make(map[Key]bool, len(snap.Records))
	paths := make(map[string]bool, len(snap.Records))
	// One record per worker id: the delivered one if it is still there,
	// else the lowest path (records are sorted by path).
	winner := make(map[uint64]Key)
	for _, rec := range snap.Records {
		if rec.Err != nil {
			continue
		}
		if k, ok := w.owner[rec.Key.WorkerID]; ok && k == rec.Key {
			winner[rec.Key.WorkerID] = k
		}
	}
	for _, rec := range snap.Records {
		if _, ok := winner[rec.Key.WorkerID]; !ok && rec.Err == nil {
			winner[rec.Key.WorkerID] = rec.Key
		}
	}
	clear(w.shadowed)
	var changes []Change
	for _, rec := range snap.Records {
		paths[rec.Path] = true
		if rec.Err != nil {
			w.badRecord(rec)
			if _, ok := w.delivered[rec.Key]; ok && rec.Key != (Key{}) {
				present[rec.Key] = true // keeps its last good record
			}
			continue
		}
		if k := winner[rec.Key.WorkerID]; k != rec.Key {
			w.shadow(rec, k)
			continue
		}
		delete(w.badSeen, rec.Path)
		present[rec.Key] = true
		if c, ok := w.diff(rec, snap.Revision); ok {
			changes = append(changes, c)
		}
	}
	for p := range w.badSeen {
		if !paths[p] {
			delete(w.badSeen, p)
		}
	}
	var removed []Change
	for k, old := range w.delivered {
		if !present[k] {
			removed = append(removed, Change{Kind: Removed, Key: k, Worker: old, Revision: snap.Revision})
		}
	}
	slices.SortFunc(removed, func(a, b Change) int { return compareKeys(a.Key, b.Key) })
	for _, c := range append(removed, changes...) {
		if ctx.Err() != nil {
			return 0, n, ctx.Err()
		}
		w.deliver(c)
		n[c.Kind]++
	}
	w.revision.Store(snap.Revision)
	w.syncedOnce.Do(func() { close(w.synced) })
	return snap.Revision, n, nil
}

// shadow sets aside a good record whose worker id the record holder
// has, reporting it as bad.
func (w *Watcher) shadow(rec Record, holder Key) {
	w.shadowed[rec.Key] = rec
	rec.Err = fmt.Errorf("record %s: %w", rec.Path, &IDInUseError{ID: rec.Key.WorkerID, Holder: holder})
	w.badRecord(rec)
}

// promote delivers the lowest shadowed record of worker id, if any, after
// the record that had the id went.
func (w *Watcher) promote(id uint64, rev int64) {
	var best *Record
	for k, rec := range w.shadowed {
		if k.WorkerID == id && (best == nil || rec.Path < best.Path) {
			r := rec
			best = &r
		}
	}
	if best == nil {
		return
	}
	delete(w.shadowed, best.Key)
	delete(w.badSeen, best.Path)
	w.deliver(Change{Kind: Added, Key: best.Key, Worker: best.Worker, Lease: best.Lease, Revision: rev})
}

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.WorkerID, b.WorkerID))
}

// diff compares a good record with what was delivered for its key. The
// same record under a new lease (its registrant registered again after
// losing its lease) is no change to deliver; it is logged.
func (w *Watcher) diff(rec Record, rev int64) (Change, bool) {
	old, ok := w.delivered[rec.Key]
	if was := w.leases[rec.Key]; ok && rec.Lease != was && old.Equal(rec.Worker) {
		w.leases[rec.Key] = rec.Lease
		w.cfg.Logger.Info("catalog: worker registered again under a new lease", "worker", rec.Key.WorkerID, "model", clip.String(rec.Key.Model),
			"group", clip.String(rec.Key.Group), "registration", registration(rec.Lease), "was", registration(was), "revision", rev)
	}
	switch {
	case !ok:
		return Change{Kind: Added, Key: rec.Key, Worker: rec.Worker, Lease: rec.Lease, Revision: rev}, true
	case !old.Equal(rec.Worker):
		return Change{Kind: Updated, Key: rec.Key, Worker: rec.Worker, Old: old, Lease: rec.Lease, Revision: rev}, true
	}
	return Change{}, false
}

// registration says who keeps a record: a lease, or nobody.
func registration(l LeaseID) string {
	if l == NoLease {
		return "persistent"
	}
	return fmt.Sprintf("lease %x", int64(l))
}

// deliver records c as delivered and hands it to OnChange.
func (w *Watcher) deliver(c Change) {
	if c.Kind == Removed {
		delete(w.delivered, c.Key)
		delete(w.leases, c.Key)
		if w.owner[c.Key.WorkerID] == c.Key {
			delete(w.owner, c.Key.WorkerID)
		}
	} else {
		w.delivered[c.Key] = c.Worker
		w.leases[c.Key] = c.Lease
		w.owner[c.Key.WorkerID] = c.Key
	}
	w.workers.Store(int64(len(w.delivered)))
	w.cfg.OnChange(c)
}

// badRecord counts a bad record write once.
func (w *Watcher) badRecord(rec Record) {
	if r, ok := w.badSeen[rec.Path]; ok && r == rec.ModRevision {
		return
	}
	w.badSeen[rec.Path] = rec.ModRevision
	w.bad.Add(1)
	// Whoever writes to etcd chooses the key and the record: the line
	// repeats at most clip.Echo bytes of the key and maxLoggedErr of the
	// error, each with its length when cut.
	w.cfg.Logger.Warn("catalog: ignoring bad worker record", "key", clip.String(rec.Path), "revision", rec.ModRevision,
		"err", clip.N(rec.Err.Error(), maxLoggedErr))
	if w.cfg.OnBadRecord != nil {
		w.cfg.OnBadRecord(rec.Path, rec.Err)
	}
}

// follow watches from rev+1, delivering changes, until the watch fails.
func (w *Watcher) follow(ctx context.Context, rev int64) error {
	ws, err := w.src.Watch(ctx, rev+1)
	if err != nil {
		return err
	}
	defer ws.Close()
	for {
		evs, err := ws.Next(ctx)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			rec := ev.Record
			switch {
			case ev.Type == EventPut && rec.Err != nil:
				w.badRecord(rec)
			case ev.Type == EventPut:
				if k, ok := w.owner[rec.Key.WorkerID]; ok && k != rec.Key {
					w.shadow(rec, k)
					break
				}
				delete(w.badSeen, rec.Path)
				if c, ok := w.diff(rec, rec.ModRevision); ok {
					w.deliver(c)
				}
			default: // delete
				delete(w.badSeen, rec.Path)
				delete(w.shadowed, rec.Key)
				if old, ok := w.delivered[rec.Key]; ok && rec.Err == nil {
					w.deliver(Change{Kind: Removed, Key: rec.Key, Worker: old, Revision: rec.ModRevision})
					w.promote(rec.Key.WorkerID, rec.ModRevision)
				}
			}
			w.revision.Store(rec.ModRevision)
		}
	}
}
