package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestIndexDemoCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs([]string{"index-demo", "--workers", "8", "--entries", "20000", "--churn", "5000", "--queries", "100", "--era", "array"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("index-demo: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "index == engine truth") {
		t.Fatalf("no verdict in output:\n%s", out.String())
	}
}

func TestIndexDemoRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"index-demo", "--era", "yaml"},
		{"index-demo", "--queries", "0"},
		{"index-demo", "--workers", "0"},
	} {
		var out, errOut bytes.Buffer
		cmd := newRootCommand(&out, &errOut)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}
