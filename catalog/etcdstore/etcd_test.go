package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

var prefixes atomic.Int64

func uniquePrefix() string { return fmt.Sprintf("/etcdtest/%d", prefixes.Add(1)) }

// changes is a Watcher consumer for tests.
type changes chan catalog.Change

func (c changes) config() catalog.WatcherConfig {
	return catalog.WatcherConfig{
		OnChange: func(ch catalog.Change) { c <- ch },
		RetryMin: 10 * time.Millisecond,
		RetryMax: 500 * time.Millisecond,
	}
}

// expect reads len(want) changes within timeout and compares them.
func (c changes) expect(t *testing.T, timeout time.Duration, want ...string) {
	t.Helper()
	var got []string
	deadline := time.After(timeout)
	for len(got) < len(want) {
		select {
		case ch := <-c:
			got = append(got, storetest.ChangeString(ch))
		case <-deadline:
			t.Fatalf("changes %q, then nothing for %v; want %q", got, timeout, want)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("changes %q, want %q", got, want)
	}
}

// startWatcher runs a Watcher until the test ends; it waits for Synced.
func startWatcher(t *testing.T, src catalog.WatchSource, c changes) *catalog.Watcher {
	t.Helper()
	return startWatcherLog(t, src, c, nil)
}

// startWatcherLog is startWatcher logging to log (nil: the default).
func startWatcherLog(t *testing.T, src catalog.WatchSource, c changes, log *slog.Logger) *catalog.Watcher {
	t.Helper()
	cfg := c.config()
	cfg.Logger = log
	w := catalog.NewWatcher(src, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Watcher.Run = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Watcher.Run did not return 10s after its context ended")
		}
	})
	select {
	case <-w.Synced():
	case <-time.After(15 * time.Second):
		t.Fatal("watcher not synced within 15s")
	}
	return w
}

// startSession runs a Session's Run; the returned func ends it (without
// Close) and waits for it.
func startSession(t *testing.T, s *catalog.Session) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Session.Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Session.Run did not return 10s after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestEtcdSessionKeepsAlive: a 2 s lease stays alive across many renewals.
func TestEtcdSessionKeepsAlive(t *testing.T) {
	t.Parallel()
	e := sharedEtcd(t)
	store := storetest.NewEtcdStore(t, e.Endpoints(), uniquePrefix())
	ctx := context.Background()
	renewals := make(chan catalog.LeaseID, 100)
	sess, err := catalog.Register(ctx, store, storetest.Worker("m", "g", 1), 2*time.Second,
		catalog.OnRenewal(func(id catalog.LeaseID) { renewals <- id }))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	startSession(t, sess)
	start := time.Now()
	for i := range 5 { // about 3.3 s: longer than the TTL
		select {
		case id := <-renewals:
			if id != sess.Lease() {
				t.Fatalf("renewed lease %x, session holds %x", id, sess.Lease())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("renewal %d did not come", i)
		}
	}
	if _, err := store.Get(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 1}); err != nil {
		t.Fatalf("record gone after %v of renewals: %v", time.Since(start), err)
	}
	select {
	case <-sess.Done():
		t.Fatal("Done closed while the lease is renewed")
	default:
	}
}

// TestEtcdLeaseExpiryRemovesWorker: a registrant that stops renewing
// without revoking (a crashed sidecar) is removed within TTL + 2 s.
func TestEtcdLeaseExpiryRemovesWorker(t *testing.T) {
	t.Parallel()
	e := sharedEtcd(t)
	prefix := uniquePrefix()
	watched := storetest.NewEtcdStore(t, e.Endpoints(), prefix)
	sidecar := storetest.NewEtcdStore(t, e.Endpoints(), prefix) // its own client, like a separate process
	c := make(changes, 100)
	startWatcher(t, watched, c)
	const ttl = 2 * time.Second
	sess, err := catalog.Register(context.Background(), sidecar, storetest.Worker("m", "g", 5), ttl)
	if err != nil {
		t.Fatal(err)
	}
	stop := startSession(t, sess)
	c.expect(t, 10*time.Second, "added m/g/5")
	stop() // keep-alives stop; the lease is not revoked
	crashed := time.Now()
	c.expect(t, ttl+2*time.Second, "removed m/g/5")
	t.Logf("worker removed %v after its registrant stopped (TTL %v)", time.Since(crashed).Round(time.Millisecond), ttl)
}

