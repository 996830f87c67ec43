package quantile

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestAt: nearest rank at the edges (no samples, one, p = 0 and 1, p out
// of range) and in between, on unsorted input.
func TestAt(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100 … 1: unsorted
	}
	twoHundred := make([]int, 200)
	for i := range twoHundred {
		twoHundred[i] = (i*7)%200 + 1 // 1 … 200, shuffled
	}
	for _, tc := range []struct {
		name    string
		samples []int
		p       float64
		want    int
	}{
		{"empty", nil, 0.5, 0},
		{"empty p=1", []int{}, 1, 0},
		{"one p=0", []int{7}, 0, 7},
		{"one p=0.5", []int{7}, 0.5, 7},
		{"one p=0.99", []int{7}, 0.99, 7},
		{"one p=1", []int{7}, 1, 7},
		{"p=0 is the smallest", []int{3, 1, 2}, 0, 1},
		{"p=1 is the largest", []int{3, 1, 2}, 1, 3},
		{"p below 0 is clamped", []int{3, 1, 2}, -0.5, 1},
		{"p above 1 is clamped", []int{3, 1, 2}, 7, 3},
		{"NaN counts as 0", []int{3, 1, 2}, math.NaN(), 1},
		{"median of odd n", []int{5, 1, 4, 2, 3}, 0.5, 3},
		{"median of even n is the lower", []int{4, 3, 2, 1}, 0.5, 2},
		{"just above a rank takes the next", []int{4, 3, 2, 1}, 0.51, 3},
		{"ties", []int{2, 2, 1, 2}, 0.5, 2},
		{"p99 of 100 leaves out the largest", hundred, 0.99, 99},
		{"p99 of 200 leaves out the two largest", twoHundred, 0.99, 198},
		{"p99 of 50 is the largest", hundred[50:], 0.99, 50},
		{"p7 of 100: 0.07·100 computes above 7", hundred, 0.07, 7},
		{"p50 of 100", hundred, 0.5, 50},
		{"p90 of 100", hundred, 0.9, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.samples)
			s := Of(tc.samples)
			if got := s.At(tc.p); got != tc.want {
				t.Errorf("Of(%v).At(%v) = %v, want %v", tc.samples, tc.p, got, tc.want)
			}
			if s.Len() != len(tc.samples) {
				t.Errorf("Len() = %d, want %d", s.Len(), len(tc.samples))
			}
			if !slices.Equal(tc.samples, before) {
				t.Errorf("Of changed its input: %v, was %v", tc.samples, before)
			}
		})
	}
}

// TestZero: the zero Samples holds none.
func TestZero(t *testing.T) {
	var s Samples[time.Duration]
	if s.Len() != 0 || s.At(0.99) != 0 {
		t.Fatalf("zero Samples: Len %d, At(0.99) %v; want 0, 0", s.Len(), s.At(0.99))
	}
}

// TestAtWholePercents checks At against the definition in whole numbers,
// ⌈k·n/100⌉-th smallest, for every percent k and n up to 300, on
// durations and floats: no p·n computed a little above a whole number
// takes the next rank.
func TestAtWholePercents(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 300; n++ {
		d := make([]time.Duration, n)
		f := make([]float64, n)
		for i := range d {
			d[i] = time.Duration(r.IntN(1000))
			f[i] = r.Float64()
		}
		ds, fs := Of(d), Of(f)
		sd, sf := slices.Sorted(slices.Values(d)), slices.Sorted(slices.Values(f))
		for k := 0; k <= 100; k++ {
			rank := max((k*n+99)/100, 1)
			p := float64(k) / 100
			if got, want := ds.At(p), sd[rank-1]; got != want {
				t.Fatalf("n %d, p %v: durations %v, want rank %d, %v", n, p, got, rank, want)
			}
			if got, want := fs.At(p), sf[rank-1]; got != want {
				t.Fatalf("n %d, p %v: floats %v, want rank %d, %v", n, p, got, rank, want)
			}
		}
	}
}
