package coordinator

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// loadModel is a brute-force reference of the engine-load rule: every
// live booking with its rank, its creation time, the blocks it added,
// and whether it counts on top of its rank's figure.
type loadModel struct {
	live map[string]*modelBooking
	figs map[indexer.Rank]EngineLoad // ranks with a figure
}

type modelBooking struct {
	rank    indexer.Rank
	created time.Time
	seq     []uint64
	fresh   int
	private int // blocks booked without KV reuse
	counts  bool
}

// held counts the distinct blocks the live bookings of rank hold, but
// skip.
func (m *loadModel) held(rank indexer.Rank, skip string) map[uint64]bool {
	h := map[uint64]bool{}
	for id, b := range m.live {
		if b.rank == rank && id != skip {
			for _, x := range b.seq {
				h[x] = true
			}
		}
	}
	return h
}

func (m *loadModel) freshOn(rank indexer.Rank, seq []uint64, skip string) int {
	h := m.held(rank, skip)
	n := 0
	seen := map[uint64]bool{}
	for _, x := range seq {
		if !h[x] && !seen[x] {
			n++
		}
		seen[x] = true
	}
	return n
}

// want is the rule's effective load of rank.
func (m *loadModel) want(rank indexer.Rank, total int) Load {
	booked := Load{Blocks: len(m.held(rank, ""))}
	var since Load
	for _, b := range m.live {
		if b.rank != rank {
			continue
		}
		booked.Blocks += b.private
		booked.Requests++
		if b.counts {
			since.Blocks += b.fresh
			since.Requests++
		}
	}
	f, ok := m.figs[rank]
	if !ok {
		return booked
	}
	out := Load{Blocks: booked.Blocks, Requests: f.Running + f.Waiting + since.Requests}
	if total > 0 {
		out.Blocks = int(math.Round(f.KVUsage*float64(total))) + since.Blocks
	}
	return out
}

