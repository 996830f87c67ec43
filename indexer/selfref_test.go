package indexer

import (
	"math/rand/v2"
	"testing"
)

// selfReferencingQuadratic is the definition: a hash equal to an earlier
// one, or to the parent.
func selfReferencingQuadratic(s Stored) bool {
	for i, h := range s.Hashes {
		if s.HasParent && h == s.Parent {
			return true
		}
		for _, g := range s.Hashes[:i] {
			if g == h {
				return true
			}
		}
	}
	return false
}

// randomStored returns an event of up to 600 hashes with, at random, a
// planted repeat: of an earlier hash, of the parent, of the hash 0 (and
// events holding 0 once, or with parent 0).
func randomStored(rng *rand.Rand) Stored {
	n := rng.IntN(600)
	if rng.IntN(4) == 0 {
		n = rng.IntN(40) // around the pairwise cutoff
	}
	s := Stored{Hashes: make([]uint64, n), HasParent: rng.IntN(3) > 0, Parent: rng.Uint64()}
	small := rng.IntN(5) == 0 // hashes from a small space: natural repeats
	for i := range s.Hashes {
		s.Hashes[i] = rng.Uint64()
		if small {
			s.Hashes[i] = rng.Uint64N(uint64(4 * n))
		}
	}
	if n == 0 {
		return s
	}
	switch rng.IntN(8) {
	case 0: // a repeat of an earlier hash
		i, j := rng.IntN(n), rng.IntN(n)
		s.Hashes[i] = s.Hashes[j]
	case 1: // the parent among the hashes
		s.Hashes[rng.IntN(n)] = s.Parent
	case 2: // 0 once, and maybe the parent 0
		s.Hashes[rng.IntN(n)] = 0
		if rng.IntN(2) == 0 {
			s.Parent = 0
		}
	case 3: // 0 twice (or once, if i == j)
		s.Hashes[rng.IntN(n)], s.Hashes[rng.IntN(n)] = 0, 0
	case 4: // the parent 0 and no 0 among the hashes
		s.Parent = 0
	}
	return s
}

// TestSelfReferencingMatchesQuadratic compares selfReferencing with the
// definition on random events with planted repeats, also with the hash
// set's probes cut to 0 and 1 slot (the set then gives up on most events
// and the sort decides).
func TestSelfReferencingMatchesQuadratic(t *testing.T) {
	defer func(p int) { repeatsMaxProbe = p }(repeatsMaxProbe)
	tr := NewTree(16)
	for _, probe := range []int{repeatsMaxProbe, 0, 1} {
		repeatsMaxProbe = probe
		rng := rand.New(rand.NewPCG(uint64(probe), 7))
		dups := 0
		for i := range 4000 {
			s := randomStored(rng)
			want := selfReferencingQuadratic(s)
			if got := tr.selfReferencing(&s); got != want {
				t.Fatalf("probe %d, event %d: selfReferencing = %v, want %v (%d hashes, parent %#x %v, hashes %#x)",
					probe, i, got, want, len(s.Hashes), s.Parent, s.HasParent, s.Hashes)
			}
			if want {
				dups++
			}
		}
		if dups < 1000 || dups > 3000 {
			t.Fatalf("probe %d: %d of 4000 events self-referencing: the planting is off", probe, dups)
		}
	}
}

// TestRepeatsSpreadsCraftedHashes feeds the hash set hashes a fixed
// multiplicative hash would pile up — small integers, multiples of large
// powers of two, hashes equal in their low or high 32 bits — and checks
// that it never gives up (no probe past repeatsMaxProbe) and answers as
// the definition does.
func TestRepeatsSpreadsCraftedHashes(t *testing.T) {
	tr := NewTree(16)
	for _, c := range []struct {
		name string
		hash func(i uint64) uint64
	}{
		{"small", func(i uint64) uint64 { return i + 1 }},
		{"shifted-48", func(i uint64) uint64 { return (i + 1) << 48 }},
		{"shifted-32", func(i uint64) uint64 { return (i + 1) << 32 }},
		{"low-equal", func(i uint64) uint64 { return (i+1)<<32 | 0xdeadbeef }},
		{"high-equal", func(i uint64) uint64 { return 0xdeadbeef<<32 | (i + 1) }},
		{"golden", func(i uint64) uint64 { return (i + 1) * 0x9e3779b97f4a7c15 }},
	} {
		for _, n := range []int{17, 64, 512, 4096} {
			hs := make([]uint64, n)
			for i := range hs {
				hs[i] = c.hash(uint64(i))
			}
			for rep := range 50 {
				dup, ok := tr.repeats(hs, c.hash(uint64(n)), true, repeatsMaxProbe)
				if !ok || dup {
					t.Fatalf("%s, %d hashes, call %d: repeats = %v, %v; want false, true", c.name, n, rep, dup, ok)
				}
			}
			hs[n-1] = hs[n/2]
			if dup, ok := tr.repeats(hs, 1, false, repeatsMaxProbe); !ok || !dup {
				t.Fatalf("%s, %d hashes with a repeat: repeats = %v, %v; want true, true", c.name, n, dup, ok)
			}
		}
	}
}
