// Package dumptest compares GET /dump bodies in tests: Lines lists a
// dump's blocks and watermarks independently of how each replica numbered
// its tree's nodes. It reads the dump with the API server's codec, so it
// lives apart from package testsupport, which the server's own tests
// import. Test support only; no production code imports it.
package dumptest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/internal/apiserver"
)

// Lines lists a /dump's blocks and watermarks in a stable order,
// independent of how each replica numbered its tree's nodes.
func Lines(t testing.TB, raw []byte) []string {
	t.Helper()
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		t.Fatal(err)
	}
	var out []string
	for name, part := range parts {
		s, err := apiserver.UnmarshalSnapshot(part)
		if err != nil {
			t.Fatalf("partition %s: %v", name, err)
		}
		for _, ev := range s.Events {
			for _, b := range ev.Blocks {
				out = append(out, fmt.Sprintf("%s %v parent=%d/%v %d %d %v", name, ev.Rank, ev.ParentHash, ev.HasParent, b.Hash, b.TokensHash, b.Counts))
			}
		}
		for _, w := range s.Ranks {
			out = append(out, fmt.Sprintf("%s watermark %v %d %v %d", name, w.Rank, w.Seq, w.HasSeq, w.Digest))
		}
	}
	slices.Sort(out)
	return out
}
