package mocker

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Defaults of Timing's budgets: vLLM's max_num_batched_tokens for chunked
// prefill on a data-centre GPU, and its max_num_seqs.
const (
	DefaultMaxNumBatchedTokens = 8192
	DefaultMaxNumSeqs          = 256
)

// Timing prices the steps of an engine's scheduler and its KV transfers.
// The zero value schedules with the default budgets and prices nothing:
// every step and transfer takes no time, so an engine serves as fast as
// it can (what tests and the demo use unless they set costs).
type Timing struct {
	// MaxNumBatchedTokens is a step's token budget (vLLM's
	// max_num_batched_tokens): each decoding sequence takes one token, and
	// prefills share the rest as chunks of their uncached prompt tokens.
	// 0: DefaultMaxNumBatchedTokens.
	MaxNumBatchedTokens int
	// MaxNumSeqs is how many sequences may run (or wait for a KV transfer)
	// at once (vLLM's max_num_seqs); 0: DefaultMaxNumSeqs.
	MaxNumSeqs int
	// A step costs StepOverhead, plus PrefillPerToken per prompt token it
	// prefills, plus DecodePerSeq per sequence it decodes a token for.
	StepOverhead    time.Duration
	PrefillPerToken time.Duration
	DecodePerSeq    time.Duration
	// TransferPerBlock is what receiving one KV block from a remote
	// prefill costs; a transfer from another KV-transfer domain costs
	// CrossDomainFactor times as much (0: 1, no penalty).
	TransferPerBlock  time.Duration
	CrossDomainFactor float64
}

// H100Llama8B is Timing calibrated to Llama-3.1-8B-Instruct served on one
// H100 80 GB (docs/mocker.md has the figures and their sources): a step
// costs 4.6 ms plus 30 µs per decoding sequence and 30 µs per prefilled
// token, and a 16-token block of its KV (2 MiB) crosses a 50 GB/s link in
// 42 µs, 4 times slower between KV-transfer domains.
var H100Llama8B = Timing{
	StepOverhead:      4600 * time.Microsecond,
	PrefillPerToken:   30 * time.Microsecond,
	DecodePerSeq:      30 * time.Microsecond,
	TransferPerBlock:  42 * time.Microsecond,
	CrossDomainFactor: 4,
}

