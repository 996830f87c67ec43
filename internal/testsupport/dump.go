package testsupport

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// DumpLines lists a /dump's blocks and watermarks in a stable order,
// independent of how each replica numbered its tree's nodes.
func DumpLines(t testing.TB, raw []byte) []string {
	t.Helper()
	var parts map[string]indexer.Snapshot
	if err := json.Unmarshal(raw, &parts); err != nil {
		t.Fatal(err)
	}
	var out []string
	for name, s := range parts {
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
