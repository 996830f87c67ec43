package quantile

import (
	"cmp"
	"math"
	"slices"
)

// Samples is a sorted copy of a set of samples, made by Of. The zero value
// holds none. It is read-only, so safe for concurrent use.
type Samples[T cmp.Ordered] struct {
	sorted []T
}

// Of returns a sorted copy of samples. It does not change samples or keep
// it, so the caller may go on using it in its own order.
func Of[T cmp.Ordered](samples []T) Samples[T] {
	s := slices.Clone(samples)
	slices.Sort(s)
	return Samples[T]{sorted: s}
}

// Len is the number of samples.
func (s Samples[T]) Len() int { return len(s.sorted) }

// At returns the p-quantile by nearest rank: the ⌈p·n⌉-th smallest of the
// n samples, the smallest sample that at least a share p of them do not
// exceed. It is always one of the samples, never an interpolation. p is
// clamped to [0, 1] (NaN counts as 0): At(0) is the smallest sample, At(1)
// the largest. With no samples it returns the zero value.
//
// Nearest rank is right for the p99 of a small sample: of 100 samples it
// is the 99th smallest, leaving out only the slowest one, where the index
// ⌊p·n⌋ gives the 100th, the maximum, and so reports one outlier as the
// p99; below 100 samples it is the maximum, as no sample is 1 % of them
// or less.
func (s Samples[T]) At(p float64) T {
	n := len(s.sorted)
	if n == 0 {
		var zero T
		return zero
	}
	if !(p > 0) {
		return s.sorted[0]
	}
	if p >= 1 {
		return s.sorted[n-1]
	}
	// p·n is rounded down by a part in 10¹² first, so that a p·n meant as
	// a whole number and computed a little above it (0.07·100 is
	// 7.000000000000001) does not take the next rank.
	k := int(math.Ceil(p * float64(n) * (1 - 1e-12)))
	return s.sorted[min(max(k, 1), n)-1]
}
