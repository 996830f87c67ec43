package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/prefixd/prefixd/indexer"
)

// Worker is what the Manager needs to know of one worker:
// its partition and one Source per dp rank.
type Worker struct {
	ID        uint64
	Partition indexer.PartitionKey
	BlockSize int
	Sources   []Source // one per dp rank, Source.Worker == ID
	// Capacity bounds what each rank may hold per tier in the index (from
	// the record's total/host/disk_kv_blocks, with a margin); zero tiers
	// are unbounded.
	Capacity indexer.Capacity
}

// Manager is the per-worker stream manager. It runs one Subscriber per
// worker rank, keyed by worker id and dp rank, and keeps the index in step
// with the workers it is told about: a new worker starts its streams, a
// changed worker restarts only the streams whose source changed (a rank
// added or removed leaves its siblings' streams and blocks alone), and a
// removed worker stops its streams and leaves the index; a partition goes
// with its last worker.
//
// Set and Remove only record what is wanted and return at once (the
// catalog watcher calls them and must not wait); Run's goroutine makes it
// so, and never waits for a stream to stop: a stopping stream is fenced
// off the index (IndexApplier.Fence) and its rank removed at once; its
// successor starts when its goroutine has exited.
// Create with NewManager and call Run; the other methods are safe for
// concurrent use while Run runs.
type Manager struct {
	ix   *indexer.Index
	cfg  SubscriberConfig
	log  *slog.Logger
	kick chan struct{} // cap 1: something changed
	// exited receives the key of each stream whose goroutine returned; it
	// is read by Run until quit closes.
	exited chan rankKey
	quit   chan struct{}

	mu      sync.Mutex // guards the fields below; never held across index calls
	workers map[uint64]Worker
	subs    map[rankKey]*rankStream // running or stopping; written only by Run's goroutine
	errs    map[uint64]string       // why a wanted worker is not indexed
	prune   bool                    // the catalog is synced: drop what no worker wants
	stopped bool
	// removed holds the blocks each rank of a removed worker held when
	// Remove took it out of the index, for the line logged when its stream
	// stops (by then the index holds none).
	removed map[rankKey]int

	// Owned by Run's goroutine.
	indexed map[uint64]indexer.PartitionKey // workers whose ranks may be in the index
	parts   map[indexer.PartitionKey]bool   // partitions it indexed workers in
}

type rankKey struct {
	worker uint64
	rank   uint32
}

// rankStream is one rank's subscriber, running or stopping.
type rankStream struct {
	src      Source
	capacity indexer.Capacity
	part     indexer.PartitionKey
	app      *IndexApplier
	sub      *Subscriber
	cancel   context.CancelFunc
	stopping bool // cancelled and fenced; its goroutine has not exited yet
}

// NewManager returns a manager feeding ix; cfg is used for every
// Subscriber (its Metrics are shared).
//
// With cfg.Metrics, prefixd_stream_degraded reports what Status does, read
// when it is scraped: the index's word on every wanted rank whose stream
// runs or that the index holds (a rank restored from a peer, a rank
// degraded by another rank's stream or truncated by the memory cap), not
// only what each stream saw last.
func NewManager(ix *indexer.Index, cfg SubscriberConfig, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{ix: ix, cfg: cfg, log: log, kick: make(chan struct{}, 1), exited: make(chan rankKey), quit: make(chan struct{}),
		workers: map[uint64]Worker{}, subs: map[rankKey]*rankStream{}, errs: map[uint64]string{}, removed: map[rankKey]int{},
		indexed: map[uint64]indexer.PartitionKey{}, parts: map[indexer.PartitionKey]bool{}}
	if cfg.Metrics != nil {
		cfg.Metrics.reportFrom(m.Status)
	}
	return m
}

// Set adds or updates a worker. It returns at once; Run starts, restarts
// and stops streams to match. A block size that conflicts with the
// partition's (another worker's) keeps the worker out of the index, which
// Status reports, until the conflict goes. Set copies w.Sources but keeps
// their Ranks, which the streams read without copies (the ranks of a
// worker should share one slice): the caller must not change them
// afterwards.
func (s *Manager) Set(w Worker) {
	w.Sources = slices.Clone(w.Sources)
	for i := range w.Sources {
		w.Sources[i].Worker = w.ID
		w.Sources[i].BlockSize = w.BlockSize
	}
	s.mu.Lock()
	if !s.stopped {
		s.workers[w.ID] = w
	}
	s.mu.Unlock()
	s.poke()
}

