package doctest

import (
	"fmt"
	"os/exec"
	"strings"
)

// Step is one command of a shell block and, in a transcript, what it
// prints.
type Step struct {
	Line    int    // the command's first line in the document
	Command string // as written, continuation lines included
	// Background: the command ends with "&"; it is started, not waited
	// for, and its output is not compared.
	Background bool
	// Want is the output the transcript shows under the command, its
	// lines joined as Match reads them; Check says whether to compare it
	// (a transcript's command with nothing under it prints what it likes).
	Want  []string
	Check bool
}

// Steps splits a shell block into its commands. A block with a line that
// starts with "$ " is a transcript: each "$ " line (and the lines that
// complete it, as bash reads them) is a command, and the lines under it up
// to the next command or blank line are what it prints. Any other block is
// a script: every complete command is a step, comment lines aside. A
// command is complete when bash -n accepts it, so continuation lines,
// quotes and here-documents span lines as they do in a terminal.
func Steps(b Block) ([]Step, error) {
	lines := strings.Split(strings.TrimSuffix(b.Text, "\n"), "\n")
	transcript := false
	for _, l := range lines {
		if strings.HasPrefix(l, "$ ") {
			transcript = true
		}
	}
	var steps []Step
	for i := 0; i < len(lines); {
		l := lines[i]
		switch {
		case strings.TrimSpace(l) == "":
			i++
			continue
		case transcript && !strings.HasPrefix(l, "$ "):
			return nil, fmt.Errorf("%s:%d: output with no command above it", b.File, b.Line+1+i)
		case !transcript && strings.HasPrefix(strings.TrimSpace(l), "#"):
			i++
			continue
		}
		first := i
		cmd := strings.TrimPrefix(l, "$ ")
		for i++; !complete(cmd); i++ {
			if i == len(lines) {
				return nil, fmt.Errorf("%s:%d: the command is never completed: %q", b.File, b.Line+1+first, cmd)
			}
			cmd += "\n" + lines[i]
		}
		s := Step{Line: b.Line + 1 + first, Command: cmd, Background: background(cmd)}
		if transcript {
			var out []string
			for ; i < len(lines) && strings.TrimSpace(lines[i]) != "" && !strings.HasPrefix(lines[i], "$ "); i++ {
				out = append(out, lines[i])
			}
			s.Want, s.Check = joinWrapped(out), len(out) > 0
			if s.Check && s.Background {
				return nil, fmt.Errorf("%s:%d: a command run in the background shows output", b.File, s.Line)
			}
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// complete reports whether bash reads cmd as whole commands.
func complete(cmd string) bool {
	if strings.HasSuffix(strings.TrimRight(cmd, " "), "\\") {
		return false
	}
	var stderr strings.Builder
	c := exec.Command("bash", "-n", "-c", cmd)
	c.Stderr = &stderr
	// bash only warns of a here-document that runs to the end.
	return c.Run() == nil && !strings.Contains(stderr.String(), "here-document")
}

// background reports whether cmd's last command runs in the background.
func background(cmd string) bool {
	last := cmd[strings.LastIndexByte(cmd, '\n')+1:]
	if i := strings.Index(last, " #"); i >= 0 {
		last = last[:i]
	}
	last = strings.TrimSpace(last)
	return strings.HasSuffix(last, "&") && !strings.HasSuffix(last, "&&")
}

// joinWrapped joins the lines of a transcript's output that a document
// wraps: a line that starts with a space continues the one above it, its
// leading spaces dropped, so one line of JSON may be shown on several.
func joinWrapped(lines []string) []string {
	var out []string
	for _, l := range lines {
		if t := strings.TrimLeft(l, " "); t != l && len(out) > 0 {
			out[len(out)-1] += t
			continue
		}
		out = append(out, l)
	}
	return out
}

// Ellipsis in a transcript's output stands for any text within its line.
const Ellipsis = "…"

// Match reports whether got, a command's output, is what want shows: as
// many lines (a trailing newline aside), each equal but for the Ellipses,
// each of which stands for any run of characters of that line.
func Match(want []string, got string) bool {
	g := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if len(g) != len(want) {
		return false
	}
	for i := range want {
		if !matchLine(want[i], strings.TrimRight(g[i], " ")) {
			return false
		}
	}
	return true
}

func matchLine(want, got string) bool {
	parts := strings.Split(want, Ellipsis)
	if len(parts) == 1 {
		return want == got
	}
	if !strings.HasPrefix(got, parts[0]) {
		return false
	}
	got = got[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		j := strings.Index(got, p)
		if j < 0 {
			return false
		}
		got = got[j+len(p):]
	}
	return len(got) >= len(last) && strings.HasSuffix(got, last)
}
