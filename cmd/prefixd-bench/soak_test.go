package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSoakRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"soak", "--duration", "5s"}, "--duration"},
		{[]string{"soak", "--duration", "1m", "--sample", "20s"}, "--sample"},
		{[]string{"soak", "--rate", "0"}, "--rate"},
		{[]string{"soak", "--warmup", "20m"}, "--warmup"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { checkError(t, tc.args, tc.want) })
	}
}

// TestFindPrefixd: --prefixd wins; without it, the prefixd next to this
// executable, then the one on PATH; with none, the error names every
// place tried, and a file that is not executable does not count.
func TestFindPrefixd(t *testing.T) {
	executable := func(dir string) string {
		path := filepath.Join(dir, "prefixd")
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	bin, onPath, empty := t.TempDir(), t.TempDir(), t.TempDir()
	self := filepath.Join(bin, "prefixd-bench")
	next, found := executable(bin), executable(onPath)
	elsewhere := executable(t.TempDir())

	t.Setenv("PATH", onPath)
	for _, c := range []struct {
		name, flag, self, want string
	}{
		{"flag", elsewhere, self, elsewhere},
		{"flag by name on PATH", "prefixd", filepath.Join(empty, "prefixd-bench"), found},
		{"next to the executable", "", self, next},
		{"on PATH", "", filepath.Join(empty, "prefixd-bench"), found},
		{"on PATH, executable unknown", "", "", found},
	} {
		got, err := findPrefixd(c.flag, c.self)
		if err != nil || got != c.want {
			t.Errorf("%s: findPrefixd(%q, %q) = %q, %v; want %q", c.name, c.flag, c.self, got, err, c.want)
		}
	}

	t.Setenv("PATH", empty)
	if err := os.WriteFile(filepath.Join(empty, "prefixd"), []byte("not a program"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := findPrefixd("", filepath.Join(empty, "prefixd-bench"))
	for _, want := range []string{filepath.Join(empty, "prefixd"), "prefixd on PATH", "--prefixd"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("nothing to find: error %v, want one naming %q", err, want)
		}
	}
	_, err = findPrefixd("", "")
	if err == nil || !strings.Contains(err.Error(), "next to this executable (its path unknown)") {
		t.Errorf("nothing to find, executable unknown: error %v", err)
	}
	missing := filepath.Join(empty, "no-such-prefixd")
	if _, err := findPrefixd(missing, self); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("--prefixd %s: error %v, want one naming it", missing, err)
	}
}

// TestSoakNeedsPrefixd: the soak refuses a --prefixd that is not there
// before it starts anything, naming the flag and the path.
func TestSoakNeedsPrefixd(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "prefixd")
	checkError(t, []string{"soak", "--prefixd", missing}, "--prefixd: exec: \""+missing+"\"")
}
