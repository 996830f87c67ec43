package apiserver

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/indexer"
)

// Defaults for the zero values of Config's dump limits.
const (
	// DefaultMaxConcurrentDumps is how many GET /dump may stream at once,
	// besides the peers' slots.
	DefaultMaxConcurrentDumps = 2
	// DefaultPeerDumpSlots is how many more may stream for replicas
	// restoring their index.
	DefaultPeerDumpSlots = 1
	// DefaultDumpProgressTimeout bounds each write of a dump (at most
	// dumpChunk bytes). A replica restoring from the dump stops reading
	// while it restores a partition, so it is far above the time a
	// restore takes.
	DefaultDumpProgressTimeout = 10 * time.Second
)

// PeerDumpHeader, set to PeerDumpBootstrap on GET /dump, marks a replica
// restoring its index (internal/peer sends it): it may take a peer slot,
// which no other request can, so a new replica does not queue behind other
// clients' dumps. It is a claim, not a credential: with an API token set,
// only holders of the token may dump at all.
const (
	PeerDumpHeader    = "Prefixd-Peer"
	PeerDumpBootstrap = "bootstrap"
)

// dumpRetryAfter is the Retry-After, in seconds, of a /dump refused for
// want of a slot: about how long a dump of a million entries takes.
const dumpRetryAfter = "5"

// dumpChunk is the most a dump writes to its client under one deadline.
const dumpChunk = 64 << 10

// dumpCutMsg is the line logged when a dump's client stops reading.
// docs/operations.md quotes it.
const dumpCutMsg = "dump cut: the client took nothing within the progress timeout; connection closed, slot freed"

// dumper serves GET /dump: {"<model>:<group>": <snapshot JSON>, …},
// partitions in key order, streamed. Each partition is snapshotted under
// its read lock (the compact indexer.Snapshot is the only large
// allocation, and only one partition's is held at a time), then written
// with WriteSnapshot through a buffered writer, so a dump never holds
// its JSON in memory. A partition that cannot be dumped appears as
// {"error": "…"} (and is logged); the others are still served; one removed
// while the dump runs is left out.
//
// At most cap(slots) dumps run at once, and cap(peers) more for requests
// marked with PeerDumpHeader (which take a general slot when the peers'
// are taken); beyond that the answer is a 503 with Retry-After. Every
// write of a dump must be taken by the client within progress, or the
// connection is cut and the slot freed (logged, and counted as
// prefixd_dumps_total{result="cut"}): a client that keeps reading gets the
// whole dump however long it takes, one that stops cannot hold a slot.
//
// It is safe for concurrent use.
type dumper struct {
	ix       *indexer.Index
	slots    chan struct{} // a token per dump in progress
	peers    chan struct{} // a token per peer dump in a peer slot
	progress time.Duration
	log      *slog.Logger

	results  *prometheus.CounterVec // by result; nil: no metrics
	inFlight *prometheus.GaugeVec   // by slot
}

var _ http.Handler = (*dumper)(nil)

// newDumper returns the /dump handler for cfg.Index with cfg's dump
// limits (zero: the defaults), registering its metrics with
// cfg.Registerer if set; a nil log discards.
func newDumper(cfg Config, log *slog.Logger) *dumper {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &dumper{ix: cfg.Index, log: log,
		slots:    make(chan struct{}, cmp.Or(max(cfg.MaxConcurrentDumps, 0), DefaultMaxConcurrentDumps)),
		peers:    make(chan struct{}, cmp.Or(max(cfg.PeerDumpSlots, 0), DefaultPeerDumpSlots)),
		progress: cmp.Or(max(cfg.DumpProgressTimeout, 0), DefaultDumpProgressTimeout)}
	if cfg.Registerer != nil {
		d.results = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixd_dumps_total",
			Help: "GET /dump by result: complete, cut (the client took nothing within the progress timeout), aborted (the client went away), refused (no slot)."},
			[]string{"result"})
		d.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_dumps_in_progress",
			Help: "GET /dump streaming now, by slot: shared, or peer (a replica restoring its index)."}, []string{"slot"})
		for _, r := range []string{"complete", "cut", "aborted", "refused"} {
			d.results.WithLabelValues(r)
		}
		d.inFlight.WithLabelValues("shared")
		d.inFlight.WithLabelValues("peer")
		cfg.Registerer.MustRegister(d.results, d.inFlight)
	}
	return d
}

