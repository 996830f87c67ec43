package cursor

import (
	"fmt"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/prefixd/prefixd/internal/leaf/retry"
)

// Config configures a Cursor. Zero fields take the defaults noted.
type Config struct {
	// HasReplay says the source has a replay endpoint. Without one, every
	// gap (and a join that starts above SeqBase) is lost history.
	HasReplay bool
	// SeqBase is the first seq of an engine incarnation: 0 for vLLM, SGLang
	// and Dynamo; 1 for llm-d-inference-sim.
	SeqBase uint64
	// MaxBuffered and MaxBufferedBytes bound the live batches held while a
	// replay runs (default 4096 batches, 32 MiB). Past either, the merge is
	// abandoned: the rank is reset and replayed from SeqBase.
	MaxBuffered      int
	MaxBufferedBytes int
	// MaxAttempts bounds replay attempts in a row that make no progress
	// before history counts as lost (default 3).
	MaxAttempts int
	// Deadline bounds one whole replay, all attempts (default 2 min).
	Deadline time.Duration
	// Backoff is the delay before the first retry; it doubles per retry
	// without progress, up to 16×, with no jitter (retry.Interval; default
	// 250 ms).
	Backoff time.Duration
}

func (c *Config) defaults() {
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = 4096
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = 32 << 20
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.Deadline <= 0 {
		c.Deadline = 2 * time.Minute
	}
	if c.Backoff <= 0 {
		c.Backoff = 250 * time.Millisecond
	}
}

// ActionKind says what an Action asks the driver to do.
type ActionKind uint8

const (
	// ActApply: decode Payload and apply it to the rank as batch Seq.
	ActApply ActionKind = iota + 1
	// ActReset: clear everything the rank holds in the index.
	ActReset
	// ActReplay: abandon any replay attempt in flight at once and request
	// a replay from From over a fresh DEALER, not before At. Messages of the
	// new attempt are reported with its Attempt number; those of older
	// attempts are ignored.
	ActReplay
	// ActStopReplay: abandon the replay attempt in flight; none follows.
	ActStopReplay
)

// Action is one thing the driver must do, in order. Payload is the slice
// the Cursor was given (or buffered); the driver must not keep it past the
// next Cursor call if it reuses receive buffers.
type Action struct {
	Kind    ActionKind
	Seq     uint64
	Payload []byte
	From    uint64
	At      time.Time
	Attempt uint64
	Digest  uint64 // ActApply: xxh3 of Payload, to record with the watermark
}

func (a Action) String() string {
	switch a.Kind {
	case ActApply:
		return fmt.Sprintf("apply %d", a.Seq)
	case ActReset:
		return "reset"
	case ActReplay:
		return fmt.Sprintf("replay from=%d attempt=%d", a.From, a.Attempt)
	case ActStopReplay:
		return "stop-replay"
	}
	return fmt.Sprintf("action(%d)", a.Kind)
}

// Mode is what a Cursor is doing.
type Mode uint8

const (
	ModeIdle      Mode = iota // not connected
	ModeLive                  // applying live batches in order
	ModeReplay                // a replay is running; live batches are buffered
	ModeVerify                // after a reconnect: checking the last applied batch is still the engine's
	ModeAwaitLive             // no replay endpoint: the next live batch decides
)

var modeNames = [...]string{"idle", "live", "replay", "verify", "await-live"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", m)
}

// Stats counts what a Cursor saw. Counters only grow.
type Stats struct {
	Gaps           uint64 // live seq above the next expected
	Duplicates     uint64 // live or replayed batches already applied
	Restarts       uint64 // new engine incarnations detected
	Replays        uint64 // replay sessions started (a session may take several attempts)
	ReplaysOK      uint64 // sessions that closed every gap
	ReplaysFailed  uint64 // sessions that ended in lost history
	Attempts       uint64 // replay requests sent
	Incomplete     uint64 // attempts that ended without the end marker (timeout, EOF, hole)
	Overflows      uint64 // live buffer overflowed during a replay
	Verified       uint64 // reconnects whose last applied batch the engine confirmed
	Suspects       uint64 // live batches at or below the applied seq that no recent digest vouched for (verified against the engine)
	Probes         uint64 // replays asked for by Probe on a quiet stream
	LostHistory    uint64 // times the rank was reset and marked degraded
	Subsets        uint64 // times the rank was marked degraded without a reset (Degrade)
	BufferedAtPeak int    // most live batches held at once
}

