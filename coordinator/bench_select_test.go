package coordinator

import (
	"fmt"
	"testing"

	"github.com/prefixd/prefixd/indexer"
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
// waiter (comparing the first bestFit, each looked up in a real index
// where one engine caches the first half of its 2,048-token prompt), and
// a new request joins the queue.
func BenchmarkQueuedPlacement(b *testing.B) {
	ix := indexer.New(indexer.Options{})
	part := indexer.PartitionKey{Model: "m", Group: "default"}
	if err := ix.AddPartition(part, bs); err != nil {
		b.Fatal(err)
	}
	prompt := func(i int) []uint32 {
		t := make([]uint32, 128*bs)
		for j := range t {
			t[j] = uint32(j) + uint32(i%4096)<<20
		}
		return t
	}
	for i := range 4096 {
		ext := make([]uint64, 64)
		for j := range ext {
			ext[j] = uint64(i)<<20 | uint64(j) + 1
		}
		op := indexer.Op{Kind: indexer.OpStore, Store: indexer.Stored{Hashes: ext, Tokens: prompt(i)[:64*bs], BlockSize: bs, Seed: indexer.BaseSeed}}
		if res, err := ix.Apply(part, indexer.Rank{WorkerID: 1000 + uint64(i%64)}, uint64(i/64+1), []indexer.Op{op}); err != nil || len(res.Errs) > 0 {
			b.Fatal(err, res.Errs)
		}
	}
	qc := DefaultQueueConfig()
	qc.MaxLen = 4096
	cfg := ServiceConfig{Pool: DefaultPoolConfig(), Source: IndexOverlaps{Index: ix}, Rand: seeded(1), Queue: &qc}
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
		return SelectRequest{ID: fmt.Sprint("r", i), Pool: k, Tokens: prompt(i), Wait: &Wait{}}
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
