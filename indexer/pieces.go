package indexer

import "sync/atomic"

// Pieces: Index.ApplyBatch holds a partition's write lock for at most
// Options.WriteChunk blocks at a time, so that a query waits for at most that
// much work, not for a whole engine batch (an engine step stores up to a
// chunked prefill's 512 blocks and evicts as many). Between chunks other
// writers' chunks and queries run. An op of more blocks than the chunk or
// holdQuantum is applied in pieces of at most chunk blocks, and a piece
// ends early, after its first holdQuantum blocks, when a matcher waits
// for the tree (Tree.stop), so that a query waits for a few blocks' work.
// The pieces have exactly the effect and the counts of the whole op: the
// pieces of a store continue its chain (piece j's parent is
// the last hash of piece j−1), a piece that fails ends the op with the
// blocks left counted under its reason, redundancy is decided over the
// whole op, and the pieces' errors are one OpError.

// DefaultWriteChunk is Options.WriteChunk's default: the most blocks
// Index.ApplyBatch applies under one hold of a partition's write lock when
// no matcher waits (a hold may cover up to DefaultWriteChunk−1 more in
// one-block ops). 32 blocks take about 10 µs to apply.
const DefaultWriteChunk = 32

// holdQuantum is the fewest blocks a piece of Index.ApplyBatch applies
// before it ends early for a waiting matcher (Tree.stop): the writer's
// progress per hold while matchers come back to back, and about 2 µs of
// wait for a matcher.
const holdQuantum = 8

// holdCtl is what a batch's writer gives the pieces it applies: the
// shard's count of waiting matchers, read before each block after the
// first quantum of a piece (a piece ends there when it is positive), and
// the window a rebuild of the rank's lookup runs with (see Tree.stop and
// Tree.win).
type holdCtl struct {
	stop    *atomic.Int32
	quantum int
	win     *window
}

// pieces reports how many pieces of at most chunk blocks op is applied
// in for rank r, or 0 if it is applied whole: 0 unless it is a main-group
// store or remove of more blocks than chunk or holdQuantum (fewer can
// neither be split nor end early) for a rank without other KV-cache
// groups, in a tree without hybrid ranks, and (for a store) passes the
// checks made on the whole op. A piece may end early, when matchers wait
// (Tree.stop), so an op of one piece may take more.
func (t *Tree) pieces(r Rank, op *Op, chunk int) int {
	if t.hybrid > 0 || op.Group != (Group{}) || chunk <= 0 {
		return 0
	}
	var n int
	switch op.Kind {
	case OpStore:
		s := &op.Store
		n = len(s.Hashes)
		if n <= min(chunk, holdQuantum) {
			return 0
		}
		if len(s.Tokens) > 0 || s.Tier == TierDevice { // not an offload
			if s.BlockSize != t.blockSize || len(s.Tokens)/t.blockSize == 0 || t.selfReferencing(*s) {
				return 0 // fails at once, whole
			}
		}
	case OpRemove:
		n = len(op.Remove.Hashes)
		if n <= min(chunk, holdQuantum) {
			return 0
		}
	default:
		return 0
	}
	if rid, ok := t.rankIDs[r]; ok {
		rs := &t.ranks[rid]
		if rs.groups != nil || (rs.hasMain && rs.main.idx != 0) {
			return 0
		}
	}
	return (n + chunk - 1) / chunk
}

// applyPieces applies op for r in pieces of at most chunk blocks (pieces
// must have said at least 1), calling yield between pieces. yield may let
// other writers change the tree. ctl lets pieces end early for waiting
// matchers and rebuild the lookup with a window (holdCtl).
func (t *Tree) applyPieces(r Rank, op *Op, chunk int, ctl *holdCtl, yield func()) error {
	if op.Kind == OpRemove {
		return t.removePieces(r, op.Remove, chunk, ctl, yield)
	}
	s := op.Store
	n := len(s.Hashes)
	offload := len(s.Tokens) == 0 && s.Tier != TierDevice
	usable := n
	if !offload {
		usable = min(n, len(s.Tokens)/t.blockSize)
	}
	var merged *OpError
	var red uint64
	var resume bool
	t.piece = true
	defer func() { t.piece = false }()
	for from, to := 0, 0; from < usable; from = to {
		if from > 0 {
			t.piece = false
			yield()
			t.piece = true
		}
		to = min(from+chunk, usable)
		p := s
		p.Hashes = s.Hashes[from:to]
		if from > 0 {
			p.Parent, p.HasParent = s.Hashes[from-1], true
		}
		if !offload {
			p.Tokens = s.Tokens[from*t.blockSize : to*t.blockSize]
		}
		// stop and resume are this op's only while it holds the tree:
		// the writers that yield lets in apply their ops whole.
		t.pieceRed, t.done, t.resume = 0, 0, resume
		t.stop, t.quantum, t.win = ctl.stop, ctl.quantum, ctl.win
		err := t.Apply(r, Op{Kind: OpStore, Store: p})
		t.stop, t.win, t.resume = nil, nil, false
		done := t.done
		t.done = 0
		red += t.pieceRed
		// A piece that stopped early is continued by the next, in the
		// same clock tick.
		if resume = done > 0; resume {
			to = from + done
		}
		if err == nil {
			continue
		}
		oe, ok := err.(*OpError)
		if !ok {
			return err
		}
		if !offload {
			// The store ends here: the blocks left are skipped for the
			// same reason, as the whole op would skip them.
			rest := n - to
			t.counts[oe.Reason] += uint64(rest)
			oe.Blocks += rest
			return oe
		}
		if merged == nil {
			merged = oe
		} else {
			merged.Blocks += oe.Blocks
		}
	}
	if usable < n {
		return t.fail(r, ReasonShortTokens, s.Hashes[usable], n-usable)
	}
	if merged != nil {
		return merged
	}
	if red == uint64(n) {
		if rid, ok := t.rankIDs[r]; ok {
			t.redundant += red
			t.ranks[rid].redundant += red
		}
	}
	return nil
}

// removePieces applies a main-group remove in pieces; a remove skips each
// block it cannot apply and goes on, so the pieces' errors are summed.
func (t *Tree) removePieces(r Rank, rm Removed, chunk int, ctl *holdCtl, yield func()) error {
	var merged *OpError
	for from, to := 0, 0; from < len(rm.Hashes); from = to {
		if from > 0 {
			yield()
		}
		to = min(from+chunk, len(rm.Hashes))
		p := rm
		p.Hashes = rm.Hashes[from:to]
		t.done, t.stop, t.quantum = 0, ctl.stop, ctl.quantum
		err := t.Apply(r, Op{Kind: OpRemove, Remove: p})
		t.stop = nil
		if t.done > 0 {
			to = from + t.done
			t.done = 0
		}
		if err == nil {
			continue
		}
		oe, ok := err.(*OpError)
		if !ok {
			return err
		}
		if merged == nil {
			merged = oe
		} else {
			merged.Blocks += oe.Blocks
		}
	}
	if merged != nil {
		return merged
	}
	return nil
}
