package catalog_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Testable {
		s := storetest.NewMemoryStore("")
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// flakyRenewals is a Registrar whose lease renewals fail while fail is
// set, as when etcd is unreachable for longer than a TTL; everything else
// passes through, so the lease itself stays valid.
type flakyRenewals struct {
	catalog.Registrar
	fail atomic.Bool
}

func (f *flakyRenewals) KeepAliveOnce(ctx context.Context, id catalog.LeaseID) (time.Duration, error) {
	if f.fail.Load() {
		return 0, errors.New("etcd unreachable")
	}
	return f.Registrar.KeepAliveOnce(ctx, id)
}

// TestSessionUpdateWhileLeaseLost runs Update in a loop while Run gives
// up on a lease it could not renew: Run must read the record under the
// lock Update writes it under (the race detector fails this test
// otherwise).
func TestSessionUpdateWhileLeaseLost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := storetest.NewMemoryStore("")
	defer s.Close()
	reg := &flakyRenewals{Registrar: s}
	w := storetest.Worker("m", "g", 1)
	sess, err := catalog.Register(ctx, reg, w, time.Second) // renewed every third of a second
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sess.Run(ctx) }()
	stop := make(chan struct{})
	updated := make(chan int)
	go func() {
		n := 0
		defer func() { updated <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			u := w
			u.Lifecycle = []catalog.Lifecycle{catalog.LifecycleActive, catalog.LifecycleDraining}[i%2]
			if sess.Update(ctx, u) == nil {
				n++
			}
		}
	}()
	for range 5 {
		lease := sess.Lease()
		reg.fail.Store(true)
		testsupport.Eventually(t, 10*time.Second, "registered again after failed renewals", func() bool { return sess.Lease() != lease })
		reg.fail.Store(false)
	}
	close(stop)
	if n := <-updated; n == 0 {
		t.Fatal("no Update succeeded")
	}
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
