// Package quantile owns the one quantile formula of the simulation's and
// the benchmarks' reports: nearest rank, over a sorted copy of the
// samples (Of, then Samples.At).
package quantile
