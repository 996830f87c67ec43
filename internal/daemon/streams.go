package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
)

// WorkerStreams is what the stream manager needs to know of one worker:
// its partition and one Source per dp rank.
type WorkerStreams struct {
	ID        uint64
	Partition indexer.PartitionKey
	BlockSize int
	Sources   []events.Source // one per dp rank, Source.Worker == ID
}

// RankStatus is the state of one worker rank's stream.
type RankStatus struct {
	Worker    uint64
	Rank      uint32
	Partition indexer.PartitionKey
	Endpoint  string
	events.State
	Blocks int
	Err    string // why the stream is not running, if it is not
}

// Streams runs one events.Subscriber per worker rank and keeps the index
// in step with the workers it is told about: a new worker starts its
// streams, a changed worker restarts only the streams whose source
// changed, and a removed worker stops its streams and leaves the index.
// Create with NewStreams; call Run; Set and Remove are safe for concurrent
// use from other goroutines while Run runs.
type Streams struct {
	ix   *indexer.Index
	cfg  events.SubscriberConfig
	log  *slog.Logger
	cmds chan func(context.Context)

	mu      sync.Mutex // guards workers and subs (read by Status from other goroutines)
	workers map[uint64]WorkerStreams
	subs    map[streamKey]*stream
}

type streamKey struct {
	worker uint64
	rank   uint32
}

type stream struct {
	src    events.Source
	part   indexer.PartitionKey
	sub    *events.Subscriber
	cancel context.CancelFunc
	done   chan struct{}
}

// NewStreams returns a manager feeding ix; cfg is used for every
// Subscriber (its Metrics are shared).
func NewStreams(ix *indexer.Index, cfg events.SubscriberConfig, log *slog.Logger) *Streams {
	if log == nil {
		log = slog.Default()
	}
	return &Streams{ix: ix, cfg: cfg, log: log, cmds: make(chan func(context.Context)),
		workers: map[uint64]WorkerStreams{}, subs: map[streamKey]*stream{}}
}

// ErrStopped is returned by Set and Remove after Run has returned.
var ErrStopped = errors.New("stream manager stopped")

// Run owns every subscriber goroutine until ctx ends, then stops them all
// and returns ctx's error after they exited.
func (s *Streams) Run(ctx context.Context) error {
	for {
		select {
		case f := <-s.cmds:
			f(ctx)
		case <-ctx.Done():
			s.mu.Lock()
			subs := make([]*stream, 0, len(s.subs))
			for _, st := range s.subs {
				subs = append(subs, st)
			}
			s.mu.Unlock()
			for _, st := range subs {
				st.stop()
			}
			return ctx.Err()
		}
	}
}

