package coordinator

import (
	"fmt"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// sysPrompt is the first hash of the system prompt every request of
// TestSharedSystemPromptSpreads shares (32 blocks).
const sysPrompt, sysBlocks = 1 << 30, 32

// sysSource reports the system prompt as cached on the ranks of on,
// nothing else.
type sysSource struct{ on []uint64 }

func (sysSource) Overlaps(string, string, []uint32, string, string) ([]indexer.Overlap, int, error) {
	return nil, bs, nil
}

func (s sysSource) OverlapsByHash(_, _ string, h []uint64) ([]indexer.Overlap, int, error) {
	if len(h) == 0 || h[0] != sysPrompt {
		return nil, bs, nil
	}
	n := uint32(min(len(h), sysBlocks))
	var ov []indexer.Overlap
	for _, id := range s.on {
		ov = append(ov, indexer.Overlap{Rank: rk(id), Device: n})
	}
	return ov, bs, nil
}

// TestSharedSystemPromptSpreads: a burst of requests at one instant that
// all share one long system prompt (llm-d's hotspot report: one shared
// prompt, one pod) does not all go to the engine that caches it, nor, when
// every engine caches it, to any one engine: each booking raises its
// engine's cost, and equal costs are broken at random. The engine that
// alone caches the prompt takes a larger share (it books only each
// request's own 8 blocks, the others all 40) but at most half; once every
// engine caches it the burst spreads evenly.
func TestSharedSystemPromptSpreads(t *testing.T) {
	const engines, requests = 8, 64
	for _, tc := range []struct {
		name string
		on   []uint64
		// maxShare bounds the requests of the busiest engine.
		maxShare int
	}{
		{"cached on one engine", []uint64{3}, requests / 2},
		{"cached on every engine", []uint64{1, 2, 3, 4, 5, 6, 7, 8}, requests / 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ServiceConfig{Pool: DefaultPoolConfig(), Source: sysSource{tc.on}}
			cfg.Pool.Options = ServedOptions()
			var es []Engine
			for id := uint64(1); id <= engines; id++ {
				es = append(es, engine(id, RoleAggregated, endpoint(id)))
			}
			s, _ := newService(t, cfg, es...)
			k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
			got := map[uint64]int{}
			for i := range requests {
				h := append(hashes(sysPrompt, sysBlocks), hashes(uint64(i+1)<<20, 8)...)
				c, err := s.SelectAndReserve(SelectRequest{ID: fmt.Sprint("r", i), Pool: k, Hashes: h})
				if err != nil {
					t.Fatal(err)
				}
				got[c.Rank.WorkerID]++
			}
			for id, n := range got {
				if n > tc.maxShare {
					t.Errorf("engine %d took %d of %d requests (%v), want at most %d", id, n, requests, got, tc.maxShare)
				}
			}
			if len(got) != engines {
				t.Errorf("%d engines used (%v), want all %d", len(got), got, engines)
			}
		})
	}
}
