package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// run executes the command tree in-process with args and returns what it
// wrote to stdout and stderr.
func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestVersion(t *testing.T) {
	stdout, stderr, err := run(t, "version")
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	if stderr != "" {
		t.Errorf("version wrote to stderr: %q", stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("version printed %d lines, want 3:\n%s", len(lines), stdout)
	}
	if !strings.HasPrefix(lines[0], "prefixd ") || len(lines[0]) == len("prefixd ") {
		t.Errorf("line 1 = %q, want \"prefixd <version>\"", lines[0])
	}
	if want := "go: " + runtime.Version(); lines[1] != want {
		t.Errorf("line 2 = %q, want %q", lines[1], want)
	}
	if !strings.HasPrefix(lines[2], "revision: ") {
		t.Errorf("line 3 = %q, want \"revision: …\"", lines[2])
	}
}

func TestVersionRejectsArgs(t *testing.T) {
	if _, _, err := run(t, "version", "extra"); err == nil {
		t.Fatal("version extra: want an error, got nil")
	}
}

func TestUnknownCommand(t *testing.T) {
	_, _, err := run(t, "no-such-command")
	if err == nil {
		t.Fatal("want an error for an unknown command, got nil")
	}
}

func TestUnknownFlagPointsAtHelp(t *testing.T) {
	_, _, err := run(t, "version", "--no-such-flag")
	if err == nil {
		t.Fatal("want an error for an unknown flag, got nil")
	}
	if !strings.Contains(err.Error(), "prefixd version --help") {
		t.Errorf("error %q does not point at \"prefixd version --help\"", err)
	}
}

func TestHelpListsVersion(t *testing.T) {
	stdout, _, err := run(t, "--help")
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(stdout, "version") {
		t.Errorf("--help does not list the version command:\n%s", stdout)
	}
}

// TestVersionLDFlags builds the real binary with -X main.version and runs it,
// so a rename of the variable cannot silently break release stamping.
func TestVersionLDFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	goTool, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "prefixd")
	build := exec.Command(goTool, "build", "-buildvcs=false", "-ldflags", "-X main.version=v9.8.7-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("prefixd version: %v\n%s", err, out)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != "prefixd v9.8.7-test" {
		t.Errorf("first line = %q, want %q", first, "prefixd v9.8.7-test")
	}
}
