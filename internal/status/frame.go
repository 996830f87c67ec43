package status

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
)

// Rank states, best to worst. A rank is down when its stream is not
// running or not connected, degraded when its history is known to be
// incomplete, queued while it waits for a replay slot (its index lags the
// engine until one frees up), replaying while its initial replay runs or
// live batches wait for a replay to close a gap (lag > 0), and ok
// otherwise.
const (
	StateOK        = "ok"
	StateReplaying = "replaying"
	StateQueued    = "queued"
	StateDegraded  = "degraded"
	StateDown      = "down"
)

// stateOrder lists the states best first.
var stateOrder = []string{StateOK, StateReplaying, StateQueued, StateDegraded, StateDown}

// Frame is one refresh of the status view. Its JSON form is what
// "prefixd status --once --json" prints.
type Frame struct {
	// Server and Time say where and when the pages were read; Build
	// leaves them for the caller to fill in.
	Server  string    `json:"server"`
	Time    time.Time `json:"time"`
	Catalog Catalog   `json:"catalog"`
	// Ranks are ordered by model, routing group, worker and rank.
	Ranks []Rank `json:"ranks"`
	Index Index  `json:"index"`
	Plans Plans  `json:"plans"`
}

// Catalog is the daemon's view of etcd.
type Catalog struct {
	Up      bool   `json:"up"`      // etcd answered during the scrape
	Workers uint64 `json:"workers"` // worker records the catalog watch holds
}

// Rank is one worker rank and its event stream.
type Rank struct {
	Worker uint64 `json:"worker"`
	Rank   uint32 `json:"rank"`
	Model  string `json:"model"`
	Group  string `json:"routing_group"`
	Role   string `json:"role"`
	// State is StateOK, StateReplaying, StateQueued, StateDegraded or
	// StateDown.
	State string `json:"state"`
	// Replay is the listener's replay phase ("queued", "running" or "").
	Replay string `json:"replay,omitempty"`
	// Degraded and DegradedReason are the listener's: the rank is known
	// to hold a strict subset of its engine's cache, whatever its State
	// (a rank that is down may be degraded too, e.g. restored so from a
	// peer while its engine cannot be reached).
	Degraded       bool   `json:"degraded"`
	DegradedReason string `json:"degraded_reason,omitempty"`
	// Status and LastError are the listener's, as /workers reports them.
	Status    string `json:"status"`
	LastError string `json:"last_error,omitempty"`
	// LastSeq is the last batch applied and LastSeenSeq the last received
	// live; Lag is LastSeenSeq − LastSeq (0 when applied is ahead), null
	// unless both are known.
	LastSeq     *uint64 `json:"last_seq"`
	LastSeenSeq *uint64 `json:"last_seen_seq"`
	Lag         *uint64 `json:"lag"`
	Blocks      int     `json:"blocks"`
	Replays     Replays `json:"replays"`
	Gaps        uint64  `json:"gaps"`
	Restarts    uint64  `json:"restarts"`
	// Routed counts requests booked on the rank, of every kind.
	Routed uint64 `json:"routed"`
}

// Replays are a rank's replay outcomes (prefixd_stream_replays_total).
type Replays struct {
	OK      uint64 `json:"ok"`
	Partial uint64 `json:"partial"`
	Failed  uint64 `json:"failed"`
}

// Index is the index's size over all partitions, and per partition.
type Index struct {
	Entries    uint64      `json:"entries"`
	Bytes      uint64      `json:"bytes"`
	MaxEntries uint64      `json:"max_entries"` // the configured cap; 0 = none
	Partitions []Partition `json:"partitions"`  // by model and routing group
}

// Partition is the size of one (model, routing group) index.
type Partition struct {
	Model   string `json:"model"`
	Group   string `json:"routing_group"`
	Entries uint64 `json:"entries"`
	Blocks  uint64 `json:"blocks"`
	Bytes   uint64 `json:"bytes"`
}

// Plans are the disaggregated plans: how many hold bookings, and counts of
// the transitions (by state entered) and compensations (by reason) since
// the daemon started.
type Plans struct {
	Live          uint64            `json:"live"`
	Transitions   map[string]uint64 `json:"transitions"`
	Compensations map[string]uint64 `json:"compensations"`
}

// Build makes a frame from a /workers list and a /metrics page. It does
// not modify ws.
func Build(ws []api.WorkerInfo, m Metrics) Frame {
	f := Frame{
		Catalog: Catalog{Up: m.Sum("prefixd_catalog_up") > 0, Workers: count(m.Sum("prefixd_catalog_workers"))},
		Ranks:   []Rank{},
		Index:   Index{MaxEntries: count(m.Sum("prefixd_index_max_entries")), Partitions: []Partition{}},
		Plans: Plans{Live: count(m.Sum("prefixd_plans_live")),
			Transitions:   counts(m.By("prefixd_plan_transitions_total", "state")),
			Compensations: counts(m.By("prefixd_plan_compensations_total", "reason"))},
	}
	for _, w := range ws {
		for r, l := range w.Listeners {
			f.Ranks = append(f.Ranks, rank(w, r, l, m))
		}
	}
	slices.SortFunc(f.Ranks, func(a, b Rank) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
	})
	for _, s := range m["prefixd_index_entries"] {
		model, group := s.Labels["model"], s.Labels["routing_group"]
		p := Partition{Model: model, Group: group, Entries: count(s.Value),
			Blocks: count(m.Sum("prefixd_index_blocks", "model", model, "routing_group", group)),
			Bytes:  count(m.Sum("prefixd_index_bytes", "model", model, "routing_group", group))}
		f.Index.Partitions = append(f.Index.Partitions, p)
		f.Index.Entries += p.Entries
		f.Index.Bytes += p.Bytes
	}
	slices.SortFunc(f.Index.Partitions, func(a, b Partition) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Group, b.Group))
	})
	return f
}

