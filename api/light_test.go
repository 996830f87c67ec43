package api

import (
	"testing"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
)

// TestLight keeps etcd and ZMQ out of api's dependencies
// (importcheck.Light).
func TestLight(t *testing.T) {
	importcheck.Light(t, "github.com/prefixd/prefixd/api")
}
