package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// blackhole is a TCP proxy that can stop forwarding without closing
// anything, as a network partition does: connections stay open (no RST,
// no FIN), bytes just stop arriving.
type blackhole struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	paused  bool // both ways
	replies bool // from the target only: requests arrive, answers do not
	conns   []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	b.cond = sync.NewCond(&b.mu)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		b.set(false)
		b.holdReplies(false)
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, in, out)
			b.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); b.pipe(out, in, false) }()
			go func() { defer wg.Done(); b.pipe(in, out, true) }()
		}
	}()
	return b
}

// pipe copies src to dst, holding each chunk while paused (or, for the
// target's replies, while replies are).
func (b *blackhole) pipe(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.mu.Lock()
			for b.paused || (replies && b.replies) {
				b.cond.Wait()
			}
			b.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (b *blackhole) set(paused bool) {
	b.mu.Lock()
	b.paused = paused
	b.mu.Unlock()
	b.cond.Broadcast()
}

// holdReplies holds (or releases) what the target sends, and only that.
func (b *blackhole) holdReplies(hold bool) {
	b.mu.Lock()
	b.replies = hold
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *blackhole) endpoint() string { return "http://" + b.ln.Addr().String() }

// TestEtcdPartitionDuringWatch: a partition that keeps the client's
// connection open (so its state stays READY and the etcd client resumes
// the same watch afterwards) is still noticed: the watch's header reads
// fail during it and succeed after, and the watcher lists again and diffs.
// Without the header check this test sees no resync.
func TestEtcdPartitionDuringWatch(t *testing.T) {
	t.Parallel()
	e := storetest.StartEtcd(t)
	u, err := url.Parse(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy := newBlackhole(t, u.Host)
	prefix := uniquePrefix()
	daemon := storetest.NewEtcdStore(t, []string{proxy.endpoint()}, prefix)
	etcdstore.SetWatchCheck(daemon.Store, 200*time.Millisecond)
	operator := storetest.NewEtcdStore(t, e.Endpoints(), prefix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 1), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c := make(changes, 100)
	watcher := startWatcher(t, daemon, c)
	c.expect(t, 10*time.Second, "added m/g/1")
	// A change after the list arrives through the watch: the watch (and
	// its header check) is running before the partition.
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 2), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	c.expect(t, 10*time.Second, "added m/g/2")

	proxy.set(true)
	if _, err := operator.Put(ctx, storetest.Worker("m", "g", 3), catalog.NoLease); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, "a failed header read", func() bool { return etcdstore.WatchCheckFailures(daemon.Store) > 0 })
	if st := watcher.Stats(); st.Resyncs != 0 {
		t.Fatalf("resynced during the partition: %+v", st)
	}
	proxy.set(false)
	c.expect(t, 10*time.Second, "added m/g/3")
	testsupport.Eventually(t, 10*time.Second, "a resync after the partition", func() bool { return watcher.Stats().Resyncs >= 1 })
	if st := watcher.Stats(); st.Workers != 3 {
		t.Fatalf("watcher stats %+v, want 3 workers", st)
	}
}

// TestEtcdWriteDeadlineDuringPartition: while a partition holds every
// byte between the store and etcd, registrations and unregistrations
// with a deadline end at it with an error that says etcd did not answer
// (catalog.ErrUnavailable), instead of waiting for the partition to heal;
// none of them wrote anything (each waited for its read). A write whose
// transaction reached etcd but whose answer was lost fails the same way,
// and lands whole: afterwards every record has its id claim and every
// claim its record.
func TestEtcdWriteDeadlineDuringPartition(t *testing.T) {
	e := storetest.StartEtcd(t)
	u, err := url.Parse(e.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy := newBlackhole(t, u.Host)
	prefix := uniquePrefix()
	daemon := storetest.NewEtcdStore(t, []string{proxy.endpoint()}, prefix)
	raw, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := func(id uint64) catalog.Registration {
		return catalog.Registration{Key: catalog.Key{Model: "m", Group: "g", WorkerID: id}, BlockSize: 16,
			EventsEndpoint: fmt.Sprintf("tcp://10.0.0.1:%d", 20000+id)}
	}
	const before = 20
	for id := range uint64(before) {
		if err := catalog.RegisterRanks(ctx, daemon, reg(id)); err != nil {
			t.Fatal(err)
		}
	}

	proxy.set(true)
	const deadline, margin = 500 * time.Millisecond, 2 * time.Second
	var wg sync.WaitGroup
	errs := make(chan error, 2*before)
	for id := range uint64(before) {
		for _, write := range []func(context.Context) error{
			func(ctx context.Context) error { return catalog.RegisterRanks(ctx, daemon, reg(100+id)) },
			func(ctx context.Context) error { return catalog.UnregisterRanks(ctx, daemon, "m", "g", id, nil) },
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				start := time.Now()
				err := write(wctx)
				if took := time.Since(start); took > deadline+margin {
					err = fmt.Errorf("answered after %v: %w", took, err)
				}
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, catalog.ErrUnavailable) || !strings.HasPrefix(err.Error(), "catalog: etcd unreachable: ") ||
			!strings.Contains(err.Error(), "no answer from "+proxy.endpoint()+" in time") {
			t.Fatalf("a write during the partition: %v; want catalog: etcd unreachable … within %v", err, deadline+margin)
		}
	}

	// A write whose answer is lost: its transaction reaches etcd (after
	// the read, the update function holds etcd's replies), the store's
	// does not.
	proxy.set(false)
	cut := catalog.Key{Model: "m", Group: "g", WorkerID: 500}
	var once sync.Once
	wctx, wcancel := context.WithTimeout(ctx, deadline)
	_, err = daemon.Update(wctx, cut, func(w *catalog.Worker, _ catalog.Current) error {
		once.Do(func() { proxy.holdReplies(true) })
		w.BlockSize, w.EventsEndpoint, w.DataParallelSize = 16, "tcp://10.0.0.1:20500", 1
		*w = w.WithDefaults()
		return nil
	})
	wcancel()
	if !errors.Is(err, catalog.ErrUnavailable) {
		t.Fatalf("a commit whose answer is held: %v; want catalog.ErrUnavailable", err)
	}
	testsupport.Eventually(t, 10*time.Second, "the unanswered commit applied by etcd", func() bool {
		resp, err := raw.Get(ctx, cut.Path(prefix))
		return err == nil && len(resp.Kvs) == 1
	})

	proxy.holdReplies(false)
	// The next write goes over the same connection, after every byte the
	// partition held: once it lands, so has whatever of theirs etcd took.
	if err := catalog.RegisterRanks(ctx, daemon, reg(999)); err != nil {
		t.Fatalf("a write after the partition: %v", err)
	}
	resp, err := raw.Get(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	kvs := map[string]string{}
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = string(kv.Value)
	}
	records := 0
	for k, v := range kvs {
		if key, err := catalog.ParseKey(prefix, k); err == nil {
			records++
			if claim := catalog.IDClaimPath(prefix, key.WorkerID); kvs[claim] != k {
				t.Errorf("record %s without its claim (%s = %q)", k, claim, kvs[claim])
			}
		} else if _, ok := kvs[v]; !ok {
			t.Errorf("claim %s names %s, which does not exist", k, v)
		}
	}
	if records != before+2 {
		t.Errorf("%d records; want the %d before (none of the writes cut while etcd heard nothing landed), the unanswered one and the one after", records, before)
	}
}
