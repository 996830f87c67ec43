package workload

import (
	"errors"
	"fmt"
	"slices"

	"github.com/prefixd/prefixd/indexer"
)

// Config describes a fleet and its traffic. DefaultConfig returns the
// parameters of the index benchmark; the zero Config is not valid.
type Config struct {
	Seed      uint64
	Workers   int // engine workers
	DPRanks   int // data-parallel ranks per worker; each rank has its own cache
	BlockSize int // tokens per block
	Vocab     int // token ids are drawn uniformly from [0, Vocab)

	// SystemPrompts shared prompts start conversations; their popularity
	// is Zipf-distributed with exponent SystemPromptSkew. Each is between
	// SystemPromptBlocksMin and SystemPromptBlocksMax blocks long. With no
	// system prompts, conversations start from nothing.
	SystemPrompts         int
	SystemPromptBlocksMin int
	SystemPromptBlocksMax int
	SystemPromptSkew      float64

	// Active conversations are open at once; each step serves one turn of
	// a random open conversation, so turns of different conversations
	// interleave.
	Active   int
	TurnsMin int
	TurnsMax int
	// A turn adds between TurnBlocksMin and TurnBlocksMax blocks: the user
	// message (prefill) and the answer (decode, DecodeShare of the turn,
	// stored one block per event).
	TurnBlocksMin int
	TurnBlocksMax int
	DecodeShare   float64
	// PrefillChunkBlocks bounds the blocks of one prefill store event
	// (chunked prefill).
	PrefillChunkBlocks int

	// BranchProb is the probability that a new conversation forks from an
	// earlier turn of a recent conversation (regenerate an answer or edit a
	// user message) on that conversation's rank.
	BranchProb float64
	// StickyProb is the probability that a new conversation is routed to a
	// rank that already served its system prompt; otherwise it goes to the
	// less loaded of two random ranks.
	StickyProb float64

	// RankCapacityBlocks is the cache size of each rank in blocks; a full
	// rank evicts least recently used blocks. 0 means unlimited.
	RankCapacityBlocks int

	// After the target is reached, LongPrompts prompts of LongPromptBlocks
	// blocks (a system prompt and a document) are each served on
	// LongPromptRanks distinct ranks.
	LongPrompts      int
	LongPromptBlocks int
	LongPromptRanks  int

	// TargetEntries: traffic is generated until the ranks together hold at
	// least this many (block, rank) entries; then until ChurnBlocks more
	// blocks have been stored, which full ranks make room for by evicting
	// (the steady state of a fleet whose caches have filled).
	TargetEntries int
	ChurnBlocks   int
}

// DefaultConfig returns the benchmark fleet: 64 single-rank workers with
// 16-token blocks and a 16,384-block (262,144-token) cache each, 32 shared
// system prompts of 1,024–4,096 tokens, chats of 1–12 turns of 64–1,024
// tokens (half of each turn decoded), 10% forks, and traffic until
// 1,000,000 entries, close to the fleet's full capacity (1,048,576), then
// 1,000,000 more stored blocks of churn with the caches full.
func DefaultConfig() Config {
	return Config{
		Seed:      1,
		Workers:   64,
		DPRanks:   1,
		BlockSize: 16,
		Vocab:     128256, // Llama 3

		SystemPrompts:         32,
		SystemPromptBlocksMin: 64,
		SystemPromptBlocksMax: 256,
		SystemPromptSkew:      1.0,

		Active:             256,
		TurnsMin:           1,
		TurnsMax:           12,
		TurnBlocksMin:      4,
		TurnBlocksMax:      64,
		DecodeShare:        0.5,
		PrefillChunkBlocks: 128, // 2,048-token chunked prefill

		BranchProb: 0.1,
		StickyProb: 0.8,

		RankCapacityBlocks: 16384,

		LongPrompts:      4,
		LongPromptBlocks: 512,
		LongPromptRanks:  8,

		TargetEntries: 1_000_000,
		ChurnBlocks:   1_000_000,
	}
}

