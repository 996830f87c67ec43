package cursor

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of cursor scenario files")

// TestCursorScenarios runs every testdata/*.txt scenario: each
// command drives the Cursor, and the block under "----" is the actions it
// must return followed by its state. Run with -rewrite to regenerate.
//
// Commands (times in ms since the start, kept until changed):
//
//	config replay=true|false seqbase=N maxbuf=N maxbytes=N attempts=N deadline=MS backoff=MS
//	connect [t=MS]          disconnect
//	live seq=N [p=PAYLOAD] [t=MS]        (default payload "b<seq>")
//	rbatch seq=N [p=PAYLOAD] [a=N] [t=MS]  a replay batch message of attempt a (default: the latest)
//	rend [a=N] [t=MS]                      the replay end marker
//	rfail [a=N] [t=MS]                     the attempt ended incomplete (timeout, EOF)
//	cleared                              the last applied batch held AllBlocksCleared
//	corrupt                              the last applied batch could not be decoded (or lost a remove)
//	degrade                              the last applied batch left out stores it could not decode
//	probe [t=MS]                         the live socket has been quiet
//	expire [t=MS]                        the session deadline timer fired
//	waited ms=N                          an attempt waited N ms for a replay slot
//	deadline                             print the session deadline (ms since the start) or "none"
//	resume seq=N [p=PAYLOAD] [degraded=true]  state restored from a peer up to seq N (digest of the payload), degraded there or not
//	stats
func TestCursorScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenario struct {
	c   *Cursor
	t0  time.Time
	now time.Time
}

func runScenario(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := &scenario{t0: time.Unix(1_000_000, 0)}
	sc.now = sc.t0
	sc.c = New(Config{HasReplay: true})
	lines := bufio.NewScanner(strings.NewReader(string(raw)))
	lineNo := 0
	next := func() (string, bool) {
		if !lines.Scan() {
			return "", false
		}
		lineNo++
		return lines.Text(), true
	}
	commands := 0
	for {
		line, ok := next()
		if !ok {
			break
		}
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		cmdLine := lineNo
		var want []string
		sep, ok := next()
		if !ok || sep != "----" {
			t.Fatalf("%s:%d: command %q not followed by ----", path, cmdLine, line)
		}
		for {
			l, ok := next()
			if !ok || l == "" {
				break
			}
			want = append(want, l)
		}
		got := sc.do(t, path, cmdLine, line)
		commands++
		out.WriteString(line + "\n----\n")
		for _, g := range got {
			out.WriteString(g + "\n")
		}
		out.WriteString("\n")
		if !*rewrite && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\n got:\n  %s\n want:\n  %s", path, cmdLine, line,
				strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if commands == 0 {
		t.Fatalf("%s: no commands", path)
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (sc *scenario) do(t *testing.T, path string, lineNo int, line string) []string {
	fields := strings.Fields(line)
	args := map[string]string{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("%s:%d: argument %q is not key=value", path, lineNo, f)
		}
		args[k] = v
	}
	num := func(k string, def uint64) uint64 {
		v, ok := args[k]
		if !ok {
			return def
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s:%d: %s=%q: %v", path, lineNo, k, v, err)
		}
		return n
	}
	if _, ok := args["t"]; ok {
		sc.now = sc.t0.Add(time.Duration(num("t", 0)) * time.Millisecond)
	}
	payload := func(seq uint64) []byte {
		if p, ok := args["p"]; ok {
			return []byte(p)
		}
		return []byte(fmt.Sprintf("b%d", seq))
	}
	var acts []Action
	switch fields[0] {
	case "config":
		cfg := Config{
			HasReplay:        args["replay"] != "false",
			SeqBase:          num("seqbase", 0),
			MaxBuffered:      int(num("maxbuf", 0)),
			MaxBufferedBytes: int(num("maxbytes", 0)),
			MaxAttempts:      int(num("attempts", 0)),
			Deadline:         time.Duration(num("deadline", 0)) * time.Millisecond,
			Backoff:          time.Duration(num("backoff", 0)) * time.Millisecond,
		}
		sc.c = New(cfg)
		return nil
	case "connect":
		acts = sc.c.Connected(sc.now)
	case "disconnect":
		acts = sc.c.Disconnected()
	case "live":
		seq := num("seq", 0)
		acts = sc.c.Live(seq, payload(seq), sc.now)
	case "rbatch":
		seq := num("seq", 0)
		acts = sc.c.ReplayBatch(num("a", sc.c.Attempt()), seq, payload(seq), sc.now)
	case "rend":
		acts = sc.c.ReplayEnd(num("a", sc.c.Attempt()), sc.now)
	case "rfail":
		acts = sc.c.ReplayIncomplete(num("a", sc.c.Attempt()), sc.now)
	case "cleared":
		sc.c.ObserveCleared()
	case "corrupt":
		acts = sc.c.Corrupt()
	case "degrade":
		sc.c.Degrade()
	case "probe":
		acts = sc.c.Probe(sc.now)
	case "expire":
		acts = sc.c.Expire(sc.now)
	case "waited":
		sc.c.Waited(time.Duration(num("ms", 0)) * time.Millisecond)
	case "deadline":
		if at, ok := sc.c.Deadline(); ok {
			return []string{fmt.Sprintf("deadline=%d", at.Sub(sc.t0).Milliseconds())}
		}
		return []string{"deadline=none"}
	case "resume":
		seq := num("seq", 0)
		sc.c.Resume(seq, xxh3.Hash(payload(seq)), args["degraded"] == "true")
	case "stats":
		s := sc.c.Stats()
		line := fmt.Sprintf("gaps=%d dups=%d restarts=%d replays=%d ok=%d failed=%d attempts=%d incomplete=%d overflows=%d verified=%d suspects=%d lost=%d probes=%d peak=%d",
			s.Gaps, s.Duplicates, s.Restarts, s.Replays, s.ReplaysOK, s.ReplaysFailed, s.Attempts, s.Incomplete, s.Overflows, s.Verified, s.Suspects, s.LostHistory, s.Probes, s.BufferedAtPeak)
		if s.Subsets > 0 {
			line += fmt.Sprintf(" subsets=%d", s.Subsets)
		}
		return []string{line}
	default:
		t.Fatalf("%s:%d: unknown command %q", path, lineNo, fields[0])
	}
	var got []string
	for _, a := range acts {
		s := a.String()
		if a.Kind == ActApply && string(a.Payload) != fmt.Sprintf("b%d", a.Seq) {
			s += " p=" + string(a.Payload)
		}
		if a.Kind == ActReplay && !a.At.Equal(sc.now) {
			s += " after=" + a.At.Sub(sc.now).String()
		}
		got = append(got, s)
	}
	return append(got, sc.state())
}

func (sc *scenario) state() string {
	c := sc.c
	applied, live := "-", "-"
	if s, ok := c.Applied(); ok {
		applied = strconv.FormatUint(s, 10)
	}
	if s, ok := c.LastLive(); ok {
		live = strconv.FormatUint(s, 10)
	}
	return fmt.Sprintf("state: mode=%v applied=%s live=%s degraded=%v buffered=%d", c.Mode(), applied, live, c.Degraded(), c.Buffered())
}
