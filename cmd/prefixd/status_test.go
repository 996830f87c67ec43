package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/etcdstore"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/events/stream"
	"github.com/prefixd/prefixd/internal/daemon"
	"github.com/prefixd/prefixd/internal/sim/mocker"
	"github.com/prefixd/prefixd/internal/status"
	"github.com/prefixd/prefixd/internal/testsupport"
)

func TestStatusRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--json"}, "--json needs --once"},
		{[]string{"status", "--interval", "0s"}, "--interval"},
		{[]string{"status", "--once", "--timeout", "-1s"}, "--timeout"},
		{[]string{"status", "extra"}, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestStatusUnreachable: --once fails, naming the server, when nothing
// listens there.
func TestStatusUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	out, _, err := run(t, "status", "--once", "--server", url)
	if err == nil || !strings.Contains(err.Error(), "prefixd at "+url) || out != "" {
		t.Fatalf("status of a closed port: err %v, output %q", err, out)
	}
}

// startStatusDaemon runs a daemon on a real etcd and returns its URL.
func startStatusDaemon(t *testing.T, etcd []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Config{Etcd: etcdstore.Config{Endpoints: etcd, DialTimeout: 5 * time.Second}, MaxEntries: -1, // "(no cap)" below
			Listen: "127.0.0.1:0", OnReady: func(a string) { addr <- a },
			Subscriber: stream.SubscriberConfig{IdleTimeout: 500 * time.Millisecond, RetryMax: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond}})
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case err := <-done:
		cancel()
		t.Fatalf("daemon exited: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("daemon did not start")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("daemon did not stop")
		}
	})
	return url
}

// TestStatusAgainstDaemon: a real daemon on a real etcd follows a mock
// engine that served requests; "status --once" shows the worker's rank ok
// with the engine's last seq applied and seen, its blocks, the index's
// entries and the booking routed to it; --json says the same; without
// --once, frames follow one another until the context ends.
func TestStatusAgainstDaemon(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	url := startStatusDaemon(t, etcd.Endpoints())
	store, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	eng, err := mocker.New(mocker.Config{TotalBlocks: 64, BlockSize: 4, Store: store,
		Worker: catalog.Worker{WorkerID: 7, ModelName: "m", Endpoint: "http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	ectx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(ectx) }()
	defer func() { stopEngine(); <-engDone }()
	<-eng.Ready()

	c := &client.Client{BaseURL: url}
	rank0 := func() (api.Listener, bool) {
		ws, err := c.Workers(context.Background(), "", "")
		if err != nil || len(ws) != 1 {
			return api.Listener{}, false
		}
		l, ok := ws[0].Listeners[0]
		return l, ok
	}
	testsupport.Eventually(t, 20*time.Second, "worker 7's stream to be active", func() bool {
		l, ok := rank0()
		return ok && l.Status == api.StatusActive
	})
	// A SUB socket receives only once its subscription has reached the
	// publisher (ZMQ's slow joiner): a batch published before that is
	// fetched by the next idle probe's replay, and nothing is seen live.
	// Warm-up prompts, one block each, until one arrives live.
	warm := uint32(0)
	testsupport.Eventually(t, 20*time.Second, "a batch seen on the live socket", func() bool {
		if l, ok := rank0(); ok && l.LastSeenSeq != nil {
			return true
		}
		warm++
		if _, err := eng.Serve(context.Background(), mocker.Request{TokenIDs: []uint32{1000 + warm, 2000 + warm, 3000 + warm, 4000 + warm}, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		return false
	})
	// Live batches now: three prompts sharing a prefix.
	for i := range 3 {
		prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, uint32(100 + i), 10, 11, 12, 13}
		if _, err := eng.Serve(context.Background(), mocker.Request{TokenIDs: prompt, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	last, ok := eng.LastSeq()
	if !ok {
		t.Fatal("the engine published nothing")
	}
	testsupport.Eventually(t, 20*time.Second, fmt.Sprintf("seq %d applied and seen", last), func() bool {
		l, ok := rank0()
		return ok && l.LastSeq != nil && *l.LastSeq == last && l.LastSeenSeq != nil && *l.LastSeenSeq == last
	})
	if _, err := c.SelectAndReserve(context.Background(), api.SelectRequest{Prompt: api.Prompt{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}},
		ModelName: "m", SelectionID: "s1"}); err != nil {
		t.Fatal(err)
	}
	blocks := len(eng.Holds()) // one rank: its blocks are the index's entries

	out, _, err := run(t, "status", "--once", "--server", url)
	if err != nil {
		t.Fatal(err)
	}
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 14 && f[0] == "7" {
			row = f
		}
	}
	// WORKER MODEL GROUP ROLE RANK STATE DEGRADED APPLIED SEEN LAG BLOCKS REPLAYS GAPS RESTARTS ROUTED
	seq, n := strconv.FormatUint(last, 10), strconv.Itoa(blocks)
	if want := []string{"7", "m", "default", "aggregated", "0", "ok", "no", seq, seq, "0", n}; row == nil || strings.Join(row[:11], " ") != strings.Join(want, " ") || row[14] != "1" {
		t.Fatalf("rank line %q, want %q … routed 1; output:\n%s", row, want, out)
	}
	if !strings.Contains(out, "catalog up, 1 workers   index "+n+" entries (no cap)") || !strings.Contains(out, "ranks: 1 ok\n") {
		t.Fatalf("summary lacks catalog, index and ranks (want %s entries):\n%s", n, out)
	}

	out, _, err = run(t, "status", "--once", "--json", "--server", url)
	if err != nil {
		t.Fatal(err)
	}
	var f status.Frame
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if len(f.Ranks) != 1 || f.Ranks[0].State != status.StateOK || *f.Ranks[0].LastSeq != last || *f.Ranks[0].LastSeenSeq != last ||
		f.Ranks[0].Blocks != blocks || f.Ranks[0].Replays.OK == 0 || f.Ranks[0].Routed != 1 ||
		f.Index.Entries != uint64(blocks) || !f.Catalog.Up || f.Catalog.Workers != 1 || f.Server != url {
		t.Fatalf("--json frame %+v", f)
	}

	// Refreshing: not a terminal, so frames follow one another, with no
	// control sequences, until the context ends.
	var live testsupport.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := newRootCommand(&live, &live)
	cmd.SetArgs([]string{"status", "--server", url, "--interval", "20ms"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	testsupport.Eventually(t, 10*time.Second, "two frames", func() bool {
		return strings.Count(live.String(), "\n\nprefixd "+url) >= 2
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("status ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("status did not stop with its context")
	}
	if s := live.String(); !strings.HasPrefix(s, "prefixd "+url) || strings.Contains(s, "\x1b") {
		t.Fatalf("frames:\n%q", s)
	}
}
