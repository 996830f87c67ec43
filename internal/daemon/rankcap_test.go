package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// TestRankCap drives the rank cap through a scenario: records are
// admitted while their ranks fit, held back beyond, admitted in key order
// when ranks leave; an admitted record that grows past the cap leaves and
// is held; no admitted record is displaced.
func TestRankCap(t *testing.T) {
	c := newRankCap(8)
	rec := func(id uint64, ranks uint32) catalog.Worker {
		w := storetest.Worker("m", "g", id)
		w.DataParallelSize = ranks
		return w
	}
	changes := func(out []catalog.Change, held bool) string {
		var s []string
		for _, ch := range out {
			s = append(s, fmt.Sprintf("%s %d/%d", ch.Kind, ch.Key.WorkerID, ranksOf(ch.Worker)))
			if ch.Kind == catalog.Updated {
				s[len(s)-1] += fmt.Sprintf(" was %d", ranksOf(ch.Old))
			}
		}
		if held {
			s = append(s, "held")
		}
		return strings.Join(s, ", ")
	}
	added := func(w catalog.Worker) catalog.Change {
		return catalog.Change{Kind: catalog.Added, Key: w.Key(), Worker: w}
	}
	updated := func(w, old catalog.Worker) catalog.Change {
		return catalog.Change{Kind: catalog.Updated, Key: w.Key(), Worker: w, Old: old}
	}
	removed := func(w catalog.Worker) catalog.Change {
		return catalog.Change{Kind: catalog.Removed, Key: w.Key(), Worker: w}
	}
	for i, step := range []struct {
		ch              catalog.Change
		want            string
		admitted, heldN int
	}{
		{added(rec(1, 4)), "added 1/4", 4, 0},
		{added(rec(2, 4)), "added 2/4", 8, 0},
		{added(rec(5, 2)), "held", 8, 2},
		{added(rec(3, 1)), "held", 8, 3},
		{updated(rec(3, 2), rec(3, 1)), "held", 8, 4}, // a held record changes: still held
		{updated(rec(2, 4), rec(2, 4)), "updated 2/4 was 4", 8, 4},
		{removed(rec(1, 4)), "removed 1/4, added 3/2, added 5/2", 8, 0}, // key order
	} {
		out, held := c.Apply(step.ch)
		if got := changes(out, held); got != step.want || c.Admitted() != step.admitted || c.Held() != step.heldN {
			t.Fatalf("step %d: %s → %q, admitted %d, held %d; want %q, %d, %d", i, step.ch.Kind, got, c.Admitted(), c.Held(), step.want, step.admitted, step.heldN)
		}
	}
	// Worker 2 grows past the cap: it leaves and is held; the others stay.
	out, held := c.Apply(updated(rec(2, 7), rec(2, 4)))
	if got := changes(out, held); got != "removed 2/4, held" || c.Admitted() != 4 || c.Held() != 7 {
		t.Fatalf("worker 2 grows to 7: %q, admitted %d, held %d", got, c.Admitted(), c.Held())
	}
	// Removing a held record frees nothing and passes nothing on.
	if out, held := c.Apply(removed(rec(2, 7))); len(out) != 0 || held || c.Held() != 0 {
		t.Fatalf("removing held worker 2: %q", changes(out, held))
	}
	// No cap: everything is admitted.
	c = newRankCap(0)
	if out, held := c.Apply(added(rec(9, catalog.MaxDataParallelSize))); changes(out, held) != "added 9/4096" {
		t.Fatalf("no cap: %q", changes(out, held))
	}
}

// TestRankCapReserve: a registration's ranks count against the cap from
// its check until the watch delivers its record, the write fails, or the
// reservation lapses; the refusal names the limit and the counts.
func TestRankCapReserve(t *testing.T) {
	c := newRankCap(8)
	now := time.Unix(1000, 0)
	until := now.Add(reserveFor)
	w1 := storetest.Worker("m", "g", 1)
	w1.DataParallelSize = 4
	c.Apply(catalog.Change{Kind: catalog.Added, Key: w1.Key(), Worker: w1})
	k2, k3 := catalog.Key{Model: "m", Group: "g", WorkerID: 2}, catalog.Key{Model: "m", Group: "g", WorkerID: 3}
	id2, err := c.Reserve(k2, 3, now, until)
	if err != nil || id2 == 0 {
		t.Fatalf("reserve 3 of 4 left: %d, %v", id2, err)
	}
	_, err = c.Reserve(k3, 2, now, until)
	if want := "data_parallel_size: 2 more ranks would make 9, beyond this daemon's limit of 8 ranks (--max-ranks): 4 are registered and 3 are being registered; unregister workers first"; err == nil || err.Error() != want || !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("reserve past the limit: %v; want %q", err, want)
	}
	if _, err := c.Reserve(k3, 1, now, until); err != nil {
		t.Fatalf("reserve the last rank: %v", err)
	}
	// Worker 2's record arrives: its reservation becomes admitted ranks.
	w2 := storetest.Worker("m", "g", 2)
	w2.DataParallelSize = 3
	c.Apply(catalog.Change{Kind: catalog.Added, Key: k2, Worker: w2})
	if _, err := c.Reserve(k3, 1, now, until); err == nil {
		t.Fatal("worker 2 counted twice or not at all: a ninth rank was reserved")
	}
	// Worker 3's write failed: its rank is free again; then one that
	// never shows lapses.
	for id := range c.reserved {
		c.Release(id)
	}
	if _, err := c.Reserve(k3, 1, now, until); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if _, err := c.Reserve(k3, 1, until, until.Add(reserveFor)); err != nil {
		t.Fatalf("after the first reservation lapsed: %v", err)
	}
	if id, err := newRankCap(0).Reserve(k3, catalog.MaxDataParallelSize, now, until); id != 0 || err != nil {
		t.Fatalf("no cap: %d, %v", id, err)
	}
}

