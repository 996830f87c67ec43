package etcdstore_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func TestEtcdStoreConformance(t *testing.T) {
	t.Parallel()
	e := sharedEtcd(t)
	storetest.Run(t, func(t *testing.T) storetest.Testable {
		// A fresh prefix per subtest on one server.
		return storetest.NewEtcdStore(t, e.Endpoints(), uniquePrefix()+"/prefixd/v1")
	})
}

// shared is one embedded etcd for the tests that neither restart it nor
// turn auth on; each uses its own key prefix. It starts on first use and
// stops in TestMain.
var shared struct {
	once sync.Once
	dir  string
	e    *etcdstore.Embedded
	err  error
}

func sharedEtcd(t *testing.T) *etcdstore.Embedded {
	t.Helper()
	shared.once.Do(func() {
		start := time.Now()
		if shared.dir, shared.err = os.MkdirTemp("", "catalog-etcd-"); shared.err != nil {
			return
		}
		ctx, cancel := testsupport.Context(t)
		defer cancel()
		shared.e, shared.err = etcdstore.StartEmbedded(ctx, etcdstore.EmbeddedConfig{Dir: shared.dir, UnsafeNoFsync: true})
		t.Logf("shared embedded etcd started in %v", time.Since(start).Round(time.Millisecond))
	})
	if shared.err != nil {
		t.Fatalf("shared embedded etcd: %v", shared.err)
	}
	return shared.e
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.e != nil {
		shared.e.Close()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}
