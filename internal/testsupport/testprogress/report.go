package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json`: a test event (test2json's
// TestEvent) or, for a package that does not build, a build event
// (ImportPath, Action build-output or build-fail).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	FailedBuild string
	ImportPath  string
}

// reporter turns the events into the lines testprogress prints. It is
// driven by its caller, with the time passed in, and does no I/O but
// writing to w. It is not safe for concurrent use.
type reporter struct {
	w     io.Writer
	begin time.Time

	// running holds the packages started and not finished, by import path.
	running map[string]*pkgRun

	// passed, skipped and failed count the packages finished.
	passed, skipped, failed int
	// failures names what failed, in order, for the closing summary:
	// "pkg TestX", "pkg TestX (unfinished)", "pkg" or "pkg [build failed]".
	failures []string
	// builds counts the build-fail events.
	builds int
	// events counts the JSON events read: none at all is an error.
	events int
}

// pkgRun is a package's test binary while it runs.
type pkgRun struct {
	path  string
	start time.Time
	// out is the output outside any test: the PASS/FAIL lines, the result
	// line, a TestMain's prints, a timeout's dump.
	out bytes.Buffer
	// tests holds the top-level tests started and not finished, with the
	// output of their subtests; a test that passes is dropped.
	tests map[string]*testRun
	// failed is set when one of its tests failed.
	failed bool
}

type testRun struct {
	start time.Time
	out   bytes.Buffer
}

func newReporter(w io.Writer, now time.Time) *reporter {
	return &reporter{w: w, begin: now, running: map[string]*pkgRun{}}
}

// line takes one line of input, without its newline.
func (r *reporter) line(b []byte, now time.Time) {
	var ev event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &ev) != nil || ev.Action == "" {
		r.printf("%s\n", b)
		return
	}
	r.events++
	switch ev.Action {
	case "build-output":
		r.printf("%s", ev.Output)
		return
	case "build-fail":
		r.builds++
		return
	}
	if ev.Package == "" {
		return
	}
	p := r.running[ev.Package]
	if ev.Action == "start" || p == nil {
		if p != nil {
			return // a second start: go test -json writes one per package
		}
		p = &pkgRun{path: ev.Package, start: now, tests: map[string]*testRun{}}
		r.running[ev.Package] = p
		if ev.Action == "start" {
			return
		}
	}
	if ev.Test == "" {
		r.pkgEvent(p, ev, now)
		return
	}
	top, _, sub := strings.Cut(ev.Test, "/")
	t := p.tests[top]
	switch ev.Action {
	case "run":
		if t == nil {
			p.tests[top] = &testRun{start: now}
		}
	case "output":
		if t == nil {
			// Output of a test that already ended (a goroutine it left
			// behind): the package's.
			p.out.WriteString(ev.Output)
			return
		}
		t.out.WriteString(ev.Output)
	case "pass", "skip":
		if !sub {
			delete(p.tests, top)
		}
	case "fail":
		if sub || t == nil {
			return // the top-level test fails too, with all the output
		}
		delete(p.tests, top)
		p.failed = true
		r.failures = append(r.failures, p.path+" "+top)
		r.printf("%s", t.out.Bytes())
	}
}

// pkgEvent handles an event of the package itself.
func (r *reporter) pkgEvent(p *pkgRun, ev event, now time.Time) {
	switch ev.Action {
	case "output":
		p.out.WriteString(ev.Output)
	case "pass", "skip":
		delete(r.running, p.path)
		if ev.Action == "pass" {
			r.passed++
		} else {
			r.skipped++
		}
		printed := false
		for l := range strings.Lines(p.out.String()) {
			if strings.HasPrefix(l, "ok  \t") || strings.HasPrefix(l, "?   \t") {
				r.printf("%s", l)
				printed = true
			}
		}
		if !printed {
			r.printf("ok  \t%s\t%.3fs\n", p.path, now.Sub(p.start).Seconds())
		}
	case "fail":
		delete(r.running, p.path)
		r.failPackage(p, ev.FailedBuild != "")
	}
}

// failPackage prints what a failed package left: the output of its
// unfinished tests, oldest first, then its own.
func (r *reporter) failPackage(p *pkgRun, build bool) {
	r.failed++
	for _, name := range p.testsByAge() {
		r.printf("%s", p.tests[name].out.Bytes())
		r.failures = append(r.failures, p.path+" "+name+" (unfinished)")
		p.failed = true
	}
	switch {
	case build:
		r.failures = append(r.failures, p.path+" [build failed]")
	case !p.failed:
		r.failures = append(r.failures, p.path)
	}
	r.printf("%s", p.out.Bytes())
}

// testsByAge returns the names of the package's unfinished top-level
// tests, the longest-running first.
func (p *pkgRun) testsByAge() []string {
	names := make([]string, 0, len(p.tests))
	for name := range p.tests {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := p.tests[a].start.Compare(p.tests[b].start); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return names
}

// tick prints the progress line: how long the run has gone on, how many
// packages finished, and each running package with its time and its
// longest-running test.
func (r *reporter) tick(now time.Time) {
	var b strings.Builder
	fmt.Fprintf(&b, "... %s: %d packages done", since(r.begin, now), r.passed+r.skipped+r.failed)
	if len(r.running) == 0 {
		b.WriteString("; none running (building)")
		r.printf("%s\n", b.String())
		return
	}
	pkgs := make([]*pkgRun, 0, len(r.running))
	for _, p := range r.running {
		pkgs = append(pkgs, p)
	}
	slices.SortFunc(pkgs, func(a, b *pkgRun) int {
		if c := a.start.Compare(b.start); c != 0 {
			return c
		}
		return strings.Compare(a.path, b.path)
	})
	b.WriteString("; running:")
	for i, p := range pkgs {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s %s", p.path, since(p.start, now))
		if names := p.testsByAge(); len(names) > 0 {
			fmt.Fprintf(&b, " (%s %s", names[0], since(p.tests[names[0]].start, now))
			if len(names) > 1 {
				fmt.Fprintf(&b, ", %d more", len(names)-1)
			}
			b.WriteString(")")
		}
	}
	r.printf("%s\n", b.String())
}

// finish ends the run at the end of the input: the packages still
// running are reported unfinished, and a summary follows. It returns
// whether everything passed.
func (r *reporter) finish(now time.Time) bool {
	for _, path := range sortedKeys(r.running) {
		p := r.running[path]
		delete(r.running, path)
		r.printf("testprogress: %s did not finish\n", path)
		r.failPackage(p, false)
	}
	ok := len(r.failures) == 0 && r.failed == 0 && r.builds == 0 && r.events > 0
	var b strings.Builder
	fmt.Fprintf(&b, "testprogress: %d packages: %d ok, %d without tests, %d failed, in %s\n",
		r.passed+r.skipped+r.failed, r.passed, r.skipped, r.failed, since(r.begin, now))
	for _, f := range r.failures {
		fmt.Fprintf(&b, "FAIL %s\n", f)
	}
	if r.events == 0 {
		b.WriteString("testprogress: no test events in the input (is it go test -json?)\n")
	}
	r.printf("%s", b.String())
	return ok
}

func (r *reporter) printf(format string, args ...any) {
	fmt.Fprintf(r.w, format, args...)
}

// since is the time from t to now, to the second.
func since(t, now time.Time) time.Duration {
	return now.Sub(t).Round(time.Second)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
