package importcheck

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestOffends(t *testing.T) {
	for path, want := range map[string]bool{
		"net":                                   true,
		"net/http":                              true,
		"net/http/httptrace":                    true,
		"github.com/go-zeromq/zmq4":             true,
		"github.com/pebbe/zmq4":                 true,
		"go.etcd.io/etcd/client/v3":             true,
		"github.com/prometheus/client_golang":   true,
		"net/netip":                             false,
		"net/url":                               false,
		"github.com/prefixd/prefixd/indexer":    false,
		"github.com/zeebo/xxh3":                 false,
		"github.com/prefixd/prefixd/netconfig":  false,
		"github.com/prometheus-community/other": true, // substring rule, deliberately broad
	} {
		if got := Offends(path); got != want {
			t.Errorf("Offends(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestNotForRouters(t *testing.T) {
	for path, want := range map[string]bool{
		"github.com/prefixd/prefixd/catalog":            false,
		"github.com/prefixd/prefixd/api":                false,
		"github.com/prefixd/prefixd/internal/leaf/clip": false,
		"net/http":                                       false,
		"github.com/prefixd/prefixd/indexer":             true,
		"github.com/prefixd/prefixd/indexer/workload":    true,
		"github.com/prefixd/prefixd/indexerx":            false,
		"github.com/prefixd/prefixd/coordinator":         true,
		"github.com/prefixd/prefixd/events/stream":       true,
		"github.com/prefixd/prefixd/internal/apiserver":  true,
		"github.com/prefixd/prefixd/internal/sim/mocker": true,
		"github.com/prometheus/client_golang/prometheus": true,
		"go.etcd.io/etcd/client/v3":                      true,
		"github.com/go-zeromq/zmq4":                      true,
	} {
		if got := NotForRouters(path); got != want {
			t.Errorf("NotForRouters(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestOffenders(t *testing.T) {
	// a -> b -> net/http -> net
	// a -> c -> net
	// a -> d (clean)
	out := []byte("net\n" +
		"net/http net\n" +
		"b net/http\n" +
		"c net\n" +
		"d\n" +
		"a b c d\n")
	graph, root := parse(out)
	if root != "a" {
		t.Fatalf("root = %q, want a", root)
	}
	var got []string
	for _, o := range offenders(graph, root, Offends) {
		got = append(got, o.String())
	}
	want := []string{
		"net (via a -> c -> net)",
		"net/http (via a -> b -> net/http), which also brings in net",
	}
	if !slices.Equal(got, want) {
		t.Errorf("offenders:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	clean, root := parse([]byte("d\na d\n"))
	if o := offenders(clean, root, Offends); len(o) != 0 {
		t.Errorf("offenders of a clean graph = %v, want none", o)
	}
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.TB.Fatalf(format, args...)
}

// TestForbiddenRunsGoList checks the whole path through the go command: a
// package that does import net/http is caught, and a pure one passes.
func TestForbiddenRunsGoList(t *testing.T) {
	r := &recorder{TB: t}
	Forbidden(r, "net/http/httptest")
	if len(r.errors) == 0 {
		t.Fatal("Forbidden(net/http/httptest) reported nothing")
	}
	if !strings.Contains(strings.Join(r.errors, "\n"), "must not import net/http (via net/http/httptest -> net/http)") {
		t.Errorf("Forbidden(net/http/httptest) did not name net/http with its chain:\n%s", strings.Join(r.errors, "\n"))
	}

	r = &recorder{TB: t}
	Forbidden(r, "strings")
	if len(r.errors) != 0 {
		t.Errorf("Forbidden(strings) = %q, want no errors", r.errors)
	}
}

// TestNoTestSupport: a package built on test support is caught, with the
// chain; one without passes.
func TestNoTestSupport(t *testing.T) {
	r := &recorder{TB: t}
	NoTestSupport(r, "github.com/prefixd/prefixd/catalog/storetest")
	msg := strings.Join(r.errors, "\n")
	if !strings.Contains(msg, "must not ship test support: github.com/prefixd/prefixd/internal/testsupport (via github.com/prefixd/prefixd/catalog/storetest -> github.com/prefixd/prefixd/internal/testsupport)") {
		t.Errorf("NoTestSupport(catalog/storetest):\n%s", msg)
	}
	r = &recorder{TB: t}
	NoTestSupport(r, "github.com/prefixd/prefixd/indexer")
	if len(r.errors) != 0 {
		t.Errorf("NoTestSupport(indexer) = %q, want no errors", r.errors)
	}
}

func TestLab(t *testing.T) {
	for path, want := range map[string]bool{
		"gonum.org/v1/plot":                                      true,
		"gonum.org/v1/plot/vg/vgsvg":                             true,
		"codeberg.org/go-fonts/liberation/liberationsansregular": true,
		"codeberg.org/go-latex/latex/drawtex":                    true,
		"golang.org/x/image/font/gofont/goregular":               true,
		"golang.org/x/image/font":                                true,
		"github.com/example/fontconfig":                          true, // any font package
		"github.com/prefixd/prefixd/internal/sim/routing":        true,
		"github.com/prefixd/prefixd/internal/sim/indexbench":     true,
		"github.com/prefixd/prefixd/internal/sim/indexdemo":      true,
		"github.com/prefixd/prefixd/internal/sim/trace":          true,
		"github.com/prefixd/prefixd/internal/sim/trace/mooncake": true,
		"gonum.org/v1/gonum/stat":                                false,
		"golang.org/x/image/vector":                              false,
		"github.com/prefixd/prefixd/internal/sim/demo":           false,
		"github.com/prefixd/prefixd/internal/sim/mocker":         false,
		"github.com/prefixd/prefixd/internal/sim/routingtable":   false, // a prefix of a name is not the package
		"github.com/prefixd/prefixd/cmd/prefixd-bench":           false,
		"github.com/prefixd/prefixd/indexer":                     false,
	} {
		if got := Lab(path); got != want {
			t.Errorf("Lab(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestNoLab: a package built on the plotting library and the trace is
// caught, with the chains and the fonts beneath; one without passes.
func TestNoLab(t *testing.T) {
	r := &recorder{TB: t}
	NoLab(r, "github.com/prefixd/prefixd/internal/sim/indexbench")
	msg := strings.Join(r.errors, "\n")
	for _, want := range []string{
		"must not link the benchmark lab: github.com/prefixd/prefixd/internal/sim/trace (via github.com/prefixd/prefixd/internal/sim/indexbench -> github.com/prefixd/prefixd/internal/sim/trace)",
		"must not link the benchmark lab: gonum.org/v1/plot (via github.com/prefixd/prefixd/internal/sim/indexbench -> gonum.org/v1/plot), which also brings in codeberg.org/go-fonts/",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("NoLab(internal/sim/indexbench) lacks %q:\n%s", want, msg)
		}
	}
	r = &recorder{TB: t}
	NoLab(r, "github.com/prefixd/prefixd/indexer")
	if len(r.errors) != 0 {
		t.Errorf("NoLab(indexer) = %q, want no errors", r.errors)
	}
}