// recentBatches is how many applied batches' digests a Cursor keeps.
const recentBatches = 256

type recentBatch struct {
	seq, digest uint64
	ok          bool
}

type pending struct {
	seq     uint64
	payload []byte
}

// Cursor is the per-source sequence state machine: it decides, for every
// live batch, replay message and replay outcome of one engine publisher
// (one worker rank's socket), what must be applied, reset or requested.
// It does no I/O and reads no clock: callers pass now, and execute the
// returned actions in order. Not safe for concurrent use.
//
// It keeps two watermarks: the last seq received on the live socket and
// the last seq applied. A live batch is never applied ahead of an
// outstanding earlier seq; a rank whose history is known to be incomplete
// is reset and marked degraded (it then holds a subset of the engine's
// cache) until an AllBlocksCleared or a complete replay of a new
// incarnation.
type Cursor struct {
	cfg  Config
	mode Mode

	live, applied       uint64
	hasLive, hasApplied bool
	digest              uint64 // xxh3 of the payload applied as seq applied
	degraded            bool
	// recent holds the digests of the last recentBatches batches applied
	// (slot seq % recentBatches), so that a live batch at or below the
	// applied seq can be told apart: the same digest is a duplicate (a
	// live batch that replay already applied), another one a new engine
	// incarnation whose seqs started over unseen on the live socket.
	recent [recentBatches]recentBatch

	buf      []pending // live batches held during a replay, sorted by seq
	bufBytes int

	// The replay session and its current attempt.
	from      uint64 // start requested by the current attempt
	next      uint64 // next seq this session must apply
	gotFirst  bool   // the current attempt delivered a message
	progress  bool   // the current attempt applied something
	attempts  int    // attempts in a row without progress
	deadline  time.Time
	inSession bool
	attempt   uint64 // number of the attempt in flight; older ones are stale

	stats Stats
	out   []Action
}

// New returns a cursor for a source that has never been connected.
func New(cfg Config) *Cursor {
	cfg.defaults()
	return &Cursor{cfg: cfg}
}

// Mode returns what the cursor is doing.
func (c *Cursor) Mode() Mode { return c.mode }

// Degraded reports whether the rank's history is known to be incomplete.
func (c *Cursor) Degraded() bool { return c.degraded }

// Applied returns the last applied seq.
func (c *Cursor) Applied() (seq uint64, ok bool) { return c.applied, c.hasApplied }

// LastLive returns the last seq received on the live socket.
func (c *Cursor) LastLive() (seq uint64, ok bool) { return c.live, c.hasLive }

// Buffered returns how many live batches wait for a replay to finish.
func (c *Cursor) Buffered() int { return len(c.buf) }

// Stats returns the counters.
func (c *Cursor) Stats() Stats { return c.stats }

// Connected is called when a new socket to the source is up (first join or
// reconnect). A joining cursor asks for a replay from SeqBase at once: an
// idle engine publishes nothing, and its cache must still be indexed. A
// reconnecting cursor asks for a replay from the last applied seq itself,
// to check that the engine still has that batch with the same digest.
func (c *Cursor) Connected(now time.Time) []Action {
	c.out = c.out[:0]
	c.hasLive = false
	c.dropBuffer()
	c.inSession = false
	switch {
	case c.cfg.HasReplay && !c.hasApplied:
		c.startSession(now, c.cfg.SeqBase, ModeReplay)
	case c.cfg.HasReplay:
		c.startSession(now, c.applied, ModeVerify)
	default:
		c.mode = ModeAwaitLive
	}
	return c.out
}

