package doctest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	src := "# t\n\n```sh\necho a\n```\n\n- item\n\n  ```sh continued\n  echo b\n  ```\n\n```\ndiagram\n```\n\n```sh no-run: needs a GPU\nvllm serve\n```\n````text\n```\n````\n"
	blocks, err := Parse("t.md", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{File: "t.md", Line: 3, Lang: Shell, Text: "echo a\n"},
		{File: "t.md", Line: 9, Lang: Shell, Continued: true, Text: "echo b\n"},
		{File: "t.md", Line: 13, Lang: "", Text: "diagram\n"},
		{File: "t.md", Line: 17, Lang: Shell, NoRun: "needs a GPU", Text: "vllm serve\n"},
		{File: "t.md", Line: 20, Lang: Text, Text: "```\n"},
	}
	if len(blocks) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(blocks), blocks, len(want))
	}
	for i := range want {
		if blocks[i] != want[i] {
			t.Errorf("block %d: got %+v, want %+v", i, blocks[i], want[i])
		}
	}
}

func TestParseErrors(t *testing.T) {
	for src, want := range map[string]string{
		"```sh\necho\n":                          "t.md:1: the fence is never closed",
		"```bash\necho\n```\n":                   `t.md:1: unknown block kind "bash"`,
		"```sh no-run:\necho\n```\n":             "no-run needs a reason",
		"```sh skip\necho\n```\n":                "want <kind> [continued] [no-run: <reason>]",
		"```sh continued no-run: x\necho\n```\n": "continues nothing",
	} {
		_, err := Parse("t.md", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", src, err, want)
		}
	}
}

