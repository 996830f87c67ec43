package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// TestPropertyFallbacks: the fallbacks of a selection are, against a
// brute-force reference, the cheapest other candidates in cost order
// (ties in rank order), never the chosen rank, never an ineligible or
// overloaded one, none twice; asking for none returns nil.
func TestPropertyFallbacks(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := DefaultPoolConfig()
		cfg.Thresholds.PrefillTokens = rapid.SampledFrom([]int{0, 40}).Draw(rt, "busy")
		p := NewPool(aggKey, cfg, seeded(rapid.Uint64().Draw(rt, "seed")))
		n := rapid.IntRange(1, 8).Draw(rt, "workers")
		for i := range n {
			w := worker(aggKey, uint64(i+1))
			if rapid.Bool().Draw(rt, "tainted") {
				w.Taints = []string{"t"}
			}
			if err := p.SetWorker(w); err != nil {
				rt.Fatal(err)
			}
		}
		// Random load: earlier bookings.
		for i := range rapid.IntRange(0, 6).Draw(rt, "booked") {
			h := hashes(uint64(100*i), rapid.IntRange(1, 4).Draw(rt, "blocks"))
			p.SelectAndReserve(fmt.Sprint("b", i), Query{Prompt: promptOf(h), Pin: pin(uint64(rapid.IntRange(1, n).Draw(rt, "on")))}, t0)
		}
		h := hashes(7, rapid.IntRange(1, 6).Draw(rt, "prompt"))
		var ov []indexer.Overlap
		for i := range n {
			if d := rapid.IntRange(0, len(h)).Draw(rt, "overlap"); d > 0 {
				ov = append(ov, indexer.Overlap{Rank: rk(uint64(i + 1)), Device: uint32(d)})
			}
		}
		q := Query{Prompt: promptOf(h, ov...), Fallbacks: rapid.IntRange(0, 9).Draw(rt, "fallbacks")}
		if rapid.Bool().Draw(rt, "required") {
			q.Constraints.Required = []string{"t"}
		}
		// The reference: every candidate's cost, as Select would score it.
		cands, cerr := p.candidates(&q)
		sel, fb, err := p.SelectFallbacks(q)
		if (err == nil) != (cerr == nil) {
			rt.Fatalf("select: %v, candidates: %v", err, cerr)
		}
		if err != nil {
			return
		}
		opt := p.options(&q)
		seq := indexer.HashSequence(nil, q.Prompt.Hashes)
		minPrefill := cands[0].prefill
		for _, ws := range cands {
			minPrefill = min(minPrefill, ws.prefill)
		}
		var want []Selection
		for _, ws := range cands {
			if s := p.score(ws, &q, &opt, seq, minPrefill); s.sel.Rank != sel.Rank {
				want = append(want, s.sel)
			}
		}
		slices.SortStableFunc(want, func(a, b Selection) int { return cmp.Compare(a.Cost, b.Cost) })
		want = want[:min(len(want), q.Fallbacks)]
		if q.Fallbacks == 0 || len(want) == 0 {
			if fb != nil {
				rt.Fatalf("fallbacks %v, want none", fb)
			}
			return
		}
		if !slices.EqualFunc(fb, want, func(a, b Selection) bool { return a.Rank == b.Rank && a.Cost == b.Cost }) {
			rt.Fatalf("fallbacks %v, want %v (chosen %v)", ranksOf(fb), ranksOf(want), sel.Rank)
		}
		for _, f := range fb {
			if f.Cost < sel.Cost {
				rt.Fatalf("fallback %v costs %v, less than the chosen %v at temperature 0 (%v)", f.Rank, f.Cost, sel.Rank, sel.Cost)
			}
		}
	})
}

func ranksOf(s []Selection) []indexer.Rank {
	out := make([]indexer.Rank, len(s))
	for i, x := range s {
		out[i] = x.Rank
	}
	return out
}