// Ranks returns the number of ranks, Workers × DPRanks.
func (c Config) Ranks() int { return c.Workers * c.DPRanks }

// maxConvBlocks bounds the blocks of one conversation.
func (c Config) maxConvBlocks() int {
	return max(c.SystemPromptBlocksMax+c.TurnsMax*c.TurnBlocksMax, c.LongPromptBlocks+c.TurnBlocksMax)
}

// Validate reports a configuration Generate cannot run.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Workers < 1 || c.DPRanks < 1 {
		bad("workers %d and dp ranks %d must be positive", c.Workers, c.DPRanks)
	}
	if c.BlockSize < 1 {
		bad("block size %d must be positive", c.BlockSize)
	}
	if c.Vocab < 2 {
		bad("vocabulary %d must be at least 2", c.Vocab)
	}
	if c.SystemPrompts < 0 || (c.SystemPrompts > 0 && (c.SystemPromptBlocksMin < 1 || c.SystemPromptBlocksMin > c.SystemPromptBlocksMax)) {
		bad("system prompts %d of %d..%d blocks", c.SystemPrompts, c.SystemPromptBlocksMin, c.SystemPromptBlocksMax)
	}
	if c.Active < 1 || c.TurnsMin < 1 || c.TurnsMin > c.TurnsMax {
		bad("active %d, turns %d..%d", c.Active, c.TurnsMin, c.TurnsMax)
	}
	if c.TurnBlocksMin < 1 || c.TurnBlocksMin > c.TurnBlocksMax {
		bad("turn blocks %d..%d", c.TurnBlocksMin, c.TurnBlocksMax)
	}
	if c.DecodeShare < 0 || c.DecodeShare > 1 || c.BranchProb < 0 || c.BranchProb > 1 || c.StickyProb < 0 || c.StickyProb > 1 {
		bad("decode share %v, branch %v and sticky %v probabilities must be in [0, 1]", c.DecodeShare, c.BranchProb, c.StickyProb)
	}
	if c.PrefillChunkBlocks < 1 {
		bad("prefill chunk %d must be positive", c.PrefillChunkBlocks)
	}
	if c.LongPrompts < 0 || (c.LongPrompts > 0 && (c.LongPromptRanks < 1 || c.LongPromptRanks > c.Ranks() ||
		c.LongPromptBlocks <= c.SystemPromptBlocksMax)) {
		bad("%d long prompts of %d blocks on %d of %d ranks (must exceed %d system-prompt blocks)",
			c.LongPrompts, c.LongPromptBlocks, c.LongPromptRanks, c.Ranks(), c.SystemPromptBlocksMax)
	}
	if c.RankCapacityBlocks < 0 || (c.RankCapacityBlocks > 0 && c.RankCapacityBlocks < c.maxConvBlocks()) {
		bad("rank capacity %d blocks is less than a conversation (%d blocks)", c.RankCapacityBlocks, c.maxConvBlocks())
	}
	if c.ChurnBlocks < 0 {
		bad("churn %d blocks must not be negative", c.ChurnBlocks)
	}
	if c.TargetEntries < 0 || (c.RankCapacityBlocks > 0 && c.TargetEntries > c.Ranks()*c.RankCapacityBlocks) {
		bad("target %d entries exceeds the fleet's capacity %d", c.TargetEntries, c.Ranks()*c.RankCapacityBlocks)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("workload config: %w", err)
	}
	return nil
}

// Event is one index op for one rank, in the form the event decoder hands
// to the index.
type Event struct {
	Rank indexer.Rank
	Op   indexer.Op
}

// Hold says that Rank holds the first Blocks blocks of a prompt.
type Hold struct {
	Rank   indexer.Rank
	Blocks int
}

// Prompt is a token prompt and the ranks that hold a prefix of it at the
// end of the workload, in rank order.
type Prompt struct {
	Tokens  []uint32
	Holders []Hold
}

