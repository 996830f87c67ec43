package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixd/prefixd/events/cursor"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/events/zmtp"
	"github.com/prefixd/prefixd/indexer"

	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// Source is one engine publisher: the live socket of one worker rank.
type Source struct {
	Worker uint64
	Rank   uint32 // the rank this socket belongs to
	// Ranks are the worker's registered dp ranks. A batch stamped with
	// another rank is applied under that rank only if it is one of these;
	// otherwise it is dropped and counted. Empty means just Rank. It is
	// read, never written: the ranks of one worker may share one slice.
	Ranks          []uint32
	Endpoint       string // ZMQ PUB address to dial
	ReplayEndpoint string // ZMQ ROUTER address; "" when the engine has none
	Topic          string // topic prefix to subscribe to ("" = everything)
	SeqBase        uint64 // first seq of an incarnation (0 for vLLM)
	// BlockSize is the worker's registered block size: a BlockStored
	// whose blocks contradict it (wire.CheckBlockSize) is not indexed,
	// and the rank is marked degraded with a reason naming both sizes.
	// 0 checks nothing.
	BlockSize int
	// Resume, when set, says the index already holds the rank's batches
	// up to Resume.Seq (restored from a peer): the subscriber verifies the
	// engine still has that batch (by Resume.Digest) and resumes after it.
	Resume *Watermark
}

// Watermark is a rank's last applied batch and its digest, and whether
// the rank was degraded there (and why).
type Watermark struct {
	Seq, Digest uint64
	Degraded    bool
	Reason      string
}

func (s Source) rank() indexer.Rank { return indexer.Rank{WorkerID: s.Worker, DPRank: s.Rank} }

func registered(own uint32, ranks []uint32, r uint32) bool {
	return r == own || slices.Contains(ranks, r)
}

// Applier receives what a Subscriber decides: batches in seq order and
// resets. It is declared here and implemented by the daemon's wiring (over
// indexer.Index) and by tests. Calls for one Source come from one
// goroutine; an Applier shared by several Subscribers must be safe for
// concurrent use.
type Applier interface {
	// ApplyBatch applies one decoded batch for rank r and records m with
	// it: the batch's seq and payload digest (the watermark), and whether
	// the rank is degraded after it, and why. The batch and its slices are
	// only valid during the call.
	ApplyBatch(r indexer.Rank, m indexer.Mark, b *wire.Batch) error
	// ResetRank drops everything rank r holds, its watermark too, and
	// records whether it is now degraded (lost history) and why, or not (a
	// new engine incarnation).
	ResetRank(r indexer.Rank, degraded bool, reason string) error
}

// indexWord is implemented by Appliers that hold the rank's degraded
// flag (IndexApplier): the index's word — its stream's, a foreign
// batch's (a publisher carrying several ranks), or a truncation (the
// index dropped some of the rank's blocks itself) — is the one every view
// reports, so the Subscriber's State and metrics report it too, whatever
// the rank's own stream says.
type indexWord interface {
	Degraded(r indexer.Rank) (degraded, truncated bool)
}

// batchResults is implemented by Appliers that say what the index made of
// each batch (IndexApplier): the subscriber counts and logs its redundant
// stores (indexer.BatchResult.Redundant).
type batchResults interface {
	ApplyBatchResult(r indexer.Rank, m indexer.Mark, b *wire.Batch) (indexer.BatchResult, error)
}

// redundantStoreMsg is the line a Subscriber logs at WARN the first time
// its rank sends a redundant store — a BlockStored that only re-reports
// blocks the rank already held on the device (see indexer.Tree.Redundant)
// — and then at most once a minute, with the batch's blocks and the
// running total. docs/operations.md quotes it.
const redundantStoreMsg = `redundant BlockStored: the engine re-reported cached blocks (kv_cache_report_mode="full"?); copy counts may exceed the engine's`

// SubscriberConfig tunes a Subscriber. Zero fields take the defaults noted.
type SubscriberConfig struct {
	Cursor      cursor.Config // HasReplay and SeqBase are set from the Source
	IdleTimeout time.Duration // a replay attempt with no message for this long is incomplete (default 3 s)
	LiveQueue   int           // live messages queued between the socket and the applier (default 1024); a full queue drops, and the gap is replayed
	// LiveQueueBytes bounds the bytes of those messages (default 64 MiB):
	// large batches fill the queue by size before they do by count.
	LiveQueueBytes int64
	RetryMin       time.Duration // first reconnect delay (default 100 ms), doubling
	RetryMax       time.Duration // longest reconnect delay (default 5 s)
	DialTimeout    time.Duration // one TCP dial (default 2 s)
	// ProbeInterval: after this long without a live batch, ask for a
	// replay from the next expected seq, to find a last batch the PUB
	// dropped (default 30 s; negative disables).
	ProbeInterval time.Duration
	// Limits bound what an engine can make the subscriber hold or wait
	// for on its sockets: the largest message (a bigger frame closes the
	// connection before anything is allocated for it; counted as
	// dropped{reason="oversize"}) and the ZMTP handshake time. Zero
	// fields take zmtp's defaults (16 MiB, 10 s).
	Limits        zmtp.Limits
	Logger        *slog.Logger // default slog.Default()
	Metrics       *Metrics     // nil: no metrics
	OnStateChange func(State)  // called (from the Subscriber's goroutine) whenever State changes; may be nil
	ReplaySlots   *ReplaySlots // shared bound on concurrent replay attempts; nil = unbounded
}

