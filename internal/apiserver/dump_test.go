package apiserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// dumpIndex returns an index of n partitions with some hundred blocks
// each, in two tiers (a dump of several hundred KiB: many buffer flushes).
func dumpIndex(t testing.TB, n int) (*indexer.Index, []indexer.PartitionKey) {
	ix := indexer.New(indexer.Options{})
	var keys []indexer.PartitionKey
	p := prompt(4096, 7)
	for i := range n {
		k := indexer.PartitionKey{Model: fmt.Sprintf("model-%02d", n-i), Group: "g"}
		keys = append(keys, k)
		if err := ix.AddPartition(k, 16); err != nil {
			t.Fatal(err)
		}
		for w := uint64(1); w <= 8; w++ {
			r := indexer.Rank{WorkerID: w}
			blocks := 16 * int(w)
			store(t, ix, k, r, w, indexer.TierDevice, indexer.BaseSeed, 0, seq(1000*w, blocks), p[:16*blocks])
			store(t, ix, k, r, w+1, indexer.TierHost, indexer.BaseSeed, 1000*w+uint64(blocks)-1, seq(1000*w+uint64(blocks), 4), p[16*blocks:16*(blocks+4)])
		}
	}
	return ix, keys
}

// wantDump is the /dump body as the handler built it before streaming:
// partitions in key order, each MarshalSnapshot of its snapshot.
func wantDump(t *testing.T, ix *indexer.Index) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; ; i++ {
		k := indexer.PartitionKey{Model: fmt.Sprintf("model-%02d", i+1), Group: "g"}
		snap, err := ix.Snapshot(k)
		if err != nil {
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		data, err := MarshalSnapshot(snap)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%q:%s", k.String(), data)
	}
	b.WriteString("}\n")
	return b.String()
}

// TestDumpStreamsTheSameBytes: the streamed dump is byte for byte the
// document the handler used to build in memory.
func TestDumpStreamsTheSameBytes(t *testing.T) {
	ix, _ := dumpIndex(t, 12)
	want := wantDump(t, ix)
	if len(want) < 256<<10 {
		t.Fatalf("dump of %d bytes: too small to span several writes", len(want))
	}
	r := newServer(t, Config{Index: ix}).get("/dump")
	if r.status != 200 || r.body != want {
		t.Fatalf("dump: %d, %d bytes, want %d bytes; equal: %v", r.status, len(r.body), len(want), r.body == want)
	}
}

// gatedWriter is a ResponseWriter whose WriteHeader reports that the dump
// has started (it holds its slot by then) and then waits for release.
type gatedWriter struct {
	*httptest.ResponseRecorder
	started chan struct{}
	release chan struct{}
}