// Stats counts what a workload did and what the ranks hold at its end.
type Stats struct {
	Ranks         int
	Conversations int // including forks and long-prompt conversations
	Forks         int
	Turns         int
	StoreEvents   int
	RemoveEvents  int
	StoredBlocks  int
	RemovedBlocks int
	Entries       int // (block, rank) pairs held at the end
	Blocks        int // distinct blocks (prefix paths) held by some rank at the end
}

// Workload is a generated event stream and what its ranks hold at the end.
// It is immutable: its methods are safe for concurrent use. Token and hash
// slices in Events and Long alias each other; callers must not modify them.
type Workload struct {
	BlockSize int
	Ranks     []indexer.Rank // indexed as Events refer to them; sorted
	Events    []Event
	// FillEvents is how many leading events it took to reach the target;
	// the churn and the long prompts follow.
	FillEvents int
	// Long are prompts that several ranks hold completely (plus the ranks
	// that hold only a prefix, such as the system prompt).
	Long  []Prompt
	Stats Stats

	seed      uint64
	vocab     int
	msgMin    int
	msgMax    int
	final     [][]uint64 // per rank: sorted sequence hashes it holds at the end
	histories []history
}

// history is a conversation's tokens and how many leading blocks its rank
// holds at the end.
type history struct {
	tokens []uint32
	held   int
}

// Holders returns, in rank order, each rank that holds a prefix of tokens
// at the end of the workload and how many blocks of it: the overlap an
// exact index must report for the query.
func (w *Workload) Holders(tokens []uint32) []Hold {
	seq := indexer.HashSequence(nil, indexer.HashBlocks(nil, tokens, w.BlockSize, indexer.BaseSeed))
	var out []Hold
	for ri, set := range w.final {
		n := 0
		for n < len(seq) {
			if _, ok := slices.BinarySearch(set, seq[n]); !ok {
				break
			}
			n++
		}
		if n > 0 {
			out = append(out, Hold{Rank: w.Ranks[ri], Blocks: n})
		}
	}
	return out
}

// Queries returns n scoring prompts, deterministic for the workload and n:
// about 30% are fully held by some rank (a conversation's cached history,
// or one of Long), 50% are partial hits (a cached history followed by a new
// user message, as the next turn of a chat sends) and 20% are misses (new
// tokens). Partial hits and misses end with a partial block. Prompts may
// share memory with the workload's tokens; callers must not modify them.
func (w *Workload) Queries(n int) [][]uint32 {
	r := newRNG(w.seed ^ 0x7175657269657321 ^ uint64(n)*0x9e3779b97f4a7c15)
	var held []int
	for i, h := range w.histories {
		if h.held > 0 {
			held = append(held, i)
		}
	}
	bs := w.BlockSize
	out := make([][]uint32, 0, n)
	for range n {
		p := r.float()
		switch {
		case p < 0.3 && len(held) > 0:
			if len(w.Long) > 0 && r.intn(4) == 0 {
				out = append(out, w.Long[r.intn(len(w.Long))].Tokens)
				continue
			}
			h := w.histories[held[r.intn(len(held))]]
			out = append(out, h.tokens[:h.held*bs])
		case p < 0.8 && len(held) > 0:
			h := w.histories[held[r.intn(len(held))]]
			q := make([]uint32, h.held*bs, (h.held+w.msgMax+1)*bs)
			copy(q, h.tokens)
			out = append(out, r.tokens(q, r.between(w.msgMin, w.msgMax)*bs+r.intn(bs), w.vocab))
		default:
			out = append(out, r.tokens(nil, r.between(w.msgMin, max(w.msgMin, 512))*bs+r.intn(bs), w.vocab))
		}
	}
	return out
}

// rankOf returns the rank with index ri of a fleet.
func rankOf(ri, dpRanks int) indexer.Rank {
	return indexer.Rank{WorkerID: uint64(ri / dpRanks), DPRank: uint32(ri % dpRanks)}
}

// engineHash is rank ri's opaque engine hash of the block with sequence
// hash seq.
func engineHash(salt, seq uint64) uint64 { return mix64(seq ^ salt) }
