package workload

import (
	"slices"

	"github.com/prefixd/prefixd/indexer"
)

// The llm-d comparison workload: the shape also measured with the llm-d
// KV-cache indexer's in-memory index (results in docs/benchmarks.md, the
// comparison against peers).
const (
	LLMDRanks        = 8
	LLMDPromptBlocks = 512     // one 8,192-token prompt
	LLMDStep         = 64      // rank p holds the first LLMDStep·(p+1) prompt blocks
	LLMDBackground   = 1 << 20 // background blocks, in 16-block stores
	llmdStoreBlocks  = 16
	llmdBlockSize    = 16
)

// LLMDCompare returns the shared prefix-chain workload used to compare
// with the llm-d KV-cache indexer: 8 ranks (workers 0–7), 16-token blocks;
// rank p stores the first 64·(p+1) blocks of one 512-block prompt in
// chained 16-block stores, so the true overlaps are 64, 128, …, 512 blocks;
// then 1,048,576 background blocks of random tokens arrive as 65,536
// parentless 16-block stores, round-robin over the ranks. Long[0] is the
// prompt. The workload has no conversations, so Queries returns misses.
func LLMDCompare(seed uint64) *Workload {
	r := newRNG(seed ^ 0x6c6c6d2d64)
	bs := llmdBlockSize
	w := &Workload{BlockSize: bs, seed: seed, vocab: 128256, msgMin: 4, msgMax: 64}
	salts := make([]uint64, LLMDRanks)
	for i := range salts {
		salts[i] = r.next()
		w.Ranks = append(w.Ranks, rankOf(i, 1))
	}
	var scratch []uint64
	final := make([][]uint64, LLMDRanks)
	store := func(p int, tokens []uint32, seq []uint64, from, to int) {
		hashes := make([]uint64, to-from)
		for i := range hashes {
			hashes[i] = engineHash(salts[p], seq[from+i])
		}
		st := indexer.Stored{
			Hashes:    hashes,
			Tokens:    tokens[from*bs : to*bs : to*bs],
			BlockSize: bs,
			Tier:      indexer.TierDevice,
			Seed:      indexer.BaseSeed,
		}
		if from > 0 {
			st.Parent, st.HasParent = engineHash(salts[p], seq[from-1]), true
		}
		w.Events = append(w.Events, Event{Rank: w.Ranks[p], Op: indexer.Op{Kind: indexer.OpStore, Store: st}})
		final[p] = append(final[p], seq[from:to]...)
		w.Stats.StoreEvents++
		w.Stats.StoredBlocks += to - from
	}

	prompt := r.tokens(nil, LLMDPromptBlocks*bs, w.vocab)
	pseq := seqHashes(nil, prompt, bs, &scratch)
	for p := range LLMDRanks {
		for b := 0; b < LLMDStep*(p+1); b += llmdStoreBlocks {
			store(p, prompt, pseq, b, b+llmdStoreBlocks)
		}
	}
	const n = LLMDBackground / llmdStoreBlocks
	bg := r.tokens(make([]uint32, 0, LLMDBackground*bs), LLMDBackground*bs, w.vocab)
	var seq []uint64
	for i := range n {
		tok := bg[i*llmdStoreBlocks*bs : (i+1)*llmdStoreBlocks*bs]
		seq = seqHashes(seq[:0], tok, bs, &scratch)
		store(i%LLMDRanks, tok, seq, 0, llmdStoreBlocks)
	}

	var all []uint64
	for p := range final {
		slices.Sort(final[p])
		all = append(all, final[p]...)
		w.Stats.Entries += len(final[p])
	}
	slices.Sort(all)
	w.final = final
	w.Stats.Ranks = LLMDRanks
	w.Stats.Blocks = len(slices.Compact(all))
	w.Long = []Prompt{{Tokens: prompt, Holders: w.Holders(prompt)}}
	return w
}