func (c *SubscriberConfig) defaults() {
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 3 * time.Second
	}
	if c.LiveQueue <= 0 {
		c.LiveQueue = 1024
	}
	if c.LiveQueueBytes <= 0 {
		c.LiveQueueBytes = 64 << 20
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 2 * time.Second
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Subscriber follows one Source: one goroutine owns its SUB socket, its
// replay DEALER and its Cursor, and applies batches in order. Create with
// NewSubscriber and call Run.
type Subscriber struct {
	src Source
	app Applier
	cfg SubscriberConfig

	mu    sync.Mutex // guards state
	state State
	// ranks is the worker's registered ranks (Source.Ranks, changed by
	// SetRanks without a restart).
	ranks atomic.Pointer[[]uint32]
}

// NewSubscriber returns a Subscriber for src that feeds app.
func NewSubscriber(src Source, app Applier, cfg SubscriberConfig) (*Subscriber, error) {
	if src.Endpoint == "" {
		return nil, fmt.Errorf("source worker %d rank %d: no endpoint", src.Worker, src.Rank)
	}
	if app == nil {
		return nil, errors.New("subscriber: nil applier")
	}
	cfg.defaults()
	cfg.Cursor.HasReplay = src.ReplayEndpoint != ""
	cfg.Cursor.SeqBase = src.SeqBase
	sub := &Subscriber{src: src, app: app, cfg: cfg}
	sub.SetRanks(src.Ranks)
	return sub, nil
}

// SetRanks changes the worker's registered ranks (Source.Ranks) while the
// Subscriber runs: another rank of the worker registered or removed does
// not restart this rank's stream. The Subscriber keeps ranks and only
// reads it; the caller must not change it afterwards, so that every rank
// of a worker can share one slice (a copy per rank costs the square of
// the worker's ranks). Safe for concurrent use.
func (s *Subscriber) SetRanks(ranks []uint32) {
	s.ranks.Store(&ranks)
}

// State returns the latest state. Safe for concurrent use.
func (s *Subscriber) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// replayMsg is one message (or the end) of a replay attempt.
type replayMsg struct {
	attempt uint64
	started bool // the attempt got a replay slot and sent its request
	frames  [][]byte
	err     error // the attempt's socket failed (EOF, dial error)
}

// run is the state of one Run: the cursor and the sockets it drives.
type run struct {
	s       *Subscriber
	cur     *cursor.Cursor
	dec     wire.Decoder
	batch   wire.Batch
	labels  [2]string
	prev    cursor.Stats
	synced  bool
	started time.Time // replay session start, for the duration metric

	replayCh     chan replayMsg
	attemptStop  context.CancelFunc // cancels the replay attempt in flight
	attemptWG    sync.WaitGroup
	pending      *cursor.Action // a replay to start when its timer fires
	pendingTimer *time.Timer    // fires at pending.At
	idle         *time.Timer    // replay idle timeout
	probe        *time.Timer    // quiet live socket
	deadline     *time.Timer    // the replay session's deadline (Cursor.Deadline)
	deadlineAt   time.Time      // what deadline is armed for
	queuedSince  time.Time      // the attempt in flight waits for a slot since (zero: it does not)
	replayFrom   uint64         // the latest replay request's first seq
	wasDegraded  bool
	wasTruncated bool
	corrupt      string // why the last reset came from a bad batch ("" if it did not)
	degradedWhy  string // why the cursor is degraded, recorded with each batch
	expired      bool   // the session deadline timer fired
	redundant    uint64 // blocks of redundant stores applied since Run started
	sizeSeen     bool   // a store of blocks of Source.BlockSize was seen (a short last page is then just short)
	sizeLogged   string // the last block size mismatch logged ("" none)
	session      replaySession
	logs         logLimiter
}

// Run follows the source until ctx is cancelled: it connects (retrying
// forever with backoff while the publisher is not up), replays, applies,
// and reconnects after EOF. It returns ctx's error, after every goroutine
// it started has exited.
func (s *Subscriber) Run(ctx context.Context) error {
	r := &run{
		s:        s,
		cur:      newCursorFor(s),
		labels:   [2]string{strconv.FormatUint(s.src.Worker, 10), strconv.FormatUint(uint64(s.src.Rank), 10)},
		replayCh: make(chan replayMsg, 64),
	}
	if w := s.src.Resume; w != nil && w.Degraded {
		r.degradedWhy = w.Reason // restored degraded: it stays so until lifted here
		r.wasDegraded = true
	}
	r.idle = time.NewTimer(time.Hour)
	r.idle.Stop()
	r.pendingTimer = time.NewTimer(time.Hour)
	r.pendingTimer.Stop()
	r.probe = time.NewTimer(time.Hour)
	r.probe.Stop()
	defer r.probe.Stop()
	r.deadline = time.NewTimer(time.Hour)
	r.deadline.Stop()
	defer r.deadline.Stop()
	defer func() {
		r.stopReplay()
		if m := s.cfg.Metrics; m != nil {
			m.forget(r.labels[0], r.labels[1])
		}
	}()
	// What is known before the first connection (a rank restored degraded
	// from a peer stays so while its engine cannot be reached) is the
	// State and metrics from the start.
	r.publish()
	bo := retry.Backoff(s.cfg.RetryMin, s.cfg.RetryMax)
	for {
		start := time.Now()
		err := r.connection(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > s.cfg.RetryMax {
			bo.Reset() // the connection lasted: this failure is a new one
		}
		delay := bo.NextBackOff()
		r.disconnected(err, delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// newCursorFor returns s's cursor, resumed from what the index already
// holds (Source.Resume). Without a replay endpoint nothing can verify the
// restored batches, and the cursor says so at the first live batch: one
// of a new incarnation resets the rank, any other is lost history (reset,
// degraded); until then the rank is what it was restored as.
func newCursorFor(s *Subscriber) *cursor.Cursor {
	c := cursor.New(s.cfg.Cursor)
	if w := s.src.Resume; w != nil {
		c.Resume(w.Seq, w.Digest, w.Degraded)
	}
	return c
}

// connection dials the live socket and serves it until it fails.
func (r *run) connection(ctx context.Context) error {
	s := r.s
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(zmtp.WithLimits(cctx, s.cfg.Limits), zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout))
	defer sub.Close()
	if err := sub.Dial(zmtp.Endpoint(s.src.Endpoint)); err != nil {
		return err
	}
	live := make(chan [][]byte, s.cfg.LiveQueue)
	var queued atomic.Int64 // bytes in live
	readErr := make(chan error, 1)
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			msg, err := sub.Recv()
			if err != nil {
				readErr <- err
				return
			}
			n := int64(framesLen(msg.Frames))
			if queued.Add(n) > s.cfg.LiveQueueBytes {
				queued.Add(-n)
				r.drop("queue_full") // by size; the seq gap is replayed
				continue
			}
			select {
			case live <- msg.Frames:
			default:
				// The applier is behind: drop, and the seq gap is replayed.
				queued.Add(-n)
				r.drop("queue_full")
			}
		}
	}()
	defer func() {
		cancel()
		sub.Close()
		readers.Wait()
	}()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.src.Topic); err != nil {
		// The connection died under the subscription: the reader has (or
		// will soon have) the reason, e.g. a frame the guard refused.
		return firstErr(ctx, readErr, err, s.cfg.DialTimeout)
	}
	r.setUp(true)
	defer r.setUp(false)
	r.log(slog.LevelInfo, "connect", time.Minute, "stream connected", "endpoint", s.src.Endpoint, "replay_endpoint", s.src.ReplayEndpoint)
	r.exec(ctx, r.cur.Connected(time.Now()))
	r.resetProbe()
	defer func() { r.exec(ctx, r.cur.Disconnected()) }()
	if !r.s.cfg.Cursor.HasReplay {
		r.synced = true // no replay to wait for
		r.publish()
	}
	topic := []byte(s.src.Topic)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-readErr:
			return err
		case frames := <-live:
			queued.Add(-int64(framesLen(frames)))
			r.resetProbe()
			seq, payload, err := wire.ParseLive(frames, topic)
			if err != nil {
				r.dropErr(err)
				continue
			}
			r.exec(ctx, r.cur.Live(seq, payload, time.Now()))
		case m := <-r.replayCh:
			r.onReplay(ctx, m)
		case <-r.probe.C:
			r.exec(ctx, r.cur.Probe(time.Now()))
			r.resetProbe()
		case <-r.idle.C:
			r.exec(ctx, r.cur.ReplayIncomplete(r.cur.Attempt(), time.Now()))
		case <-r.deadline.C:
			r.deadlineAt, r.expired = time.Time{}, true
			r.exec(ctx, r.cur.Expire(time.Now()))
		case <-r.pendingTimer.C:
			if a := r.pending; a != nil {
				r.pending = nil
				r.startAttempt(ctx, *a)
			}
		}
	}
}