// TestServiceFallbacksAndMove: a Choice lists the fallbacks asked for;
// Move books the reservation where it ran, over a busy threshold too;
// errors for an unknown id, a rank of another pool, and a plan's booking.
func TestServiceFallbacksAndMove(t *testing.T) {
	cfg := ServiceConfig{Pool: DefaultPoolConfig()}
	cfg.Pool.Thresholds.PrefillTokens = 10
	s, _ := newService(t, cfg, engine(1, RoleAggregated, endpoint(1)), engine(2, RoleAggregated, endpoint(2)), engine(3, RoleAggregated, endpoint(3)),
		engine(4, RoleDecode, endpoint(4)), engine(5, RolePrefill, endpoint(5)))
	k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	c, err := s.SelectAndReserve(SelectRequest{ID: "a", Pool: k, Tokens: make([]uint32, 4*bs), Fallbacks: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Fallbacks) != 2 || slices.ContainsFunc(c.Fallbacks, func(f Selection) bool { return f.Rank == c.Rank }) {
		t.Fatalf("chose %v, fallbacks %v: want the two others", c.Rank, ranksOf(c.Fallbacks))
	}
	// The chosen rank is now busy (64 prefill tokens > 10): moving onto
	// the first fallback books there anyway, and frees the first.
	to := c.Fallbacks[0].Rank
	if err := s.Move("a", to); err != nil {
		t.Fatal(err)
	}
	p := s.pools.Pool(k)
	if r, _ := p.Reserved("a"); r != to {
		t.Fatalf("reservation on %v, want %v", r, to)
	}
	if l, _ := p.Load(c.Rank); l != (Load{}) {
		t.Errorf("the rank left holds %+v", l)
	}
	if l, _ := p.Load(to); l.Requests != 1 || l.PrefillTokens != 4*bs || l.Blocks != 4 {
		t.Errorf("the rank moved to holds %+v", l)
	}
	if err := s.Move("a", to); err != nil {
		t.Errorf("a second move to the same rank: %v", err)
	}
	if err := s.Move("a", rk(4)); !errors.Is(err, ErrBadPinnedRank) {
		t.Errorf("move to a decode rank: %v, want ErrBadPinnedRank", err)
	}
	if err := s.Move("nope", to); !errors.Is(err, ErrReservationNotFound) {
		t.Errorf("move of an unknown id: %v", err)
	}
	if _, err := s.Plan(planReq("pl")); err != nil {
		t.Fatal(err)
	}
	if err := s.Move("pl/decode", rk(4)); !errors.Is(err, ErrReservationNotFound) {
		t.Errorf("move of a plan's booking: %v, want ErrReservationNotFound", err)
	}
	if err := s.Free("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release("pl"); err != nil {
		t.Fatal(err)
	}
	if n := s.Reservations(); n != 0 {
		t.Errorf("%d reservations left", n)
	}
	if tot := p.Total(); tot != (Load{}) {
		t.Errorf("pool left %+v", tot)
	}
}

// TestPropertyServiceMoves drives random reservations, fallbacks, moves,
// prefill completions, frees, engine departures and expiry through a
// Service, checking after every step that each rank's load is exactly
// what the reservations on it book, and that everything returns to zero
// once every reservation is freed.
func TestPropertyServiceMoves(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		clk := &clock{t0}
		cfg := ServiceConfig{Pool: DefaultPoolConfig(), Now: clk.now, Rand: seeded(rapid.Uint64().Draw(rt, "seed"))}
		cfg.Pool.Thresholds.PrefillTokens = rapid.SampledFrom([]int{0, 50}).Draw(rt, "busy")
		cfg.Pool.ReservationTTL = time.Duration(rapid.IntRange(1, 600).Draw(rt, "ttl")) * time.Second
		if rapid.Bool().Draw(rt, "predicted") {
			cfg.Predicted = indexer.NewPredictions(time.Minute, 0, 0)
		}
		s := NewService(cfg)
		k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
		engines := []Engine{engine(1, RoleAggregated, endpoint(1)), engine(2, RoleAggregated, endpoint(2)), engine(3, RoleAggregated, endpoint(3))}
		for _, e := range engines {
			if err := s.SetEngine(e); err != nil {
				rt.Fatal(err)
			}
		}
		ids := []string{"a", "b", "c", "d"}
		check := func(step string) {
			p := s.pools.Pool(k)
			if p == nil {
				return
			}
			want := map[indexer.Rank]int{}
			for _, id := range ids {
				if r, ok := p.Reserved(id); ok {
					want[r]++
				}
			}
			for _, r := range p.Ranks() {
				l, _ := p.Load(r)
				if l.Requests != want[r] || l.Blocks < 0 || l.PrefillTokens < 0 || (want[r] == 0 && l != (Load{})) {
					rt.Fatalf("%s: rank %v holds %+v with %d reservations", step, r, l, want[r])
				}
			}
		}
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for i := range steps {
			id := rapid.SampledFrom(ids).Draw(rt, "id")
			op := rapid.IntRange(0, 5).Draw(rt, "op")
			switch op {
			case 0, 1:
				b := rapid.IntRange(1, 5).Draw(rt, "blocks")
				shape := rapid.IntRange(1, 3).Draw(rt, "shape") * bs // prompts share prefixes
				tokens := make([]uint32, b*bs)
				for j := range tokens {
					tokens[j] = uint32(j % shape)
				}
				c, err := s.SelectAndReserve(SelectRequest{ID: id, Pool: k, Tokens: tokens, Fallbacks: rapid.IntRange(0, 3).Draw(rt, "fallbacks")})
				if err == nil {
					if rapid.Bool().Draw(rt, "served_elsewhere") && len(c.Fallbacks) > 0 {
						if err := s.Move(id, rapid.SampledFrom(c.Fallbacks).Draw(rt, "to").Rank); err != nil {
							rt.Fatalf("move onto a fallback: %v", err)
						}
					}
				}
			case 2:
				r := rk(uint64(rapid.IntRange(1, 4).Draw(rt, "to")))
				s.Move(id, r) // rank 4 is in no pool: refused
			case 3:
				s.ReservePrefillComplete(id)
			case 4:
				s.Free(id)
			case 5:
				if rapid.Bool().Draw(rt, "expire") {
					clk.t = clk.t.Add(time.Duration(rapid.IntRange(0, 400).Draw(rt, "dt")) * time.Second)
					s.Expire(clk.t)
				} else {
					e := rapid.SampledFrom(engines).Draw(rt, "engine")
					if _, ok := s.engines[e.Key()]; ok {
						s.RemoveEngine(e.Key())
					} else if err := s.SetEngine(e); err != nil {
						rt.Fatal(err)
					}
				}
			}
			check(fmt.Sprintf("step %d op %d", i, op))
		}
		for _, id := range ids {
			s.Free(id)
		}
		check("final")
		if n := s.Reservations(); n != 0 {
			rt.Fatalf("%d reservations left", n)
		}
		if p := s.pools.Pool(k); p != nil {
			if tot := p.Total(); tot != (Load{}) {
				rt.Fatalf("pool left %+v", tot)
			}
		}
	})
}
