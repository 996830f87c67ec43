package doctest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDocs runs every fenced block of README.md and docs/*.md that runs
// (docs/README.md says how): each shell and python block in a session of
// its own, or in the previous block's with "continued", against the
// processes the blocks start; each go block must be an excerpt of an
// Example function that go test runs; json blocks must parse; a bare fence
// must hold no command.
func TestDocs(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	// The documents' commands run bin/prefixd (README.md builds it with
	// make build); make it current first, so that no session waits for it.
	if out, err := exec.Command("make", "-C", root, "-s", "build").CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	// The sessions have no network: docs/client.md's go mod tidy takes the
	// modules it needs (the tests of dependencies' imports included, which
	// no build of prefixd downloads) from the module cache. Tidy such a
	// module here first, where the module proxy can be reached.
	warm := t.TempDir()
	if err := os.WriteFile(filepath.Join(warm, "go.mod"), []byte("module example.com/warm\n\ngo 1.26\n\nrequire github.com/prefixd/prefixd v0.0.0\n\nreplace github.com/prefixd/prefixd => "+root+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(warm, "main.go"), []byte("package main\n\nimport _ \"github.com/prefixd/prefixd/client\"\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tidy := exec.Command("go", "mod", "tidy")
	tidy.Dir = warm
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy of a module that imports the client: %v\n%s", err, out)
	}
	// Its workspace form loads prefixd's whole module graph, the
	// requirements no build on this platform downloads included (e.g. a
	// Windows-only one of cobra's): build it here too, as the document does.
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte("module example.com/warmwork\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "main.go"), []byte("package main\n\nimport _ \"github.com/prefixd/prefixd/client\"\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"work", "init", ".", root}, {"build", "-o", os.DevNull, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a workspace with prefixd: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	examples, err := Examples(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := NetnsSupported(); err != nil {
		t.Logf("sessions share the machine's network (%v): the documents' ports must be free", err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		rel, _ := filepath.Rel(root, path)
		t.Run(filepath.Base(rel), func(t *testing.T) {
			t.Parallel()
			runDocument(t, root, rel, examples)
		})
	}
}

// documentTimeout bounds one document's blocks.
const documentTimeout = 2 * time.Minute

func runDocument(t *testing.T, root, rel string, examples map[string]string) {
	src, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Parse(rel, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), documentTimeout)
	defer cancel()
	var s *Session
	for _, b := range blocks {
		switch {
		case b.NoRun != "":
			t.Logf("%s: %s block not run: %s", b.Where(), b.Lang, b.NoRun)
			continue
		case b.Lang == Go:
			if err := CheckGo(b, examples); err != nil {
				t.Error(err)
			}
			continue
		case b.Lang == JSON:
			if err := CheckJSON(b); err != nil {
				t.Error(err)
			}
			continue
		case b.Lang != Shell && b.Lang != Python:
			if err := CheckText(b); err != nil {
				t.Error(err)
			}
			continue
		case b.Continued && s == nil:
			t.Fatalf("%s: continued, but no block runs before it", b.Where())
		case !b.Continued:
			s = newSession(t, root)
		}
		run := RunShell
		if b.Lang == Python {
			run = RunPython
		}
		if err := run(ctx, s, b); err != nil {
			t.Fatalf("%v\nthe session's background commands printed:\n%s", err, s.Background())
		}
	}
}

// newSession starts a session at the repository's root, with bin on PATH,
// its own temporary directory (TMPDIR) and the embedded etcd's data in it
// (PREFIXD_DATA_DIR), and the Go module proxy and checksum database off
// (a session has no network: modules come from the module cache); the test's cleanup
// stops it.
func newSession(t *testing.T, root string) *Session {
	t.Helper()
	tmp := t.TempDir()
	env := append(os.Environ(),
		"PATH="+filepath.Join(root, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PREFIXD_DATA_DIR="+filepath.Join(tmp, "prefixd-data"),
		"GOPROXY=off", "GOSUMDB=off")
	s, err := Start(Options{Dir: root, Temp: tmp, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("stop the session: %v\n%s", err, s.Background())
		}
	})
	return s
}