// Remove forgets worker id and takes it out of the index before it
// returns: its streams are fenced off the index and its ranks removed at
// once (quick index calls; nothing waits for a stream to stop). Run then
// stops the streams and, if it was the last worker there, removes the
// partition. Removing an unknown worker does nothing.
func (s *Manager) Remove(id uint64) {
	s.mu.Lock()
	w, ok := s.workers[id]
	delete(s.workers, id)
	delete(s.errs, id)
	var apps []*IndexApplier
	var ranks []rankKey
	for k, st := range s.subs {
		if k.worker == id && !st.stopping {
			apps = append(apps, st.app)
			ranks = append(ranks, k)
		}
	}
	s.mu.Unlock()
	for _, a := range apps {
		a.Fence()
	}
	if ok {
		held := make(map[rankKey]int, len(ranks))
		for _, k := range ranks {
			if rs, err := s.ix.Rank(w.Partition, indexer.Rank{WorkerID: id, DPRank: k.rank}); err == nil {
				held[k] = rs.Blocks
			}
		}
		s.mu.Lock()
		maps.Copy(s.removed, held)
		s.mu.Unlock()
		if err := s.ix.RemoveWorkerFrom(w.Partition, id); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
			s.log.Error("remove worker from index", "worker", id, "model", w.Partition.Model, "group", w.Partition.Group, "err", err)
		}
	}
	s.poke()
}

// Prune is called once the catalog has been listed: from then on, index
// partitions and ranks that no worker wants (restored from a peer for a
// worker that has since left) are removed too.
func (s *Manager) Prune() {
	s.mu.Lock()
	s.prune = true
	s.mu.Unlock()
	s.poke()
}

func (s *Manager) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run owns every subscriber goroutine until ctx ends, then stops them all
// and returns ctx's error after they exited.
func (s *Manager) Run(ctx context.Context) error {
	for {
		s.reconcile(ctx)
		select {
		case <-s.kick:
		case k := <-s.exited:
			s.reap(k)
		case <-ctx.Done():
			s.shutdown()
			return ctx.Err()
		}
	}
}

// shutdown cancels every stream and waits for their goroutines.
func (s *Manager) shutdown() {
	s.mu.Lock()
	s.stopped = true
	n := 0
	for _, st := range s.subs {
		st.cancel()
		n++
	}
	s.mu.Unlock()
	for ; n > 0; n-- {
		<-s.exited
	}
	close(s.quit)
}

// source returns the source w wants for rank r.
func (w Worker) source(r uint32) (Source, bool) {
	for _, src := range w.Sources {
		if src.Rank == r {
			return src, true
		}
	}
	return Source{}, false
}

// reconcile brings the streams and the index in step with the wanted
// workers. Runs on Run's goroutine.
func (s *Manager) reconcile(ctx context.Context) {
	s.mu.Lock()
	workers := make(map[uint64]Worker, len(s.workers))
	for id, w := range s.workers {
		workers[id] = w
	}
	prune := s.prune
	type rankCapacity struct {
		st       *rankStream
		k        rankKey
		capacity indexer.Capacity
	}
	var capacity []rankCapacity
	type stopped struct {
		st      *rankStream
		k       rankKey
		removed int // blocks it held when Remove took them out (0: not removed)
	}
	var stop []stopped
	// Stop what is not wanted as it runs; update what only changed its
	// registered ranks or capacity.
	for k, st := range s.subs {
		if st.stopping {
			continue
		}
		w, ok := workers[k.worker]
		src, want := w.source(k.rank)
		switch {
		case !ok || !want || w.Partition != st.part || !sameSource(src, st.src):
			st.stopping = true
			st.cancel()
			stop = append(stop, stopped{st, k, s.removed[k]})
			delete(s.removed, k)
		default:
			if !sameRanks(src.Ranks, st.src.Ranks) {
				st.sub.SetRanks(src.Ranks)
				st.src.Ranks = src.Ranks
			}
			if w.Capacity != st.capacity {
				capacity = append(capacity, rankCapacity{st, k, w.Capacity})
			}
		}
	}
	s.mu.Unlock()
	// A stopped stream's rank leaves the index now: fenced, its
	// subscriber can no longer touch the index while it winds down.
	for _, x := range stop {
		x.st.app.Fence()
		r := indexer.Rank{WorkerID: x.k.worker, DPRank: x.k.rank}
		blocks := x.removed
		if rs, err := s.ix.Rank(x.st.part, r); err == nil {
			blocks = max(blocks, rs.Blocks)
		}
		if err := s.ix.RemoveRank(x.st.part, r); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
			s.log.Error("remove rank", "worker", x.k.worker, "rank", x.k.rank, "err", err)
			continue
		}
		s.log.Info("stream stopped; rank removed from index", "worker", x.k.worker, "rank", x.k.rank, "endpoint", x.st.src.Endpoint, "blocks", blocks)
	}
	for _, c := range capacity { // index calls without s.mu
		if err := s.ix.SetRankCapacity(c.st.part, indexer.Rank{WorkerID: c.k.worker, DPRank: c.k.rank}, c.capacity); err == nil {
			c.st.capacity = c.capacity
		}
	}

	// Workers that left (or moved partition): every stream of theirs is
	// stopping and fenced, so their ranks (those learned only from
	// batches too) leave at once.
	for id, part := range s.indexed {
		if w, ok := workers[id]; ok && w.Partition == part {
			continue
		}
		if s.hasRunning(id) {
			continue
		}
		if err := s.ix.RemoveWorkerFrom(part, id); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
			s.log.Error("remove worker from index", "worker", id, "model", part.Model, "group", part.Group, "err", err)
		}
		delete(s.indexed, id)
		s.log.Info("worker removed from index", "worker", id, "model", part.Model, "group", part.Group)
	}
	s.dropEmptyPartitions(workers, prune)

	// Start wanted streams that have none (a stopping one is replaced
	// once it has exited).
	for _, id := range slices.Sorted(maps.Keys(workers)) {
		w := workers[id]
		if part, ok := s.indexed[id]; ok && part != w.Partition {
			continue // still leaving its old partition
		}
		if err := s.ix.AddPartition(w.Partition, w.BlockSize); err != nil {
			s.setErr(id, fmt.Sprintf("not indexed: %v", err))
			continue
		}
		s.setErr(id, "")
		for _, src := range w.Sources {
			k := rankKey{id, src.Rank}
			s.mu.Lock()
			_, exists := s.subs[k]
			s.mu.Unlock()
			if exists {
				continue
			}
			if err := s.start(ctx, k, src, w.Partition, w.Capacity); err != nil {
				s.setErr(id, err.Error())
				continue
			}
			s.indexed[id] = w.Partition
			s.parts[w.Partition] = true
		}
	}
}

