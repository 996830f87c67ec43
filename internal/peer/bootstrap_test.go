package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/apiserver"
	"github.com/prefixd/prefixd/internal/testsupport/dumptest"
)

// bootstrapSource returns an index of n partitions, each with a few ranks
// holding chains of blocks (about 60 entries per partition).
func bootstrapSource(t *testing.T, n int) *indexer.Index {
	t.Helper()
	ix := indexer.New(indexer.Options{})
	for i := range n {
		k := indexer.PartitionKey{Model: fmt.Sprintf("m%d", i), Group: "default"}
		if err := ix.AddPartition(k, 4); err != nil {
			t.Fatal(err)
		}
		for w := uint64(1); w <= 3; w++ {
			st := indexer.Stored{BlockSize: 4, Seed: indexer.BaseSeed}
			for b := range 20 {
				st.Hashes = append(st.Hashes, w<<32|uint64(b))
				for j := range 4 {
					st.Tokens = append(st.Tokens, uint32(1000*i+100*int(w)+4*b+j))
				}
			}
			if _, err := ix.ApplyBatch(k, indexer.Rank{WorkerID: w}, indexer.Mark{Seq: 7, Digest: 99}, []indexer.Op{{Kind: indexer.OpStore, Store: st}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ix
}

// peer serves a prefixd API for ix that requires token on every request
// (as /dump will), or serves body as the /dump when body is not empty.
func peer(t *testing.T, ix *indexer.Index, token, body string) *httptest.Server {
	h := apiserver.NewHandler(apiserver.Config{Index: ix})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error":"authorization: missing bearer token"}`, http.StatusUnauthorized)
			return
		}
		if body != "" && r.URL.Path == "/dump" {
			w.Write([]byte(body))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func dumpOf(t *testing.T, ix *indexer.Index) map[indexer.PartitionKey]string {
	t.Helper()
	out := map[indexer.PartitionKey]string{}
	for _, k := range ix.Partitions() {
		s, err := ix.Snapshot(k)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := apiserver.MarshalSnapshot(s)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = string(raw)
	}
	return out
}

var quiet = slog.New(slog.DiscardHandler)

// dumpBody is ix's GET /dump.
func dumpBody(ix *indexer.Index) []byte {
	rec := httptest.NewRecorder()
	apiserver.NewHandler(apiserver.Config{Index: ix}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dump", nil))
	return rec.Body.Bytes()
}

// TestBootstrapStreamsPeerDump: Bootstrap sends the token and restores
// every partition of the peer's dump exactly (watermarks and digests
// included); without the token the peer refuses and Bootstrap fails.
func TestBootstrapStreamsPeerDump(t *testing.T) {
	src := bootstrapSource(t, 5)
	srv := peer(t, src, "s3cret", "")
	dst := indexer.New(indexer.Options{MaxEntries: 1000})
	got, err := Bootstrap(context.Background(), []string{srv.URL}, dst, nil, "s3cret", quiet)
	if err != nil || got != srv.URL {
		t.Fatalf("Bootstrap: %q, %v", got, err)
	}
	if want, have := dumptest.Lines(t, dumpBody(src)), dumptest.Lines(t, dumpBody(dst)); !slices.Equal(want, have) || len(have) != 5*(3*20+3) {
		t.Fatalf("restored:\n%v\nwant:\n%v", have, want)
	}
	if st, _ := dst.Rank(indexer.PartitionKey{Model: "m0", Group: "default"}, indexer.Rank{WorkerID: 2}); !st.HasSeq || st.Watermark != 7 || st.Digest != 99 || st.Blocks != 20 {
		t.Fatalf("restored rank %+v", st)
	}
	other := indexer.New(indexer.Options{})
	if _, err := Bootstrap(context.Background(), []string{srv.URL}, other, nil, "", quiet); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("Bootstrap without the token: %v", err)
	}
}

// TestBootstrapLimits: a dump past the byte limit or the block limit fails
// with an error that says so, and the partitions it restored before are
// removed again (a partition that existed before stays).
func TestBootstrapLimits(t *testing.T) {
	src := bootstrapSource(t, 6)
	var full bytes.Buffer
	srv := peer(t, src, "", "")
	dumpSize := func() int {
		resp, err := http.Get(srv.URL + "/dump")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n, _ := full.ReadFrom(resp.Body)
		return int(n)
	}()
	existing := indexer.PartitionKey{Model: "m3", Group: "default"}
	for _, c := range []struct {
		name string
		lim  dumpLimits
		want error
		msg  string
	}{
		{"bytes", dumpLimits{bytes: int64(dumpSize) * 2 / 3}, errDumpTooLarge, fmt.Sprintf("more than %d bytes", dumpSize*2/3)},
		{"blocks", dumpLimits{bytes: 1 << 30, blocks: 4*60 + 30}, apiserver.ErrSnapshotTooLarge, "partition m4:default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := indexer.New(indexer.Options{})
			if err := dst.AddPartition(existing, 4); err != nil {
				t.Fatal(err)
			}
			err := bootstrapFrom(context.Background(), srv.URL, dst, http.DefaultClient, "", c.lim)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %v, want %v mentioning %q", err, c.want, c.msg)
			}
			keys := dst.Partitions()
			if len(keys) != 1 || keys[0] != existing {
				t.Fatalf("partitions after a failed bootstrap: %v, want only %v", keys, existing)
			}
			if err := bootstrapFrom(context.Background(), srv.URL, dst, http.DefaultClient, "", dumpLimits{bytes: int64(dumpSize), blocks: 6 * 60}); err != nil {
				t.Fatalf("exactly at the limits: %v", err)
			}
		})
	}
}

// TestBootstrapBadDumps: malformed dumps and a peer's partition errors are
// errors naming what is wrong.
func TestBootstrapBadDumps(t *testing.T) {
	src := bootstrapSource(t, 1)
	good := dumpOf(t, src)[indexer.PartitionKey{Model: "m0", Group: "default"}]
	for body, want := range map[string]string{
		`{"m0:default":{"error":"boom"}}`:             "partition m0:default: the snapshot is an error: boom",
		`{"nocolon":` + good + `}`:                    `partition "nocolon" is not model:routing_group`,
		`{"m0:default":` + good + `} {}`:              "data after the dump",
		`[]`:                                          "want {",
		`{"m0:default":` + good:                       "dump: EOF",
		`{"m0:default":{"events":[{"x":1}]}}`:         "events[0].event.data: not a stored event",
		`{"m0:default":{"block_size":0,"events":[]}}`: "block size 0",
	} {
		dst := indexer.New(indexer.Options{})
		err := bootstrapFrom(context.Background(), peer(t, src, "", body).URL, dst, http.DefaultClient, "", dumpLimits{bytes: 1 << 20})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: error %v, want %q", body, err, want)
		}
		if keys := dst.Partitions(); len(keys) != 0 {
			t.Errorf("%.60s: partitions %v left after a failed bootstrap", body, keys)
		}
	}
}

// TestExpandPeers: dns+ peers become one URL per resolved address (IPv6
// bracketed, duplicates dropped, path kept); others pass through; a
// failed lookup is reported and skipped.
func TestExpandPeers(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]string, error) {
		switch host {
		case "prefixd-peers.ns.svc":
			return []string{"10.0.0.7", "10.0.0.8", "fd00::9", "10.0.0.7"}, nil
		case "noport":
			return []string{"fd00::1"}, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
	got, errs := ExpandPeers(context.Background(), []string{
		"http://prefixd-0:8090/", "dns+http://prefixd-peers.ns.svc:8090/base", "dns+http://gone:8090", "dns+https://noport", "dns+ftp://x:1",
	}, lookup)
	want := []string{"http://prefixd-0:8090", "http://10.0.0.7:8090/base", "http://10.0.0.8:8090/base", "http://[fd00::9]:8090/base", "https://[fd00::1]"}
	if !slices.Equal(got, want) {
		t.Errorf("peers %q, want %q", got, want)
	}
	if len(errs) != 2 || !strings.Contains(errs[0], "gone") || !strings.Contains(errs[1], "dns+ftp://x:1") {
		t.Errorf("errors %q", errs)
	}
	// The real resolver: localhost is at least 127.0.0.1.
	got, errs = ExpandPeers(context.Background(), []string{"dns+http://localhost:8090"}, nil)
	if len(errs) != 0 || !slices.Contains(got, "http://127.0.0.1:8090") {
		t.Errorf("localhost: %q %q", got, errs)
	}
}

// TestBootstrapWaitsForABusyPeer: Bootstrap asks for the dump as a
// replica's bootstrap (the header that gives it a peer slot), and a peer
// whose dump slots are taken all the same (503) is asked again after its
// Retry-After instead of being given up on.
func TestBootstrapWaitsForABusyPeer(t *testing.T) {
	src := bootstrapSource(t, 3)
	h := apiserver.NewHandler(apiserver.Config{Index: src})
	dumps := make(chan string, 10) // the header of each /dump request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dump" {
			dumps <- r.Header.Get(apiserver.PeerDumpHeader)
			if len(dumps) == 1 { // the first ask: busy
				w.Header().Set("Retry-After", "0")
				http.Error(w, `{"error":"dump: 2 dumps already in progress; retry later"}`, http.StatusServiceUnavailable)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dst := indexer.New(indexer.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := Bootstrap(ctx, []string{srv.URL}, dst, nil, "", quiet); err != nil || got != srv.URL {
		t.Fatalf("Bootstrap from a peer busy once: %q, %v", got, err)
	}
	close(dumps)
	var headers []string
	for h := range dumps {
		headers = append(headers, h)
	}
	if want := []string{apiserver.PeerDumpBootstrap, apiserver.PeerDumpBootstrap}; !slices.Equal(headers, want) {
		t.Fatalf("/dump asked %d times with %s %q; want twice with %q", len(headers), apiserver.PeerDumpHeader, headers, apiserver.PeerDumpBootstrap)
	}
	if want, have := dumptest.Lines(t, dumpBody(src)), dumptest.Lines(t, dumpBody(dst)); !slices.Equal(want, have) {
		t.Fatal("the restored index differs from the peer's")
	}
}