func (d *dumper) count(result string) {
	if d.results != nil {
		d.results.WithLabelValues(result).Inc()
	}
}

// acquire takes a slot for r: a peer's first, for a request that claims
// to be a replica's bootstrap, else a shared one. It returns the slot's
// name and its release, or ok false when none is free.
func (d *dumper) acquire(r *http.Request) (slot string, release func(), ok bool) {
	take := func(c chan struct{}, name string) (string, func(), bool) {
		select {
		case c <- struct{}{}:
		default:
			return "", nil, false
		}
		if d.inFlight != nil {
			d.inFlight.WithLabelValues(name).Inc()
		}
		return name, func() {
			if d.inFlight != nil {
				d.inFlight.WithLabelValues(name).Dec()
			}
			<-c
		}, true
	}
	if r.Header.Get(PeerDumpHeader) == PeerDumpBootstrap {
		if s, rel, ok := take(d.peers, "peer"); ok {
			return s, rel, true
		}
	}
	return take(d.slots, "shared")
}

func (d *dumper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	slot, release, ok := d.acquire(r)
	if !ok {
		d.count("refused")
		w.Header().Set("Retry-After", dumpRetryAfter)
		writeError(w, &httpError{http.StatusServiceUnavailable,
			fmt.Sprintf("dump: %d dumps already in progress; retry later", cap(d.slots))})
		return
	}
	defer release()
	keys := d.ix.Partitions()
	slices.SortFunc(keys, func(a, b indexer.PartitionKey) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group))
	})
	w.Header().Set("Content-Type", "application/json")
	// The connection ends with the dump: the write deadline the dump
	// leaves on it must not cut the next request's answer.
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		d.count("complete")
		return
	}
	pw := &progressWriter{w: w, rc: http.NewResponseController(w), every: d.progress}
	bw := bufio.NewWriterSize(pw, dumpChunk)
	bw.WriteByte('{')
	n := 0
	for _, k := range keys {
		if r.Context().Err() != nil {
			break // the client went away
		}
		snap, err := d.ix.Snapshot(k)
		if errors.Is(err, indexer.ErrNoPartition) {
			continue // removed since listed
		}
		if n++; n > 1 {
			bw.WriteByte(',')
		}
		name, _ := json.Marshal(k.String()) // a string always marshals
		bw.Write(name)
		bw.WriteByte(':')
		if err != nil {
			d.log.Error("dump partition", "partition", k.String(), "err", err)
			msg, _ := json.Marshal(map[string]string{"error": err.Error()})
			bw.Write(msg)
			continue
		}
		if err := WriteSnapshot(bw, snap); err != nil {
			break // bufio keeps the first write error
		}
	}
	if r.Context().Err() == nil && pw.err == nil {
		bw.WriteString("}\n")
		bw.Flush()
		pw.flush()
	}
	switch {
	case pw.cut:
		d.count("cut")
		d.log.Warn(dumpCutMsg, "remote", r.RemoteAddr, "slot", slot, "sent_bytes", pw.sent, "progress_timeout", d.progress)
	case pw.err != nil || r.Context().Err() != nil:
		d.count("aborted")
	default:
		d.count("complete")
	}
}

// progressWriter writes a dump to its client in pieces of at most
// dumpChunk bytes, each under a write deadline of every from its start,
// so that the client must keep taking the dump, not finish it in a given
// time. A ResponseWriter without deadlines (a test's recorder) is written
// without them.
type progressWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	every time.Duration
	sent  int64
	err   error // the first write error
	cut   bool  // err is a write deadline that passed
}

func (p *progressWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 && p.err == nil {
		chunk := b[:min(len(b), dumpChunk)]
		p.deadline()
		n, err := p.w.Write(chunk)
		written += n
		p.sent += int64(n)
		b = b[n:]
		p.fail(err)
	}
	return written, p.err
}

// flush sends what the response buffers hold, under a deadline.
func (p *progressWriter) flush() {
	if p.err == nil {
		p.deadline()
		p.fail(p.rc.Flush())
	}
}

func (p *progressWriter) deadline() {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.every)) // ErrNotSupported: no deadline to keep
}

func (p *progressWriter) fail(err error) {
	if err != nil && p.err == nil {
		p.err, p.cut = err, errors.Is(err, os.ErrDeadlineExceeded)
	}
}
