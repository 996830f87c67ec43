package indexer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"
)

// growthTree is a tree for one rank's lookup of n entries: n random keys
// in nodes of edge blocks each, held by rank 0 up to the keys inserted so
// far (as a lookup requires: the tree holds exactly the table's entries
// plus the one being inserted). edge 1 puts every key in a node of its
// own, so a rebuild resolves each key through a different node; longer
// edges are what chains of stores leave.
type growthTree struct {
	t    *Tree
	keys []uint64
	refs []ref
}

func newGrowthTree(n, edge int, seed uint64) *growthTree {
	g := &growthTree{t: NewTree(16), keys: make([]uint64, n), refs: make([]ref, n)}
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i += edge {
		L := min(edge, n-i)
		id := uint32(len(g.t.nodes))
		depth := uint32(i)
		nd := node{live: true, depth: depth, hashes: make([]uint64, L), hold: []holder{{rid: 0}},
			ext: make([]uint64, L), cnt: make([]uint32, L)}
		for j := range L {
			x := rng.Uint64()
			nd.hashes[j], nd.ext[j], nd.cnt[j] = x, x, 1
			g.keys[i+j], g.refs[i+j] = x, ref{id, depth + uint32(j)}
		}
		g.t.nodes = append(g.t.nodes, nd)
	}
	return g
}

// insert inserts key i (keys go in order, so the holder's cut grows by
// one block each time).
func (g *growthTree) insert(lk *lookup, i int) {
	g.t.nodes[g.refs[i].node].hold[0].cut++
	lk.insert(g.t, 0, g.keys[i], g.refs[i])
}

// BenchmarkLookupGrowth grows one rank's lookup from empty to n entries
// and reports the slowest single insert — the longest a writer holds the
// partition for one block's entry, where a table's rebuild falls — in
// the thread's CPU time (threadTime: preemptions on the shared machine do
// not count), as max-µs (over all runs) and runmax-µs (the median over
// runs of each run's slowest); how many inserts per run took over 20 µs;
// and the mean insert, timed without the per-insert clock (ns/insert).
// The tree is built before the clock runs, and the collector is off while
// it runs, so that only the table's own work is timed.
func BenchmarkLookupGrowth(b *testing.B) {
	for _, edge := range []int{1, 256} {
		for _, n := range []int{16 << 10, 128 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("edge=%d/n=%d", edge, n), func(b *testing.B) {
				defer debug.SetGCPercent(debug.SetGCPercent(-1))
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var worst []time.Duration
				var total time.Duration
				slow := 0
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					g := newGrowthTree(n, edge, uint64(i))
					runtime.GC()
					var lk lookup
					w := time.Duration(0)
					for k := range n {
						t0 := threadTime()
						g.insert(&lk, k)
						d := threadTime() - t0
						w = max(w, d)
						if d > 20*time.Microsecond {
							slow++
						}
					}
					worst = append(worst, w)
					g = newGrowthTree(n, edge, uint64(i))
					lk = lookup{}
					runtime.GC()
					b.StartTimer()
					t0 := time.Now()
					for k := range n {
						g.insert(&lk, k)
					}
					total += time.Since(t0)
				}
				slices.Sort(worst)
				b.ReportMetric(float64(worst[len(worst)-1].Nanoseconds())/1e3, "max-µs")
				b.ReportMetric(float64(worst[len(worst)/2].Nanoseconds())/1e3, "runmax-µs")
				b.ReportMetric(float64(slow)/float64(b.N), "inserts>20µs")
				b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*n), "ns/insert")
			})
		}
	}
}

// BenchmarkLookupGet looks up present and absent keys in one rank's
// lookup of n entries (keys in nodes of 16 blocks).
func BenchmarkLookupGet(b *testing.B) {
	for _, n := range []int{1 << 10, 16 << 10, 1 << 20} {
		g := newGrowthTree(n, 16, 7)
		var lk lookup
		for k := range n {
			g.insert(&lk, k)
		}
		order := rand.New(rand.NewPCG(9, 9)).Perm(n)
		b.Run(fmt.Sprintf("hit/n=%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				k := order[i]
				if _, ok := lk.get(g.t, 0, g.keys[k]); !ok {
					b.Fatalf("key %d missing", k)
				}
				if i++; i == n {
					i = 0
				}
			}
		})
		present := make(map[uint64]bool, n)
		for _, x := range g.keys {
			present[x] = true
		}
		miss := make([]uint64, 4096)
		rng := rand.New(rand.NewPCG(11, 11))
		for i := range miss {
			for miss[i] = rng.Uint64(); present[miss[i]]; miss[i] = rng.Uint64() {
			}
		}
		b.Run(fmt.Sprintf("miss/n=%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if _, ok := lk.get(g.t, 0, miss[i]); ok {
					b.Fatalf("absent key %#x found", miss[i])
				}
				i = (i + 1) % len(miss)
			}
		})
	}
}