// TestPropertyEngineLoadRule drives random bookings, frees, moves, engine
// figures and forgotten figures through a pool and checks the effective
// load of every rank against the reference after every step: each
// booking counted at most once (in the figure or on top), nothing
// negative, and, once traffic stops, the next figure is the whole load.
func TestPropertyEngineLoadRule(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := DefaultPoolConfig()
		cfg.Options.AssumeKVReuse = rapid.Bool().Draw(rt, "reuse")
		total := rapid.SampledFrom([]int{0, 100}).Draw(rt, "total")
		ranks := []indexer.Rank{rk(1), rk(2)}
		p := NewPool(aggKey, cfg, seeded(rapid.Uint64().Draw(rt, "seed")))
		for _, r := range ranks {
			w := worker(aggKey, r.WorkerID)
			w.TotalKVBlocks = total
			if err := p.SetWorker(w); err != nil {
				rt.Fatal(err)
			}
		}
		m := &loadModel{live: map[string]*modelBooking{}, figs: map[indexer.Rank]EngineLoad{}}
		now := t0
		next := 0
		check := func(step string) {
			for _, r := range ranks {
				rl, _ := p.RankLoad(r)
				got, want := rl.Effective, m.want(r, total)
				if got.Blocks != want.Blocks || got.Requests != want.Requests {
					rt.Fatalf("%s: rank %v effective %+v, want %+v (%+v)", step, r, got, want, rl)
				}
				if rl.Since.Blocks < 0 || rl.Since.Requests < 0 || got.Blocks < 0 || got.Requests < 0 || got.PrefillTokens < 0 {
					rt.Fatalf("%s: rank %v negative: %+v", step, r, rl)
				}
				if b, _ := p.Load(r); b.Requests != rl.Booked.Requests || rl.Since.Requests > b.Requests {
					rt.Fatalf("%s: rank %v counts %d on top of %d bookings", step, r, rl.Since.Requests, b.Requests)
				}
			}
		}
		steps := rapid.IntRange(1, 80).Draw(rt, "steps")
		for i := range steps {
			now = now.Add(time.Duration(rapid.IntRange(0, 3).Draw(rt, "dt")) * time.Second)
			rank := rapid.SampledFrom(ranks).Draw(rt, "rank")
			var step string
			switch op := rapid.IntRange(0, 5).Draw(rt, "op"); op {
			case 0, 1: // book
				id := fmt.Sprint("r", next)
				next++
				h := hashes(uint64(rapid.IntRange(0, 3).Draw(rt, "base")), rapid.IntRange(0, 4).Draw(rt, "n"))
				seq := indexer.HashSequence(nil, h)
				fresh := len(seq)
				if cfg.Options.AssumeKVReuse {
					fresh = m.freshOn(rank, seq, "")
				}
				if _, err := p.SelectAndReserve(id, Query{Prompt: promptOf(h), Pin: &rank}, now); err != nil {
					rt.Fatal(err)
				}
				f, ok := m.figs[rank]
				m.live[id] = &modelBooking{rank: rank, created: now, seq: seq, fresh: fresh, counts: ok && now.After(f.At)}
				if !cfg.Options.AssumeKVReuse {
					m.live[id].seq, m.live[id].private = nil, len(seq) // never shared
				}
				step = "book " + id
			case 2: // free
				id := fmt.Sprint("r", rapid.IntRange(0, max(next-1, 0)).Draw(rt, "id"))
				_, live := m.live[id]
				if p.Free(id) != live {
					rt.Fatalf("free %s: pool and model disagree on liveness", id)
				}
				delete(m.live, id)
				step = "free " + id
			case 3: // move
				id := fmt.Sprint("r", rapid.IntRange(0, max(next-1, 0)).Draw(rt, "id"))
				b, live := m.live[id]
				if p.Move(id, rank) != live {
					rt.Fatalf("move %s: pool and model disagree on liveness", id)
				}
				if live && b.rank != rank {
					if cfg.Options.AssumeKVReuse {
						b.fresh = m.freshOn(rank, b.seq, id)
					}
					b.rank = rank
					_, b.counts = m.figs[rank]
				}
				step = "move " + id
			case 4: // a figure
				lag := time.Duration(rapid.IntRange(0, 4).Draw(rt, "lag")) * time.Second
				l := EngineLoad{At: now.Add(-lag), Running: rapid.IntRange(0, 5).Draw(rt, "running"),
					Waiting: rapid.IntRange(0, 5).Draw(rt, "waiting"), KVUsage: float64(rapid.IntRange(0, 10).Draw(rt, "usage")) / 10}
				err := p.SetEngineLoad(rank, l)
				if f, ok := m.figs[rank]; ok && l.At.Before(f.At) {
					if !errors.Is(err, ErrStaleLoad) {
						rt.Fatalf("an older figure: %v, want ErrStaleLoad", err)
					}
					break
				}
				if err != nil {
					rt.Fatal(err)
				}
				m.figs[rank] = l
				for _, b := range m.live {
					if b.rank == rank && b.counts && !b.created.After(l.At) {
						b.counts = false
					}
				}
				step = fmt.Sprintf("figure %v %+v", rank, l)
			case 5: // forget the figure
				if err := p.SetEngineLoad(rank, EngineLoad{}); err != nil {
					rt.Fatal(err)
				}
				delete(m.figs, rank)
				for _, b := range m.live {
					if b.rank == rank {
						b.counts = false
					}
				}
				step = fmt.Sprintf("forget %v", rank)
			}
			check(fmt.Sprintf("step %d (%s)", i, step))
		}
		// Traffic stops: a figure newer than every booking is the whole
		// load, and an idle engine's figure makes it 0.
		now = now.Add(time.Second)
		for _, r := range ranks {
			l := EngineLoad{At: now, Running: 3, KVUsage: 0.25}
			if err := p.SetEngineLoad(r, l); err != nil {
				rt.Fatal(err)
			}
			rl, _ := p.RankLoad(r)
			if rl.Since != (Load{}) || rl.Effective.Requests != 3 {
				rt.Fatalf("rank %v after a figure newer than every booking: %+v", r, rl)
			}
			if total > 0 && rl.Effective.Blocks != 25 {
				rt.Fatalf("rank %v blocks %d, want the figure's 25", r, rl.Effective.Blocks)
			}
			for id := range m.live {
				p.Free(id)
			}
			now = now.Add(time.Second)
			if err := p.SetEngineLoad(r, EngineLoad{At: now}); err != nil {
				rt.Fatal(err)
			}
			if rl, _ := p.RankLoad(r); rl.Effective != (Load{}) {
				rt.Fatalf("rank %v idle: effective %+v, want 0", r, rl.Effective)
			}
		}
	})
}

