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