// TestEtcdRestartDuringWatch stops etcd under a watcher and a session and
// starts it again on the same data dir and URL: the watcher reconnects
// (listing again, or resuming its watch) and reports only what changed; the session, whose lease
// went unrenewed past its TTL, registers again with a new lease, which the
// watcher logs (the record is the same: no change is delivered).
func TestEtcdRestartDuringWatch(t *testing.T) {
	t.Parallel()
	e1 := storetest.StartEtcd(t)
	cfg := e1.Config()
	prefix := uniquePrefix()
	daemon := storetest.NewEtcdStore(t, e1.Endpoints(), prefix)
	sidecar := storetest.NewEtcdStore(t, e1.Endpoints(), prefix)
	operator := storetest.NewEtcdStore(t, e1.Endpoints(), prefix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, id := range []uint64{2, 3} {
		if _, err := operator.Put(ctx, storetest.Worker("m", "g", id), catalog.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = 3 * time.Second
	w1 := storetest.Worker("m", "g", 1)
	sess, err := catalog.Register(ctx, sidecar, w1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	startSession(t, sess)
	c := make(changes, 100)
	logs, log := testlog.New(nil)
	watcher := startWatcherLog(t, daemon, c, log)
	c.expect(t, 10*time.Second, "added m/g/1", "added m/g/2", "added m/g/3")
	oldLease, lost := sess.Lease(), sess.Done()

	stopped := time.Now()
	e1.Close()
	select {
	case <-lost:
		t.Logf("session lost its lease %v after etcd stopped", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("session did not report its lease lost while etcd was down")
	}

	restarted := time.Now()
	e2, err := etcdstore.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("restart etcd on %s: %v", cfg.ClientURL, err)
	}
	defer e2.Close()
	t.Logf("etcd restarted on the same dir and %s in %v (down %v)", cfg.ClientURL, time.Since(restarted).Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))

	// What really changes meanwhile: worker 2 leaves, worker 4 arrives.
	if _, err := operator.Delete(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 4), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 15*time.Second, "removed m/g/2", "added m/g/4")

	testsupport.Eventually(t, 15*time.Second, "the session to register again", func() bool {
		return sess.Lease() != oldLease
	})
	got, err := operator.Get(ctx, w1.Key())
	if err != nil || !got.Equal(w1) {
		t.Fatalf("worker 1 after re-registration: %+v, %v", got, err)
	}
	snap, err := operator.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range snap.Records {
		if r.Key == w1.Key() && r.Lease != sess.Lease() {
			t.Fatalf("worker 1 is held by lease %x, the session's is %x", r.Lease, sess.Lease())
		}
	}
	// Nothing else was delivered: the next change is the marker.
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 99), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 10*time.Second, "added m/g/99")
	logs.Wait(t, 10*time.Second, "catalog: worker registered again under a new lease", "worker=1",
		fmt.Sprintf("registration=lease %x", int64(sess.Lease())), fmt.Sprintf("was=lease %x", int64(oldLease)))
	// The watcher lists again when it sees the connection drop; the etcd
	// client may also resume the watch by itself from the same revision on
	// the same data before the drop is seen (Resyncs 0), which delivers the
	// same changes. Never more than one resync.
	st := watcher.Stats()
	t.Logf("watcher stats %+v", st)
	if st.Resyncs > 1 || st.Workers != 4 {
		t.Fatalf("watcher stats %+v, want at most one resync and 4 workers", st)
	}
}

// TestEtcdWipedRestartDuringWatch: etcd comes back on the same URL with
// no data (a new cluster whose revisions start over). A resumed watch
// would wait silently for revisions the new cluster reaches only much
// later; the watcher must list again, report the loss and what the new
// cluster holds, and log the resync with what it changed.
func TestEtcdWipedRestartDuringWatch(t *testing.T) {
	t.Parallel()
	e1 := storetest.StartEtcd(t)
	cfg := e1.Config()
	prefix := uniquePrefix()
	daemon := storetest.NewEtcdStore(t, e1.Endpoints(), prefix)
	operator := storetest.NewEtcdStore(t, e1.Endpoints(), prefix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range []uint64{1, 2, 3, 4} {
		if _, err := operator.Put(ctx, storetest.Worker("m", "g", id), catalog.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	c := make(changes, 100)
	logs, log := testlog.New(nil)
	watcher := startWatcherLog(t, daemon, c, log)
	c.expect(t, 10*time.Second, "added m/g/1", "added m/g/2", "added m/g/3", "added m/g/4")

	e1.Close()
	cfg.Dir = t.TempDir()
	e2, err := etcdstore.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatalf("start an empty etcd on %s: %v", cfg.ClientURL, err)
	}
	defer e2.Close()
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 9), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 15*time.Second, "removed m/g/1", "removed m/g/2", "removed m/g/3", "removed m/g/4", "added m/g/9")
	if st := watcher.Stats(); st.Resyncs < 1 || st.Workers != 1 {
		t.Fatalf("watcher stats %+v, want a resync and 1 worker", st)
	}
	// The list that found the loss (worker 9 may come with it, or by the
	// watch after it).
	rec := logs.Wait(t, 10*time.Second, "catalog: resynced: listed the workers again", "resyncs=1", "removed=4", "updated=0")
	if a := rec.Attrs["added"]; a != "0" && a != "1" {
		t.Errorf("resync line %v: want added 0 or 1", rec)
	}
}

