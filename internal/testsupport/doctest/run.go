package doctest

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Limits of a block's run.
const (
	// Settle is how long a command may keep failing, or printing other
	// than its transcript shows, before the block fails: the daemons a
	// block starts in the background take a moment to serve, register and
	// index, as they do for a reader at a terminal. A command is run again
	// every RetryEvery until then.
	Settle     = 30 * time.Second
	RetryEvery = 100 * time.Millisecond
	// CommandTimeout bounds one run of one command.
	CommandTimeout = 20 * time.Second
)

// RunShell runs a shell block's steps in s, in order. A background step
// is started once; any other step is run until it exits 0 and, in a
// transcript, prints what the block shows, for up to Settle.
func RunShell(ctx context.Context, s *Session, b Block) error {
	steps, err := Steps(b)
	if err != nil {
		return err
	}
	for _, st := range steps {
		if err := runStep(ctx, s, b, st); err != nil {
			return err
		}
	}
	return nil
}

func runStep(ctx context.Context, s *Session, b Block, st Step) error {
	where := fmt.Sprintf("%s:%d", b.File, st.Line)
	settle := Settle
	if s.Settle > 0 {
		settle = s.Settle
	}
	deadline := time.Now().Add(settle)
	tick := time.NewTicker(RetryEvery)
	defer tick.Stop()
	var first Result // a command that changes state shows why it failed on its first run
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, CommandTimeout)
		r, err := s.Run(cctx, st.Command)
		cancel()
		if attempt == 1 {
			first = r
		}
		if err != nil {
			return fmt.Errorf("%s: %s\n%v; it printed:\n%s", where, st.Command, err, clip(r.Output))
		}
		switch {
		case st.Background && r.Status != 0:
			return fmt.Errorf("%s: %s\ncould not be started (exit %d):\n%s", where, st.Command, r.Status, clip(r.Output))
		case st.Background:
			return nil
		case r.Status == 0 && (!st.Check || Match(st.Want, r.Output)):
			return nil
		case time.Now().After(deadline):
			what := fmt.Sprintf("exit status %d", r.Status)
			if r.Status == 0 {
				what = "output differs"
			}
			err := fmt.Errorf("%s: %s\n%s after %d runs in %v; want:\n%s\ngot:\n%s", where, st.Command, what, attempt, settle,
				strings.Join(st.Want, "\n"), clip(r.Output))
			if first != r {
				err = fmt.Errorf("%w\nthe first run (exit %d) printed:\n%s", err, first.Status, clip(first.Output))
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// RunPython runs a python block in s, once, with python3; it must exit 0.
func RunPython(ctx context.Context, s *Session, b Block) error {
	f := filepath.Join(s.dir, fmt.Sprintf("block-%d.py", b.Line))
	if err := os.WriteFile(f, []byte(b.Text), 0o644); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	r, err := s.Run(cctx, "python3 "+shellQuote(f))
	if err == nil && r.Status != 0 {
		err = fmt.Errorf("exit status %d", r.Status)
	}
	if err != nil {
		return fmt.Errorf("%s: python3: %v; it printed:\n%s", b.Where(), err, clip(r.Output))
	}
	return nil
}

// clip keeps the end of a long output, where what went wrong is.
func clip(s string) string {
	const max = 4 << 10
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}

// Examples returns, for every Example function with an output comment
// (which go test runs and checks) in the *_test.go files under root, its
// name and its body's source.
func Examples(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), "func Example") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, ex := range doc.Examples(f) {
			if ex.Output == "" && !ex.EmptyOutput {
				continue // compiled, never run
			}
			body, ok := ex.Code.(*ast.BlockStmt)
			if !ok {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			out[rel+": Example"+prefixed(ex.Name)] = string(src[fset.Position(body.Lbrace).Offset+1 : fset.Position(body.Rbrace).Offset])
		}
		return nil
	})
	return out, err
}

func prefixed(name string) string {
	if name == "" {
		return ""
	}
	return "_" + name
}

// CheckGo checks a go block: it must be an excerpt of one of examples (as
// Examples returns them), its lines in order and next to each other, their
// indentation and blank lines aside, so the code a document shows is code
// go test runs.
func CheckGo(b Block, examples map[string]string) error {
	want := codeLines(b.Text)
	if len(want) == 0 {
		return fmt.Errorf("%s: an empty go block", b.Where())
	}
	for _, body := range examples {
		got := codeLines(body)
		for i := 0; i+len(want) <= len(got); i++ {
			if equal(got[i:i+len(want)], want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%s: the go block is not an excerpt of any Example function with an output comment (go test runs those); its first line: %q", b.Where(), want[0])
}

func codeLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func equal(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var requestLine = regexp.MustCompile(`^(GET|POST|PUT|DELETE) /\S*\n`)

// CheckJSON checks a json block: a JSON value, or one member of an object
// (`"name": value`), optionally after an HTTP request line (`POST
// /register`).
func CheckJSON(b Block) error {
	t := requestLine.ReplaceAllString(b.Text, "")
	if strings.HasPrefix(strings.TrimSpace(t), `"`) {
		t = "{" + t + "}"
	}
	var v any
	if err := json.Unmarshal([]byte(t), &v); err != nil {
		return fmt.Errorf("%s: not JSON: %v", b.Where(), err)
	}
	return nil
}

var commandLike = regexp.MustCompile(`(?m)^(\$ |(bin/)?prefixd |curl |go (run|test|build|get) |make |kubectl |python3? )`)

// CheckText checks a block that is not run: a bare fence holding what
// looks like a command fails, as a command should say sh (or sh no-run:
// why), and a text block must not hold a transcript.
func CheckText(b Block) error {
	switch {
	case b.Lang == "" && commandLike.MatchString(b.Text):
		return fmt.Errorf("%s: a bare fence holds a command (%q): say sh, sh no-run: <why>, or text if it is not one",
			b.Where(), commandLike.FindString(b.Text))
	case b.Lang == Text && strings.HasPrefix(b.Text, "$ "):
		return fmt.Errorf("%s: a text block holds a transcript: say sh", b.Where())
	}
	return nil
}