// Resume seeds a cursor that has never been connected with state restored
// from elsewhere (a peer's dump): the rank's index already holds the
// batches up to seq, the last of which had digest. The first Connected
// then verifies, as after a reconnect, that the engine still has that
// batch before resuming after it; otherwise it resets and replays from
// SeqBase.
//
// degraded says the restored state was degraded where it came from: the
// rank stays degraded until what would have lifted it there
// (AllBlocksCleared, a new incarnation replayed from SeqBase).
func (c *Cursor) Resume(seq, digest uint64, degraded bool) {
	c.applied, c.hasApplied, c.digest, c.degraded = seq, true, digest, degraded
	c.recent[seq%recentBatches] = recentBatch{seq: seq, digest: digest, ok: true}
}

// Disconnected is called when the socket is gone (EOF or error); the
// driver makes a new one and calls Connected.
func (c *Cursor) Disconnected() []Action {
	c.out = c.out[:0]
	if c.mode == ModeReplay || c.mode == ModeVerify {
		c.emit(Action{Kind: ActStopReplay})
	}
	c.attempt++ // whatever is still in flight is stale
	c.mode = ModeIdle
	c.inSession = false
	c.dropBuffer()
	return c.out
}

// ObserveCleared is called after applying a batch that contained
// AllBlocksCleared: the rank's state is exact again.
func (c *Cursor) ObserveCleared() { c.degraded = false }

// Probe is called when the live socket has been quiet for a while: a PUB
// drops silently, and a lost last batch leaves no gap to see until the
// engine publishes again, which an idle engine may never do. Nor does a
// lost batch of a new incarnation: an engine that restarted in place and
// published fewer batches than were applied before, all lost (a
// subscription not yet through to the PUB), shows no seq that gives it
// away. So Probe verifies as a reconnect does: it asks for a replay from
// the last applied seq, and the batch there must be the one applied
// (same digest) — then the replay carries on with what is new; an
// engine with nothing new answers with that batch and the end marker.
// Without an applied batch it asks from SeqBase.
func (c *Cursor) Probe(now time.Time) []Action {
	c.out = c.out[:0]
	if c.mode != ModeLive || !c.cfg.HasReplay {
		return c.out
	}
	c.stats.Probes++
	if c.hasApplied {
		c.startSession(now, c.applied, ModeVerify)
	} else {
		c.startSession(now, c.cfg.SeqBase, ModeReplay)
	}
	return c.out
}

// Corrupt is called when an applied batch could not be decoded, or left
// out an event that may have removed blocks: whatever it removed may still
// be indexed, so the rank is reset and degraded. The stream carries on
// after that seq.
func (c *Cursor) Corrupt() []Action {
	c.out = c.out[:0]
	c.stats.LostHistory++
	c.emit(Action{Kind: ActReset})
	c.degraded = true
	return c.out
}

// Degrade is called when an applied batch left out events that would
// have added blocks (BlockStored events that could not be decoded): the
// rank now holds a strict subset of the engine's cache. Nothing it holds
// is wrong, so it is not reset; it is marked degraded until, as after lost
// history, an AllBlocksCleared or a complete replay of a new incarnation.
// A batch that may have lost a remove is Corrupt instead.
func (c *Cursor) Degrade() {
	c.stats.Subsets++
	c.degraded = true
}

// Live handles a batch received on the live socket.
func (c *Cursor) Live(seq uint64, payload []byte, now time.Time) []Action {
	c.out = c.out[:0]
	if c.hasLive && seq < c.live {
		c.live = seq
		c.restart(seq, payload, now)
		return c.out
	}
	c.live, c.hasLive = seq, true
	if c.hasApplied && seq <= c.applied && c.mode != ModeAwaitLive && c.cfg.HasReplay {
		c.behind(seq, payload, now)
		return c.out
	}
	switch c.mode {
	case ModeReplay, ModeVerify:
		if c.hasApplied && seq <= c.applied {
			c.stats.Duplicates++
			return c.out
		}
		c.hold(seq, payload, now)
	case ModeAwaitLive:
		c.firstWithoutReplay(seq, payload)
	case ModeLive:
		c.liveInOrder(seq, payload, now)
	}
	return c.out
}

