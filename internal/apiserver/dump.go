package apiserver

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/prefixd/prefixd/indexer"
)

// DefaultMaxConcurrentDumps is how many GET /dump may stream at once when
// Config.MaxConcurrentDumps is 0.
const DefaultMaxConcurrentDumps = 2

// dumpRetryAfter is the Retry-After, in seconds, of a /dump refused for
// want of a slot: about how long a dump of a million entries takes.
const dumpRetryAfter = "5"

// dumper serves GET /dump: {"<model>:<group>": <snapshot JSON>, …},
// partitions in key order, streamed. Each partition is snapshotted under
// its read lock (the compact indexer.Snapshot is the only large
// allocation, and only one partition's is held at a time), then written
// with WriteSnapshot through a buffered writer, so a dump never holds
// its JSON in memory. A partition that cannot be dumped appears as
// {"error": "…"} (and is logged); the others are still served; one removed
// while the dump runs is left out. At most cap(slots) dumps run at once;
// beyond that the answer is a 503 with Retry-After.
//
// It is safe for concurrent use.
type dumper struct {
	ix    *indexer.Index
	slots chan struct{} // a token per dump in progress
	log   *slog.Logger
}

var _ http.Handler = (*dumper)(nil)

// newDumper returns the /dump handler for ix. maxConcurrent ≤ 0 means
// DefaultMaxConcurrentDumps; a nil log discards.
func newDumper(ix *indexer.Index, maxConcurrent int, log *slog.Logger) *dumper {
	if maxConcurrent <= 0 {
		maxConcurrent = DefaultMaxConcurrentDumps
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &dumper{ix: ix, slots: make(chan struct{}, maxConcurrent), log: log}
}

func (d *dumper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case d.slots <- struct{}{}:
		defer func() { <-d.slots }()
	default:
		w.Header().Set("Retry-After", dumpRetryAfter)
		writeError(w, &httpError{http.StatusServiceUnavailable,
			fmt.Sprintf("dump: %d dumps already in progress; retry later", cap(d.slots))})
		return
	}
	keys := d.ix.Partitions()
	slices.SortFunc(keys, func(a, b indexer.PartitionKey) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group))
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteByte('{')
	n := 0
	for _, k := range keys {
		if r.Context().Err() != nil {
			return // the client went away
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
			return // bufio keeps the first write error: the client went away
		}
	}
	bw.WriteString("}\n")
	bw.Flush()
}
