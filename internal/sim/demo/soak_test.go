package demo

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport"
)

// TestSoakShort runs the soak for a few seconds against a freshly built
// prefixd process: samples are taken, every kind of fleet event happens,
// requests are served and the daemon follows every engine at the end.
// (Flatness needs minutes; make soak judges it.)
func TestSoakShort(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "prefixd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/prefixd/prefixd/cmd/prefixd").CombinedOutput(); err != nil {
		t.Fatalf("build prefixd: %v\n%s", err, out)
	}
	var out, csv bytes.Buffer
	ctx, cancel := testsupport.Context(t)
	defer cancel()
	rep, err := Soak(ctx, SoakConfig{Config: Config{Out: &out}, Daemon: bin, Duration: 8 * time.Second, Sample: time.Second,
		ChurnEvery: 1500 * time.Millisecond, Rate: 100, MaxGrowth: 100, CSV: &csv, ProbeInterval: time.Second})
	if err != nil {
		var mismatches []string
		if rep != nil {
			mismatches = rep.Mismatches
		}
		t.Fatalf("soak: %v %q\n%s", err, mismatches, out.String())
	}
	if len(rep.Samples) < 6 || rep.Requests < 100 {
		t.Fatalf("%d samples, %d requests\n%s", len(rep.Samples), rep.Requests, out.String())
	}
	for _, s := range rep.Samples {
		if s.RSS <= 0 || s.Goroutines <= 0 || s.Workers < 12 {
			t.Fatalf("sample %+v", s)
		}
	}
	for _, kind := range []string{"engine restarted", "engine crashed and replaced", "prefix cache reset"} {
		if rep.Churn[kind] == 0 {
			t.Errorf("no %q in %v", kind, rep.Churn)
		}
	}
	if lines := strings.Count(csv.String(), "\n"); lines != len(rep.Samples)+1 {
		t.Errorf("CSV has %d lines for %d samples", lines, len(rep.Samples))
	}
	if rep.Requests < rep.Samples[len(rep.Samples)-1].Requests {
		t.Errorf("final count %d below the last sample's %d", rep.Requests, rep.Samples[len(rep.Samples)-1].Requests)
	}
}

// TestFlatness: a flat curve passes, a steady climb does not, and the
// warm-up is ignored.
func TestFlatness(t *testing.T) {
	t.Parallel()
	curve := func(f func(i int) int64) []SoakSample {
		var ss []SoakSample
		for i := range 30 {
			ss = append(ss, SoakSample{At: time.Duration(i) * 10 * time.Second, RSS: f(i)})
		}
		return ss
	}
	const mb = 1 << 20
	warmup := 60 * time.Second
	flat := curve(func(i int) int64 {
		if i < 6 {
			return int64(i+1) * 10 * mb // warm-up climb, ignored
		}
		return 60*mb + int64(i%3)*mb // noise
	})
	if g, slope := flatness(flat, warmup); g > 0.05 || slope > 10*mb {
		t.Errorf("flat curve: growth %.3f, slope %d B/h", g, slope)
	}
	leak := curve(func(i int) int64 { return 60*mb + int64(i)*2*mb })
	if g, slope := flatness(leak, warmup); g <= 0.10 || slope < 700*mb {
		t.Errorf("leaking curve: growth %.3f, slope %d B/h", g, slope)
	}
}
