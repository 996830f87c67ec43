package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// syncEngines are two two-rank aggregated engines and a decode and a
// prefill engine for plans.
func syncEngines() []Engine {
	agg := func(id uint64) Engine {
		return Engine{Worker: Worker{Rank: rk(id), Model: "m", Group: "default", Role: RoleAggregated, Endpoint: endpoint(id)}, DPRanks: []uint32{0, 1}, BlockSize: bs}
	}
	return []Engine{agg(1), agg(2), engine(3, RoleDecode, endpoint(3)), engine(4, RolePrefill, endpoint(4))}
}

// loads is every rank's booked load in every pool of s.
func loads(s *Service) map[string]Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Load{}
	for _, k := range s.pools.Keys() {
		p := s.pools.Pool(k)
		for _, r := range p.Ranks() {
			l, _ := p.Load(r)
			out[k.String()+" "+r.String()] = l
		}
	}
	return out
}

func idle(s *Service) bool {
	for _, l := range loads(s) {
		if l != (Load{}) {
			return false
		}
	}
	return true
}

var aggPool = PoolKey{Model: "m", Group: "default", Role: RoleAggregated}

// TestPropertyPeerMirrorsOrigin drives random local traffic through an
// origin Service (reservations, moves, prefill completions, frees, plans,
// expiry) and feeds its delta stream, in random batches, to a peer that
// has no traffic of its own, and to a second peer that joins midway
// from a snapshot (SnapshotBookings, ResetPeer). After every step each
// peer's per-rank Load equals the origin's; DropPeer leaves them idle.
func TestPropertyPeerMirrorsOrigin(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var stream []BookingDelta
		clk := &clock{t0}
		cfg := ServiceConfig{Pool: DefaultPoolConfig(), Now: clk.now, Rand: seeded(1), Origin: "a",
			OnBooking: func(d BookingDelta) { stream = append(stream, d) }}
		cfg.Pool.ReservationTTL = 30 * time.Second
		cfg.Coordinator.PlanTTL = 30 * time.Second
		origin := NewService(cfg)
		peerCfg := ServiceConfig{Pool: cfg.Pool, Coordinator: cfg.Coordinator, Now: clk.now, Rand: seeded(2), Origin: "b"}
		mirror, late := NewService(peerCfg), NewService(peerCfg)
		for _, s := range []*Service{origin, mirror, late} {
			for _, e := range syncEngines() {
				if err := s.SetEngine(e); err != nil {
					rt.Fatal(err)
				}
			}
		}
		delivered, lateFrom := 0, -1
		deliver := func() {
			for delivered < len(stream) {
				n := rapid.IntRange(1, len(stream)-delivered).Draw(rt, "batch")
				batch := stream[delivered : delivered+n]
				if a, d := mirror.ApplyPeer(slices.Clone(batch)); a+d != n {
					rt.Fatalf("apply %d deltas: %d applied, %d dropped", n, a, d)
				}
				if lateFrom >= 0 {
					late.ApplyPeer(slices.Clone(batch))
				}
				delivered += n
			}
		}
		ids := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
		for step := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			id := rapid.SampledFrom(ids).Draw(rt, "id")
			switch op := rapid.IntRange(0, 7).Draw(rt, "op"); op {
			case 0, 1: // a reservation: prompts share prefixes
				base := uint64(rapid.IntRange(0, 2).Draw(rt, "prefix")) * 100
				n := rapid.IntRange(1, 6).Draw(rt, "blocks")
				_, _ = origin.SelectAndReserve(SelectRequest{ID: id, Pool: aggPool, Hashes: hashes(base, n)})
			case 2:
				_ = origin.ReservePrefillComplete(id)
			case 3:
				_ = origin.Free(id)
			case 4:
				to := indexer.Rank{WorkerID: uint64(rapid.IntRange(1, 2).Draw(rt, "to")), DPRank: uint32(rapid.IntRange(0, 1).Draw(rt, "dp"))}
				_ = origin.Move(id, to)
			case 5:
				r := planReq("p" + id)
				_, _ = origin.Plan(r)
				if rapid.Bool().Draw(rt, "prefilled") {
					_, _ = origin.PrefillComplete(r.ID)
				}
			case 6:
				_, _ = origin.Release("p" + id)
			case 7: // time passes; every Service expires at the same clock
				clk.t = clk.t.Add(time.Duration(rapid.IntRange(1, 40).Draw(rt, "secs")) * time.Second)
				deliver()
				for _, s := range []*Service{origin, mirror, late} {
					s.Expire(clk.t)
				}
			}
			deliver()
			if lateFrom < 0 && rapid.IntRange(0, 9).Draw(rt, "join") == 0 {
				origin.SnapshotBookings(func(seq uint64, live []BookingDelta) {
					late.ResetPeer("a", seq, live)
					lateFrom = int(seq)
				})
			}
			want := loads(origin)
			if got := loads(mirror); !maps.Equal(got, want) {
				rt.Fatalf("step %d: mirror %v, origin %v", step, got, want)
			}
			if got := loads(late); lateFrom >= 0 && !maps.Equal(got, want) {
				rt.Fatalf("step %d: late peer %v, origin %v", step, got, want)
			}
		}
		ps := mirror.Peers()
		if len(stream) > 0 && (len(ps) != 1 || ps[0].Seq != uint64(len(stream)) || ps[0].Gaps != 0 || ps[0].Applied+ps[0].Dropped != uint64(len(stream))) {
			rt.Fatalf("peers %+v after %d deltas", ps, len(stream))
		}
		mirror.DropPeer("a")
		late.DropPeer("a")
		if !idle(mirror) || !idle(late) || mirror.Reservations() != 0 || late.Reservations() != 0 || len(mirror.Peers()) != 0 {
			rt.Fatalf("after DropPeer: %v, %v", loads(mirror), loads(late))
		}
	})
}

