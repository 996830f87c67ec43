package workload

import "math/bits"

// rng is SplitMix64: small, fast, and fixed, so a seed gives the same
// workload on every platform and Go version (math/rand makes no such
// promise for its helpers).
type rng struct{ s uint64 }

func newRNG(seed uint64) *rng { return &rng{s: mix64(seed)} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// mix64 is the SplitMix64 finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n) (n > 0), by multiply-shift.
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

// between returns a number in [lo, hi].
func (r *rng) between(lo, hi int) int { return lo + r.intn(hi-lo+1) }

// float returns a number in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// tokens appends n token ids below vocab to dst.
func (r *rng) tokens(dst []uint32, n, vocab int) []uint32 {
	for range n {
		dst = append(dst, uint32(r.intn(vocab)))
	}
	return dst
}
