package etcdstore_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

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

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	conns  []net.Conn
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
			go func() { defer wg.Done(); b.pipe(out, in) }()
			go func() { defer wg.Done(); b.pipe(in, out) }()
		}
	}()
	return b
}

// pipe copies src to dst, holding each chunk while paused.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.mu.Lock()
			for b.paused {
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