func (r *run) onReplay(ctx context.Context, m replayMsg) {
	if m.attempt != r.cur.Attempt() {
		return // a stale attempt
	}
	now := time.Now()
	if m.started {
		r.resetIdle() // the idle timeout runs from when the attempt got its slot
		if !r.queuedSince.IsZero() {
			waited := now.Sub(r.queuedSince)
			r.cur.Waited(waited) // nor does the session's deadline count the wait
			if waited > time.Second {
				r.log(slog.LevelInfo, "replay slot", time.Minute, "replay got a slot", "waited", waited.Round(time.Millisecond))
			}
			r.queuedSince = time.Time{}
		}
		r.publish()
		return
	}
	if errors.Is(m.err, errPreempted) {
		seq, _ := r.cur.Applied()
		r.log(slog.LevelInfo, "preempted", time.Minute, "replay preempted: it held its slot past its budget while others waited; it queues again",
			"applied_seq", seq)
	}
	if m.err != nil {
		r.refused(m.err, "replay")
		r.exec(ctx, r.cur.ReplayIncomplete(m.attempt, now))
		return
	}
	r.resetIdle()
	seq, payload, end, err := wire.ParseReplay(m.frames)
	switch {
	case err != nil:
		r.dropErr(err)
		r.exec(ctx, r.cur.ReplayIncomplete(m.attempt, now))
	case end:
		r.stopReplay()
		r.exec(ctx, r.cur.ReplayEnd(m.attempt, now))
	default:
		r.exec(ctx, r.cur.ReplayBatch(m.attempt, seq, payload, now))
	}
}

