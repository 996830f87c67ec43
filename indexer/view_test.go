package indexer

import (
	"slices"
	"testing"
)

// TestPublishedEdgeNotOverwritten: a leaf published at 10 blocks is
// trimmed to 5 and extended by 5 other blocks: the extension must not
// write the array the first view holds (it would change under a match
// reading that view), so the first view still reads the first 10 hashes
// while the new one reads the new edge.
func TestPublishedEdgeNotOverwritten(t *testing.T) {
	tr := NewTree(4)
	tr.enableViews()
	r := Rank{1, 0}
	must(t, tr.Apply(r, chainOp(4, 1, 10, 100)))
	tr.publishViews()
	must(t, CheckViews(tr))
	first := chainQuery(4, 1, 10)
	v0 := tr.pub.state.Load().view(1)
	if v0 == nil || !slices.Equal(v0.hashes, first) {
		t.Fatalf("published edge %x, want %x", v0.hashes, first)
	}
	must(t, tr.Apply(r, Op{Kind: OpRemove, Remove: Removed{Hashes: []uint64{109, 108, 107, 106, 105}}}))
	tr.publishViews()
	must(t, CheckViews(tr))
	other := chainOp(4, 500, 5, 200)
	other.Store.Parent, other.Store.HasParent = 104, true
	must(t, tr.Apply(r, other))
	tr.publishViews()
	must(t, CheckViews(tr))
	if !slices.Equal(v0.hashes, first) {
		t.Fatalf("the first view's edge became %x, was %x", v0.hashes, first)
	}
	v2 := tr.pub.state.Load().view(1)
	want := append(slices.Clone(first[:5]), chainQuery(4, 500, 5)...)
	if !slices.Equal(v2.hashes, want) {
		t.Fatalf("the new view's edge %x, want %x", v2.hashes, want)
	}
}