// do runs f on Run's goroutine and waits for it.
func (s *Streams) do(ctx context.Context, f func(context.Context) error) error {
	errc := make(chan error, 1)
	select {
	case s.cmds <- func(rctx context.Context) { errc <- f(rctx) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Set adds or updates a worker: its partition is created (a block size
// that conflicts with the partition's is an error and nothing starts),
// streams whose source is new or changed start, and ranks it no longer
// has stop and leave the index.
func (s *Streams) Set(ctx context.Context, w WorkerStreams) error {
	return s.do(ctx, func(rctx context.Context) error {
		if err := s.ix.AddPartition(w.Partition, w.BlockSize); err != nil {
			return fmt.Errorf("worker %d: %w", w.ID, err)
		}
		s.mu.Lock()
		old, had := s.workers[w.ID]
		s.workers[w.ID] = w
		s.mu.Unlock()
		if had && old.Partition != w.Partition {
			s.removeLocked(old)
		}
		want := map[streamKey]events.Source{}
		for _, src := range w.Sources {
			src.Worker = w.ID
			want[streamKey{w.ID, src.Rank}] = src
		}
		s.mu.Lock()
		var stop []*stream
		var stopKeys []streamKey
		for k, st := range s.subs {
			if k.worker != w.ID {
				continue
			}
			if src, ok := want[k]; !ok || !sameSource(src, st.src) || st.part != w.Partition {
				stop = append(stop, st)
				stopKeys = append(stopKeys, k)
				delete(s.subs, k)
			}
		}
		s.mu.Unlock()
		for i, st := range stop {
			st.stop()
			if err := s.ix.RemoveRank(st.part, indexer.Rank{WorkerID: stopKeys[i].worker, DPRank: stopKeys[i].rank}); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
				s.log.Error("remove rank", "worker", stopKeys[i].worker, "rank", stopKeys[i].rank, "err", err)
			}
		}
		for k, src := range want {
			s.mu.Lock()
			_, running := s.subs[k]
			s.mu.Unlock()
			if running {
				continue
			}
			if err := s.start(rctx, k, src, w.Partition); err != nil {
				return err
			}
		}
		return nil
	})
}

func sameSource(a, b events.Source) bool {
	return a.Worker == b.Worker && a.Rank == b.Rank && a.Endpoint == b.Endpoint && a.ReplayEndpoint == b.ReplayEndpoint &&
		a.Topic == b.Topic && a.SeqBase == b.SeqBase && slices.Equal(a.Ranks, b.Ranks)
}

func (s *Streams) start(ctx context.Context, k streamKey, src events.Source, part indexer.PartitionKey) error {
	// A rank the index already holds (restored from a peer's dump) resumes
	// after its watermark once the engine confirms the batch's digest.
	if rs, err := s.ix.Rank(part, indexer.Rank{WorkerID: k.worker, DPRank: k.rank}); err == nil && rs.HasSeq && rs.Digest != 0 {
		src.Resume = &events.Watermark{Seq: rs.Watermark, Digest: rs.Digest}
	}
	app := &events.IndexApplier{Index: s.ix, Partition: part}
	sub, err := events.NewSubscriber(src, app, s.cfg)
	if err != nil {
		return fmt.Errorf("worker %d rank %d: %w", k.worker, k.rank, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	st := &stream{src: src, part: part, sub: sub, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	s.subs[k] = st
	s.mu.Unlock()
	go func() {
		defer close(st.done)
		_ = sub.Run(sctx) // returns ctx's error when stopped
	}()
	return nil
}

func (st *stream) stop() {
	st.cancel()
	<-st.done
}

// Remove stops every stream of worker id and removes it from the index.
// Removing an unknown worker does nothing.
func (s *Streams) Remove(ctx context.Context, id uint64) error {
	return s.do(ctx, func(context.Context) error {
		s.mu.Lock()
		w, ok := s.workers[id]
		delete(s.workers, id)
		s.mu.Unlock()
		if ok {
			s.removeLocked(w)
		}
		return nil
	})
}

// removeLocked stops w's streams and drops it from its partition. Called
// on Run's goroutine.
func (s *Streams) removeLocked(w WorkerStreams) {
	s.mu.Lock()
	var stop []*stream
	for k, st := range s.subs {
		if k.worker == w.ID {
			stop = append(stop, st)
			delete(s.subs, k)
		}
	}
	s.mu.Unlock()
	for _, st := range stop {
		st.stop()
	}
	if err := s.ix.RemoveWorkerFrom(w.Partition, w.ID); err != nil && !errors.Is(err, indexer.ErrNoPartition) {
		s.log.Error("remove worker", "worker", w.ID, "err", err)
	}
}

// Status reports every stream, ordered by worker and rank. Safe for
// concurrent use.
func (s *Streams) Status() []RankStatus {
	s.mu.Lock()
	out := make([]RankStatus, 0, len(s.subs))
	for k, st := range s.subs {
		out = append(out, RankStatus{Worker: k.worker, Rank: k.rank, Partition: st.part, Endpoint: st.src.Endpoint,
			State: st.sub.State()})
	}
	s.mu.Unlock()
	for i := range out {
		if rs, err := s.ix.Rank(out[i].Partition, indexer.Rank{WorkerID: out[i].Worker, DPRank: out[i].Rank}); err == nil {
			out[i].Blocks = rs.Blocks
		}
	}
	slices.SortFunc(out, func(a, b RankStatus) int {
		return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
	})
	return out
}

// Synced reports whether every stream finished its initial replay
// (completed, or failed and degraded).
func (s *Streams) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.subs {
		if !st.sub.State().Synced {
			return false
		}
	}
	return true
}
