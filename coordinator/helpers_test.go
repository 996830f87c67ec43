package coordinator

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

var t0 = time.Unix(1_000_000, 0).UTC()

const bs = 16

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func rk(id uint64) indexer.Rank { return indexer.Rank{WorkerID: id} }

func worker(key PoolKey, id uint64) Worker {
	return Worker{Rank: rk(id), Model: key.Model, Group: key.Group, Role: key.Role, TotalKVBlocks: 100, MaxNumBatchedTokens: 1000}
}

var aggKey = PoolKey{Model: "m", Group: "g", Role: RoleAggregated}

// hashes returns n local block hashes base, base+1, ...
func hashes(base uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = base + uint64(i)
	}
	return h
}

func promptOf(h []uint64, ov ...indexer.Overlap) Prompt {
	return Prompt{Tokens: len(h) * bs, BlockSize: bs, Hashes: h, Overlaps: ov}
}

func newPool(t *testing.T, cfg PoolConfig, seed uint64, ws ...Worker) *Pool {
	t.Helper()
	p := NewPool(aggKey, cfg, seeded(seed))
	for _, w := range ws {
		if err := p.SetWorker(w); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func mustReserve(t *testing.T, p *Pool, id string, q Query) Selection {
	t.Helper()
	s, err := p.SelectAndReserve(id, q, t0)
	if err != nil {
		t.Fatalf("reserve %q: %v", id, err)
	}
	return s
}

func pin(id uint64) *indexer.Rank { r := rk(id); return &r }

func fptr(f float64) *float64 { return &f }
