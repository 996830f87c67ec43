package routing

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/one-router.json from the current code")

// TestOneRouterUnchanged: one replica replays exactly as the single
// router did before replicas existed. testdata/one-router.json holds that
// router's results on the trace's first 60 requests, every policy at ×4
// (written by the code before replicas; -rewrite regenerates it,
// which only a change meant to alter the simulation may do).
func TestOneRouterUnchanged(t *testing.T) {
	reqs, prompts := sliceOf(t)
	reqs, prompts = reqs[:60], prompts[:60]
	got, err := Sweep(context.Background(), DefaultConfig(), reqs, prompts, Policies, []float64{4}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Wall = 0
	}
	path := filepath.Join("testdata", "one-router.json")
	if *rewrite {
		b, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []Result
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d", len(got), len(want))
	}
	for i := range got {
		g := got[i]
		g.TTFTs = nil
		if !reflect.DeepEqual(g, want[i]) {
			t.Errorf("%s ×%g:\n got %+v\nwant %+v", g.Policy, g.Speedup, g, want[i])
		}
	}
}