// TestRankLimit: through a real daemon on a real etcd with --max-ranks 8,
// POST /register refuses a registration that would take the catalog past
// the limit (409 naming the limit and the count) before writing anything;
// a sidecar's record beyond it, written to etcd directly, is ignored —
// logged, counted, not streamed or listed — until ranks leave, when it
// joins.
func TestRankLimit(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	logs, log := testlog.New(t)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.MaxRanks, c.Logger = 8, log })
	store := etcdStore(t, etcd)
	reg := func(id uint64, size int) (int, string) {
		return register(t, d, map[string]any{"instance_id": id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 21000+100*id), "model_name": "m",
			"block_size": 16, "data_parallel_size": size})
	}
	listed := func(id uint64) bool {
		for _, w := range workersOf(t, d, "m") {
			if w.InstanceID == id {
				return true
			}
		}
		return false
	}
	metric := func(line string) bool {
		_, body := call(t, "GET", d.url+"/metrics", "", nil)
		return strings.Contains(string(body), "\n"+line+"\n")
	}
	const wait = 20 * time.Second
	if code, body := reg(1, 6); code != http.StatusCreated {
		t.Fatalf("register worker 1: %d %s", code, body)
	}
	testsupport.Eventually(t, wait, "worker 1 listed", func() bool { return listed(1) })
	code, body := reg(2, 4)
	if want := "data_parallel_size: 4 more ranks would make 10, beyond this daemon's limit of 8 ranks (--max-ranks): 6 are registered; unregister workers first"; code != http.StatusConflict || !strings.Contains(body, want) {
		t.Fatalf("register 4 ranks over the limit: %d %s; want 409 %q", code, body, want)
	}
	if _, err := store.Get(context.Background(), catalog.Key{Model: "m", Group: "default", WorkerID: 2}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("the refused registration wrote a record: %v", err)
	}
	if code, body := reg(2, 2); code != http.StatusCreated {
		t.Fatalf("register 2 ranks, up to the limit: %d %s", code, body)
	}
	testsupport.Eventually(t, wait, "8 ranks streamed", func() bool { return listed(2) && metric("prefixd_catalog_ranks 8") })

	// A sidecar writes its record to etcd itself: the daemon cannot refuse
	// it, so it ignores it while it does not fit.
	w := catalog.Worker{WorkerID: 3, ModelName: "m", BlockSize: 16, EventsEndpoint: "tcp://127.0.0.1:21300", DataParallelSize: 2}.WithDefaults()
	sess, err := catalog.Register(context.Background(), store, w, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	logs.Wait(t, wait, ignoredMsg, "worker=3", "model=m", "group=default", "ranks=2", "streamed_ranks=8", "max_ranks=8",
		fmt.Sprintf("registration=lease %x", sess.Lease()))
	testsupport.Eventually(t, wait, "the ignored ranks counted", func() bool {
		return metric("prefixd_catalog_ignored_ranks 2") && metric("prefixd_catalog_ranks 8") && metric("prefixd_catalog_max_ranks 8")
	})
	if listed(3) {
		t.Fatal("the ignored worker is listed")
	}
	for _, st := range workersOf(t, d, "m") {
		if len(st.Listeners) > 6 {
			t.Fatalf("worker %d lists %d ranks", st.InstanceID, len(st.Listeners))
		}
	}

	// Worker 2 leaves: worker 3 fits, and joins.
	if code, body := call(t, "POST", d.url+"/unregister", "", map[string]any{"instance_id": 2, "model_name": "m"}); code != http.StatusOK {
		t.Fatalf("unregister worker 2: %d %s", code, body)
	}
	logs.Wait(t, wait, "worker joined", "worker=3", "ranks=[0 1]")
	testsupport.Eventually(t, wait, "worker 3 listed and streamed", func() bool {
		return listed(3) && metric("prefixd_catalog_ignored_ranks 0") && metric("prefixd_catalog_ranks 8")
	})
}

// TestRankLimitConcurrent: 32 registrations at once through one daemon
// with --max-ranks 8: eight land, the others are refused before they
// write, and nothing is left over the limit to ignore.
func TestRankLimitConcurrent(t *testing.T) {
	etcd := storetest.StartEtcd(t)
	d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.MaxRanks = 8 })
	const n = 32
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for id := range uint64(n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := register(t, d, map[string]any{"instance_id": 100 + id, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 22000+id), "model_name": "m", "block_size": 16})
			codes <- code
		}()
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if got[http.StatusCreated] != 8 || got[http.StatusConflict] != n-8 {
		t.Fatalf("statuses %v; want 8 × 201 and %d × 409", got, n-8)
	}
	testsupport.Eventually(t, 20*time.Second, "8 ranks streamed, none ignored", func() bool {
		_, body := call(t, "GET", d.url+"/metrics", "", nil)
		return strings.Contains(string(body), "\nprefixd_catalog_ranks 8\n") && strings.Contains(string(body), "\nprefixd_catalog_ignored_ranks 0\n")
	})
}
