package indexer_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBuild32BitStops: a 32-bit build of the index stops at once, naming
// why (arch32.go), rather than building an index whose bounds overflow.
func TestBuild32BitStops(t *testing.T) {
	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "GOARCH=386", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "prefixd_needs_a_64_bit_platform") {
		t.Fatalf("GOARCH=386 go build: %v\n%s", err, out)
	}
}
