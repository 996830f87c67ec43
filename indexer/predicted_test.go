package indexer_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
)

func TestPredictions(t *testing.T) {
	k := indexer.PartitionKey{Model: "m", Group: "g"}
	a, b := indexer.Rank{WorkerID: 1}, indexer.Rank{WorkerID: 2}
	t0 := time.Unix(1000, 0)
	p := indexer.NewPredictions(2*time.Second, 0, 0)
	prompt := []uint64{11, 12, 13, 14}
	p.Add(k, a, prompt[:3], t0)
	p.Add(k, b, []uint64{11, 99}, t0.Add(time.Second))
	got := p.Match(k, prompt, t0.Add(time.Second), nil)
	want := []indexer.Overlap{{Rank: a, Device: 3, Host: 3, Disk: 3}, {Rank: b, Device: 1, Host: 1, Disk: 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("Match = %v, want %v", got, want)
	}
	// The same blocks of another prefix are not predicted: keys are
	// sequence hashes.
	if got := p.Match(k, []uint64{12, 13}, t0, nil); len(got) != 0 {
		t.Fatalf("a suffix matched: %v", got)
	}
	if got := p.Match(indexer.PartitionKey{Model: "m"}, prompt, t0, nil); len(got) != 0 {
		t.Fatalf("another partition matched: %v", got)
	}
	// a's predictions end at t0+2s; b's, made later, live on.
	if got := p.Match(k, prompt, t0.Add(2*time.Second), nil); !slices.Equal(got, want[1:]) {
		t.Fatalf("after a's TTL: %v, want %v", got, want[1:])
	}
	p.Expire(t0.Add(2 * time.Second))
	if n := p.Len(); n != 2 {
		t.Fatalf("Len after expiry = %d, want b's 2", n)
	}
	// A refresh extends a prediction.
	p.Add(k, b, []uint64{11}, t0.Add(2500*time.Millisecond))
	p.Expire(t0.Add(3 * time.Second))
	if got := p.Match(k, prompt, t0.Add(3*time.Second), nil); !slices.Equal(got, []indexer.Overlap{{Rank: b, Device: 1, Host: 1, Disk: 1}}) {
		t.Fatalf("refreshed prediction: %v", got)
	}
	if n := p.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1 (the refreshed block)", n)
	}
	p.RemoveRank(k, b)
	if n := p.Len(); n != 0 {
		t.Fatalf("Len after RemoveRank = %d", n)
	}
}