func (c *Cursor) liveInOrder(seq uint64, payload []byte, now time.Time) {
	switch {
	case !c.hasApplied:
		switch {
		case seq == c.cfg.SeqBase:
			c.degraded = false // a whole incarnation from its first batch
			c.apply(seq, payload)
		case c.degraded:
			c.apply(seq, payload) // after lost history: carry on from here
		case c.cfg.HasReplay:
			c.stats.Gaps++
			if !c.hold(seq, payload, now) {
				c.startSession(now, c.cfg.SeqBase, ModeReplay)
			}
		default:
			c.lost()
			c.apply(seq, payload)
		}
	case seq <= c.applied:
		c.stats.Duplicates++
	case seq == c.applied+1:
		c.apply(seq, payload)
	default:
		c.stats.Gaps++
		if !c.cfg.HasReplay {
			c.lost()
			c.apply(seq, payload)
			return
		}
		if !c.hold(seq, payload, now) {
			c.startSession(now, c.applied+1, ModeReplay)
		}
	}
}

// behind handles a live batch at or below the applied seq. Usually it is
// a duplicate: replay (a join, a gap, a probe) applied it before the live
// socket delivered it. But when the socket delivered nothing above it
// first, it may be the start of a new incarnation that restarted its seqs
// below the applied one — seen only when a replay, not the live socket,
// brought the old incarnation's history. A recent digest decides; without
// one, the last applied batch is verified with the engine as after a
// reconnect.
func (c *Cursor) behind(seq uint64, payload []byte, now time.Time) {
	r := c.recent[seq%recentBatches]
	switch {
	case r.ok && r.seq == seq && r.digest == xxh3.Hash(payload):
		c.stats.Duplicates++
	case r.ok && r.seq == seq:
		c.restart(seq, payload, now)
	default:
		c.stats.Duplicates++
		if c.mode == ModeLive {
			c.stats.Suspects++
			c.startSession(now, c.applied, ModeVerify)
		}
	}
}

// firstWithoutReplay handles the first live batch of a socket to a source
// without a replay endpoint. Nothing can confirm that a reconnect resumes
// the same incarnation, so anything but a first batch of an incarnation
// means lost history.
func (c *Cursor) firstWithoutReplay(seq uint64, payload []byte) {
	c.mode = ModeLive
	if seq == c.cfg.SeqBase {
		if c.hasApplied {
			c.reset()
		}
		c.degraded = false
		c.apply(seq, payload)
		return
	}
	c.lost()
	c.apply(seq, payload)
}

// restart handles a live seq below the last one: a new engine incarnation.
func (c *Cursor) restart(seq uint64, payload []byte, now time.Time) {
	c.stats.Restarts++
	c.reset()
	c.degraded = false
	if !c.cfg.HasReplay {
		c.inSession = false
		c.mode = ModeAwaitLive
		c.firstWithoutReplay(seq, payload)
		return
	}
	if !c.hold(seq, payload, now) {
		c.startSession(now, c.cfg.SeqBase, ModeReplay)
	}
}

// Attempt returns the number of the latest replay attempt requested.
func (c *Cursor) Attempt() uint64 { return c.attempt }

// ReplayBatch handles one batch message of replay attempt a.
func (c *Cursor) ReplayBatch(a, seq uint64, payload []byte, now time.Time) []Action {
	c.out = c.out[:0]
	if a != c.attempt {
		return c.out // a stale message of an abandoned attempt
	}
	first := !c.gotFirst
	c.gotFirst = true
	switch c.mode {
	case ModeVerify:
		if !first {
			return c.out
		}
		if seq == c.applied && xxh3.Hash(payload) == c.digest {
			// Same incarnation: carry on with this attempt's next message.
			c.stats.Verified++
			c.mode = ModeReplay
			c.next = c.applied + 1
			return c.out
		}
		c.newIncarnation(now)
	case ModeReplay:
		if first && seq > max(c.from, c.cfg.SeqBase) {
			// The engine no longer has what we asked for.
			c.lostAndContinue(seq, payload)
			return c.out
		}
		switch {
		case seq < c.next || (c.hasApplied && seq <= c.applied):
			c.stats.Duplicates++
		case seq == c.next:
			c.apply(seq, payload)
			c.next++
			c.progress = true
		default:
			// A hole inside the attempt: messages were dropped. Keep this
			// one and ask again from the hole.
			if !c.hold(seq, payload, now) {
				c.retry(now)
			}
		}
	}
	return c.out
}