// exec carries out the cursor's actions in order.
func (r *run) exec(ctx context.Context, acts []cursor.Action) {
	src := r.s.src
	for i := 0; i < len(acts); i++ {
		a := acts[i]
		switch a.Kind {
		case cursor.ActApply:
			if more := r.apply(a.Seq, a.Digest, a.Payload); len(more) > 0 {
				// The batch was corrupt: the cursor reset the rank. Its
				// actions come first; the rest of this list follows.
				rest := append([]cursor.Action(nil), acts[i+1:]...)
				r.exec(ctx, append(append([]cursor.Action(nil), more...), rest...))
				return
			}
		case cursor.ActReset:
			// The cursor's state after this call says whether the reset is
			// a loss (degraded) or a new start (a new incarnation).
			r.degradedWhy = ""
			if r.cur.Degraded() {
				r.degradedWhy = "lost history: " + r.lossReason(r.cur.Stats(), r.prev)
			}
			if err := r.s.app.ResetRank(src.rank(), r.cur.Degraded(), r.degradedWhy); err != nil && !errors.Is(err, ErrFenced) {
				r.s.cfg.Logger.Error("reset rank", "worker", src.Worker, "rank", src.Rank, "err", err)
			}
		case cursor.ActReplay:
			r.stopReplay()
			r.replayFrom = a.From
			if r.started.IsZero() {
				r.started = time.Now()
			}
			if d := time.Until(a.At); d > 0 {
				pa := a
				r.pending = &pa
				r.pendingTimer.Reset(d)
			} else {
				r.startAttempt(ctx, a)
			}
		case cursor.ActStopReplay:
			r.stopReplay()
		}
	}
	r.publish()
}

// apply decodes and applies one batch. A batch that cannot be decoded, or
// that left out an event that may have removed blocks (Skips.Lossy), is
// dropped and the cursor told: it returns the cursor's reset actions. A
// batch that left out only BlockStored events is applied, and the rank
// marked degraded (a strict subset) without a reset.
func (r *run) apply(seq, digest uint64, payload []byte) []cursor.Action {
	src := r.s.src
	if err := r.dec.Decode(payload, &r.batch); err != nil {
		r.dropErr(err)
		r.corrupt = "a batch could not be decoded"
		r.log(slog.LevelWarn, "corrupt", time.Minute, "batch cannot be decoded: rank reset and marked degraded", "seq", seq, "err", err)
		return r.cur.Corrupt()
	}
	skips := &r.batch.Skipped
	if skips.First != nil {
		r.countSkips(skips)
	}
	rank := src.rank()
	if r.batch.HasDPRank && uint32(r.batch.DPRank) != src.Rank {
		if r.batch.DPRank < 0 || !registered(src.Rank, *r.s.ranks.Load(), uint32(r.batch.DPRank)) {
			r.drop("unknown_rank")
			return nil
		}
		rank.DPRank = uint32(r.batch.DPRank)
	}
	if skips.Lossy() {
		// Applying the rest would keep what the skipped event removed.
		// Resetting clears everything anyway, so nothing is applied.
		r.drop("lossy")
		r.corrupt = "a batch had an undecodable event that may have removed blocks"
		r.log(slog.LevelWarn, "lossy", time.Minute, "batch has undecodable events that may have removed blocks: rank reset and marked degraded",
			"seq", seq, "skipped", skips.Total(), "first_err", skips.First)
		if rank != src.rank() {
			// Stamped with another registered rank: that rank may hold
			// what was removed too.
			if err := r.s.app.ResetRank(rank, true, "lost history: "+r.corrupt); err != nil && !errors.Is(err, ErrFenced) {
				r.s.cfg.Logger.Error("reset rank", "worker", src.Worker, "rank", rank.DPRank, "err", err)
			}
		}
		return r.cur.Corrupt()
	}
	var stored, removed, clears float64
	for i := range r.batch.Events {
		switch r.batch.Events[i].Kind {
		case wire.KindBlockStored:
			stored++
		case wire.KindBlockRemoved:
			removed++
		case wire.KindAllBlocksCleared:
			clears++
		}
	}
	// A store skipped after the batch's last AllBlocksCleared is missing
	// from the rank whatever came before: degraded, without a reset.
	subset := skips.First != nil && skippedAfterClear(&r.batch)
	// Stores whose blocks are not of the registered size are left out
	// (never hashed at the wrong size): the rank lacks them, so it is
	// degraded the same way, with a reason naming both sizes.
	mismatch, mismatched := r.checkSizes(seq, rank)
	// The rank's state after the batch goes in with it: an AllBlocksCleared
	// lifts degraded (ObserveCleared below), a skipped store sets it.
	//
	// A batch stamped with another registered rank (a publisher that
	// carries several ranks) is that rank's: it records no watermark there
	// (the seq is this stream's), it marks the rank degraded when this
	// stream lost history it may have carried or skipped one of its stores,
	// and it neither lifts this stream's flag (its AllBlocksCleared clears
	// the other rank) nor sets it (its skipped stores are the other rank's).
	foreign := rank != src.rank()
	mark := indexer.Mark{Seq: seq, Digest: digest, Degraded: r.cur.Degraded() && clears == 0, Foreign: foreign}
	switch {
	case mismatched:
		mark.Degraded, mark.Reason = true, mismatch
	case subset:
		mark.Degraded, mark.Reason = true, "a BlockStored event could not be decoded: the rank lacks its blocks"
	case mark.Degraded:
		mark.Reason = r.degradedWhy
		if foreign {
			mark.Reason = fmt.Sprintf("rank %d's stream, which carries this rank's events, lost history: %s", src.Rank, r.degradedWhy)
		}
	}
	var res indexer.BatchResult
	var err error
	if br, ok := r.s.app.(batchResults); ok {
		res, err = br.ApplyBatchResult(rank, mark, &r.batch)
	} else {
		err = r.s.app.ApplyBatch(rank, mark, &r.batch)
	}
	if err != nil {
		if !errors.Is(err, ErrFenced) { // fenced: the stream is being stopped
			r.s.cfg.Logger.Error("apply batch", "worker", src.Worker, "rank", rank.DPRank, "seq", seq, "err", err)
			r.drop("apply_error")
		}
		return nil
	}
	if m := r.s.cfg.Metrics; m != nil {
		m.batches.WithLabelValues(r.labels[0], r.labels[1], "applied").Inc()
		m.events.WithLabelValues(r.labels[0], r.labels[1], "stored").Add(stored)
		m.events.WithLabelValues(r.labels[0], r.labels[1], "removed").Add(removed)
		m.events.WithLabelValues(r.labels[0], r.labels[1], "cleared").Add(clears)
		m.events.WithLabelValues(r.labels[0], r.labels[1], "unknown").Add(float64(r.batch.Unknown))
		m.redundant.WithLabelValues(r.labels[0], r.labels[1]).Add(float64(res.Redundant))
	}
	if res.Redundant > 0 {
		r.redundant += res.Redundant
		r.log(slog.LevelWarn, "redundant", time.Minute, redundantStoreMsg, "seq", seq, "blocks", res.Redundant, "total", r.redundant)
	}
	if foreign {
		if subset {
			r.log(slog.LevelWarn, "subset", time.Minute, "batch for another rank has undecodable BlockStored events: applied without them, that rank marked degraded",
				"seq", seq, "batch_rank", rank.DPRank, "skipped", skips.Total(), "first_err", skips.First)
		}
		return nil
	}
	if clears > 0 {
		r.cur.ObserveCleared()
		r.degradedWhy = ""
	}
	if mismatched {
		r.cur.Degrade() // after ObserveCleared, which it overrides
		r.degradedWhy = mark.Reason
	} else if subset {
		r.cur.Degrade() // after ObserveCleared, which it overrides
		r.degradedWhy = mark.Reason
		r.log(slog.LevelWarn, "subset", time.Minute, "batch has undecodable BlockStored events: applied without them, rank marked degraded (it lacks their blocks)",
			"seq", seq, "skipped", skips.Total(), "first_err", skips.First)
	}
	return nil
}

