package status

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog"
)

func u64(v uint64) *uint64 { return &v }

// fleetMetrics is a /metrics page of a daemon with workers 1 (ranks 0 and
// 1) and 2 in model m, and worker 3 in model n.
const fleetMetrics = `
# HELP prefixd_catalog_up 1 if etcd answered.
# TYPE prefixd_catalog_up gauge
prefixd_catalog_up 1
# TYPE prefixd_catalog_workers gauge
prefixd_catalog_workers 3
# TYPE prefixd_index_entries gauge
prefixd_index_entries{model="m",routing_group="default"} 120
prefixd_index_entries{model="n",routing_group="team \"a\""} 30
# TYPE prefixd_index_blocks gauge
prefixd_index_blocks{model="m",routing_group="default"} 100
prefixd_index_blocks{model="n",routing_group="team \"a\""} 30
# TYPE prefixd_index_bytes gauge
prefixd_index_bytes{model="m",routing_group="default"} 2048
prefixd_index_bytes{model="n",routing_group="team \"a\""} 3145728
# TYPE prefixd_index_max_entries gauge
prefixd_index_max_entries 100000
# TYPE prefixd_stream_up gauge
prefixd_stream_up{rank="0",worker="1"} 1
prefixd_stream_up{rank="1",worker="1"} 1
prefixd_stream_up{rank="0",worker="2"} 0
prefixd_stream_up{rank="0",worker="3"} 1
# TYPE prefixd_stream_replays_total counter
prefixd_stream_replays_total{rank="0",result="ok",worker="1"} 2
prefixd_stream_replays_total{rank="0",result="partial",worker="1"} 1
prefixd_stream_replays_total{rank="0",result="failed",worker="1"} 0
prefixd_stream_replays_total{rank="1",result="ok",worker="1"} 1
prefixd_stream_replays_total{rank="0",result="failed",worker="3"} 1
# TYPE prefixd_stream_gaps_total counter
prefixd_stream_gaps_total{rank="0",worker="1"} 4
prefixd_stream_gaps_total{rank="0",worker="3"} 7
# TYPE prefixd_stream_restarts_total counter
prefixd_stream_restarts_total{rank="1",worker="1"} 1
# TYPE prefixd_routed_total counter
prefixd_routed_total{kind="selection",rank="0",worker="1"} 5
prefixd_routed_total{kind="plan_decode",rank="0",worker="1"} 2
prefixd_routed_total{kind="plan_prefill",rank="0",worker="3"} 3
# TYPE prefixd_plans_live gauge
prefixd_plans_live 2
# TYPE prefixd_plan_transitions_total counter
prefixd_plan_transitions_total{state="DecodeCommitted"} 4
prefixd_plan_transitions_total{state="Linked"} 3
prefixd_plan_transitions_total{state="Compensated"} 1
prefixd_plan_transitions_total{state="Released"} 0
# TYPE prefixd_plan_compensations_total counter
prefixd_plan_compensations_total{reason="expired"} 1
# TYPE prefixd_stream_replay_duration_seconds histogram
prefixd_stream_replay_duration_seconds_bucket{le="0.001"} 0
prefixd_stream_replay_duration_seconds_bucket{le="+Inf"} 3
prefixd_stream_replay_duration_seconds_sum 0.5
prefixd_stream_replay_duration_seconds_count 3
`