func rank(w api.WorkerInfo, r uint32, l api.Listener, m Metrics) Rank {
	wl := []string{"worker", strconv.FormatUint(w.InstanceID, 10), "rank", strconv.FormatUint(uint64(r), 10)}
	res := m.By("prefixd_stream_replays_total", "result", wl...)
	out := Rank{Worker: w.InstanceID, Rank: r, Model: w.ModelName, Group: w.RoutingGroup, Role: string(cmp.Or(w.Role, catalog.RoleAggregated)),
		Status: l.Status, LastError: l.LastError, Degraded: l.Degraded, DegradedReason: l.DegradedReason, LastSeq: l.LastSeq, LastSeenSeq: l.LastSeenSeq, Blocks: l.Blocks, Replay: l.Replay,
		Replays:  Replays{OK: count(res["ok"]), Partial: count(res["partial"]), Failed: count(res["failed"])},
		Gaps:     count(m.Sum("prefixd_stream_gaps_total", wl...)),
		Restarts: count(m.Sum("prefixd_stream_restarts_total", wl...)),
		Routed:   count(m.Sum("prefixd_routed_total", wl...))}
	if l.LastSeq != nil && l.LastSeenSeq != nil {
		lag := *l.LastSeenSeq - min(*l.LastSeq, *l.LastSeenSeq)
		out.Lag = &lag
	}
	up, _ := m.Get("prefixd_stream_up", wl...)
	connected := l.Status == api.StatusActive || up > 0
	switch {
	case l.Status == api.StatusFailed || !connected:
		out.State = StateDown
	case l.Degraded:
		out.State = StateDegraded
	case l.Replay == "queued":
		out.State = StateQueued
	case l.Status == api.StatusPending || (out.Lag != nil && *out.Lag > 0):
		out.State = StateReplaying
	default:
		out.State = StateOK
	}
	return out
}

// count converts a metric value to a count (negative and NaN are 0).
func count(v float64) uint64 {
	if !(v > 0) {
		return 0
	}
	return uint64(v)
}

func counts(m map[string]float64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = count(v)
	}
	return out
}

// WriteText renders the frame as text: a summary, one table line per
// rank, one per index partition, and the plan counters. States other than
// ok are upper case, so that they stand out.
func (f Frame) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "prefixd %s", f.Server)
	if !f.Time.IsZero() {
		fmt.Fprintf(&b, "  %s", f.Time.Format(time.DateTime))
	}
	b.WriteString("\n")
	catalog := "DOWN"
	if f.Catalog.Up {
		catalog = "up"
	}
	limit := "no cap"
	if f.Index.MaxEntries > 0 {
		limit = fmt.Sprintf("cap %d", f.Index.MaxEntries)
	}
	fmt.Fprintf(&b, "catalog %s, %d workers   index %d entries (%s), %s   plans %d live\n",
		catalog, f.Catalog.Workers, f.Index.Entries, limit, bytesText(f.Index.Bytes), f.Plans.Live)
	b.WriteString(f.rankSummary())
	b.WriteString("\n\n")

	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tMODEL\tGROUP\tROLE\tRANK\tSTATE\tDEGRADED\tAPPLIED\tSEEN\tLAG\tBLOCKS\tREPLAYS OK/PARTIAL/FAILED\tGAPS\tRESTARTS\tROUTED\tLAST ERROR")
	for _, r := range f.Ranks {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%d\t%d\t%d\t%s\n", r.Worker, r.Model, r.Group, r.Role, r.Rank,
			stateText(r.State), degradedText(r.Degraded), seqText(r.LastSeq), seqText(r.LastSeenSeq), seqText(r.Lag), r.Blocks,
			r.Replays.OK, r.Replays.Partial, r.Replays.Failed, r.Gaps, r.Restarts, r.Routed, r.LastError)
	}
	if len(f.Ranks) == 0 {
		fmt.Fprintln(tw, "(no workers)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString("\n")
	fmt.Fprintln(tw, "MODEL\tGROUP\tENTRIES\tBLOCKS\tBYTES")
	for _, p := range f.Index.Partitions {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", p.Model, p.Group, p.Entries, p.Blocks, bytesText(p.Bytes))
	}
	if len(f.Index.Partitions) == 0 {
		fmt.Fprintln(tw, "(empty index)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&b, "\nplan transitions: %s\nplan compensations: %s\n", countsText(f.Plans.Transitions), countsText(f.Plans.Compensations))
	// The padding of an empty last cell would leave trailing blanks.
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	_, err := io.WriteString(w, strings.Join(lines, "\n"))
	return err
}

// rankSummary counts the ranks per state, worst last: "ranks: 3 ok, 1 DOWN".
func (f Frame) rankSummary() string {
	n := map[string]int{}
	for _, r := range f.Ranks {
		n[r.State]++
	}
	parts := []string{}
	for _, s := range stateOrder {
		if n[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s], stateText(s)))
		}
	}
	if len(parts) == 0 {
		return "ranks: none"
	}
	return "ranks: " + strings.Join(parts, ", ")
}

func stateText(s string) string {
	if s == StateOK {
		return s
	}
	return strings.ToUpper(s)
}

// degradedText is the DEGRADED column: "YES" (upper case, as it is bad
// news) or "no".
func degradedText(d bool) string {
	if d {
		return "YES"
	}
	return "no"
}

func seqText(p *uint64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatUint(*p, 10)
}

// countsText lists "key n" pairs by key, or "none".
func countsText(m map[string]uint64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// bytesText is n in B, KiB, MiB or GiB, with one decimal above B.
func bytesText(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 2 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMG"[i])
}