// TestPredictionsMerge: a rank's overlap is the larger of the index's and
// the prediction's; a prediction the index covers ends.
func TestPredictionsMerge(t *testing.T) {
	k := indexer.PartitionKey{Model: "m"}
	a, b, c := indexer.Rank{WorkerID: 1}, indexer.Rank{WorkerID: 2}, indexer.Rank{WorkerID: 3}
	t0 := time.Unix(0, 0)
	p := indexer.NewPredictions(time.Minute, 0, 0)
	prompt := []uint64{1, 2, 3, 4}
	p.Add(k, a, prompt, t0)
	p.Add(k, b, prompt[:2], t0)
	ov := []indexer.Overlap{{Rank: c, Device: 1, Host: 2, Disk: 2}, {Rank: b, Device: 3, Host: 3, Disk: 4}, {Rank: a, Device: 1, Host: 1, Disk: 1}}
	var pred []indexer.Overlap
	got := p.Merge(k, prompt, ov, t0, &pred)
	want := []indexer.Overlap{{Rank: a, Device: 4, Host: 4, Disk: 4}, {Rank: b, Device: 3, Host: 3, Disk: 4}, {Rank: c, Device: 1, Host: 2, Disk: 2}}
	if !slices.Equal(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
	if len(pred) != 2 || pred[0].Device != 4 || pred[1].Device != 2 {
		t.Fatalf("predicted overlaps %v", pred)
	}
	// b's events arrived (the index holds 3 ≥ 2 blocks): its prediction
	// ended; a's lives.
	if n := p.Len(); n != 4 {
		t.Fatalf("Len = %d, want a's 4", n)
	}
}

// TestPredictionsBounded: past MaxEntries the oldest predictions go.
func TestPredictionsBounded(t *testing.T) {
	k := indexer.PartitionKey{Model: "m"}
	p := indexer.NewPredictions(time.Hour, 0, 8)
	t0 := time.Unix(0, 0)
	for i := range 5 {
		p.Add(k, indexer.Rank{WorkerID: uint64(i)}, []uint64{1, 2, 3}, t0.Add(time.Duration(i)*time.Second))
	}
	if n := p.Len(); n != 8 {
		t.Fatalf("Len = %d, want the cap 8", n)
	}
	got := p.Match(k, []uint64{1, 2, 3}, t0.Add(5*time.Second), nil)
	// Ranks 0 and 1 lost their first blocks (the oldest), rank 2 its first:
	// only ranks 3 and 4 still match from the start.
	if len(got) != 2 || got[0].Rank.WorkerID != 3 || got[1].Rank.WorkerID != 4 || got[0].Device != 3 {
		t.Fatalf("Match after eviction = %v", got)
	}
}

// TestPredictionsModel checks Match against a brute-force model under
// random adds, refreshes, expiry and rank removal.
func TestPredictionsModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	k := indexer.PartitionKey{Model: "m"}
	ttl := 10 * time.Second
	p := indexer.NewPredictions(ttl, 0, 0)
	type key struct {
		seq  uint64
		rank indexer.Rank
	}
	model := map[key]time.Time{}
	now := time.Unix(0, 0)
	prompt := func() []uint64 {
		n := 1 + rng.IntN(6)
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(1 + rng.IntN(3)) // few values: shared prefixes
		}
		return out
	}
	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		r := indexer.Rank{WorkerID: uint64(rng.IntN(4))}
		switch x := rng.IntN(10); {
		case x < 5:
			q := prompt()
			p.Add(k, r, q, now)
			for _, h := range indexer.HashSequence(nil, q) {
				model[key{h, r}] = now.Add(ttl)
			}
		case x < 6:
			p.RemoveRank(k, r)
			for kk := range model {
				if kk.rank == r {
					delete(model, kk)
				}
			}
		default:
			q := prompt()
			got := p.Match(k, q, now, nil)
			var want []indexer.Overlap
			seq := indexer.HashSequence(nil, q)
			for w := range 4 {
				r := indexer.Rank{WorkerID: uint64(w)}
				n := 0
				for n < len(seq) && model[key{seq[n], r}].After(now) {
					n++
				}
				if n > 0 {
					want = append(want, indexer.Overlap{Rank: r, Device: uint32(n), Host: uint32(n), Disk: uint32(n)})
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: Match(%v) = %v, want %v", step, q, got, want)
			}
		}
	}
}

// TestPredictionsBookSettle: a booking's prediction lives while it is
// pending (at most the pending TTL), then a TTL from Settle; a shorter
// one never shortens a longer one.
func TestPredictionsBookSettle(t *testing.T) {
	k := indexer.PartitionKey{Model: "m"}
	a, b := indexer.Rank{WorkerID: 1}, indexer.Rank{WorkerID: 2}
	t0 := time.Unix(0, 0)
	p := indexer.NewPredictions(time.Second, time.Minute, 0)
	prompt := []uint64{1, 2, 3}
	at := func(d time.Duration) []indexer.Overlap { return p.Match(k, prompt, t0.Add(d), nil) }
	p.Book("x", k, a, prompt, t0)
	p.Book("y", k, b, prompt, t0)
	if got := at(30 * time.Second); len(got) != 2 {
		t.Fatalf("pending bookings at 30 s: %v, want both", got)
	}
	p.Settle("x", t0.Add(30*time.Second))
	p.Settle("unknown", t0)
	if got := at(31 * time.Second); len(got) != 1 || got[0].Rank != b {
		t.Fatalf("a second after x settled: %v, want only y", got)
	}
	if got := at(time.Minute); len(got) != 0 {
		t.Fatalf("past the pending TTL: %v", got)
	}
	p.Expire(t0.Add(time.Minute))
	if p.Len() != 0 || p.Pending() != 0 {
		t.Fatalf("after expiry: %d entries, %d pending", p.Len(), p.Pending())
	}
	// Add (settled) does not shorten a pending prediction.
	p.Book("z", k, a, prompt, t0)
	p.Add(k, a, prompt, t0)
	if got := at(10 * time.Second); len(got) != 1 {
		t.Fatalf("a pending prediction was shortened: %v", got)
	}
}
