package importcheck

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// Module is the import path of prefixd's module.
const Module = "github.com/prefixd/prefixd"

// A Room is a layer of the module's packages. Rooms are listed bottom up:
// a package imports only packages of its own room or of rooms below it
// (Layers checks this). docs/architecture.md draws the same picture.
type Room struct {
	Name string
	// Paths are the room's packages, relative to Module: a path ending in
	// "/..." holds every package below it too. The most specific match
	// wins (internal/sim/mocker/publishtest is test support, not the lab).
	Paths []string
}

// Rooms are the module's layers, bottom up.
var Rooms = []Room{
	{"leaves", []string{"internal/leaf/..."}},
	{"domain", []string{"indexer/...", "events/...", "catalog/...", "coordinator"}},
	{"public", []string{"api", "client"}},
	{"adapters", []string{"internal/apiserver", "internal/daemon", "internal/peer", "internal/replica", "internal/engineload", "internal/proxy", "internal/sidecar", "internal/status", "internal/tokenize", "internal/epp"}},
	{"lab", []string{"internal/sim/..."}},
	{"commands", []string{"cmd/...", "internal/cli", "deploy"}},
	// Test support, imported only by tests (NoTestSupport keeps it out of
	// what ships), may use anything.
	{"test support", []string{"internal/testsupport/...", "catalog/storetest", "events/wire/wiretest", "internal/sim/mocker/publishtest"}},
}

// RoomOf returns the index in Rooms of the module package rel (a path
// relative to Module), or -1 if no room holds it.
func RoomOf(rel string) int {
	best, bestLen := -1, -1
	for i, r := range Rooms {
		for _, p := range r.Paths {
			n := -1
			if base, ok := strings.CutSuffix(p, "/..."); ok {
				if rel == base || strings.HasPrefix(rel, base+"/") {
					n = len(base)
				}
			} else if rel == p {
				n = len(p) + 1 // an exact path beats a prefix of the same length
			}
			if n > bestLen {
				best, bestLen = i, n
			}
		}
	}
	return best
}

// Layers fails t for every package of the module that no room holds, and
// for every import that runs upward: from a package to one in a room
// above its own. Test files are not checked.
func Layers(t testing.TB) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, Module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s/...: %v\n%s", Module, err, stderr.Bytes())
	}
	for _, problem := range upward(out) {
		t.Error(problem)
	}
}

// upward returns what Layers reports for go list's output.
func upward(out []byte) []string {
	var problems []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg, ok := strings.CutPrefix(fields[0], Module+"/")
		if !ok {
			continue
		}
		from := RoomOf(pkg)
		if from < 0 {
			problems = append(problems, fmt.Sprintf("%s is in no room of importcheck.Rooms", pkg))
			continue
		}
		for _, imp := range fields[1:] {
			rel, ok := strings.CutPrefix(imp, Module+"/")
			if !ok {
				continue
			}
			if to := RoomOf(rel); to > from {
				problems = append(problems, fmt.Sprintf("%s (%s) imports %s (%s), a room above", pkg, Rooms[from].Name, rel, roomName(to)))
			}
		}
	}
	return problems
}

func roomName(i int) string {
	if i < 0 {
		return "no room"
	}
	return Rooms[i].Name
}