func TestStepsTranscript(t *testing.T) {
	b := Block{File: "t.md", Line: 10, Lang: Shell, Text: "$ serve &\n$ curl -s x \\\n    -d '{}'   # 404\n{\"a\":1,\n \"b\":2}\n\n$ true\n"}
	steps, err := Steps(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 3 {
		t.Fatalf("got %d steps: %+v", len(steps), steps)
	}
	if s := steps[0]; !s.Background || s.Check || s.Line != 11 {
		t.Errorf("step 0: %+v", s)
	}
	if s := steps[1]; s.Background || !s.Check || s.Line != 12 || s.Command != "curl -s x \\\n    -d '{}'   # 404" || len(s.Want) != 1 || s.Want[0] != `{"a":1,"b":2}` {
		t.Errorf("step 1: %+v", s)
	}
	if s := steps[2]; s.Check || s.Line != 17 {
		t.Errorf("step 2: %+v", s)
	}
}

func TestStepsScript(t *testing.T) {
	b := Block{File: "t.md", Line: 1, Lang: Shell, Text: "# a comment\nX=1 &&\n  echo $X\ncat >f <<'EOF'\n$ not a prompt here\nEOF\nserve & # starts\n"}
	steps, err := Steps(b)
	if err == nil {
		// "$ " inside a here-document makes the block a transcript, which
		// it is not: a transcript's output under no command is an error.
		t.Fatalf("got %+v, want an error", steps)
	}
	b.Text = strings.Replace(b.Text, "$ not", "not", 1)
	steps, err = Steps(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"X=1 &&\n  echo $X", "cat >f <<'EOF'\nnot a prompt here\nEOF", "serve & # starts"}
	if len(steps) != len(want) {
		t.Fatalf("got %+v", steps)
	}
	for i := range want {
		if steps[i].Command != want[i] || steps[i].Check {
			t.Errorf("step %d: %+v, want command %q", i, steps[i], want[i])
		}
	}
	if !steps[2].Background || steps[0].Background {
		t.Errorf("background: %+v", steps)
	}
	if _, err := Steps(Block{File: "t.md", Line: 1, Text: "echo 'open\n"}); err == nil {
		t.Error("an unterminated quote: want an error")
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		want []string
		got  string
		ok   bool
	}{
		{[]string{"a"}, "a\n", true},
		{[]string{"a"}, "b\n", false},
		{[]string{"a", "b"}, "a\n", false},
		{[]string{"a…c"}, "abbbc", true},
		{[]string{"a…c"}, "abbbcd", false},
		{[]string{"…"}, "", true},
		{[]string{"{…,\"x\":1,…}"}, `{"a":2,"x":1,"b":3}`, true},
		{[]string{"{…,\"x\":1,…}"}, `{"a":2,"x":2,"b":3}`, false},
		{[]string{"ab…bc"}, "abc", false},
		{[]string{"1  active  …"}, "1  active  -   0\n", true},
	} {
		if got := Match(c.want, c.got); got != c.ok {
			t.Errorf("Match(%q, %q) = %v, want %v", c.want, c.got, got, c.ok)
		}
	}
}

func TestCheckGo(t *testing.T) {
	examples := map[string]string{"x_test.go: Example": "\n\tc := f()\n\n\tif c {\n\t\treturn\n\t}\n"}
	if err := CheckGo(Block{Text: "c := f()\nif c {\n    return\n}\n"}, examples); err != nil {
		t.Error(err)
	}
	if err := CheckGo(Block{File: "t.md", Line: 3, Text: "c := g()\n"}, examples); err == nil {
		t.Error("a block in no example: want an error")
	}
}

func TestCheckJSONAndText(t *testing.T) {
	for text, ok := range map[string]bool{
		"POST /register\n{\"a\": 1}\n":     true,
		"\"kv\": {\"a\": null}\n":          true,
		"[1, 2]\n":                         true,
		"{\"a\": 1,}\n":                    false,
		"GET /workers?m=x\n[{\"a\": 1}]\n": true,
	} {
		if err := CheckJSON(Block{Text: text}); (err == nil) != ok {
			t.Errorf("CheckJSON(%q) = %v", text, err)
		}
	}
	for b, ok := range map[Block]bool{
		{Text: " etcd ──▶ catalog\n"}:                   true,
		{Text: "bin/prefixd serve\n"}:                   false,
		{Text: "x\n$ curl -s localhost:8090/health\n"}:  false,
		{Lang: Text, Text: "prefixd status [--once]\n"}: true,
		{Lang: Text, Text: "$ echo\n"}:                  false,
	} {
		if err := CheckText(b); (err == nil) != ok {
			t.Errorf("CheckText(%+v) = %v", b, err)
		}
	}
}

func newTestSession(t *testing.T) *Session {
	t.Helper()
	s, err := Start(Options{Dir: t.TempDir(), Temp: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSession runs commands in one shell: state carries over, each
// command's output is its own, a background job's output stays out of
// later commands', and Close stops the job.
func TestSession(t *testing.T) {
	s := newTestSession(t)
	ctx := t.Context()
	run := func(cmd string) Result {
		t.Helper()
		r, err := s.Run(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	run("export X=1; cd /")
	if r := run("(while :; do echo noise; sleep 0.01; done) &"); r.Status != 0 {
		t.Fatalf("start a job: %+v", r)
	}
	if r := run("echo $X $PWD; echo err >&2"); r.Output != "1 /\nerr\n" || r.Status != 0 {
		t.Errorf("got %+v", r)
	}
	if r := run("exit_with() { return $1; }; exit_with 3"); r.Status != 3 {
		t.Errorf("status: got %+v", r)
	}
	if r := run("false | true"); r.Status == 0 {
		t.Error("pipefail: a failed pipeline exited 0")
	}
	if r := run("cat; echo done"); r.Output != "done\n" {
		t.Errorf("a command's stdin is empty: got %q", r.Output)
	}
	if !strings.Contains(s.Background(), "noise") {
		t.Errorf("Background() = %q", s.Background())
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(StopTimeout + 5*time.Second):
		t.Fatal("Close did not return")
	}
}

// TestSessionTimeout: a command past its context's deadline kills the
// session and says so.
func TestSessionTimeout(t *testing.T) {
	s := newTestSession(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Run(ctx, "echo started; sleep 60"); err == nil || !strings.Contains(err.Error(), "not done in time") {
		t.Fatalf("got %v, want not done in time", err)
	}
	_ = s.Close()
}

// TestRunShellFailsOnDifference: a transcript whose output never shows
// fails, naming the line, the command and both outputs.
func TestRunShellFailsOnDifference(t *testing.T) {
	s := newTestSession(t)
	s.Settle = 300 * time.Millisecond
	t.Cleanup(func() { _ = s.Close() })
	b := Block{File: "t.md", Line: 4, Lang: Shell, Text: "$ echo ok\nok\n$ echo no\nyes\n"}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := RunShell(ctx, s, b)
	if err == nil || !strings.Contains(err.Error(), "t.md:7: echo no") || !strings.Contains(err.Error(), "want:\nyes\ngot:\nno") {
		t.Fatalf("got %v", err)
	}
}
