package coordinator

import (
	"fmt"
	"math"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// cachedOn3 starts the block hashes engine 3 caches (cachedSource).
const cachedOn3 = 1 << 20

// cachedSource reports a prompt whose first hash is cachedOn3 as cached
// on engine 3 in whole, and nothing else.
type cachedSource struct{}

func (cachedSource) Overlaps(string, string, []uint32, string, string) ([]indexer.Overlap, int, error) {
	return nil, bs, nil
}

func (cachedSource) OverlapsByHash(_, _ string, h []uint64) ([]indexer.Overlap, int, error) {
	if len(h) > 0 && h[0] == cachedOn3 {
		return []indexer.Overlap{{Rank: rk(3), Device: uint32(len(h))}}, bs, nil
	}
	return nil, bs, nil
}

// TestSpreadSample: the absolute-scale softmax gives equal costs equal
// chances, and an engine dearer by scale·ln 2 half the best one's.
func TestSpreadSample(t *testing.T) {
	const draws = 40_000
	cases := []struct {
		name  string
		costs []float64
		scale float64
		want  []float64 // probabilities
	}{
		{"equal", []float64{5, 5, 5, 5}, 2, []float64{0.25, 0.25, 0.25, 0.25}},
		{"half", []float64{10, 10 + 3*math.Ln2}, 3, []float64{2. / 3, 1. / 3}},
		{"far", []float64{0, 40, 1e300}, 4, []float64{1 / (1 + math.Exp(-10)), math.Exp(-10) / (1 + math.Exp(-10)), 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc := make([]scored, len(tc.costs))
			for i, c := range tc.costs {
				sc[i].cost = c
			}
			rng := seeded(7)
			got := make([]int, len(sc))
			for range draws {
				got[spreadSample(sc, tc.scale, rng)]++
			}
			for i, p := range tc.want {
				// 5 standard deviations of a binomial count.
				tol := 5*math.Sqrt(draws*p*(1-p)) + 1
				if d := math.Abs(float64(got[i]) - draws*p); d > tol {
					t.Errorf("cost %g: drawn %d of %d, want %.0f ± %.0f", tc.costs[i], got[i], draws, draws*p, tol)
				}
			}
		})
	}
}

// TestPeerSpreadOnlyWithPeers: a Service configured with PeerSpread picks
// the cheapest engine while it has no peer, spreads over engines that cost
// about the same once a peer's bookings reach it, keeps a request on the
// engine that caches its prefix, and stops spreading when the peer leaves.
func TestPeerSpreadOnlyWithPeers(t *testing.T) {
	cfg := ServiceConfig{Pool: DefaultPoolConfig(), Origin: "a", Source: cachedSource{}}
	cfg.Pool.Options = ServedOptions()
	cfg.Pool.PeerSpread = 0.25
	var engines []Engine
	for id := uint64(1); id <= 4; id++ {
		engines = append(engines, engine(id, RoleAggregated, endpoint(id)))
	}
	s, _ := newService(t, cfg, engines...)
	k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	// Engines 2 to 4 each hold one block more than engine 1.
	for id := uint64(2); id <= 4; id++ {
		r := rk(id)
		if _, err := s.Reserve(SelectRequest{ID: fmt.Sprint("held", id), Pool: k, Hashes: hashes(100*id, 1), Pin: &r}); err != nil {
			t.Fatal(err)
		}
	}
	picks := func() map[uint64]int {
		t.Helper()
		got := map[uint64]int{}
		for range 400 {
			c, err := s.Select(SelectRequest{Pool: k, Hashes: hashes(1, 8)})
			if err != nil {
				t.Fatal(err)
			}
			got[c.Rank.WorkerID]++
		}
		return got
	}
	if got := picks(); got[1] != 400 {
		t.Fatalf("no peers: picks %v, want engine 1 every time", got)
	}
	if a, d := s.ResetPeer("b", 0, nil); a != 0 || d != 0 {
		t.Fatalf("reset peer: %d applied, %d dropped", a, d)
	}
	got := picks()
	for id := uint64(1); id <= 4; id++ {
		// One block dearer at a scale of 2 blocks: weight e^(−1/2) ≈
		// 0.61, about 86 picks each of 400.
		if got[id] < 50 {
			t.Errorf("with a peer: picks %v, engine %d picked %d times, want ≥ 50", got, id, got[id])
		}
	}
	if got[1] <= got[2] && got[1] <= got[3] && got[1] <= got[4] {
		t.Errorf("with a peer: picks %v, want the cheapest engine picked most", got)
	}
	// Engine 3 caches the whole prompt: about 9 blocks cheaper (its
	// prefill term drops to 0), weight e^(−4.5) ≈ 0.011 for the others.
	cached := 0
	for range 400 {
		c, err := s.Select(SelectRequest{Pool: k, Hashes: hashes(cachedOn3, 8)})
		if err != nil {
			t.Fatal(err)
		}
		if c.Rank.WorkerID == 3 {
			cached++
		}
	}
	if cached < 400*9/10 {
		t.Errorf("with a peer: the caching engine picked %d of 400 times, want most", cached)
	}
	s.DropPeer("b")
	if got := picks(); got[1] != 400 {
		t.Fatalf("peer gone: picks %v, want engine 1 every time", got)
	}
}