// ReplayEnd handles the end marker of replay attempt a.
func (c *Cursor) ReplayEnd(a uint64, now time.Time) []Action {
	c.out = c.out[:0]
	if a != c.attempt {
		return c.out
	}
	switch c.mode {
	case ModeVerify:
		// The engine does not have the batch we applied last: it restarted
		// (or rolled its buffer past it).
		c.newIncarnation(now)
	case ModeReplay:
		c.drain()
		if len(c.buf) == 0 {
			c.endSession(true)
			return c.out
		}
		c.retry(now)
	}
	return c.out
}

// ReplayIncomplete handles an attempt that ended without the end marker:
// an idle timeout, EOF, or a malformed reply. It is not proof of loss.
func (c *Cursor) ReplayIncomplete(a uint64, now time.Time) []Action {
	c.out = c.out[:0]
	if a != c.attempt {
		return c.out
	}
	if c.mode == ModeReplay || c.mode == ModeVerify {
		c.retry(now)
	}
	return c.out
}

// Deadline returns when the replay session in progress runs out of time
// (ok false when no session runs). The driver calls Expire then: a
// replay that keeps trickling batches never ends an attempt, so the
// deadline cannot wait for one to end.
func (c *Cursor) Deadline() (at time.Time, ok bool) {
	return c.deadline, c.inSession && (c.mode == ModeReplay || c.mode == ModeVerify)
}

// Waited extends the session's deadline by d: the time an attempt spent
// waiting for a replay slot, which is not the replay's fault.
func (c *Cursor) Waited(d time.Duration) {
	if c.inSession && d > 0 {
		c.deadline = c.deadline.Add(d)
	}
}

// Expire ends the session in progress if its deadline has passed, as if
// its attempts had run out: a replay is lost history (reset, degraded,
// carry on with what is buffered); an unanswered verification means a
// new incarnation.
func (c *Cursor) Expire(now time.Time) []Action {
	c.out = c.out[:0]
	if at, ok := c.Deadline(); !ok || now.Before(at) {
		return c.out
	}
	c.stats.Incomplete++ // the attempt in flight is cut short
	if c.mode == ModeVerify {
		c.newIncarnation(now)
		return c.out
	}
	c.drain()
	c.lostAfterAttempts()
	return c.out
}

// ---- internals ----

func (c *Cursor) emit(a Action) { c.out = append(c.out, a) }

func (c *Cursor) apply(seq uint64, payload []byte) {
	c.digest = xxh3.Hash(payload)
	c.recent[seq%recentBatches] = recentBatch{seq: seq, digest: c.digest, ok: true}
	c.emit(Action{Kind: ActApply, Seq: seq, Payload: payload, Digest: c.digest})
	c.applied, c.hasApplied = seq, true
}

func (c *Cursor) reset() {
	c.emit(Action{Kind: ActReset})
	c.hasApplied = false
	clear(c.recent[:])
}

// lost marks the history lost: the rank is cleared and degraded.
func (c *Cursor) lost() {
	c.stats.LostHistory++
	c.reset()
	c.degraded = true
}

func (c *Cursor) startSession(now time.Time, from uint64, mode Mode) {
	c.stats.Replays++
	c.inSession = true
	c.attempts = 0
	c.deadline = now.Add(c.cfg.Deadline)
	c.next = from
	c.mode = mode
	c.request(from, now)
}

func (c *Cursor) request(from uint64, at time.Time) {
	c.stats.Attempts++
	c.attempt++
	c.from = from
	c.gotFirst, c.progress = false, false
	c.emit(Action{Kind: ActReplay, From: from, At: at, Attempt: c.attempt})
}

// retry ends the attempt in flight as incomplete and asks again from the
// first missing seq after a backoff, unless the attempts or the deadline
// ran out.
func (c *Cursor) retry(now time.Time) {
	c.stats.Incomplete++
	if c.mode == ModeVerify {
		// Verification never got its answer: retry it as is.
		if c.noMoreAttempts(now) {
			c.newIncarnation(now)
			return
		}
		c.request(c.from, now.Add(c.backoff()))
		return
	}
	c.drain()
	if c.noMoreAttempts(now) {
		c.lostAfterAttempts()
		return
	}
	from := c.cfg.SeqBase
	if c.hasApplied {
		from = c.applied + 1
	}
	c.next = from
	c.request(from, now.Add(c.backoff()))
}

