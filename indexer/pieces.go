package indexer

// Pieces: Index.ApplyBatch holds a shard's write lock for at most
// Options.WriteChunk blocks at a time and publishes the tree's views when
// it lets go (view.go), so that other writers of the shard take turns
// with it and matches see a batch's progress every chunk, not only at its
// end (an engine step stores up to a chunked prefill's 512 blocks and
// evicts as many). An op of more blocks than the chunk is applied in
// pieces of at most chunk blocks. The pieces have exactly the effect and
// the counts of the whole op: the pieces of a store continue its chain
// (piece j's parent is the last hash of piece j−1), a piece that fails
// ends the op with the blocks left counted under its reason, redundancy is
// decided over the whole op, and the pieces' errors are one OpError.

// DefaultWriteChunk is Options.WriteChunk's default: the most blocks
// Index.ApplyBatch applies under one hold of a shard's write lock (a hold
// may cover up to DefaultWriteChunk−1 more in one-block ops), short enough
// that matches and the shard's other writers see progress between holds
// (BenchmarkIndexApply measures blocks applied per second).
const DefaultWriteChunk = 32

// pieces reports how many pieces of at most chunk blocks op is applied
// in for rank r, or 0 if it is applied whole: 0 unless it is a main-group
// store or remove of more blocks than chunk for a rank without other
// KV-cache groups, in a tree without hybrid ranks, and (for a store)
// passes the checks made on the whole op.
func (t *Tree) pieces(r Rank, op *Op, chunk int) int {
	if t.hybrid > 0 || op.Group != (Group{}) || chunk <= 0 {
		return 0
	}
	var n int
	switch op.Kind {
	case OpStore:
		s := &op.Store
		n = len(s.Hashes)
		if n <= chunk {
			return 0
		}
		if len(s.Tokens) > 0 || s.Tier == TierDevice { // not an offload
			if s.BlockSize != t.blockSize || len(s.Tokens)/t.blockSize == 0 || t.selfReferencing(s) {
				return 0 // fails at once, whole
			}
		}
	case OpRemove:
		n = len(op.Remove.Hashes)
		if n <= chunk {
			return 0
		}
	default:
		return 0
	}
	if rid, ok := t.rid(r); ok {
		rs := &t.ranks[rid]
		if rs.groups != nil || (rs.hasMain && rs.main.idx != 0) {
			return 0
		}
	}
	return (n + chunk - 1) / chunk
}

// applyPieces applies op for r in pieces of at most chunk blocks (pieces
// must have said at least 1), calling yield between pieces. yield may let
// other writers change the tree.
func (t *Tree) applyPieces(r Rank, op *Op, chunk int, yield func()) error {
	if op.Kind == OpRemove {
		return t.removePieces(r, op.Remove, chunk, yield)
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
	t.piece = true
	defer func() { t.piece = false }()
	for from := 0; from < usable; from += chunk {
		if from > 0 {
			t.piece = false
			yield()
			t.piece = true
		}
		to := min(from+chunk, usable)
		p := s
		p.Hashes = s.Hashes[from:to]
		if from > 0 {
			p.Parent, p.HasParent = s.Hashes[from-1], true
		}
		if !offload {
			p.Tokens = s.Tokens[from*t.blockSize : to*t.blockSize]
		}
		t.pieceRed = 0
		err := t.Apply(r, Op{Kind: OpStore, Store: p})
		red += t.pieceRed
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
		if rid, ok := t.rid(r); ok {
			t.redundant += red
			t.ranks[rid].redundant += red
		}
	}
	return nil
}

// removePieces applies a main-group remove in pieces; a remove skips each
// block it cannot apply and goes on, so the pieces' errors are summed.
func (t *Tree) removePieces(r Rank, rm Removed, chunk int, yield func()) error {
	var merged *OpError
	for from := 0; from < len(rm.Hashes); from += chunk {
		if from > 0 {
			yield()
		}
		p := rm
		p.Hashes = rm.Hashes[from:min(from+chunk, len(rm.Hashes))]
		err := t.Apply(r, Op{Kind: OpRemove, Remove: p})
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