// TestApplyPeerCountsWhatItCannotApply: duplicates, gaps, unknown ids,
// pools and ranks, this Service's own deltas and bad sizes are counted,
// never errors, and a gap still applies the delta after it.
func TestApplyPeerCountsWhatItCannotApply(t *testing.T) {
	s, _ := newService(t, ServiceConfig{Origin: "me"}, syncEngines()...)
	r1 := indexer.Rank{WorkerID: 1}
	admit := func(origin string, seq uint64, id string) BookingDelta {
		return BookingDelta{Origin: origin, Seq: seq, Op: BookingAdmit, ID: id, Pool: aggPool, Rank: r1, Blocks: []uint64{7, 8}, PrefillTokens: 32}
	}
	ds := []BookingDelta{
		admit("a", 1, "x"),
		admit("a", 1, "y"), // duplicate seq
		admit("a", 2, "x"), // duplicate id
		admit("a", 5, "z"), // gap of 2, applies
		{Origin: "a", Seq: 6, Op: BookingFree, ID: "nope"},
		{Origin: "a", Seq: 7, Op: BookingAdmit, ID: "q", Pool: PoolKey{Model: "other"}, Rank: r1},
		{Origin: "a", Seq: 8, Op: BookingAdmit, ID: "q", Pool: aggPool, Rank: indexer.Rank{WorkerID: 99}},
		{Origin: "a", Seq: 9, Op: BookingAdmit, ID: "q", Pool: aggPool, Rank: r1, Private: -1},
		admit("me", 1, "own"),
		admit("", 1, "anonymous"),
		{Origin: "a", Seq: 10, Op: BookingPrefilled, ID: "x"},
	}
	applied, dropped := s.ApplyPeer(ds)
	if applied != 3 || dropped != 8 {
		t.Fatalf("applied %d dropped %d, want 3 and 8", applied, dropped)
	}
	want := []PeerStatus{{Origin: "a", Seq: 10, Bookings: 2, Applied: 3, Dropped: 6, Gaps: 1, Missed: 2}}
	if got := s.Peers(); !slices.Equal(got, want) {
		t.Fatalf("peers %+v, want %+v", got, want)
	}
	l, _ := s.pools.Pool(aggPool).Load(r1)
	if want := (Load{Blocks: 2, PrefillTokens: 32, Requests: 2}); l != want {
		t.Fatalf("load %+v, want %+v (x prefilled, z not; blocks shared)", l, want)
	}
	// A local id can never free or take over a peer's booking.
	if err := s.Free("x"); err == nil {
		t.Fatal("a local Free freed a peer's booking")
	}
	if n := s.DropPeer("a"); n != 2 || s.Reservations() != 0 {
		t.Fatalf("DropPeer freed %d, %d left", n, s.Reservations())
	}
}

