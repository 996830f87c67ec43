package wire_test

import (
	"testing"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
)

// TestNoIOImports enforces that the codec does no I/O: nothing it imports,
// directly or not, may reach ZMQ, etcd, net/http, Prometheus or net.
func TestNoIOImports(t *testing.T) {
	importcheck.Forbidden(t, "github.com/prefixd/prefixd/events/wire")
}
