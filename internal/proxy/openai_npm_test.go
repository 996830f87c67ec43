package proxy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/catalog"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/internal/proxy"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// npmDir holds the openai npm client's package.json, its lock and
// client.mjs; `make deps` (scripts/test-deps.sh --npm) runs npm ci there.
const npmDir = "testdata/openai-npm"

// TestOpenAINpmClient: the official openai npm client, unmodified,
// through prefixd proxy to mock engines booked by a real prefixd serve:
// chat and completions, streamed and not; an engine's 400 is its
// BadRequestError and an unknown model its NotFoundError, each sent
// once (the SDK retries neither).
func TestOpenAINpmClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not on PATH: run `make deps` (scripts/test-deps.sh installs Debian's nodejs and npm, then npm ci in internal/proxy/%s)", npmDir)
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	var installed struct {
		Version string `json:"version"`
	}
	if err := readJSON(filepath.Join(npmDir, "package-lock.json"), &lock); err != nil {
		t.Fatal(err)
	}
	if err := readJSON(filepath.Join(npmDir, "node_modules", "openai", "package.json"), &installed); err != nil {
		t.Fatalf("the openai npm package is not installed: run `make deps` (npm ci in internal/proxy/%s): %v", npmDir, err)
	}
	if want := lock.Packages["node_modules/openai"].Version; installed.Version != want {
		t.Fatalf("openai %s installed in internal/proxy/%s, the lock pins %s: run `make deps`", installed.Version, npmDir, want)
	}

	s := startStack(t, proxy.Config{}, coordinator.CoordinatorConfig{},
		spec{id: 1, role: catalog.RoleAggregated}, spec{id: 2, role: catalog.RoleAggregated})
	ctx, cancel := testsupport.Context(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = npmDir
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+s.url+"/v1", "MODEL="+model)
	out, err := cmd.CombinedOutput()
	t.Logf("openai %s:\n%s", installed.Version, out)
	if err != nil {
		t.Fatalf("the openai npm client: %v", err)
	}
	for _, name := range []string{"chat", "chat_stream", "completions", "completions_stream", "bad_request", "not_found"} {
		if !strings.Contains(string(out), "\nok "+name+" ") && !strings.HasPrefix(string(out), "ok "+name+" ") {
			t.Errorf("no %q check passed", name)
		}
	}
	_, page := s.get("/metrics")
	for _, want := range []string{
		`prefixd_proxy_requests_total{outcome="engine_4xx",route="chat"} 1`, // n 2, once
		`prefixd_proxy_requests_total{outcome="error_4xx",route="chat"} 1`,  // gpt-4o, once
		`prefixd_proxy_requests_total{outcome="ok",route="chat"} 2`,
		`prefixd_proxy_requests_total{outcome="ok",route="completions"} 2`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