// checkSizes leaves out of the batch every BlockStored whose blocks
// contradict the registered block size (wire.CheckBlockSize), counts
// them, logs the first of a kind (and again only when the engine's size
// changes), and returns the reason to degrade rank with and whether to:
// a mismatch after the batch's last AllBlocksCleared leaves the rank
// without those blocks (one before it is cleared anyway).
func (r *run) checkSizes(seq uint64, rank indexer.Rank) (string, bool) {
	want := r.s.src.BlockSize
	if want <= 0 {
		return "", false
	}
	evs := r.batch.Events
	var first wire.SizeMismatch
	n, last, lastClear := 0, -1, -1
	for i := range evs {
		ev := &evs[i]
		if ev.Kind == wire.KindAllBlocksCleared {
			lastClear = i
		}
		m, bad := wire.CheckBlockSize(ev, want, r.sizeSeen)
		if !bad {
			if ev.Kind == wire.KindBlockStored && int(ev.BlockSize) == want && len(ev.TokenIDs) >= want {
				r.sizeSeen = true
			}
			continue
		}
		if n == 0 {
			first = m
		}
		n++
		last = i
		ev.Kind = kindLeftOut
	}
	if n == 0 {
		return "", false
	}
	r.batch.Events = slices.DeleteFunc(evs, func(ev wire.Event) bool { return ev.Kind == kindLeftOut })
	if m := r.s.cfg.Metrics; m != nil {
		m.sizeMismatch.WithLabelValues(r.labels[0], r.labels[1]).Add(float64(n))
	}
	reason := first.Reason()
	if key := fmt.Sprint(first.EngineSize(), "/", first.Field); key != r.sizeLogged {
		r.sizeLogged = key
		r.log(slog.LevelWarn, "block size", 0, blockSizeMismatchMsg, "seq", seq, "batch_rank", rank.DPRank,
			"registered_block_size", want, "engine_block_size", first.EngineSize(), "block_size_field", first.Field,
			"token_ids", first.Tokens, "block_hashes", first.Hashes, "events", n)
	}
	return reason, last > lastClear
}

// kindLeftOut marks an event checkSizes takes out of its batch.
const kindLeftOut wire.Kind = 255

// blockSizeMismatchMsg is the line a Subscriber logs at WARN the first
// time its engine's BlockStored events contradict the registered block
// size (and again if the engine's size changes). docs/operations.md
// quotes it.
const blockSizeMismatchMsg = "block size mismatch: the engine's blocks are not of the registered block size; its BlockStored events are not indexed and the rank is marked degraded (check the worker's block_size)"

// skippedAfterClear reports whether b skipped an event after its last
// AllBlocksCleared (or has none): a skip before a clear leaves nothing
// missing.
func skippedAfterClear(b *wire.Batch) bool {
	for i := len(b.Events) - 1; i >= 0; i-- {
		if b.Events[i].Kind == wire.KindAllBlocksCleared {
			return b.Skipped.Last > i
		}
	}
	return b.Skipped.Total() > 0
}

// countSkips counts a batch's skipped events in the metrics.
func (r *run) countSkips(s *wire.Skips) {
	m := r.s.cfg.Metrics
	if m == nil {
		return
	}
	for k := range s.N {
		for i, n := range s.N[k] {
			if n > 0 {
				m.skipped.WithLabelValues(r.labels[0], r.labels[1], wire.SkipKind(k).String(), wire.SkipReasons[i]).Add(float64(n))
			}
		}
	}
}

