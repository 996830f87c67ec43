package importcheck

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Forbidden fails t if the package pkg (an import path, or a relative path
// such as ".") transitively imports anything Offends reports. Each offender
// is named with the shortest import chain that reaches it. Test-only imports
// of pkg are not checked.
//
// It runs "go list -deps" with the go command found on PATH; "go test" puts
// its own GOROOT/bin first on PATH, so that is the toolchain under test.
func Forbidden(t testing.TB, pkg string) { check(t, pkg, Offends, "must not import") }

// Light fails t if the package pkg transitively imports the etcd client
// or server or a ZMQ library: the record schema (catalog), the API's types
// and the Go client are imported by routers and tools that must not link
// the daemon's machinery.
func Light(t testing.TB, pkg string) { check(t, pkg, Heavy, "must not import") }

// ForRouters fails t if the package pkg transitively imports what a
// router linking prefixd's public packages (api, client) must not carry:
// etcd, ZMQ, Prometheus, or the daemon's own machinery (the index, the
// coordinator, the event streams, the API's server, the daemon, the lab).
func ForRouters(t testing.TB, pkg string) { check(t, pkg, NotForRouters, "must not import") }

// NotForRouters reports whether path is a package ForRouters refuses.
func NotForRouters(path string) bool {
	if Heavy(path) || strings.Contains(path, "github.com/prometheus") {
		return true
	}
	for _, p := range []string{"indexer", "coordinator", "events", "internal/apiserver", "internal/daemon", "internal/sim"} {
		if path == "github.com/prefixd/prefixd/"+p || strings.HasPrefix(path, "github.com/prefixd/prefixd/"+p+"/") {
			return true
		}
	}
	return false
}

// Heavy reports whether path is etcd or ZMQ.
func Heavy(path string) bool {
	return strings.Contains(path, "go.etcd.io") || strings.Contains(path, "zmq")
}

// NoTestSupport fails t if the package pkg transitively imports test
// support (see TestSupport): what ships in the binary must not carry
// fakes, test harnesses or package testing.
func NoTestSupport(t testing.TB, pkg string) {
	check(t, pkg, TestSupport, "must not ship test support:")
}

// TestSupport reports whether path is test support: package testing, and
// prefixd's test-support packages (catalog/storetest, internal/testsupport,
// internal/testsupport/dumptest, internal/testsupport/openloop,
// internal/testsupport/pypub,
// internal/testsupport/testlog, internal/sim/mocker/publishtest,
// events/wire/wiretest).
func TestSupport(path string) bool {
	if path == "testing" {
		return true
	}
	for _, p := range []string{"catalog/storetest", "internal/testsupport", "internal/testsupport/dumptest", "internal/testsupport/openloop", "internal/testsupport/pypub", "internal/testsupport/testlog", "internal/sim/mocker/publishtest", "events/wire/wiretest"} {
		if path == "github.com/prefixd/prefixd/"+p {
			return true
		}
	}
	return false
}

// NoLab fails t if the package pkg transitively imports the benchmark
// lab (see Lab): the production binary must not carry the plotting
// library, its fonts, the embedded trace or the benchmarks, which live in
// cmd/prefixd-bench.
func NoLab(t testing.TB, pkg string) {
	check(t, pkg, Lab, "must not link the benchmark lab:")
}

// Lab reports whether path belongs to the benchmark lab: gonum.org/v1/plot
// and below, the LaTeX text renderer it draws with (codeberg.org/go-latex),
// any font package (a path element containing "font": the go-fonts
// modules, golang.org/x/image's fonts, plot's own), and prefixd's lab
// packages (internal/sim/routing, internal/sim/indexbench,
// internal/sim/indexdemo, internal/sim/trace, each with its
// subpackages).
func Lab(path string) bool {
	for _, p := range []string{"gonum.org/v1/plot", "codeberg.org/go-latex", "codeberg.org/go-fonts",
		"github.com/prefixd/prefixd/internal/sim/routing", "github.com/prefixd/prefixd/internal/sim/indexbench",
		"github.com/prefixd/prefixd/internal/sim/indexdemo", "github.com/prefixd/prefixd/internal/sim/trace"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	for elem := range strings.SplitSeq(path, "/") {
		if strings.Contains(elem, "font") {
			return true
		}
	}
	return false
}

// check fails t for every package reached from pkg that offends.
func check(t testing.TB, pkg string, offends func(string) bool, verb string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	// One line per package: its import path, then its direct imports.
	cmd := exec.Command(goTool, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	graph, root := parse(out)
	if root == "" {
		t.Fatalf("go list -deps %s: no packages listed", pkg)
	}
	for _, o := range offenders(graph, root, offends) {
		t.Errorf("%s %s %s", root, verb, o)
	}
}

// Offends reports whether path is a package the I/O-free cores must not
// depend on: anything whose path contains "zmq", "go.etcd.io", "net/http" or
// "github.com/prometheus", and the package "net" itself.
func Offends(path string) bool {
	return path == "net" ||
		strings.Contains(path, "zmq") ||
		strings.Contains(path, "go.etcd.io") ||
		strings.Contains(path, "net/http") ||
		strings.Contains(path, "github.com/prometheus")
}

// parse reads "go list -deps" output in the format Forbidden asks for. It
// returns each package's direct imports and the named package, which go list
// prints last (after all its dependencies).
func parse(out []byte) (graph map[string][]string, root string) {
	graph = make(map[string][]string)
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		graph[fields[0]] = fields[1:]
		root = fields[0]
	}
	return graph, root
}

// offender is one forbidden dependency: the shortest import chain from the
// checked package to it, and every forbidden package below it.
type offender struct {
	chain []string // root, ..., offender
	below []string // sorted
}

func (o offender) String() string {
	var b strings.Builder
	b.WriteString(o.chain[len(o.chain)-1])
	b.WriteString(" (via ")
	b.WriteString(strings.Join(o.chain, " -> "))
	b.WriteString(")")
	if len(o.below) > 0 {
		b.WriteString(", which also brings in ")
		b.WriteString(strings.Join(o.below, ", "))
	}
	return b.String()
}

// offenders returns the forbidden packages first reached from root, that is
// those not reached only through another forbidden package, sorted by path.
// Forbidden packages that sit only beneath one of them are listed in its
// below field, so every forbidden dependency is named.
func offenders(graph map[string][]string, root string, offends func(string) bool) []offender {
	// Breadth-first from root, stopping at forbidden packages, so that each
	// parent link gives a shortest chain.
	parent := map[string]string{root: ""}
	queue := []string{root}
	var first []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != root && offends(p) {
			first = append(first, p)
			continue
		}
		for _, imp := range graph[p] {
			if _, seen := parent[imp]; !seen {
				parent[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	slices.Sort(first)

	out := make([]offender, 0, len(first))
	for _, p := range first {
		var o offender
		for q := p; q != ""; q = parent[q] {
			o.chain = append(o.chain, q)
		}
		slices.Reverse(o.chain)
		for q := range reachable(graph, p) {
			if q != p && offends(q) {
				o.below = append(o.below, q)
			}
		}
		slices.Sort(o.below)
		out = append(out, o)
	}
	return out
}

// reachable returns every package reachable from p in graph, p included.
func reachable(graph map[string][]string, p string) map[string]bool {
	seen := map[string]bool{p: true}
	stack := []string{p}
	for len(stack) > 0 {
		q := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, imp := range graph[q] {
			if !seen[imp] {
				seen[imp] = true
				stack = append(stack, imp)
			}
		}
	}
	return seen
}
