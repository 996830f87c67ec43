package indexer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSelfReferencing checks events of n distinct random hashes
// with a parent, none repeating (the common case, which must look at
// every hash).
func BenchmarkSelfReferencing(b *testing.B) {
	for _, n := range []int{64, 512} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			s := Stored{Hashes: make([]uint64, n), Parent: rng.Uint64(), HasParent: true}
			for i := range s.Hashes {
				s.Hashes[i] = rng.Uint64()
			}
			tr := NewTree(16)
			for b.Loop() {
				if tr.selfReferencing(&s) {
					b.Fatal("distinct hashes found self-referencing")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/hash")
		})
	}
}
