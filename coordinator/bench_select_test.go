package coordinator

import (
	"fmt"
	"testing"
)

// BenchmarkServiceSelectAndReserve: a selection booked and freed through
// the Service, with 64 engines of which every eighth caches half of the
// 2,048-token prompt, and 256 reservations live at any time.
func BenchmarkServiceSelectAndReserve(b *testing.B) {
	benchSelectAndReserve(b, 0)
}

func benchSelectAndReserve(b *testing.B, fallbacks int) {
	s := NewService(ServiceConfig{Pool: DefaultPoolConfig(), Source: benchOverlaps{}, Rand: seeded(1)})
	for i := uint64(0); i < 64; i++ {
		e := engine(1000+i, RoleAggregated, endpoint(1000+i))
		e.TotalKVBlocks, e.MaxNumBatchedTokens = 1<<20, 1<<20
		if err := s.SetEngine(e); err != nil {
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
		setFallbacks(&reqs[i], fallbacks)
	}
	i := 0
	for b.Loop() {
		r := reqs[i%live]
		if i >= live {
			if err := s.Free(r.ID); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.SelectAndReserve(r); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkServiceSelectAndReserveFallbacks is the same with three
// fallbacks asked for.
func BenchmarkServiceSelectAndReserveFallbacks(b *testing.B) {
	benchSelectAndReserve(b, 3)
}

func setFallbacks(r *SelectRequest, n int) { r.Fallbacks = n }

// BenchmarkQueuedPlacement: a booking freed on a saturated pool of 64
// engines with 512 requests waiting (shortest-work): the Free places one
// waiter (comparing the first bestFit), and a new request joins the
// queue. The same 2,048-token prompts and overlaps as above.
func BenchmarkQueuedPlacement(b *testing.B) {
	qc := DefaultQueueConfig()
	qc.MaxLen = 4096
	cfg := ServiceConfig{Pool: DefaultPoolConfig(), Source: benchOverlaps{}, Rand: seeded(1), Queue: &qc}
	cfg.QueueBusy.PrefillTokensFrac = 0.5
	s := NewService(cfg)
	for i := uint64(0); i < 64; i++ {
		e := engine(1000+i, RoleAggregated, endpoint(1000+i))
		e.TotalKVBlocks, e.MaxNumBatchedTokens = 1<<20, 2048
		if err := s.SetEngine(e); err != nil {
			b.Fatal(err)
		}
	}
	k := PoolKey{Model: "m", Group: "default", Role: RoleAggregated}
	req := func(i int) SelectRequest {
		t := make([]uint32, 128*bs)
		for j := range t {
			t[j] = uint32(j) + uint32(i%4096)<<20
		}
		return SelectRequest{ID: fmt.Sprint("r", i), Pool: k, Tokens: t, Wait: &Wait{}}
	}
	var live []string     // booked, in order
	var waiting []*Ticket // in order
	n := 0
	add := func() {
		r := req(n)
		n++
		_, t, err := s.Enqueue(r)
		switch {
		case err != nil:
			b.Fatal(err)
		case t == nil:
			live = append(live, r.ID)
		default:
			waiting = append(waiting, t)
		}
	}
	placed := func() {
		kept := waiting[:0]
		for _, t := range waiting {
			select {
			case <-t.Done():
				if _, err := t.Result(); err != nil {
					b.Fatal(err)
				}
				live = append(live, t.ID())
			default:
				kept = append(kept, t)
			}
		}
		waiting = kept
	}
	for s.Waiting(k) < 512 {
		add()
	}
	for b.Loop() {
		id := live[0]
		live = live[1:]
		if err := s.Free(id); err != nil {
			b.Fatal(err)
		}
		placed()
		add()
	}
}
