package etcdstore_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestEmbeddedPicksAgain: a port StartEmbedded picked as free but that
// another socket took before etcd could bind it is picked again (tests
// that start servers in parallel race for ports so); a port given in the
// config that is in use fails at once.
func TestEmbeddedPicksAgain(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenURL := "http://" + taken.Addr().String()
	picks := 0
	pick := func() (string, error) {
		picks++
		if picks == 1 {
			return takenURL, nil // free when picked, taken since
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer l.Close()
		return "http://" + l.Addr().String(), nil
	}
	ctx, cancel := testsupport.Context(t)
	defer cancel()
	e, err := etcdstore.StartEmbeddedPicking(ctx, etcdstore.EmbeddedConfig{Dir: t.TempDir(), UnsafeNoFsync: true}, pick)
	if err != nil {
		t.Fatalf("StartEmbedded with its first pick taken: %v", err)
	}
	defer e.Close()
	// Two picks (client, peer), the client's taken, then two more.
	if got := e.Endpoints()[0]; got == takenURL || picks != 4 {
		t.Fatalf("serving on %s after %d picks; want another port than the taken %s, after 4 picks", got, picks, takenURL)
	}

	picks = 1 // no more taken picks
	_, err = etcdstore.StartEmbeddedPicking(ctx, etcdstore.EmbeddedConfig{Dir: t.TempDir(), ClientURL: takenURL, UnsafeNoFsync: true}, pick)
	if !errors.Is(err, syscall.EADDRINUSE) || picks != 2 {
		t.Fatalf("StartEmbedded on a given client URL in use: %v after %d picks; want EADDRINUSE at once (the peer's one pick)", err, picks)
	}
}
