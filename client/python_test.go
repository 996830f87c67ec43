package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// python is the interpreter with Debian's packages (the first python3 on
// PATH may be another build).
const python = "/usr/bin/python3"

// TestPythonClient runs the Python client's tests (client/python) against
// the real API handler.
func TestPythonClient(t *testing.T) {
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s: %v (make test installs it)", python, err)
	}
	srv := fixture(t, "")
	dir, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(context.Background(), python, "-m", "unittest", "-v", "test_prefixd_client")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PREFIXD_URL="+srv.URL, "PREFIXD_TOKEN=w", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python tests: %v", err)
	}
}