// TestPeerBookingsSteerSelection: a rank a peer booked heavily costs
// more here, so a selection goes elsewhere; after DropPeer it is free
// again.
func TestPeerBookingsSteerSelection(t *testing.T) {
	s, _ := newService(t, ServiceConfig{Origin: "me"}, engine(1, RoleAggregated, endpoint(1)), engine(2, RoleAggregated, endpoint(2)))
	pool := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	var ds []BookingDelta
	for i := range 8 {
		ds = append(ds, BookingDelta{Origin: "a", Seq: uint64(i + 1), Op: BookingAdmit, ID: fmt.Sprint(i), Pool: pool, Rank: rk(1),
			Blocks: hashes(uint64(1000*(i+1)), 10), PrefillTokens: 160})
	}
	if a, d := s.ApplyPeer(ds); a != 8 || d != 0 {
		t.Fatalf("applied %d dropped %d", a, d)
	}
	for range 5 {
		c, err := s.Select(SelectRequest{Pool: pool, Hashes: hashes(1, 4)})
		if err != nil || c.Rank != rk(2) {
			t.Fatalf("select: %v %v, want worker 2", c.Rank, err)
		}
	}
	c, err := s.Select(SelectRequest{Pool: pool, Hashes: hashes(1, 4), Pin: pin(1)})
	if err != nil || c.ActiveRequests != 8 || c.PotentialDecodeBlocks != 84 {
		t.Fatalf("pinned to the booked rank: %+v %v", c.Selection, err)
	}
	s.DropPeer("a")
	c, _ = s.Select(SelectRequest{Pool: pool, Hashes: hashes(1, 4), Pin: pin(1)})
	if c.ActiveRequests != 0 || c.PotentialDecodeBlocks != 4 {
		t.Fatalf("after DropPeer: %+v", c.Selection)
	}
}

// TestOnBookingOrder: a local reservation's life is reported in order
// with a sequence from 1; a move is a free and an admit; expiry frees.
func TestOnBookingOrder(t *testing.T) {
	var got []string
	s, clk := newService(t, ServiceConfig{Origin: "a", OnBooking: func(d BookingDelta) {
		got = append(got, fmt.Sprintf("%d %v %s %v blocks=%d prefill=%d", d.Seq, d.Op, d.ID, d.Rank, len(d.Blocks), d.PrefillTokens))
	}}, engine(1, RoleAggregated, endpoint(1)), engine(2, RoleAggregated, endpoint(2)))
	c, err := s.SelectAndReserve(SelectRequest{ID: "x", Pool: aggPool, Hashes: hashes(1, 3), PromptTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	other := rk(1)
	if c.Rank == other {
		other = rk(2)
	}
	must(t, s.Move("x", other))
	must(t, s.ReservePrefillComplete("x"))
	must(t, s.Free("x"))
	if _, err := s.SelectAndReserve(SelectRequest{ID: "y", Pool: aggPool, Hashes: hashes(1, 1), PromptTokens: 16}); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(DefaultReservationTTL)
	s.Expire(clk.t)
	want := []string{
		fmt.Sprintf("1 admit x %v blocks=3 prefill=48", c.Rank),
		fmt.Sprintf("2 free x %v blocks=0 prefill=0", c.Rank),
		fmt.Sprintf("3 admit x %v blocks=3 prefill=48", other),
		fmt.Sprintf("4 prefilled x %v blocks=0 prefill=0", other),
		fmt.Sprintf("5 free x %v blocks=0 prefill=0", other),
	}
	if len(got) != 7 || !slices.Equal(got[:5], want) || got[5][:8] != "6 admit " || got[6][:7] != "7 free " {
		t.Fatalf("deltas:\n%v\nwant\n%v then y's admit and expiry", got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