// setErr records (or clears, with "") why worker id is not indexed,
// logging each new reason once.
func (s *Manager) setErr(id uint64, msg string) {
	s.mu.Lock()
	old := s.errs[id]
	if msg == "" {
		delete(s.errs, id)
	} else if _, wanted := s.workers[id]; wanted {
		s.errs[id] = msg
	}
	s.mu.Unlock()
	if msg != "" && msg != old {
		s.log.Error("worker not indexed", "worker", id, "err", msg)
	}
}

// hasRunning reports whether worker id has a stream that is not stopping.
func (s *Manager) hasRunning(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.subs {
		if k.worker == id && !st.stopping {
			return true
		}
	}
	return false
}

// dropEmptyPartitions removes partitions no wanted or indexed worker
// uses. Before the catalog is synced (prune false) it keeps partitions it
// never indexed itself: they may hold a peer's dump for workers the
// catalog has yet to deliver.
func (s *Manager) dropEmptyPartitions(workers map[uint64]Worker, prune bool) {
	used := map[indexer.PartitionKey]bool{}
	for _, w := range workers {
		used[w.Partition] = true
	}
	for _, part := range s.indexed {
		used[part] = true
	}
	for _, part := range s.ix.Partitions() {
		if used[part] {
			if prune {
				s.pruneRanks(part, workers)
			}
			continue
		}
		if !prune && !s.parts[part] {
			continue
		}
		delete(s.parts, part)
		if err := s.ix.RemovePartition(part); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
			s.log.Error("remove partition", "model", part.Model, "group", part.Group, "err", err)
			continue
		}
		s.log.Info("partition removed: no workers left", "model", part.Model, "group", part.Group)
	}
}

// pruneRanks removes from part the ranks of workers that no longer want
// it and have no stream (ranks restored from a peer's dump).
func (s *Manager) pruneRanks(part indexer.PartitionKey, workers map[uint64]Worker) {
	var gone []uint64
	_ = s.ix.Read(part, func(t *indexer.Tree) {
		for _, r := range t.Ranks() {
			if w, ok := workers[r.WorkerID]; (!ok || w.Partition != part) && s.indexed[r.WorkerID] != part && !slices.Contains(gone, r.WorkerID) {
				gone = append(gone, r.WorkerID)
			}
		}
	})
	for _, id := range gone {
		if s.hasRunning(id) {
			continue
		}
		if err := s.ix.RemoveWorkerFrom(part, id); err == nil {
			s.log.Info("restored worker removed from index: not in the catalog", "worker", id, "model", part.Model, "group", part.Group)
		}
	}
}

// sameRanks reports whether two rank lists are equal, at once when they
// are the same slice (the ranks of one worker share theirs).
func sameRanks(a, b []uint32) bool {
	if len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) {
		return true
	}
	return slices.Equal(a, b)
}