func (c *Cursor) noMoreAttempts(now time.Time) bool {
	if c.progress {
		c.attempts = 0
	} else {
		c.attempts++
	}
	return c.attempts >= c.cfg.MaxAttempts || !now.Before(c.deadline)
}

// backoff is the delay before the next attempt: the retry schedule's
// interval, doubling per attempt without progress up to 16×, without
// jitter (the cursor is deterministic).
func (c *Cursor) backoff() time.Duration {
	return retry.Interval(c.cfg.Backoff, 16*c.cfg.Backoff, c.attempts-1)
}

// newIncarnation handles a reconnect whose last applied batch the engine
// no longer has: reset and replay the new incarnation from SeqBase.
func (c *Cursor) newIncarnation(now time.Time) {
	c.stats.Restarts++
	c.reset()
	c.degraded = false
	c.startSession(now, c.cfg.SeqBase, ModeReplay)
}

// lostAndContinue handles a replay whose first batch is above what was
// asked: reset, mark degraded, apply from this batch on.
func (c *Cursor) lostAndContinue(seq uint64, payload []byte) {
	c.stats.ReplaysFailed++
	c.lost()
	c.apply(seq, payload)
	c.next = seq + 1
	c.progress = true
	i := 0
	for i < len(c.buf) && c.buf[i].seq <= seq {
		c.bufBytes -= len(c.buf[i].payload)
		i++
	}
	c.buf = c.buf[i:]
}

// lostAfterAttempts ends a session whose attempts ran out: reset, mark
// degraded, apply what is buffered, and carry on live.
func (c *Cursor) lostAfterAttempts() {
	c.stats.ReplaysFailed++
	c.lost()
	for _, p := range c.buf {
		c.apply(p.seq, p.payload)
	}
	c.dropBuffer()
	c.emit(Action{Kind: ActStopReplay})
	c.attempt++
	c.endSession(false)
}

// drain applies buffered batches that continue the applied seq.
func (c *Cursor) drain() {
	i := 0
	for ; i < len(c.buf); i++ {
		p := c.buf[i]
		if c.hasApplied && p.seq <= c.applied {
			c.stats.Duplicates++
			continue
		}
		if (!c.hasApplied && p.seq != c.cfg.SeqBase) || (c.hasApplied && p.seq != c.applied+1) {
			break
		}
		c.apply(p.seq, p.payload)
		c.progress = true
	}
	for _, p := range c.buf[:i] {
		c.bufBytes -= len(p.payload)
	}
	c.buf = c.buf[i:]
	if c.hasApplied {
		c.next = c.applied + 1
	}
}

func (c *Cursor) endSession(ok bool) {
	if ok {
		c.stats.ReplaysOK++
	}
	c.inSession = false
	c.mode = ModeLive
}

// hold buffers a live batch during a replay, in seq order without
// duplicates. Overflow abandons the merge: reset and replay from SeqBase;
// hold then reports true (a new session has started).
func (c *Cursor) hold(seq uint64, payload []byte, now time.Time) (overflowed bool) {
	i, found := slices.BinarySearchFunc(c.buf, seq, func(p pending, s uint64) int {
		switch {
		case p.seq < s:
			return -1
		case p.seq > s:
			return 1
		}
		return 0
	})
	if found {
		c.stats.Duplicates++
		return false
	}
	c.buf = slices.Insert(c.buf, i, pending{seq, payload})
	c.bufBytes += len(payload)
	c.stats.BufferedAtPeak = max(c.stats.BufferedAtPeak, len(c.buf))
	if len(c.buf) > c.cfg.MaxBuffered || c.bufBytes > c.cfg.MaxBufferedBytes {
		c.stats.Overflows++
		c.dropBuffer()
		c.reset()
		c.degraded = false
		c.startSession(now, c.cfg.SeqBase, ModeReplay)
		return true
	}
	return false
}

func (c *Cursor) dropBuffer() {
	clear(c.buf)
	c.buf = c.buf[:0]
	c.bufBytes = 0
}
