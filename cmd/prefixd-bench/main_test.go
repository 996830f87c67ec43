package main

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport/importcheck"
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

// checkError runs args, bounded in case they start running, and checks
// that they fail with an error mentioning want.
func checkError(t *testing.T, args []string, want string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%v: error %v, want one mentioning %q", args, err, want)
	}
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
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "prefixd-bench ") || lines[1] != "go: "+runtime.Version() {
		t.Errorf("version printed:\n%s\nwant prefixd-bench <version>, go: %s, revision: …", stdout, runtime.Version())
	}
}

// TestHelpListsTheLab: the lab's subcommands are here, and the daemon's
// are not (they are prefixd's).
func TestHelpListsTheLab(t *testing.T) {
	stdout, _, err := run(t, "--help")
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"routing", "index", "index-demo", "soak", "version"} {
		if !strings.Contains(stdout, "\n  "+want+" ") {
			t.Errorf("--help does not list %s:\n%s", want, stdout)
		}
	}
	if _, _, err := run(t, "serve"); err == nil {
		t.Error("serve: no error, want an unknown command")
	}
}

func TestUnknownFlagPointsAtHelp(t *testing.T) {
	checkError(t, []string{"routing", "--no-such-flag"}, "prefixd-bench routing --help")
}

// TestBinaryShipsNoTestSupport: the lab's binary, too, links no fake
// store, test harness or package testing.
func TestBinaryShipsNoTestSupport(t *testing.T) {
	importcheck.NoTestSupport(t, "github.com/prefixd/prefixd/cmd/prefixd-bench")
}
