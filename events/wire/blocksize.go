package wire

import (
	"fmt"

	"github.com/prefixd/prefixd/indexer"
)

// SizeMismatch is a BlockStored event whose blocks are not of the size a
// worker was registered with: what it says, and what was registered.
type SizeMismatch struct {
	Registered int // the worker's registered block size
	Field      int // the event's block_size field (0: absent)
	Tokens     int // len(token_ids)
	Hashes     int // len(block_hashes)
}

// EngineSize is the block size the event says its engine uses: its
// block_size field when that contradicts the registered size, else the
// token ids per block hash when they divide evenly, else 0 (unknown).
func (m SizeMismatch) EngineSize() int {
	switch {
	case m.Field > 0 && m.Field != m.Registered:
		return m.Field
	case m.Hashes > 0 && m.Tokens%m.Hashes == 0:
		return m.Tokens / m.Hashes
	}
	return 0
}

// Reason names both sizes, for the rank's degraded reason and the log.
func (m SizeMismatch) Reason() string {
	got := "blocks of another size"
	if n := m.EngineSize(); n > 0 {
		got = fmt.Sprintf("block size %d", n)
	}
	field := "no block_size"
	if m.Field > 0 {
		field = fmt.Sprintf("block_size %d", m.Field)
	}
	return fmt.Sprintf("block size mismatch: the engine's BlockStored says %s (%s, %d token_ids for %d block_hashes), the worker is registered with block_size %d: its blocks are not indexed",
		got, field, m.Tokens, m.Hashes, m.Registered)
}

// CheckBlockSize reports whether ev is a BlockStored whose blocks
// contradict a registered block size of want tokens. Only what the index
// would hash at want is checked: a device-tier store (medium absent or
// GPU) of a full or sliding-window attention group with token ids, not
// REMOTE. Offloads carry no tokens, and other tiers' events come from KV
// connectors with their own block sizes (vLLM PR #40984's discussion).
//
// vLLM's BlockPool.cache_full_blocks publishes whole blocks only:
// token_ids covers every block from the first newly cached one to the
// last full one, so len(token_ids) is a multiple of block_size, and
// block_hashes may name fewer blocks than that (null blocks of a
// sliding-window or Mamba group, and blocks already cached, are skipped;
// vLLM issue #44451). SGLang publishes one event per page with block_size
// = len(page tokens), and only its last page may be short. So the event
// contradicts want when:
//
//   - its block_size field is set and is not want — except a short last
//     page (one hash, block_size = len(token_ids) < want) once partialOK
//     (the stream has shown a block of want tokens, so the page size is
//     want and this page is just short; the index does not hash it);
//   - or its tokens are not whole blocks of want for its hashes: with k
//     whole blocks and p tokens left over, k ≥ len(block_hashes) when p is
//     0, or k = len(block_hashes) − 1 (a short last block) when it is not.
func CheckBlockSize(ev *Event, want int, partialOK bool) (SizeMismatch, bool) {
	m := SizeMismatch{Registered: want, Field: int(ev.BlockSize), Tokens: len(ev.TokenIDs), Hashes: len(ev.BlockHashes)}
	if ev.Kind != KindBlockStored || want <= 0 || m.Tokens == 0 || m.Hashes == 0 || ev.Locality == "REMOTE" {
		return m, false
	}
	if tier, ok := indexer.TierFromMedium(ev.Medium); !ok || tier != indexer.TierDevice {
		return m, false
	}
	if a := groupOf(ev).Attention; a != indexer.AttentionFull && a != indexer.AttentionSlidingWindow {
		return m, false
	}
	if m.Field > 0 && m.Field != want {
		short := m.Hashes == 1 && m.Field == m.Tokens && m.Field < want
		return m, !(short && partialOK)
	}
	k, p := m.Tokens/want, m.Tokens%want
	if (p == 0 && k >= m.Hashes) || (p > 0 && k == m.Hashes-1) {
		return m, false
	}
	return m, true
}
