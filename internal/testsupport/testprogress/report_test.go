package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the testdata streams")

// TestStreams feeds each testdata/*.jsonl, a stream recorded from
// `go test -json` (Go 1.26) on small packages written for the case, to a
// reporter and compares what it prints, with its verdict, to the .golden
// file beside it. Run with -rewrite to regenerate the .golden files.
//
// Each event is handled at its own Time (an event without one, such as a
// build event, at the time of the one before), and the reporter ticks
// every 20 s from the first event's time, as the command's ticker would.
//
//	pass      a passing package (output, a skipped subtest, a skipped test) and one without tests
//	fail      a failed subtest fails its parent; the tests around it pass
//	panic     a test panics: its output with the trace, the tests after it never run
//	build     a test file that does not compile, one that go vet rejects, and a
//	          broken package that two test packages import
//	exit      a test calls os.Exit: no test fails, the package does
//	parallel  two parallel tests, one failing, and a serial one
//	timeout   go test -timeout 2s with a test that blocks: the dump is the test's
//	race      go test -race with a data race in one test
//	slow      two packages of two 45 s tests each (recorded at 1.5 s and
//	          stretched 30 times: times, Elapsed and durations in the output)
func TestStreams(t *testing.T) {
	files, err := filepath.Glob("testdata/*.jsonl")
	if err != nil || len(files) == 0 {
		t.Fatalf("no streams: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".jsonl"), func(t *testing.T) {
			got := replay(t, f, 20*time.Second)
			golden := strings.TrimSuffix(f, ".jsonl") + ".golden"
			if *rewrite {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("%s: got\n%s\nwant\n%s", f, got, want)
			}
		})
	}
}

// replay runs the stream in path through a reporter on the stream's own
// clock and returns its output and verdict.
func replay(t *testing.T, path string, every time.Duration) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	var times []time.Time
	var now time.Time
	for l := range bytes.Lines(raw) {
		l = bytes.TrimSuffix(l, []byte("\n"))
		var ev struct{ Time time.Time }
		if err := json.Unmarshal(l, &ev); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if now.IsZero() && !ev.Time.IsZero() {
			// The clock starts at the first time, even for the build
			// events before it, which have none.
			for i := range times {
				times[i] = ev.Time
			}
		}
		if !ev.Time.IsZero() {
			now = ev.Time
		}
		lines, times = append(lines, l), append(times, now)
	}
	if len(lines) == 0 || now.IsZero() {
		t.Fatalf("%s: no event with a time", path)
	}
	var out strings.Builder
	r := newReporter(&out, times[0])
	next := times[0].Add(every)
	for i, l := range lines {
		for !next.After(times[i]) {
			r.tick(next)
			next = next.Add(every)
		}
		r.line(l, times[i])
	}
	fmt.Fprintf(&out, "passed: %v\n", r.finish(now))
	return out.String()
}

// TestTick: the progress line before any package runs, and with a package
// whose tests run in parallel.
func TestTick(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var out strings.Builder
	r := newReporter(&out, t0)
	r.tick(t0.Add(20 * time.Second))
	at := func(s int, line string) { r.line([]byte(line), t0.Add(time.Duration(s)*time.Second)) }
	at(25, `{"Action":"start","Package":"p"}`)
	at(26, `{"Action":"run","Package":"p","Test":"TestA"}`)
	at(26, `{"Action":"pause","Package":"p","Test":"TestA"}`)
	at(27, `{"Action":"run","Package":"p","Test":"TestB"}`)
	at(27, `{"Action":"run","Package":"p","Test":"TestB/sub"}`)
	at(28, `{"Action":"run","Package":"p","Test":"TestC"}`)
	at(28, `{"Action":"pass","Package":"p","Test":"TestB/sub"}`)
	r.tick(t0.Add(40 * time.Second))
	at(50, `{"Action":"pass","Package":"p","Test":"TestA"}`)
	r.tick(t0.Add(60 * time.Second))
	want := "... 20s: 0 packages done; none running (building)\n" +
		"... 40s: 0 packages done; running: p 15s (TestA 14s, 2 more)\n" +
		"... 1m0s: 0 packages done; running: p 35s (TestB 33s, 1 more)\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestNotJSON: a line that is not an event is copied as it is, and input
// without any event fails the run.
func TestNotJSON(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var out strings.Builder
	r := newReporter(&out, t0)
	for _, l := range []string{"go: finding module", "", "{not json", `{"Package":"p"}`} {
		r.line([]byte(l), t0)
	}
	if r.finish(t0) {
		t.Error("finish passed input without events")
	}
	want := "go: finding module\n\n{not json\n{\"Package\":\"p\"}\n" +
		"testprogress: 0 packages: 0 ok, 0 without tests, 0 failed, in 0s\n" +
		"testprogress: no test events in the input (is it go test -json?)\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestUnfinishedPackage: input that ends while a package runs (go test
// killed) fails, with the package's output so far.
func TestUnfinishedPackage(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var out strings.Builder
	r := newReporter(&out, t0)
	for _, l := range []string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
	} {
		r.line([]byte(l), t0)
	}
	if r.finish(t0.Add(time.Minute)) {
		t.Error("finish passed a package that did not finish")
	}
	want := "testprogress: p did not finish\n=== RUN   TestA\n" +
		"testprogress: 1 packages: 0 ok, 0 without tests, 1 failed, in 1m0s\n" +
		"FAIL p TestA (unfinished)\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestRun: the command prints a progress line while its input is quiet,
// and returns the verdict at the end of the input.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		end  string
		pass bool
	}{
		{`{"Action":"pass","Package":"p","Elapsed":1}`, true},
		{`{"Action":"fail","Package":"p","Elapsed":1}`, false},
	} {
		in, w := io.Pipe()
		var out testsupport.Buffer
		done := make(chan bool, 1)
		go func() { done <- run(in, &out, 5*time.Millisecond) }()
		fmt.Fprintln(w, `{"Action":"start","Package":"p"}`)
		testsupport.Eventually(t, 10*time.Second, "a progress line naming p", func() bool {
			return strings.Contains(out.String(), "running: p ")
		})
		fmt.Fprintln(w, tc.end)
		w.Close()
		select {
		case pass := <-done:
			if pass != tc.pass {
				t.Errorf("%s: run = %v, want %v; output:\n%s", tc.end, pass, tc.pass, out.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("run did not return at the end of its input")
		}
	}
}