func sameSource(a, b Source) bool {
	return a.Worker == b.Worker && a.Rank == b.Rank && a.Endpoint == b.Endpoint && a.ReplayEndpoint == b.ReplayEndpoint &&
		a.Topic == b.Topic && a.SeqBase == b.SeqBase
}

// start runs a subscriber for k. Called on Run's goroutine.
func (s *Manager) start(ctx context.Context, k rankKey, src Source, part indexer.PartitionKey, capacity indexer.Capacity) error {
	r := indexer.Rank{WorkerID: k.worker, DPRank: k.rank}
	// A rank the index already holds (restored from a peer's dump) resumes
	// after its watermark once the engine confirms the batch's digest.
	if rs, err := s.ix.Rank(part, r); err == nil && rs.HasSeq && rs.Digest != 0 {
		src.Resume = &Watermark{Seq: rs.Watermark, Digest: rs.Digest, Degraded: rs.Degraded, Reason: rs.DegradedReason}
	}
	if err := s.ix.SetRankCapacity(part, r, capacity); err != nil {
		return fmt.Errorf("worker %d rank %d: %w", k.worker, k.rank, err)
	}
	app := &IndexApplier{Index: s.ix, Partition: part}
	sub, err := NewSubscriber(src, app, s.cfg)
	if err != nil {
		return fmt.Errorf("worker %d rank %d: %w", k.worker, k.rank, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	st := &rankStream{src: src, capacity: capacity, part: part, app: app, sub: sub, cancel: cancel}
	s.mu.Lock()
	// Remove (or Set) may have run since reconcile read what is wanted.
	if w, ok := s.workers[k.worker]; !ok || w.Partition != part {
		s.mu.Unlock()
		cancel()
		return nil
	}
	s.subs[k] = st
	delete(s.removed, k) // left by a Remove whose stream had already stopped
	s.mu.Unlock()
	go func() {
		_ = sub.Run(sctx) // returns ctx's error when stopped
		select {
		case s.exited <- k:
		case <-s.quit:
		}
	}()
	return nil
}

// reap forgets a stream whose goroutine exited (its rank left the index
// when it was stopped); the next reconcile may start its successor.
func (s *Manager) reap(k rankKey) {
	s.mu.Lock()
	delete(s.subs, k)
	s.mu.Unlock()
}

// Status reports every wanted rank, ordered by worker and rank: its
// stream's state, or why it has none.
func (s *Manager) Status() []Rank {
	s.mu.Lock()
	out := make([]Rank, 0, len(s.subs))
	for id, w := range s.workers {
		for _, src := range w.Sources {
			rs := Rank{Worker: id, Rank: src.Rank, Partition: w.Partition, Endpoint: src.Endpoint}
			st := s.subs[rankKey{id, src.Rank}]
			if st != nil && !st.stopping && sameSource(src, st.src) && st.part == w.Partition {
				rs.State, rs.Running = st.sub.State(), true
			} else {
				rs.Err = s.errs[id] // "" while the stream is starting
			}
			out = append(out, rs)
		}
	}
	s.mu.Unlock()
	for i := range out {
		s.indexWord(&out[i])
	}
	slices.SortFunc(out, func(a, b Rank) int {
		return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
	})
	return out
}

// Unfollowed reports a rank of worker id in partition p that the manager
// does not follow yet (the catalog knows the worker; Sync has not reached
// it): no stream, and the index's word on it, so that a view listing the
// rank before its stream starts says what Status will.
func (s *Manager) Unfollowed(p indexer.PartitionKey, id uint64, rank uint32) Rank {
	r := Rank{Worker: id, Rank: rank, Partition: p}
	s.indexWord(&r)
	return r
}

// indexWord fills r from the index's word on the rank. That word on the
// flag is the truth every view reports, before the stream's first
// connection (a rank restored from a peer's dump) as after it; the
// stream's own word only adds to it (it reaches the index with its next
// batch or reset).
func (s *Manager) indexWord(r *Rank) {
	if rs, err := s.ix.Rank(r.Partition, indexer.Rank{WorkerID: r.Worker, DPRank: r.Rank}); err == nil {
		r.Blocks, r.Truncated, r.DegradedReason = rs.Blocks, rs.Truncated, rs.DegradedReason
		r.Indexed = rs.Blocks > 0 || rs.HasSeq || rs.Degraded
		r.Degraded = r.Degraded || rs.Degraded
	}
}

// Synced reports whether every running stream finished its initial
// replay (completed, or failed and degraded).
func (s *Manager) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.subs {
		if !st.stopping && !st.sub.State().Synced {
			return false
		}
	}
	return true
}
