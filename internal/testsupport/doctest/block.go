package doctest

import (
	"bytes"
	"fmt"
	"strings"
)

// Kinds of block, by the first word of the fence's info string.
const (
	Shell  = "sh"     // commands, or a transcript of commands and what they print
	Python = "python" // a script run with python3
	Go     = "go"     // an excerpt of an Example function, which go test runs
	JSON   = "json"   // a JSON value, optionally after an HTTP request line
	Text   = "text"   // output, diagrams, synopses: never run
	YAML   = "yaml"   // a manifest excerpt: never run
)

// Block is one fenced block of a Markdown document.
type Block struct {
	File string // the document, as given to Parse
	Line int    // the line of the opening fence, from 1
	Lang string // the info string's first word; "" for a bare fence
	// Continued: the block runs in the session of the previous runnable
	// block of its document (info string word "continued").
	Continued bool
	// NoRun is why the block is not run (info string "no-run: <reason>");
	// empty for a block that runs.
	NoRun string
	Text  string // the body, without the fence's indentation, ending in "\n"
}

// Where names the block for a reader: "docs/api.md:346".
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Runnable reports whether the block's kind runs and the block does not say
// no-run.
func (b Block) Runnable() bool {
	return b.NoRun == "" && (b.Lang == Shell || b.Lang == Python || b.Lang == Go)
}

var kinds = map[string]bool{Shell: true, Python: true, Go: true, JSON: true, Text: true, YAML: true, "": true}

// Parse returns the fenced blocks of a Markdown document (CommonMark's
// backtick fences, indented by at most the enclosing list's indentation).
// The info string is a kind (sh, python, go, json, text, yaml, or none),
// then optionally "continued", then optionally "no-run: <reason>", in that
// order. An unclosed fence, an unknown kind or word, and a no-run without
// its reason are errors naming the line.
func Parse(file string, src []byte) ([]Block, error) {
	var blocks []Block
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		indent, fence, info, ok := openFence(lines[i])
		if !ok {
			continue
		}
		b := Block{File: file, Line: i + 1}
		if err := b.setInfo(info); err != nil {
			return nil, fmt.Errorf("%s: %w", b.Where(), err)
		}
		var body bytes.Buffer
		closed := false
		for i++; i < len(lines); i++ {
			l := lines[i]
			if t := strings.TrimLeft(l, " "); strings.HasPrefix(t, fence) && strings.Trim(t, "`") == "" && len(l)-len(t) <= indent+3 {
				closed = true
				break
			}
			// Lines of a block in a list item carry the item's indentation.
			n := 0
			for n < indent && n < len(l) && l[n] == ' ' {
				n++
			}
			body.WriteString(l[n:])
			body.WriteByte('\n')
		}
		if !closed {
			return nil, fmt.Errorf("%s: the fence is never closed", b.Where())
		}
		b.Text = body.String()
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// openFence reports whether line opens a backtick fence, and its
// indentation, the fence itself and its info string.
func openFence(line string) (indent int, fence, info string, ok bool) {
	t := strings.TrimLeft(line, " ")
	indent = len(line) - len(t)
	n := 0
	for n < len(t) && t[n] == '`' {
		n++
	}
	if n < 3 || strings.Contains(t[n:], "`") {
		return 0, "", "", false
	}
	return indent, t[:n], strings.TrimSpace(t[n:]), true
}

func (b *Block) setInfo(info string) error {
	rest := info
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		b.Lang, rest = rest[:i], strings.TrimSpace(rest[i:])
	} else {
		b.Lang, rest = rest, ""
	}
	if !kinds[b.Lang] {
		return fmt.Errorf("unknown block kind %q (want sh, python, go, json, text or yaml)", b.Lang)
	}
	if w, r, _ := strings.Cut(rest, " "); w == "continued" {
		b.Continued, rest = true, strings.TrimSpace(r)
	}
	switch {
	case rest == "":
	case strings.HasPrefix(rest, "no-run:"):
		b.NoRun = strings.TrimSpace(strings.TrimPrefix(rest, "no-run:"))
		if b.NoRun == "" {
			return fmt.Errorf("no-run needs a reason: %q", info)
		}
	default:
		return fmt.Errorf("info string %q: want <kind> [continued] [no-run: <reason>]", info)
	}
	if b.Continued && b.NoRun != "" {
		return fmt.Errorf("info string %q: a block that does not run continues nothing", info)
	}
	return nil
}
