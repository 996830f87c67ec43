package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/internal/sim/indexbench"
)

func TestIndexRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--engines", "0"}, "engines 0"},
		{[]string{"--cpu", "0"}, "core count 0"},
		{[]string{"--track", "2"}, "track 2"},
		{[]string{"--fractions", "-1"}, "fraction -1"},
		{[]string{"--requests", "-5"}, "requests -5"},
		{[]string{"--shards", "-1"}, "shards -1"},
		{[]string{"--shards", "257"}, "shards 257"},
		{[]string{"--write-chunk", "-3"}, "write chunk -3"},
		{[]string{"--appliers", "rank,x"}, `appliers "x"`},
		{[]string{"--appliers", "0"}, `appliers "0"`},
		{[]string{"--repeats", "0"}, "repeats 0"},
	} {
		_, _, err := run(t, append([]string{"index"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestIndexRuns: a tiny sweep at one core and at two, on three
// shards, prints its report and writes it, as JSON and as charts, into
// --out.
func TestIndexRuns(t *testing.T) {
	dir := t.TempDir()
	out, _, err := run(t, "index", "--requests", "40", "--engines", "4", "--cpu", "1,2", "--shards", "3",
		"--appliers", "rank,3", "--fractions", "0.5,1", "--idle-probes", "50", "--out", dir)
	if err != nil {
		t.Fatalf("index: %v\n%s", err, out)
	}
	for _, want := range []string{"GOMAXPROCS=1", "GOMAXPROCS=2", "3 index shards", "4 appliers (one per rank)", "3 appliers (ranks sticky)",
		"index equal to the engines' caches", "achieved tracks offered", "idle p50"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, indexbench.ReportJSON))
	if err != nil {
		t.Fatal(err)
	}
	var reps []indexbench.Report
	if err := json.Unmarshal(raw, &reps); err != nil {
		t.Fatal(err)
	}
	// Per core count: the per-rank sweep (with the latency), then 3 sticky appliers.
	if len(reps) != 4 || reps[2].CPUs != 2 || reps[2].Appliers != 4 || reps[3].Appliers != 3 || len(reps[0].Points) != 2 ||
		reps[0].Capacity.Ops == 0 || reps[2].Latency.LoadN == 0 || reps[3].Latency.LoadN != 0 {
		t.Fatalf("report.json: %s", raw)
	}
	text, err := os.ReadFile(filepath.Join(dir, indexbench.ReportText))
	if err != nil || !strings.Contains(string(text), "GOMAXPROCS=2") {
		t.Fatalf("report.md: %v\n%s", err, text)
	}
	for _, name := range []string{indexbench.ChartThroughput, indexbench.ChartLatency} {
		svg, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !strings.Contains(string(svg), "<svg") || !strings.Contains(string(svg), "GOMAXPROCS=2") {
			t.Errorf("%s: %v, %d bytes", name, err, len(svg))
		}
	}
}
