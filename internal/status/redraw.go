package status

import "bytes"

// ANSI control sequences for redrawing in place.
const (
	cursorHome = "\x1b[H"
	clearLine  = "\x1b[K" // from the cursor to the end of the line
	clearBelow = "\x1b[J" // from the cursor to the end of the screen
)

// Redraw returns frame prepared to overwrite the previous one on a
// terminal: the cursor goes home, each line clears what is left of the
// line it overwrites, and whatever the previous frame had below is
// cleared.
func Redraw(frame []byte) []byte {
	out := make([]byte, 0, len(frame)+len(cursorHome)+len(clearBelow)+bytes.Count(frame, []byte("\n"))*len(clearLine))
	out = append(out, cursorHome...)
	for len(frame) > 0 {
		line, rest, found := bytes.Cut(frame, []byte("\n"))
		out = append(out, line...)
		out = append(out, clearLine...)
		if found {
			out = append(out, '\n')
		}
		frame = rest
	}
	return append(out, clearBelow...)
}