// errPreempted ends a replay attempt whose slot was given to a waiting
// rank (ReplaySlots).
var errPreempted = errors.New("replay preempted: slot given to a waiting rank")

// startAttempt queues for a replay slot, then opens a fresh DEALER for
// replay attempt a and streams its messages to r.replayCh until the
// attempt is stopped or preempted.
func (r *run) startAttempt(ctx context.Context, a cursor.Action) {
	r.stopReplay()
	actx, cancel := context.WithCancel(ctx)
	r.attemptStop = cancel
	ep, timeout, slots := zmtp.Endpoint(r.s.src.ReplayEndpoint), r.s.cfg.DialTimeout, r.s.cfg.ReplaySlots
	if slots != nil {
		r.queuedSince = time.Now()
	}
	send := func(m replayMsg) bool {
		select {
		case r.replayCh <- m:
			return true
		case <-actx.Done():
			return false
		}
	}
	r.attemptWG.Add(1)
	go func() {
		defer r.attemptWG.Done()
		// The attempt's sockets live in sctx, which preemption ends too.
		sctx, preempt := context.WithCancel(actx)
		defer preempt()
		slot, err := slots.Acquire(actx, preempt)
		if err != nil {
			return
		}
		defer slot.Release()
		if !send(replayMsg{attempt: a.Attempt, started: true}) {
			return
		}
		fail := func(err error) {
			if slot.Preempted() {
				err = errPreempted
			}
			send(replayMsg{attempt: a.Attempt, err: err})
		}
		d := zmq4.NewDealer(zmtp.WithLimits(sctx, r.s.cfg.Limits), zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout))
		defer d.Close()
		if err := d.Dial(ep); err != nil {
			fail(err)
			return
		}
		if err := d.SendMulti(zmq4.NewMsgFrom(wire.ReplayRequest(a.From)...)); err != nil {
			// The connection died under the request: its reader knows why.
			recvErr, recvDone := make(chan error, 1), make(chan struct{})
			go func() {
				defer close(recvDone)
				_, err := d.Recv()
				recvErr <- err
			}()
			fail(firstErr(sctx, recvErr, err, timeout))
			d.Close() // ends the Recv if it is still waiting
			<-recvDone
			return
		}
		stop := context.AfterFunc(sctx, func() { d.Close() }) // unblocks Recv
		defer stop()
		for {
			msg, err := d.Recv()
			if err != nil {
				fail(err)
				return
			}
			if !send(replayMsg{attempt: a.Attempt, frames: msg.Frames}) {
				return
			}
		}
	}()
}

// stopReplay abandons the replay attempt in flight (and a pending one).
func (r *run) stopReplay() {
	r.queuedSince = time.Time{}
	r.pending = nil
	r.pendingTimer.Stop()
	r.idle.Stop()
	if r.attemptStop != nil {
		r.attemptStop()
		r.attemptStop = nil
	}
	r.attemptWG.Wait()
	// Drain what the abandoned attempt queued; it is stale.
	for {
		select {
		case <-r.replayCh:
		default:
			return
		}
	}
}

func (r *run) resetProbe() {
	r.probe.Stop()
	if d := r.s.cfg.ProbeInterval; d > 0 && r.s.cfg.Cursor.HasReplay {
		r.probe.Reset(d)
	}
}

func (r *run) resetIdle() {
	r.idle.Stop()
	r.idle.Reset(r.s.cfg.IdleTimeout)
}

func (r *run) dropErr(err error) {
	var fe *wire.FrameError
	var de *wire.DecodeError
	switch {
	case errors.As(err, &fe):
		r.drop(fe.Reason)
	case errors.As(err, &de):
		r.drop("malformed_" + de.Reason)
	default:
		r.drop("error")
	}
}

func (r *run) drop(reason string) {
	if m := r.s.cfg.Metrics; m != nil {
		m.dropped.WithLabelValues(r.labels[0], r.labels[1], reason).Inc()
	}
}

func (r *run) setUp(up bool) {
	r.s.mu.Lock()
	r.s.state.Connected = up
	r.s.mu.Unlock()
	if m := r.s.cfg.Metrics; m != nil {
		v := 0.0
		if up {
			v = 1
		}
		m.up.WithLabelValues(r.labels[0], r.labels[1]).Set(v)
	}
}

