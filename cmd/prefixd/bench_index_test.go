package main

import (
	"strings"
	"testing"
)

func TestBenchIndexRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--engines", "0"}, "engines 0"},
		{[]string{"--cpu", "0"}, "core count 0"},
		{[]string{"--track", "2"}, "track 2"},
		{[]string{"--fractions", "-1"}, "fraction -1"},
		{[]string{"--requests", "-5"}, "requests -5"},
	} {
		_, err := runCommand(t, append([]string{"bench", "index"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestBenchIndexRuns: a tiny sweep at one core prints its report.
func TestBenchIndexRuns(t *testing.T) {
	out, err := runCommand(t, "bench", "index", "--requests", "40", "--engines", "2", "--cpu", "1",
		"--fractions", "1", "--idle-probes", "50")
	if err != nil {
		t.Fatalf("bench index: %v\n%s", err, out)
	}
	for _, want := range []string{"GOMAXPROCS=1", "index equal to the engines' caches", "achieved tracks offered", "idle p50"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
