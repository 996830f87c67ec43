package apiserver

import (
	"io"
	"testing"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

// BenchmarkWriteSnapshot writes the snapshot of the benchmark index
// (indexer/workload.DefaultConfig: 1,048,576 entries in one tree, built
// as indexer's BenchmarkDump builds it, which measures the Tree.Dump) as
// JSON to io.Discard, one iteration per snapshot. json-B/entry is the
// JSON's size.
func BenchmarkWriteSnapshot(b *testing.B) {
	w, err := workload.Generate(workload.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	tree := indexer.NewTree(w.BlockSize)
	for i, e := range w.Events {
		if err := tree.Apply(e.Rank, e.Op); err != nil {
			b.Fatalf("event %d: %v", i, err)
		}
	}
	entries := tree.Stats().Entries
	s := tree.Dump()
	var cw countingWriter
	if err := WriteSnapshot(&cw, s); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteSnapshot(io.Discard, s); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cw)/float64(entries), "json-B/entry")
	b.SetBytes(int64(cw))
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