// publish refreshes State and the metrics after cursor calls.
func (r *run) publish() {
	c := r.cur
	st := c.Stats()
	degraded, truncated := c.Degraded(), false
	if w, ok := r.s.app.(indexWord); ok {
		d, t := w.Degraded(r.s.src.rank())
		degraded, truncated = degraded || d || t, t
	}
	if !r.synced && c.Mode() == cursor.ModeLive {
		r.synced = true
	}
	if m := r.s.cfg.Metrics; m != nil {
		w, k := r.labels[0], r.labels[1]
		m.gaps.WithLabelValues(w, k).Add(float64(st.Gaps - r.prev.Gaps))
		m.restarts.WithLabelValues(w, k).Add(float64(st.Restarts - r.prev.Restarts))
		m.probes.WithLabelValues(w, k).Add(float64(st.Probes - r.prev.Probes))
		ok := st.ReplaysOK - r.prev.ReplaysOK
		if ok > 0 && r.emptyProbe() {
			ok-- // a probe that found nothing fetched no missed batch
		}
		m.replays.WithLabelValues(w, k, "ok").Add(float64(ok))
		m.replays.WithLabelValues(w, k, "partial").Add(float64(st.Incomplete - r.prev.Incomplete))
		m.replays.WithLabelValues(w, k, "failed").Add(float64(st.ReplaysFailed - r.prev.ReplaysFailed))
		m.batches.WithLabelValues(w, k, "duplicate").Add(float64(st.Duplicates - r.prev.Duplicates))
		if n := st.Overflows - r.prev.Overflows; n > 0 {
			m.dropped.WithLabelValues(w, k, "buffer_overflow").Add(float64(n))
		}
		if seq, ok := c.Applied(); ok {
			m.lastSeq.WithLabelValues(w, k).Set(float64(seq))
		}
		if seq, ok := c.LastLive(); ok {
			m.lastSeen.WithLabelValues(w, k).Set(float64(seq))
		} else {
			// Nothing live on this connection yet: a seq from before a
			// reconnect (maybe of an engine since restarted) is no lag.
			m.lastSeen.DeleteLabelValues(w, k)
		}
		d := 0.0
		if degraded {
			d = 1
		}
		m.degraded.WithLabelValues(w, k).Set(d)
		if (st.ReplaysOK > r.prev.ReplaysOK || st.ReplaysFailed > r.prev.ReplaysFailed) && !r.started.IsZero() {
			m.replayTime.Observe(time.Since(r.started).Seconds())
		}
	}
	r.logChanges(st, degraded, truncated)
	if !c.Degraded() {
		r.degradedWhy = ""
	}
	if (st.ReplaysOK > r.prev.ReplaysOK || st.ReplaysFailed > r.prev.ReplaysFailed) || c.Mode() == cursor.ModeLive {
		r.started = time.Time{}
	}
	r.prev = st
	r.armDeadline()
	seq, ok := c.Applied()
	live, hasLive := c.LastLive()
	next := State{Connected: r.s.State().Connected, Mode: c.Mode(), Applied: seq, HasApplied: ok,
		LastLive: live, HasLive: hasLive, Degraded: degraded, Synced: r.synced, Stats: st}
	// An idle probe (a quiet stream asking for anything newer) is no
	// known lag: the rank's state stays as it was, not pending for the
	// moments the probe waits for a slot and runs.
	if (c.Mode() == cursor.ModeReplay || c.Mode() == cursor.ModeVerify) && r.session.reason != "probe" {
		next.Replay = ReplayRunning
		if !r.queuedSince.IsZero() {
			next.Replay, next.ReplayQueuedSince = ReplayQueued, r.queuedSince
		}
	}
	r.s.mu.Lock()
	changed := next != r.s.state
	r.s.state = next
	r.s.mu.Unlock()
	if changed && r.s.cfg.OnStateChange != nil {
		r.s.cfg.OnStateChange(next)
	}
}

// armDeadline keeps the deadline timer on the cursor's session deadline.
func (r *run) armDeadline() {
	at, ok := r.cur.Deadline()
	if !ok {
		if !r.deadlineAt.IsZero() {
			r.deadline.Stop()
			r.deadlineAt = time.Time{}
		}
		return
	}
	if at.Equal(r.deadlineAt) {
		return
	}
	r.deadline.Stop()
	r.deadline.Reset(max(time.Until(at), 0))
	r.deadlineAt = at
}

// logChanges logs what the cursor's counters say happened since the last
// publish: replay sessions started and finished, lost history, engine
// restarts, a rank exact again. Lines that can repeat are rate-limited
// per kind. A probe's replay (a quiet stream asking for anything newer)
// is logged only when it found something.
func (r *run) logChanges(st cursor.Stats, degraded, truncated bool) {
	p, c := r.prev, r.cur
	applied, hasApplied := c.Applied()
	live, hasLive := c.LastLive()
	seqs := func(attrs ...any) []any {
		if hasApplied {
			attrs = append(attrs, "applied_seq", applied)
		}
		if hasLive {
			attrs = append(attrs, "live_seq", live)
		}
		return attrs
	}
	if st.Restarts > p.Restarts {
		r.log(slog.LevelInfo, "restart", 10*time.Second, "engine restarted: a new incarnation; rank reset, replaying it", seqs()...)
	}
	if st.Overflows > p.Overflows {
		r.log(slog.LevelWarn, "overflow", time.Minute, "live batches overflowed the buffer during a replay: rank reset, replaying from the start", seqs()...)
	}
	took := time.Duration(0)
	if !r.started.IsZero() {
		took = time.Since(r.started).Round(time.Millisecond)
	}
	if st.ReplaysOK > p.ReplaysOK || st.ReplaysFailed > p.ReplaysFailed {
		if st.ReplaysOK > p.ReplaysOK && !r.emptyProbe() {
			r.log(slog.LevelInfo, "replay ok", 30*time.Second, "replay complete", seqs("reason", r.session.reason, "took", took)...)
		}
		r.session = replaySession{}
	}
	if st.Replays > p.Replays {
		r.session = replaySession{reason: "gap", applied: applied, hadApplied: hasApplied}
		switch {
		case st.Probes > p.Probes:
			r.session.reason = "probe"
		case st.Restarts > p.Restarts || st.Overflows > p.Overflows:
			r.session.reason = "restart"
		case c.Mode() == cursor.ModeVerify:
			r.session.reason = "reconnect"
		case !hasApplied:
			r.session.reason = "join"
		}
		if r.session.reason != "probe" {
			r.log(slog.LevelInfo, "replay", 30*time.Second, "replay started", seqs("reason", r.session.reason, "from", r.replayFrom)...)
		}
	}
	if st.LostHistory > p.LostHistory {
		r.log(slog.LevelWarn, "lost", 10*time.Second, "lost history: rank reset and marked degraded", seqs("reason", r.lossReason(st, p), "took", took)...)
	}
	r.corrupt, r.expired = "", false
	if truncated && !r.wasTruncated {
		r.log(slog.LevelWarn, "truncated", time.Minute, "rank truncated: the index dropped some of its blocks (the memory cap, or more than its registered capacity); marked degraded until its engine clears", seqs()...)
	}
	r.wasTruncated = truncated
	if degraded != r.wasDegraded {
		if !degraded {
			r.log(slog.LevelInfo, "exact", 10*time.Second, "rank exact again: degraded cleared", seqs()...)
		}
		r.wasDegraded = degraded
	}
}