// TestEtcdWatcherStopsWhileDown: cancelling a Watcher whose etcd is gone
// returns promptly.
func TestEtcdWatcherStopsWhileDown(t *testing.T) {
	t.Parallel()
	e := storetest.StartEtcd(t)
	store := storetest.NewEtcdStore(t, e.Endpoints(), uniquePrefix())
	w := catalog.NewWatcher(store, changes(make(chan catalog.Change, 10)).config())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-w.Synced():
	case <-time.After(15 * time.Second):
		t.Fatal("not synced")
	}
	e.Close()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel while etcd is down")
	}
}

// TestEtcdAuth turns etcd authentication on and off: with it on, a
// client with the root credentials works, one without credentials or
// with a wrong password fails at connect with an error that says so.
func TestEtcdAuth(t *testing.T) {
	t.Parallel()
	e := storetest.StartEtcd(t)
	ctx, cancel := testsupport.Context(t)
	defer cancel()
	prefix := uniquePrefix()

	// Off: no credentials needed.
	open := storetest.NewEtcdStore(t, e.Endpoints(), prefix)
	if _, err := open.Put(ctx, storetest.Worker("m", "g", 1), catalog.NoLease); err != nil {
		t.Fatal(err)
	}

	admin, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}

	// Connecting with credentials authenticates: etcd checks the password
	// with bcrypt (cost 10), seconds under the race detector on a loaded
	// machine, so the dial budget is generous here.
	cfg := etcdstore.Config{Endpoints: e.Endpoints(), Prefix: prefix, Username: "root", Password: "s3cret", DialTimeout: 30 * time.Second}
	authed, err := etcdstore.New(ctx, cfg)
	if err != nil {
		t.Fatalf("with credentials: %v", err)
	}
	defer authed.Close()
	c := make(changes, 10)
	startWatcher(t, authed, c)
	c.expect(t, 10*time.Second, "added m/g/1")
	sess, err := catalog.Register(ctx, authed, storetest.Worker("m", "g", 2), 5*time.Second)
	if err != nil {
		t.Fatalf("register with credentials: %v", err)
	}
	c.expect(t, 10*time.Second, "added m/g/2")
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 10*time.Second, "removed m/g/2")

	noCreds := cfg
	noCreds.Username, noCreds.Password = "", ""
	_, err = etcdstore.New(ctx, noCreds)
	if err == nil || !strings.Contains(err.Error(), "requires authentication; set a username and password") {
		t.Fatalf("without credentials: %v, want an error asking for credentials", err)
	}
	t.Logf("without credentials: %v", err)
	wrong := cfg
	wrong.Password = "nope"
	_, err = etcdstore.New(ctx, wrong)
	if err == nil || !strings.Contains(err.Error(), `authentication failed for user "root"`) {
		t.Fatalf("with a wrong password: %v, want an authentication failure", err)
	}
	t.Logf("wrong password: %v", err)
	// The store opened before auth was enabled has no token now.
	if _, err := open.Put(ctx, storetest.Worker("m", "g", 3), catalog.NoLease); err == nil {
		t.Fatal("a client without credentials wrote while auth is on")
	}

	// Off again.
	if _, err := authed.Delete(ctx, catalog.Key{Model: "m", Group: "g", WorkerID: 1}); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 10*time.Second, "removed m/g/1")
	root, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 30 * time.Second, Username: "root", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.AuthDisable(ctx); err != nil {
		t.Fatalf("auth disable: %v", err)
	}
	again, err := etcdstore.New(ctx, noCreds)
	if err != nil {
		t.Fatalf("without credentials after auth is off: %v", err)
	}
	defer again.Close()
	if _, err := again.Put(ctx, storetest.Worker("m", "g", 4), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 10*time.Second, "added m/g/4")
}
