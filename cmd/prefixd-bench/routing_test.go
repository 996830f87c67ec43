package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRouting runs a short replay through the command and checks
// its table, progress lines and files; bad flags name themselves.
func TestRouting(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, err := run(t, "routing", "--requests", "40", "--policies", "random,prefixd", "--speedups", "1",
		"--weights", "2", "--out", dir)
	if err != nil {
		t.Fatalf("routing: %v\n%s", err, stderr)
	}
	for _, want := range []string{"| random |", "| prefixd |", "Overlap weight", "| prefixd | 2 | ×1 |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "random") || !strings.Contains(stderr, "hit") {
		t.Errorf("no progress lines on stderr: %q", stderr)
	}
	for _, f := range []string{"report.json", "report.md", "ttft-cdf.svg", "ttft-vs-overlap-weight.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	// Two replicas: rows carry the count, and the replica table follows;
	// random keeps no router state and runs once.
	stdout, stderr, err = run(t, "routing", "--quiet", "--requests", "20", "--policies", "random,prefixd", "--speedups", "1", "--replicas", "1,2")
	if err != nil {
		t.Fatalf("routing --replicas: %v\n%s", err, stderr)
	}
	for _, want := range []string{"| random/r1 |", "| prefixd/r1 |", "| prefixd/r2 |", "Replicas (", "| prefixd | ×1 | 2 |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "random/r2") {
		t.Errorf("random ran at two replicas:\n%s", stdout)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas"},
		{[]string{"--replicas", "65"}, "--replicas"},
		{[]string{"--replica-spread", "-1s"}, "replica spread"},
		{[]string{"--policies", "fastest"}, "--policies"},
		{[]string{"--speedups", "x"}, "--speedups"},
		{[]string{"--speedups", "0"}, "--speedups"},
		{[]string{"--weights", "-1"}, "--weights"},
		{[]string{"--engines", "1"}, "engines"},
		{[]string{"--requests", "-1"}, "--requests"},
		{[]string{"--trace", filepath.Join(dir, "missing.jsonl")}, "missing.jsonl"},
	} {
		_, _, err := run(t, append([]string{"routing", "--quiet"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}
