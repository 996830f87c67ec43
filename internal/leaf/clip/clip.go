// Package clip shortens values a client sent for error messages, so that
// a request can never make an error as large as itself.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// Echo is how many bytes of a value an error repeats.
const Echo = 64

// String returns s if it is at most Echo bytes long, otherwise its first
// Echo bytes (cut at a UTF-8 boundary) followed by "… (N bytes)".
func String(s string) string { return N(s, Echo) }

// N is String at n bytes. A value short enough is returned without a copy
// (a string) or as one copy ([]byte).
func N[T string | []byte](s T, n int) string {
	if len(s) <= n {
		return string(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return string(s[:cut]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}