// TestEngineLoadSteersSelection: a rank whose engine reports a full KV
// cache is avoided, though prefixd booked nothing there.
func TestEngineLoadSteersSelection(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1), worker(aggKey, 2))
	if err := p.SetEngineLoad(rk(1), EngineLoad{At: t0, Running: 40, KVUsage: 0.9}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		s := mustReserve(t, p, fmt.Sprint("q", i), Query{Prompt: promptOf(hashes(uint64(100*i), 2))})
		if s.Rank != rk(2) {
			t.Fatalf("request %d went to the loaded rank %v", i, s.Rank)
		}
	}
	// Forgotten, the figure no longer counts: rank 1 is the idle one.
	if err := p.SetEngineLoad(rk(1), EngineLoad{}); err != nil {
		t.Fatal(err)
	}
	if s := mustReserve(t, p, "after", Query{Prompt: promptOf(hashes(5000, 2))}); s.Rank != rk(1) {
		t.Fatalf("with the figure forgotten, chose %v, want the idle rank 1", s.Rank)
	}
}

func TestEngineLoadRefused(t *testing.T) {
	p := newPool(t, DefaultPoolConfig(), 1, worker(aggKey, 1))
	for _, l := range []EngineLoad{
		{At: t0, KVUsage: math.NaN()},
		{At: t0, KVUsage: math.Inf(1)},
		{At: t0, KVUsage: 1.5},
		{At: t0, KVUsage: -0.1},
		{At: t0, Running: -1},
		{At: t0, Waiting: MaxEngineRequests + 1},
	} {
		if err := p.SetEngineLoad(rk(1), l); !errors.Is(err, ErrInvalidLoad) {
			t.Errorf("SetEngineLoad(%+v) = %v, want ErrInvalidLoad", l, err)
		}
	}
	if rl, _ := p.RankLoad(rk(1)); rl.HasEngine {
		t.Fatalf("a refused figure was kept: %+v", rl)
	}
	if err := p.SetEngineLoad(rk(9), EngineLoad{At: t0}); !errors.Is(err, ErrUnknownRank) {
		t.Fatalf("unknown rank: %v", err)
	}
}