// emptyProbe reports whether the replay session in progress is a probe
// that has applied nothing new: a quiet stream asked for anything newer
// and there was none.
func (r *run) emptyProbe() bool {
	if r.session.reason != "probe" {
		return false
	}
	applied, ok := r.cur.Applied()
	return !ok || (r.session.hadApplied && applied == r.session.applied)
}

// lossReason says why the rank lost history between the counters p and
// st.
func (r *run) lossReason(st, p cursor.Stats) string {
	switch {
	case r.corrupt != "":
		return r.corrupt
	case !r.s.cfg.Cursor.HasReplay:
		return "no replay endpoint"
	case r.expired:
		return "the replay ran past its deadline"
	case st.ReplaysFailed > p.ReplaysFailed && st.Incomplete > p.Incomplete:
		return "replay attempts ran out"
	}
	return "the engine no longer has the batches"
}

// replaySession is what logChanges remembers of the session in progress.
type replaySession struct {
	reason     string // join, gap, restart, reconnect, probe
	applied    uint64 // the applied seq when it started
	hadApplied bool
}

func framesLen(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}

// firstErr returns the error a socket's reader reports within wait (or
// until ctx ends), or fallback: when a write fails because the connection
// closed, the reader has the cause (a frame the guard refused, an EOF).
// It consumes what it reads from reader.
func firstErr(ctx context.Context, reader <-chan error, fallback error, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-reader:
		if err != nil {
			return err
		}
	case <-t.C:
	case <-ctx.Done():
	}
	return fallback
}

// disconnected logs a connection that ended.
func (r *run) disconnected(err error, retry time.Duration) {
	if r.refused(err, "live") {
		return // logged as what it was
	}
	if errors.Is(err, zmtp.ErrHandshakeTimeout) {
		r.log(slog.LevelWarn, "handshake", time.Minute, "stream handshake timed out: the endpoint accepted but did not speak ZMTP in time",
			"endpoint", r.s.src.Endpoint, "err", err, "retry_in", retry)
		return
	}
	r.log(slog.LevelWarn, "disconnect", time.Minute, "stream disconnected", "endpoint", r.s.src.Endpoint, "err", err, "retry_in", retry)
}

// refused counts and logs a connection the ZMTP guard closed because the
// engine sent a frame over the size limit or broke the protocol, and
// reports whether err was one. socket is "live" or "replay".
func (r *run) refused(err error, socket string) bool {
	ep := r.s.src.Endpoint
	if socket == "replay" {
		ep = r.s.src.ReplayEndpoint
	}
	var le *zmtp.LimitError
	var pe *zmtp.ProtocolError
	switch {
	case errors.As(err, &le):
		r.drop("oversize")
		r.log(slog.LevelWarn, "oversize "+socket, time.Minute, "frame refused: larger than the message size limit; connection closed, reconnecting with backoff",
			"socket", socket, "endpoint", ep, "claimed_bytes", le.Size, "limit_bytes", le.Max)
	case errors.As(err, &pe):
		r.drop("protocol")
		r.log(slog.LevelWarn, "protocol "+socket, time.Minute, "connection refused: the engine broke the ZMTP protocol; reconnecting with backoff",
			"socket", socket, "endpoint", ep, "err", err)
	default:
		return false
	}
	return true
}

// log writes one line with the rank's worker and rank, at most once per
// every for its key; the next line after a quiet spell says how many it
// held back.
func (r *run) log(level slog.Level, key string, every time.Duration, msg string, attrs ...any) {
	n, ok := r.logs.allow(key, every, time.Now())
	if !ok {
		return
	}
	attrs = append([]any{"worker", r.s.src.Worker, "rank", r.s.src.Rank}, attrs...)
	if n > 0 {
		attrs = append(attrs, "suppressed", n)
	}
	r.s.cfg.Logger.Log(context.Background(), level, msg, attrs...)
}

// logLimiter rate-limits log lines per key. Not safe for concurrent use.
type logLimiter struct {
	last       map[string]time.Time
	suppressed map[string]int
}

// allow reports whether a line of key may be written now, and how many
// were held back since the last one.
func (l *logLimiter) allow(key string, every time.Duration, now time.Time) (int, bool) {
	if l.last == nil {
		l.last, l.suppressed = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := l.last[key]; ok && now.Sub(t) < every {
		l.suppressed[key]++
		return 0, false
	}
	n := l.suppressed[key]
	l.last[key], l.suppressed[key] = now, 0
	return n, true
}
