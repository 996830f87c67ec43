package client

import (
	"testing"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
)

// TestLight keeps what a router must not link out of client's dependencies:
// etcd, ZMQ, Prometheus and the daemon's own packages
// (importcheck.ForRouters).
func TestLight(t *testing.T) {
	importcheck.ForRouters(t, "github.com/prefixd/prefixd/client")
}
