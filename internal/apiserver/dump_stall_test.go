package apiserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// bigDump returns a server of an index whose dump is larger than the
// socket buffers between a client and the server can hold (up to 4 MiB
// sent and some hundred KiB received on Linux loopback), and the dump.
func bigDump(t *testing.T, cfg Config) (*server, string) {
	t.Helper()
	const n = 200
	ix, _ := dumpIndex(t, n)
	models := make([]string, n)
	for i := range models {
		models[i] = fmt.Sprintf("model-%02d", i+1)
	}
	slices.Sort(models) // the dump's order
	want := wantDumpOf(t, ix, models...)
	if len(want) < 8<<20 {
		t.Fatalf("a dump of %d bytes: too small to fill the socket buffers", len(want))
	}
	cfg.Index = ix
	return newServer(t, cfg), want
}

// dumpConn sends GET /dump (as a replica's bootstrap if peer) on a
// connection of its own and returns it unread: a client that stops
// reading. Its receive window stays at its first size (Linux: 128 KiB)
// while it reads nothing.
func dumpConn(t *testing.T, s *server, peer bool) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "GET /dump HTTP/1.1\r\nHost: prefixd\r\n"
	if peer {
		req += PeerDumpHeader + ": " + PeerDumpBootstrap + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// readDump reads the answer on c: its status and its body, or the error
// that ended it.
func readDump(c net.Conn) (int, string, error) {
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metric returns the value of the series name{label="value"} in reg (-1
// if there is none).
func metric(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if g := m.GetGauge(); g != nil {
						return g.GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestDumpPeerSlot: two clients that asked for a dump and stopped reading
// hold both shared slots; another client is refused (503, Retry-After),
// but a replica restoring its index has a slot of its own and gets the
// whole dump at once.
func TestDumpPeerSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, want := bigDump(t, Config{Registerer: reg, DumpProgressTimeout: time.Minute}) // nobody is cut here
	dumpConn(t, s, false)
	dumpConn(t, s, false)
	testsupport.Eventually(t, 10*time.Second, "two stalled dumps in the shared slots", func() bool {
		return metric(t, reg, "prefixd_dumps_in_progress", "slot", "shared") == 2
	})
	if r := s.get("/dump"); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("a third client's dump: %d Retry-After %q %.100s; want 503 while the slots are held", r.status, r.header.Get("Retry-After"), r.body)
	}
	began := time.Now()
	r := s.do(http.MethodGet, "/dump", "", PeerDumpHeader+": "+PeerDumpBootstrap)
	if r.status != http.StatusOK || r.body != want {
		t.Fatalf("a replica's dump while strangers hold the shared slots: %d, %d of %d bytes", r.status, len(r.body), len(want))
	}
	t.Logf("the replica's dump of %d bytes took %v beside two stalled ones", len(want), time.Since(began).Round(time.Millisecond))
	if got := metric(t, reg, "prefixd_dumps_total", "result", "refused"); got != 1 {
		t.Errorf("prefixd_dumps_total{result=refused} = %v, want 1", got)
	}
}

// TestDumpCutsStalledReaders: two clients ask for a big dump and stop
// reading. Each is cut once a write has waited the progress timeout —
// its connection closed, its slot freed, a line logged and the cut
// counted — so a third client's dump is served within a bound, whole;
// the stalled clients get a truncated answer, never a dump.
func TestDumpCutsStalledReaders(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs, log := testlog.New(nil)
	const progress = 300 * time.Millisecond
	s, want := bigDump(t, Config{Registerer: reg, Logger: log, DumpProgressTimeout: progress})
	stalled := []net.Conn{dumpConn(t, s, false), dumpConn(t, s, false)}
	testsupport.Eventually(t, 10*time.Second, "two dumps in the shared slots", func() bool {
		return metric(t, reg, "prefixd_dumps_in_progress", "slot", "shared") == 2
	})
	began := time.Now()
	var got response
	testsupport.Eventually(t, progress+10*time.Second, "a third client's dump", func() bool {
		got = s.get("/dump")
		return got.status == http.StatusOK
	})
	took := time.Since(began)
	if got.body != want {
		t.Fatalf("the third client's dump: %d of %d bytes", len(got.body), len(want))
	}
	t.Logf("the third client was served %v after it first asked", took.Round(time.Millisecond))
	if n := logs.Count(dumpCutMsg); n != 2 {
		t.Fatalf("%d lines %q; want one per stalled client", n, dumpCutMsg)
	}
	for _, rec := range logs.Records() {
		if rec.Msg == dumpCutMsg && (rec.Attrs["slot"] != "shared" || rec.Attrs["progress_timeout"] != progress.String() || rec.Attrs["remote"] == "") {
			t.Errorf("cut line %v", rec)
		}
	}
	for _, m := range []struct {
		name, label, value string
		want               float64
	}{
		{"prefixd_dumps_total", "result", "cut", 2},
		{"prefixd_dumps_total", "result", "complete", 1},
		{"prefixd_dumps_in_progress", "slot", "shared", 0},
	} {
		if v := metric(t, reg, m.name, m.label, m.value); v != m.want {
			t.Errorf("%s{%s=%q} = %v, want %v", m.name, m.label, m.value, v, m.want)
		}
	}
	for i, c := range stalled {
		status, body, err := readDump(c)
		if status != http.StatusOK || err == nil || len(body) >= len(want) {
			t.Errorf("stalled client %d: %d, %d of %d bytes, %v; want a dump cut short", i, status, len(body), len(want), err)
		}
	}
}

// TestDumpSlowReaderFinishes: a client that reads slowly but steadily
// gets the whole dump, though the server's writes wait for it (the dump
// is larger than the socket buffers) and it takes more than twice the
// progress timeout. (Linux wakes a writer once half its send buffer has
// drained, so a reader must take about half of it, 2 MiB at most, per
// progress timeout: here 2 MiB/s against 1 MiB/s needed.)
func TestDumpSlowReaderFinishes(t *testing.T) {
	const progress = 2 * time.Second
	reg := prometheus.NewRegistry()
	s, want := bigDump(t, Config{Registerer: reg, DumpProgressTimeout: progress})
	c := dumpConn(t, s, false)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	status, body, err := readDump(&pacedConn{Conn: c, tick: tick.C, per: 20 << 10})
	took := time.Since(began)
	if status != http.StatusOK || err != nil || body != want {
		t.Fatalf("slow reader: %d, %d of %d bytes, %v", status, len(body), len(want), err)
	}
	if took < 2*progress {
		t.Fatalf("the slow read took %v: not slow enough to show anything", took)
	}
	t.Logf("a %d-byte dump read in %v with a progress timeout of %v", len(want), took.Round(time.Millisecond), progress)
	if v := metric(t, reg, "prefixd_dumps_total", "result", "complete"); v != 1 {
		t.Errorf("prefixd_dumps_total{result=complete} = %v, want 1", v)
	}
}

// pacedConn reads at most per bytes per tick.
type pacedConn struct {
	net.Conn
	tick <-chan time.Time
	per  int
}

func (p *pacedConn) Read(b []byte) (int, error) {
	<-p.tick
	return p.Conn.Read(b[:min(len(b), p.per)])
}
