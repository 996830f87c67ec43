package main

import (
	"testing"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
)

// TestBinaryShipsNoTestSupport: the prefixd binary links no fake store,
// test harness or package testing — the layout says what is test support,
// and this keeps it out of what ships.
func TestBinaryShipsNoTestSupport(t *testing.T) {
	importcheck.NoTestSupport(t, "github.com/prefixd/prefixd/cmd/prefixd")
}

// TestBinaryShipsNoLab: the prefixd binary (and so the image) links none
// of the benchmark lab — gonum/plot, its fonts, the embedded trace, the
// routing and index benchmarks, the index demo. They are cmd/prefixd-bench.
func TestBinaryShipsNoLab(t *testing.T) {
	importcheck.NoLab(t, "github.com/prefixd/prefixd/cmd/prefixd")
}
