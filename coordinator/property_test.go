package coordinator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestPropertyBookingsMatchLivePlans drives random sequences of plan
// operations, failures, expiries and worker removals, and checks after every
// step that each pool's reservations are exactly the bookings of live plans
// (never leaked, never negative), and that everything returns to zero once
// all plans are released or expired.
func TestPropertyBookingsMatchLivePlans(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		pcfg := DefaultPoolConfig()
		pcfg.ReservationTTL = time.Duration(rapid.IntRange(1, 600).Draw(rt, "poolTTL")) * time.Second
		pcfg.Thresholds.DecodeBlocksFrac = rapid.SampledFrom([]float64{0, 0.2}).Draw(rt, "decodeFrac")
		cfg := CoordinatorConfig{
			Order:          rapid.SampledFrom([]Order{DecodeFirst, PrefillFirst}).Draw(rt, "order"),
			PrefillFailure: rapid.SampledFrom([]FailurePolicy{FreeDecode, BypassOnDecode}).Draw(rt, "failure"),
			PlanTTL:        time.Duration(rapid.IntRange(1, 600).Draw(rt, "planTTL")) * time.Second,
		}
		if rapid.Bool().Draw(rt, "policy") {
			cfg.Policy = DefaultPolicy()
			cfg.Policy.DecodeBusyThreshold = rapid.SampledFrom([]float64{0, 0.1}).Draw(rt, "gate")
		}
		c := NewCoordinator(NewPools(pcfg, seeded(rapid.Uint64().Draw(rt, "seed"))), cachedOnDecode, cfg)
		all := []Worker{decodeW(1, "r1"), decodeW(2, "r2"), prefillW(11, "r1"), prefillW(12, "r2")}
		for _, w := range all {
			c.SetWorker(w, t0)
		}
		now := t0
		ids := []string{"a", "b", "c", "d", "e"}
		check := func(step string) {
			want := map[PoolKey][]string{}
			for _, id := range c.IDs() {
				p, _ := c.Get(id)
				for _, b := range []*Booking{p.Decode, p.Prefill} {
					if b != nil {
						want[b.Pool] = append(want[b.Pool], b.ID)
					}
				}
			}
			for _, k := range []PoolKey{decKey, preKey} {
				pool := c.Pools().Pool(k)
				var got []string
				for _, id := range ids {
					for _, suf := range []string{"/decode", "/prefill"} {
						if _, ok := pool.Reserved(id + suf); ok {
							got = append(got, id+suf)
						}
					}
				}
				w := want[k]
				slices.Sort(w)
				slices.Sort(got)
				if !slices.Equal(got, w) || pool.Reservations() != len(w) {
					rt.Fatalf("%s: pool %v reservations %v (%d), live plan bookings %v", step, k, got, pool.Reservations(), w)
				}
				tot := pool.Total()
				if tot.Requests != len(w) || tot.Blocks < 0 || tot.PrefillTokens < 0 {
					rt.Fatalf("%s: pool %v total %+v with %d bookings", step, k, tot, len(w))
				}
			}
		}
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for i := range steps {
			id := rapid.SampledFrom(ids).Draw(rt, "id")
			op := rapid.IntRange(0, 7).Draw(rt, "op")
			switch op {
			case 0, 1:
				c.Plan(req(id, rapid.IntRange(1, 6).Draw(rt, "blocks")), now)
			case 2:
				c.PrefillComplete(id, now)
			case 3:
				c.PrefillFailed(id, now)
			case 4:
				c.Release(id, now)
			case 5:
				now = now.Add(time.Duration(rapid.IntRange(0, 400).Draw(rt, "dt")) * time.Second)
				c.Expire(now)
			case 6:
				w := rapid.SampledFrom(all).Draw(rt, "worker")
				if _, ok := c.Pools().Owner(w.Rank); ok {
					c.WorkerRemoved(w.Rank, now)
				} else {
					c.SetWorker(w, now)
				}
			case 7:
				c.PlanDecode(id, now)
			}
			check(fmt.Sprintf("step %d op %d", i, op))
		}
		for _, id := range c.IDs() {
			if _, err := c.Release(id, now); err != nil {
				rt.Fatalf("release %q: %v", id, err)
			}
		}
		check("final")
		if c.Len() != 0 {
			rt.Fatalf("%d plans left", c.Len())
		}
		for _, k := range []PoolKey{decKey, preKey} {
			if tot := c.Pools().Pool(k).Total(); tot != (Load{}) {
				rt.Fatalf("pool %v left %+v", k, tot)
			}
		}
	})
}