func TestServiceEngineLoad(t *testing.T) {
	now := t0
	s := NewService(ServiceConfig{Pool: DefaultPoolConfig(), Rand: seeded(1), Now: func() time.Time { return now }})
	e := Engine{Worker: worker(aggKey, 7), DPRanks: []uint32{0, 1}, BlockSize: bs}
	e.Endpoint = "http://e7"
	if err := s.SetEngine(e); err != nil {
		t.Fatal(err)
	}
	k := e.Key()
	if err := s.SetEngineLoad(k, 1, EngineLoad{At: now, Running: 2, Waiting: 1, KVUsage: 0.5}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetEngineLoad(k, 5, EngineLoad{At: now}); !errors.Is(err, ErrUnknownRank) {
		t.Fatalf("unknown dp rank: %v", err)
	}
	now = now.Add(time.Second)
	r1 := indexer.Rank{WorkerID: 7, DPRank: 1}
	if _, err := s.Reserve(SelectRequest{ID: "x", Pool: aggKey, Hashes: hashes(1, 3), Pin: &r1}); err != nil {
		t.Fatal(err)
	}
	got, ok := s.EffectiveLoad(k, 1)
	if want := (Load{Blocks: 50 + 3, Requests: 4, PrefillTokens: 3 * bs}); !ok || got != want {
		t.Fatalf("EffectiveLoad = %+v, %v; want %+v", got, ok, want)
	}
	if got, _ := s.EffectiveLoad(k, 0); got != (Load{}) {
		t.Fatalf("rank 0 without a figure or bookings: %+v", got)
	}
}

// TestEngineLoadPeerBookings: a peer's booking counts on top of the
// engine's figure when this replica received it after the figure (it is
// a booking made since), and inside the figure when received before;
// DropPeer takes it off.
func TestEngineLoadPeerBookings(t *testing.T) {
	var deltas []BookingDelta
	e := Engine{Worker: worker(aggKey, 7), DPRanks: []uint32{0}, BlockSize: bs}
	e.Endpoint = "http://e7"
	origin, _ := newService(t, ServiceConfig{Origin: "a", OnBooking: func(d BookingDelta) { deltas = append(deltas, d) }}, e)
	peer, clk := newService(t, ServiceConfig{Origin: "b"}, e)
	r0 := indexer.Rank{WorkerID: 7}
	for i, id := range []string{"early", "late"} {
		if _, err := origin.Reserve(SelectRequest{ID: id, Pool: aggKey, Hashes: hashes(uint64(10*i), 2), Pin: &r0}); err != nil {
			t.Fatal(err)
		}
	}
	// "early" arrives before the figure, "late" after it.
	if applied, dropped := peer.ApplyPeer(deltas[:1]); applied != 1 || dropped != 0 {
		t.Fatalf("apply early: %d applied, %d dropped", applied, dropped)
	}
	clk.t = clk.t.Add(time.Second)
	if err := peer.SetEngineLoad(e.Key(), 0, EngineLoad{At: clk.t, Running: 1, KVUsage: 0.25}); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(time.Second)
	if applied, _ := peer.ApplyPeer(deltas[1:]); applied != 1 {
		t.Fatalf("apply late: %d applied", applied)
	}
	rl, _ := peer.RankLoad(e.Key(), 0)
	if rl.Booked.Requests != 2 || rl.Since != (Load{Blocks: 2, Requests: 1}) || rl.Effective.Blocks != 25+2 || rl.Effective.Requests != 2 {
		t.Fatalf("peer's load %+v", rl)
	}
	if n := peer.DropPeer("a"); n != 2 {
		t.Fatalf("DropPeer freed %d", n)
	}
	if rl, _ := peer.RankLoad(e.Key(), 0); rl.Since != (Load{}) || rl.Effective != (Load{Blocks: 25, Requests: 1}) {
		t.Fatalf("after DropPeer: %+v", rl)
	}
}

// BenchmarkServiceSelectAndReserveEngineLoad is
// BenchmarkServiceSelectAndReserve with every rank's engine figure
// counting, and one rank's figure renewed every 8 bookings (a scrape
// every 512 bookings per rank), at a clock that moves 1 µs a booking.
func BenchmarkServiceSelectAndReserveEngineLoad(b *testing.B) {
	now := t0
	s := NewService(ServiceConfig{Pool: DefaultPoolConfig(), Source: benchOverlaps{}, Rand: seeded(1), Now: func() time.Time { return now }})
	var keys []EngineKey
	for i := uint64(0); i < 64; i++ {
		e := engine(1000+i, RoleAggregated, endpoint(1000+i))
		e.TotalKVBlocks, e.MaxNumBatchedTokens = 1<<20, 1<<20
		if err := s.SetEngine(e); err != nil {
			b.Fatal(err)
		}
		keys = append(keys, e.Key())
		if err := s.SetEngineLoad(e.Key(), 0, EngineLoad{At: now, Running: int(i % 4), KVUsage: 0.01 * float64(i%8)}); err != nil {
			b.Fatal(err)
		}
	}
	k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	const live = 256
	reqs := make([]SelectRequest, live)
	for i := range reqs {
		t := make([]uint32, 128*bs)
		for j := range t {
			t[j] = uint32(j) + uint32(i)<<20
		}
		reqs[i] = SelectRequest{ID: fmt.Sprint("r", i), Pool: k, Tokens: t}
	}
	i := 0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		r := reqs[i%live]
		if i >= live {
			if err := s.Free(r.ID); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.SelectAndReserve(r); err != nil {
			b.Fatal(err)
		}
		if i%8 == 0 {
			if err := s.SetEngineLoad(keys[(i/8)%len(keys)], 0, EngineLoad{At: now, Running: i % 5, KVUsage: 0.5}); err != nil {
				b.Fatal(err)
			}
		}
		i++
	}
}