func parse(t *testing.T, page string) Metrics {
	t.Helper()
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseMetrics(t *testing.T) {
	m := parse(t, fleetMetrics)
	if v, ok := m.Get("prefixd_index_bytes", "routing_group", `team "a"`); !ok || v != 3145728 {
		t.Errorf("escaped label value: %v %v", v, ok)
	}
	if got := m.Sum("prefixd_routed_total", "worker", "1"); got != 7 {
		t.Errorf("routed of worker 1 = %v, want 7", got)
	}
	if got := m.By("prefixd_stream_replays_total", "result", "worker", "1", "rank", "0"); !reflect.DeepEqual(got, map[string]float64{"ok": 2, "partial": 1, "failed": 0}) {
		t.Errorf("replays by result = %v", got)
	}
	if _, ok := m.Get("prefixd_stream_up", "worker", "9"); ok {
		t.Error("a series of an unknown worker")
	}
	if len(m["prefixd_stream_replay_duration_seconds"]) != 0 {
		t.Error("histograms are left out")
	}
	if _, err := ParseMetrics(strings.NewReader("prefixd_plans_live{ 2\n")); err == nil {
		t.Error("a malformed page parsed")
	}
}

func TestBuild(t *testing.T) {
	metrics := parse(t, fleetMetrics)
	active := func(last, seen uint64, blocks int) api.Listener {
		return api.Listener{Status: api.StatusActive, LastSeq: u64(last), LastSeenSeq: u64(seen), Blocks: blocks}
	}
	worker := func(id uint64, model string, ls map[uint32]api.Listener) api.WorkerInfo {
		return api.WorkerInfo{InstanceID: id, ModelName: model, RoutingGroup: "default", Listeners: ls}
	}
	tests := []struct {
		name    string
		workers []api.WorkerInfo
		metrics Metrics
		want    []Rank // only the fields named in check
		check   func(r Rank) any
	}{
		{
			name: "healthy fleet",
			workers: []api.WorkerInfo{
				worker(1, "m", map[uint32]api.Listener{1: active(9, 9, 40), 0: active(41, 41, 60)}),
				worker(3, "n", map[uint32]api.Listener{0: active(5, 5, 30)}),
			},
			metrics: metrics,
			want: []Rank{
				{Worker: 1, Rank: 0, Model: "m", Group: "default", Role: "aggregated", State: StateOK, Status: "active", LastSeq: u64(41), LastSeenSeq: u64(41), Lag: u64(0), Blocks: 60,
					Replays: Replays{OK: 2, Partial: 1}, Gaps: 4, Routed: 7},
				{Worker: 1, Rank: 1, Model: "m", Group: "default", Role: "aggregated", State: StateOK, Status: "active", LastSeq: u64(9), LastSeenSeq: u64(9), Lag: u64(0), Blocks: 40,
					Replays: Replays{OK: 1}, Restarts: 1},
				{Worker: 3, Rank: 0, Model: "n", Group: "default", Role: "aggregated", State: StateOK, Status: "active", LastSeq: u64(5), LastSeenSeq: u64(5), Lag: u64(0), Blocks: 30,
					Replays: Replays{Failed: 1}, Gaps: 7, Routed: 3},
			},
		},
		{
			name:    "degraded rank",
			workers: []api.WorkerInfo{worker(1, "m", map[uint32]api.Listener{0: {Status: api.StatusActive, Degraded: true, LastSeq: u64(41), LastSeenSeq: u64(41)}})},
			metrics: metrics,
			check:   func(r Rank) any { return r.State },
			want:    []Rank{{State: StateDegraded}},
		},
		{
			name: "down streams",
			workers: []api.WorkerInfo{
				// not running at all; pending and disconnected; pending, never connected
				worker(1, "m", map[uint32]api.Listener{0: {Status: api.StatusFailed, LastError: "stream not running"}}),
				worker(2, "m", map[uint32]api.Listener{0: {Status: api.StatusPending, Degraded: true, LastSeq: u64(3)}}),
				worker(4, "m", map[uint32]api.Listener{0: {Status: api.StatusPending}}),
			},
			metrics: metrics,
			// A down rank keeps its degraded flag (and reason): the state
			// says the worst, the flag says what the index holds.
			check: func(r Rank) any { return [4]any{r.Worker, r.State, r.LastError, r.Degraded} },
			want: []Rank{{Worker: 1, State: StateDown, LastError: "stream not running"}, {Worker: 2, State: StateDown, Degraded: true},
				{Worker: 4, State: StateDown}},
		},
		{
			name: "lag and initial replay",
			workers: []api.WorkerInfo{
				worker(1, "m", map[uint32]api.Listener{0: active(41, 44, 60), 1: {Status: api.StatusPending, LastSeq: u64(2)}}),
				worker(3, "n", map[uint32]api.Listener{0: active(7, 5, 30)}), // a replay ran ahead of the live socket
			},
			metrics: metrics,
			check:   func(r Rank) any { return [3]any{r.Worker, r.State, r.Lag} },
			want: []Rank{{Worker: 1, State: StateReplaying, Lag: u64(3)}, {Worker: 1, State: StateReplaying},
				{Worker: 3, State: StateOK, Lag: u64(0)}},
		},
		{
			name: "waiting for a replay slot",
			workers: []api.WorkerInfo{
				worker(1, "m", map[uint32]api.Listener{0: {Status: api.StatusPending, Replay: "queued", Blocks: 0}, 1: {Status: api.StatusActive, Replay: "running", LastSeq: u64(9)}}),
			},
			metrics: metrics,
			check:   func(r Rank) any { return [3]any{r.Rank, r.State, r.Replay} },
			want:    []Rank{{Rank: 0, State: StateQueued, Replay: "queued"}, {Rank: 1, State: StateOK, Replay: "running"}},
		},
		{
			name:    "no metrics for a connected rank",
			workers: []api.WorkerInfo{worker(5, "m", map[uint32]api.Listener{0: {Status: api.StatusActive}})},
			metrics: nil,
			want:    []Rank{{Worker: 5, Model: "m", Group: "default", Role: "aggregated", State: StateOK, Status: "active"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Build(tt.workers, tt.metrics)
			if len(f.Ranks) != len(tt.want) {
				t.Fatalf("%d ranks, want %d: %+v", len(f.Ranks), len(tt.want), f.Ranks)
			}
			for i, r := range f.Ranks {
				got, want := any(r), any(tt.want[i])
				if tt.check != nil {
					got, want = tt.check(r), tt.check(tt.want[i])
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("rank %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}

func TestBuildFleetCounters(t *testing.T) {
	f := Build(nil, parse(t, fleetMetrics))
	want := Frame{
		Catalog: Catalog{Up: true, Workers: 3},
		Ranks:   []Rank{},
		Index: Index{Entries: 150, Bytes: 2048 + 3145728, MaxEntries: 100000, Partitions: []Partition{
			{Model: "m", Group: "default", Entries: 120, Blocks: 100, Bytes: 2048},
			{Model: "n", Group: `team "a"`, Entries: 30, Blocks: 30, Bytes: 3145728},
		}},
		Plans: Plans{Live: 2, Transitions: map[string]uint64{"DecodeCommitted": 4, "Linked": 3, "Compensated": 1, "Released": 0},
			Compensations: map[string]uint64{"expired": 1}},
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("frame\n got %+v\nwant %+v", f, want)
	}
	empty := Build(nil, nil)
	if empty.Catalog.Up || len(empty.Index.Partitions) != 0 || empty.Plans.Live != 0 {
		t.Errorf("frame of an empty page: %+v", empty)
	}
}

func TestWriteText(t *testing.T) {
	ws := []api.WorkerInfo{
		{InstanceID: 1, ModelName: "m", RoutingGroup: "default", Extensions: api.Extensions{Attributes: catalog.Attributes{Role: "decode"}}, Listeners: map[uint32]api.Listener{
			0: {Status: api.StatusActive, LastSeq: u64(41), LastSeenSeq: u64(41), Blocks: 60},
			1: {Status: api.StatusActive, LastSeq: u64(9), LastSeenSeq: u64(12), Blocks: 40},
		}},
		{InstanceID: 2, ModelName: "m", RoutingGroup: "default", Listeners: map[uint32]api.Listener{
			0: {Status: api.StatusPending, LastError: "connect: refused", Degraded: true, DegradedReason: "lost history: no replay endpoint"},
		}},
		{InstanceID: 3, ModelName: "n", RoutingGroup: "default", Listeners: map[uint32]api.Listener{
			0: {Status: api.StatusActive, Degraded: true, LastSeq: u64(5), LastSeenSeq: u64(5), Blocks: 30},
		}},
	}
	f := Build(ws, parse(t, fleetMetrics))
	f.Server = "http://127.0.0.1:8090"
	f.Time = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var b bytes.Buffer
	if err := f.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := `prefixd http://127.0.0.1:8090  2026-01-02 03:04:05
catalog up, 3 workers   index 150 entries (cap 100000), 3.0 MiB   plans 2 live
ranks: 1 ok, 1 REPLAYING, 1 DEGRADED, 1 DOWN

WORKER  MODEL  GROUP    ROLE        RANK  STATE      DEGRADED  APPLIED  SEEN  LAG  BLOCKS  REPLAYS OK/PARTIAL/FAILED  GAPS  RESTARTS  ROUTED  LAST ERROR
1       m      default  decode      0     ok         no        41       41    0    60      2/1/0                      4     0         7
1       m      default  decode      1     REPLAYING  no        9        12    3    40      1/0/0                      0     1         0
2       m      default  aggregated  0     DOWN       YES       -        -     -    0       0/0/0                      0     0         0       connect: refused
3       n      default  aggregated  0     DEGRADED   YES       5        5     0    30      0/0/1                      7     0         3

MODEL  GROUP     ENTRIES  BLOCKS  BYTES
m      default   120      100     2.0 KiB
n      team "a"  30       30      3.0 MiB

plan transitions: Compensated 1, DecodeCommitted 4, Linked 3
plan compensations: expired 1
`
	if got := b.String(); got != want {
		t.Errorf("text\n%s\nwant\n%s", got, want)
	}

	b.Reset()
	if err := (Frame{Server: "http://x"}).WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"catalog DOWN, 0 workers", "ranks: none", "(no workers)", "(empty index)", "plan transitions: none"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("empty frame lacks %q:\n%s", s, b.String())
		}
	}
}

// TestFrameJSON: the JSON form names every rank field, with null seqs.
func TestFrameJSON(t *testing.T) {
	f := Build([]api.WorkerInfo{{InstanceID: 2, ModelName: "m", RoutingGroup: "default", Listeners: map[uint32]api.Listener{0: {Status: api.StatusPending}}}}, nil)
	raw, err := json.Marshal(f.Ranks[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"worker":2,"rank":0,"model":"m","routing_group":"default","role":"aggregated","state":"down","degraded":false,"status":"pending",` +
		`"last_seq":null,"last_seen_seq":null,"lag":null,"blocks":0,"replays":{"ok":0,"partial":0,"failed":0},"gaps":0,"restarts":0,"routed":0}`
	if string(raw) != want {
		t.Errorf("json\n got %s\nwant %s", raw, want)
	}
	// A down rank restored degraded says so, with the reason.
	f = Build([]api.WorkerInfo{{InstanceID: 2, ModelName: "m", RoutingGroup: "default", Listeners: map[uint32]api.Listener{
		0: {Status: api.StatusPending, Degraded: true, DegradedReason: "lost history: replay attempts ran out"}}}}, nil)
	if raw, _ = json.Marshal(f.Ranks[0]); !bytes.Contains(raw, []byte(`"state":"down","degraded":true,"degraded_reason":"lost history: replay attempts ran out",`)) {
		t.Errorf("json of a down, degraded rank: %s", raw)
	}
}

func TestRedraw(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a\nbb\n", "\x1b[Ha\x1b[K\nbb\x1b[K\n\x1b[J"},
		{"a\nno newline", "\x1b[Ha\x1b[K\nno newline\x1b[K\x1b[J"},
		{"", "\x1b[H\x1b[J"},
	} {
		if got := string(Redraw([]byte(tc.in))); got != tc.want {
			t.Errorf("Redraw(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestBytesText(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB", 5 << 40: "5120.0 GiB"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%d) = %q, want %q", n, got, want)
		}
	}
}
