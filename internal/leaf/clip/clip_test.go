package clip

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	long := strings.Repeat("é", 40) // 80 bytes
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"model", "model"},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), strings.Repeat("a", 64) + "… (65 bytes)"},
		{long, strings.Repeat("é", 32) + "… (80 bytes)"}, // cut at a rune boundary
		{"a" + long, "a" + strings.Repeat("é", 31) + "… (81 bytes)"},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := N([]byte(c.in), Echo); got != c.want {
			t.Errorf("N(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
