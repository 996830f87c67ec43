package catalog

import (
	"testing"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
)

// TestLight keeps etcd and ZMQ out of catalog's dependencies
// (importcheck.Light).
func TestLight(t *testing.T) {
	t.Parallel()
	importcheck.Light(t, "github.com/prefixd/prefixd/catalog")
}