func newGatedWriter() *gatedWriter {
	return &gatedWriter{ResponseRecorder: httptest.NewRecorder(), started: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedWriter) WriteHeader(code int) {
	close(g.started)
	<-g.release
	g.ResponseRecorder.WriteHeader(code)
}

// TestDumpConcurrencyLimit: past maxConcurrent dumps in progress, /dump
// answers 503 with Retry-After and a JSON error; a finished dump frees its
// slot.
func TestDumpConcurrencyLimit(t *testing.T) {
	ix, _ := dumpIndex(t, 2)
	d := newDumper(Config{Index: ix, MaxConcurrentDumps: 2}, nil)
	req := httptest.NewRequest(http.MethodGet, "/dump", nil)
	gates := []*gatedWriter{newGatedWriter(), newGatedWriter()}
	done := make(chan struct{}, len(gates))
	for _, g := range gates {
		go func() {
			d.ServeHTTP(g, req)
			done <- struct{}{}
		}()
		<-g.started
	}
	busy := httptest.NewRecorder()
	d.ServeHTTP(busy, req)
	if busy.Code != http.StatusServiceUnavailable || busy.Header().Get("Retry-After") == "" ||
		!strings.HasPrefix(busy.Body.String(), `{"error":"dump: 2 dumps already in progress`) {
		t.Fatalf("third dump: %d Retry-After=%q %s", busy.Code, busy.Header().Get("Retry-After"), busy.Body)
	}
	close(gates[0].release)
	<-done
	if !strings.HasPrefix(gates[0].Body.String(), `{"model-01:g":`) {
		t.Fatalf("first dump: %.80s", gates[0].Body)
	}
	ok := httptest.NewRecorder()
	d.ServeHTTP(ok, req) // a slot is free again
	if ok.Code != 200 || ok.Body.String() != wantDump(t, ix) {
		t.Fatalf("dump after one finished: %d %.80s", ok.Code, ok.Body)
	}
	close(gates[1].release)
	<-done
	// Through the API: the 503 is JSON like every other error, with the
	// Content-Type of one.
	h := NewHandler(Config{Index: ix, MaxConcurrentDumps: 1})
	g := newGatedWriter()
	go func() {
		h.ServeHTTP(g, req)
		done <- struct{}{}
	}()
	<-g.started
	busy = httptest.NewRecorder()
	h.ServeHTTP(busy, req)
	var e struct{ Error string }
	if busy.Code != 503 || busy.Header().Get("Content-Type") != "application/json" || json.Unmarshal(busy.Body.Bytes(), &e) != nil || !strings.HasPrefix(e.Error, "dump: 1 dumps") {
		t.Fatalf("through NewHandler: %d %q %s", busy.Code, busy.Header().Get("Content-Type"), busy.Body)
	}
	close(g.release)
	<-done
}

// TestDumpSkipsRemovedPartition: a partition removed after the dump listed
// the partitions is left out, not reported as an error.
func TestDumpSkipsRemovedPartition(t *testing.T) {
	ix, _ := dumpIndex(t, 3)
	d := newDumper(Config{Index: ix, MaxConcurrentDumps: 1}, nil)
	g := newGatedWriter()
	done := make(chan struct{})
	go func() {
		d.ServeHTTP(g, httptest.NewRequest(http.MethodGet, "/dump", nil))
		close(done)
	}()
	<-g.started // partitions listed, none dumped yet
	gone := indexer.PartitionKey{Model: "model-02", Group: "g"}
	if err := ix.RemovePartition(gone); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	<-done
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(g.Body.Bytes(), &parts); err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || parts["model-02:g"] != nil || parts["model-01:g"] == nil || parts["model-03:g"] == nil {
		t.Fatalf("dump after removing model-02: %d partitions %.200s", len(parts), g.Body)
	}
	if !bytes.Equal(g.Body.Bytes(), []byte(wantDumpOf(t, ix, "model-01", "model-03"))) {
		t.Fatal("dump differs from its partitions' snapshots")
	}
}

func wantDumpOf(t *testing.T, ix *indexer.Index, models ...string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range models {
		k := indexer.PartitionKey{Model: m, Group: "g"}
		snap, err := ix.Snapshot(k)
		if err != nil {
			t.Fatal(err)
		}
		data, err := MarshalSnapshot(snap)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", k.String(), data)
	}
	b.WriteString("}\n")
	return b.String()
}

// failingWriter fails every write: the client went away.
type failingWriter struct{ *httptest.ResponseRecorder }

func (failingWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("broken pipe") }

// TestDumpStopsWhenTheClientGoes: a failed write ends the dump and frees
// its slot.
func TestDumpStopsWhenTheClientGoes(t *testing.T) {
	ix, _ := dumpIndex(t, 12)
	d := newDumper(Config{Index: ix, MaxConcurrentDumps: 1}, nil)
	d.ServeHTTP(failingWriter{httptest.NewRecorder()}, httptest.NewRequest(http.MethodGet, "/dump", nil))
	ok := httptest.NewRecorder()
	d.ServeHTTP(ok, httptest.NewRequest(http.MethodGet, "/dump", nil))
	if ok.Code != 200 {
		t.Fatalf("dump after a failed one: %d", ok.Code)
	}
}