// WithDefaults returns t with its zero budgets and factor at their
// defaults.
func (t Timing) WithDefaults() Timing {
	if t.MaxNumBatchedTokens == 0 {
		t.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if t.MaxNumSeqs == 0 {
		t.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if t.CrossDomainFactor == 0 {
		t.CrossDomainFactor = 1
	}
	return t
}

// Validate reports the first field of t (after WithDefaults) that is out
// of range.
func (t Timing) Validate() error {
	switch {
	case t.MaxNumBatchedTokens < 1:
		return fmt.Errorf("max num batched tokens %d: want at least 1", t.MaxNumBatchedTokens)
	case t.MaxNumSeqs < 1:
		return fmt.Errorf("max num seqs %d: want at least 1", t.MaxNumSeqs)
	case t.MaxNumBatchedTokens < t.MaxNumSeqs:
		return fmt.Errorf("max num batched tokens %d must be at least max num seqs %d (as vLLM requires)", t.MaxNumBatchedTokens, t.MaxNumSeqs)
	case t.StepOverhead < 0, t.PrefillPerToken < 0, t.DecodePerSeq < 0, t.TransferPerBlock < 0:
		return fmt.Errorf("step overhead %v, prefill per token %v, decode per seq %v and transfer per block %v must not be negative",
			t.StepOverhead, t.PrefillPerToken, t.DecodePerSeq, t.TransferPerBlock)
	case math.IsNaN(t.CrossDomainFactor) || math.IsInf(t.CrossDomainFactor, 0) || t.CrossDomainFactor < 1:
		return fmt.Errorf("cross-domain factor %v: want a finite factor of at least 1", t.CrossDomainFactor)
	}
	return nil
}

// ErrAborted ends a sequence its client abandoned (Scheduler.Abort).
var ErrAborted = errors.New("mocker: request aborted")

// SeqState is where a sequence is in its Scheduler.
type SeqState uint8

const (
	// SeqWaiting: in the waiting queue, holding no blocks.
	SeqWaiting SeqState = iota
	// SeqTransferring: holding its blocks while their KV arrives from a
	// remote prefill.
	SeqTransferring
	// SeqRunning: prefilling (in chunks) or decoding.
	SeqRunning
	// SeqDone: finished, or ended by Err; its blocks are freed.
	SeqDone
)

// Seq is one request in a Scheduler. The caller sets the fields before
// Add; the Scheduler writes the rest and the caller reads them where it
// drives the Scheduler (the Engine: under its lock).
type Seq struct {
	// Set by the caller.
	Tokens    []uint32 // the prompt; not modified while the sequence runs
	MaxTokens int      // tokens to generate (a sequence always generates all of them)
	// RemoteKV marks a sequence whose prompt KV is received from a remote
	// prefill (vLLM's do_remote_prefill): its blocks are allocated as
	// computed, held while TransferPerBlock per uncached block passes
	// (CrossDomainFactor times as long when CrossDomain), then cached; the
	// last prompt token is computed locally, which yields the first token.
	RemoteKV    bool
	CrossDomain bool

	// Written by the Scheduler.
	ID    uint64
	State SeqState
	Err   error // why a SeqDone sequence ended early: ErrNoSpace, ErrAborted, or Close's error
	// Computed is how many prompt tokens have their KV (hits, prefilled
	// chunks, transferred blocks); Output how many tokens were generated.
	Computed int
	Output   int
	// CachedTokens is how many prompt tokens the sequence did not compute:
	// its prefix-cache hit (whole blocks) or, for RemoteKV, the whole
	// prompt, as vLLM counts num_cached_tokens. TransferredBlocks is how
	// many blocks it received.
	CachedTokens      int
	TransferredBlocks int
	// BlockIDs are the main KV-cache group's physical blocks of the prompt
	// (those a NIXL prefill announces as remote_block_ids), set when the
	// sequence finishes.
	BlockIDs []int
	// Arrived (Add), Scheduled (admitted to run or to transfer),
	// FirstToken and Finished are on the driver's clock.
	Arrived, Scheduled, FirstToken, Finished time.Time

	alloc      *Alloc
	hashes     []uint64  // the prompt's engine block hashes, once admission is first tried
	transferAt time.Time // when its transfer is done
	step       int       // tokens scheduled in the current step
	aborted    bool
}

func (q *Seq) prefilled() bool { return q.Computed >= len(q.Tokens) }

// Step is what Plan scheduled.
type Step struct {
	Start    time.Time
	Duration time.Duration
	// PrefillTokens prompt tokens of Prefills sequences are prefilled,
	// and DecodeSeqs sequences decode a token.
	PrefillTokens int
	Prefills      int
	DecodeSeqs    int
	// Ended are the sequences that ended while planning (without running):
	// refused (ErrNoSpace) or aborted.
	Ended []*Seq
}

// Empty reports whether the step runs nothing (it takes no time).
func (s Step) Empty() bool { return s.PrefillTokens == 0 && s.DecodeSeqs == 0 }

// Load is a Scheduler's occupancy, what a router or benchmark reads.
type Load struct {
	Waiting      int // queued for the budget, a sequence slot or KV blocks
	Transferring int // holding blocks while their KV arrives
	Running      int // prefilling or decoding
	// KVUsage is the fraction of KV blocks held by requests (vLLM's
	// kv_cache_usage_perc: evictable cached blocks count as free).
	KVUsage     float64
	FreeBlocks  int
	TotalBlocks int
	// PrefixQueries and PrefixHits are cumulative: the prompt tokens of
	// the requests that computed their prompt here, and those the prefix
	// cache served.
	PrefixQueries, PrefixHits uint64
}

// Scheduler is a simulated vLLM V1 scheduler over a Pool: continuous
// batching with chunked prefill, on an explicit clock (every method takes
// now; none reads a clock or starts a goroutine). Each step, driven by
// Plan then Finish:
//
//   - the running sequences, in the order they were admitted, are
//     scheduled first: one decoding takes 1 token of the step's budget
//     (MaxNumBatchedTokens), a prefilling one a chunk of its remaining
//     prompt tokens as large as the budget left;
//   - then waiting sequences are admitted first come first served, while
//     budget and sequence slots (MaxNumSeqs) last and the pool can
//     allocate their blocks (Pool.Admit, reusing the cached prefix); the
//     first that does not fit stops admission (head-of-line, as vLLM) —
//     unless nothing runs that could ever free blocks, when it is refused
//     with ErrNoSpace;
//   - a prefill chunk caches the full blocks it covers when it is
//     scheduled (Pool.Cache), as vLLM does, so a request admitted later
//     hits them; its last chunk yields the first output token, each
//     decode step one more;
//   - the step costs StepOverhead + PrefillPerToken × prefilled tokens +
//     DecodePerSeq × decoding sequences; a sequence that generated
//     MaxTokens is finished at Finish and frees its blocks (tail first).
//
// Like vLLM, the hit is recomputed from the last prompt token when the
// cache holds the whole prompt (one token to prefill). Unlike vLLM, output
// tokens take no KV blocks (the pool holds prompts), so a running sequence
// never grows and is never preempted.
//
// A Scheduler is not safe for concurrent use.
type Scheduler struct {
	pool         *Pool
	t            Timing
	nextID       uint64
	waiting      []*Seq
	transferring []*Seq
	running      []*Seq
	aborts       int // aborted sequences not yet removed
	// queries and hits count the prompt tokens of the sequences admitted
	// to compute their prompt here, and those of them the prefix cache
	// served (vLLM's prefix_cache_queries and prefix_cache_hits); a
	// sequence taking its KV from a remote prefill counts in neither.
	queries, hits uint64
}

// NewScheduler returns a scheduler over pool with t's budgets and costs
// (WithDefaults applied); t must Validate.
func NewScheduler(pool *Pool, t Timing) (*Scheduler, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("mocker: scheduler: %w", err)
	}
	return &Scheduler{pool: pool, t: t}, nil
}

// Timing returns the scheduler's timing, defaults applied.
func (s *Scheduler) Timing() Timing { return s.t }

// Add queues q, arrived at now, and gives it an ID. A prompt needing more
// blocks than the whole pool is refused with ErrNoSpace (and not queued).
func (s *Scheduler) Add(q *Seq, now time.Time) error {
	bs := s.pool.BlockSize()
	if blocks := (len(q.Tokens) + bs - 1) / bs; blocks > s.pool.TotalBlocks() {
		return fmt.Errorf("%w: the prompt needs %d blocks of %d tokens, the pool has %d", ErrNoSpace, blocks, bs, s.pool.TotalBlocks())
	}
	s.nextID++
	q.ID, q.State, q.Arrived = s.nextID, SeqWaiting, now
	q.MaxTokens = max(q.MaxTokens, 0)
	s.waiting = append(s.waiting, q)
	return nil
}

// Abort ends q at the next Plan, as vLLM aborts a request whose client
// went away between steps: its blocks are freed then (a step it is in
// still completes, and what that step cached stays cached).
func (s *Scheduler) Abort(q *Seq) {
	if q.State == SeqDone || q.aborted {
		return
	}
	q.aborted = true
	s.aborts++
}

// Plan schedules the step starting at now (see Scheduler). The pool's
// events it causes (BlockStored of the chunks, BlockRemoved of
// evictions) are queued in the pool for the caller to publish.
func (s *Scheduler) Plan(now time.Time) Step {
	st := Step{Start: now}
	if s.aborts > 0 {
		s.removeAborted(now, &st)
	}
	// Transfers whose KV has arrived: cache the blocks and run (the last
	// prompt token is computed here).
	for i := 0; i < len(s.transferring); {
		q := s.transferring[i]
		if q.transferAt.After(now) {
			i++
			continue
		}
		s.transferring = slices.Delete(s.transferring, i, i+1)
		s.pool.Cache(q.alloc, len(q.alloc.hashes))
		q.Computed = max(len(q.Tokens)-1, 0)
		q.State = SeqRunning
		s.running = append(s.running, q)
	}
	budget := s.t.MaxNumBatchedTokens
	for _, q := range s.running {
		if budget == 0 {
			break
		}
		if q.prefilled() {
			q.step = 1
			budget--
			st.DecodeSeqs++
			continue
		}
		n := min(len(q.Tokens)-q.Computed, budget)
		s.schedulePrefill(q, n, &st)
		budget -= n
	}
	for len(s.waiting) > 0 && budget > 0 && len(s.running)+len(s.transferring) < s.t.MaxNumSeqs {
		q := s.waiting[0]
		if q.hashes == nil { // hashed once: a head-of-line sequence is tried every step
			q.hashes = BlockHashes(q.Tokens, s.pool.BlockSize())
		}
		a, err := s.pool.AdmitHashed(q.Tokens, q.hashes)
		if err != nil {
			if len(s.running)+len(s.transferring) > 0 {
				break // wait for running requests to free blocks
			}
			s.waiting = s.waiting[1:]
			s.end(q, fmt.Errorf("%w: the prompt does not fit even in an idle engine", err), now)
			st.Ended = append(st.Ended, q)
			continue
		}
		s.waiting = s.waiting[1:]
		q.alloc, q.Scheduled = a, now
		bs := s.pool.BlockSize()
		if toReceive := len(a.blocks[0]) - a.CachedBlocks; q.RemoteKV && toReceive > 0 {
			q.State, q.CachedTokens, q.TransferredBlocks = SeqTransferring, len(q.Tokens), toReceive
			cost := float64(s.t.TransferPerBlock) * float64(toReceive)
			if q.CrossDomain {
				cost *= s.t.CrossDomainFactor
			}
			q.transferAt = now.Add(time.Duration(cost))
			s.transferring = append(s.transferring, q)
			continue
		}
		q.State = SeqRunning
		q.CachedTokens = a.CachedBlocks * bs
		if q.RemoteKV {
			q.CachedTokens = len(q.Tokens) // its local hit covered the whole prompt
		} else {
			s.queries += uint64(len(q.Tokens))
			s.hits += uint64(min(q.CachedTokens, len(q.Tokens)))
		}
		q.Computed = min(a.CachedBlocks*bs, max(len(q.Tokens)-1, 0))
		if q.prefilled() && q.MaxTokens == 0 { // an empty prompt with nothing to generate
			s.end(q, nil, now)
			st.Ended = append(st.Ended, q)
			continue
		}
		s.running = append(s.running, q)
		if q.prefilled() {
			q.step = 1 // an empty prompt decodes from the start
			budget--
			st.DecodeSeqs++
			continue
		}
		n := min(len(q.Tokens)-q.Computed, budget)
		s.schedulePrefill(q, n, &st)
		budget -= n
	}
	if !st.Empty() {
		st.Duration = s.t.StepOverhead + time.Duration(st.PrefillTokens)*s.t.PrefillPerToken +
			time.Duration(st.DecodeSeqs)*s.t.DecodePerSeq
	}
	return st
}

// schedulePrefill schedules n prompt tokens of q and caches the full
// blocks they complete.
func (s *Scheduler) schedulePrefill(q *Seq, n int, st *Step) {
	q.step = n
	st.PrefillTokens += n
	st.Prefills++
	s.pool.Cache(q.alloc, (q.Computed+n)/s.pool.BlockSize())
}

func (s *Scheduler) removeAborted(now time.Time, st *Step) {
	keep := func(list []*Seq) []*Seq {
		return slices.DeleteFunc(list, func(q *Seq) bool {
			if !q.aborted {
				return false
			}
			s.end(q, ErrAborted, now)
			st.Ended = append(st.Ended, q)
			return true
		})
	}
	s.waiting, s.transferring, s.running = keep(s.waiting), keep(s.transferring), keep(s.running)
	s.aborts = 0
}

// end frees q's blocks (if any) and marks it done with err.
func (s *Scheduler) end(q *Seq, err error, now time.Time) {
	if q.alloc != nil {
		q.BlockIDs = q.alloc.BlockIDs(s.pool.Main())
		s.pool.Free(q.alloc)
		q.alloc = nil
	}
	q.State, q.Err, q.Finished, q.step = SeqDone, err, now, 0
}

// Finish completes the step Plan scheduled, at now: prefill chunks are
// computed, a completed prefill and each decode yield a token, and the
// sequences that generated MaxTokens finish and free their blocks. It
// returns the sequences that made progress, in running order.
func (s *Scheduler) Finish(now time.Time) []*Seq {
	var changed []*Seq
	for _, q := range s.running {
		if q.step == 0 {
			continue
		}
		if !q.prefilled() {
			q.Computed += q.step
			if q.prefilled() && q.MaxTokens > 0 {
				q.Output++
			}
		} else {
			q.Output++
		}
		if q.Output == 1 && q.FirstToken.IsZero() {
			q.FirstToken = now
		}
		q.step = 0
		changed = append(changed, q)
	}
	s.running = slices.DeleteFunc(s.running, func(q *Seq) bool {
		if q.prefilled() && q.Output >= q.MaxTokens {
			s.end(q, nil, now)
			return true
		}
		return false
	})
	return changed
}

// NextTransfer returns when the earliest pending KV transfer is done, so
// that an idle driver knows when to plan again.
func (s *Scheduler) NextTransfer() (time.Time, bool) {
	if len(s.transferring) == 0 {
		return time.Time{}, false
	}
	at := s.transferring[0].transferAt
	for _, q := range s.transferring[1:] {
		if q.transferAt.Before(at) {
			at = q.transferAt
		}
	}
	return at, true
}

// Close ends every sequence with err, freeing its blocks, and returns
// them.
func (s *Scheduler) Close(err error, now time.Time) []*Seq {
	all := slices.Concat(s.running, s.transferring, s.waiting)
	for _, q := range all {
		s.end(q, err, now)
	}
	s.waiting, s.transferring, s.running, s.aborts = nil, nil, nil, 0
	return all
}

// Queued is the requests the engine reports as waiting
// (vllm:num_requests_waiting, sglang:num_queue_reqs): vLLM counts a
// request whose KV is still arriving among its waiting ones.
func (l Load) Queued() int { return l.Waiting + l.Transferring }

// Load returns the scheduler's occupancy.
func (s *Scheduler) Load() Load {
	return Load{Waiting: len(s.waiting), Transferring: len(s.transferring), Running: len(s.running),
		KVUsage: s.pool.Usage(), FreeBlocks: s.pool.FreeBlocks(), TotalBlocks: s.pool.TotalBlocks(),
		PrefixQueries: s.queries, PrefixHits: s.hits}
}
