package indexer_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/prefixd/prefixd/indexer"
)

// propWorld is the fixed universe of one property run: documents over a
// tiny token alphabet (so blocks and prefixes recur across documents), hash
// seeds (base, a LoRA, a namespace) and ranks with their engine-hash scheme.
type propWorld struct {
	bs     int
	docs   [][]uint32 // token ids, whole blocks
	seeds  []uint64
	ranks  []indexer.Rank
	salted map[indexer.Rank]bool // engine hashes depend on the rank
	// local[d][s] and seq[d][s]: local and rolling hashes of doc d under seed s.
	local [][][]uint64
	seq   [][][]uint64
}

func drawWorld(t *rapid.T) *propWorld {
	w := &propWorld{
		bs:     rapid.SampledFrom([]int{2, 4}).Draw(t, "blockSize"),
		seeds:  []uint64{indexer.Seed("", ""), indexer.Seed("lora-a", ""), indexer.Seed("", "tenant-1"), indexer.Seed("lora-a", "tenant-1")},
		salted: make(map[indexer.Rank]bool),
	}
	alphabet := uint32(rapid.IntRange(2, 4).Draw(t, "alphabet"))
	ndocs := rapid.IntRange(1, 6).Draw(t, "docs")
	for d := 0; d < ndocs; d++ {
		nb := rapid.IntRange(1, 12).Draw(t, "docBlocks")
		if rapid.IntRange(0, 9).Draw(t, "longDoc") == 0 {
			// Long enough for events of more than 16 blocks.
			nb = rapid.IntRange(13, 40).Draw(t, "longDocBlocks")
		}
		var doc []uint32
		if d > 0 && rapid.IntRange(0, 2).Draw(t, "forkDoc") > 0 {
			// Continue a prefix of an earlier document (shared prefixes).
			src := w.docs[rapid.IntRange(0, d-1).Draw(t, "forkFrom")]
			keep := rapid.IntRange(0, len(src)/w.bs).Draw(t, "forkKeep")
			doc = slices.Clone(src[:min(keep, nb)*w.bs])
		}
		for len(doc) < nb*w.bs {
			doc = append(doc, rapid.Uint32Range(0, alphabet-1).Draw(t, "tok"))
		}
		w.docs = append(w.docs, doc)
	}
	nworkers := rapid.IntRange(1, 4).Draw(t, "workers")
	ndp := rapid.IntRange(1, 2).Draw(t, "dpRanks")
	for wid := 0; wid < nworkers; wid++ {
		for dp := 0; dp < ndp; dp++ {
			r := indexer.Rank{WorkerID: uint64(wid + 1), DPRank: uint32(dp)}
			w.ranks = append(w.ranks, r)
			w.salted[r] = rapid.Bool().Draw(t, "salted")
		}
	}
	w.local = make([][][]uint64, len(w.docs))
	w.seq = make([][][]uint64, len(w.docs))
	for d, doc := range w.docs {
		for _, s := range w.seeds {
			l := indexer.HashBlocks(nil, doc, w.bs, s)
			w.local[d] = append(w.local[d], l)
			w.seq[d] = append(w.seq[d], indexer.HashSequence(nil, l))
		}
	}
	return w
}

// ext is rank r's engine hash for block i of doc d under seed s: the rolling
// sequence hash (like vLLM), salted by the rank for salted ranks so equal
// paths have different engine hashes on different ranks.
func (w *propWorld) ext(r indexer.Rank, d, s, i int) uint64 {
	h := w.seq[d][s][i]
	if w.salted[r] {
		h ^= (r.WorkerID<<8 | uint64(r.DPRank) + 1) * 0x9e3779b97f4a7c15
	}
	return h
}

// junkHashes are engine hashes that no rank derives: shared by all ranks,
// they collide across documents and make conflicts and unknown blocks.
var junkHashes = []uint64{1, 2, 3, 4, 5, 6}

type propRun struct {
	t     *rapid.T
	w     *propWorld
	tr    *indexer.Tree
	m     *refModel
	trace []string
	last  *propStore // last store, for duplicates
	seq   uint64
	// chunk > 0: stores and removes go through indexer.ApplyInPieces
	// with this write chunk, as Index.ApplyBatch applies large ops.
	chunk int
	// views: the tree publishes views (as an Index's trees do), after
	// every action and between pieces, and every check also checks them
	// and the matches made on them.
	views bool
	// record, if set, is told every store and remove applied.
	record func(r indexer.Rank, op indexer.Op)
}

func (p *propRun) apply(r indexer.Rank, op indexer.Op) error {
	if p.record != nil {
		p.record(r, op)
	}
	if p.chunk > 0 {
		return indexer.ApplyInPieces(p.tr, r, op, p.chunk, func() {
			if p.views {
				// Between pieces, as Index.ApplyBatch publishes.
				indexer.PublishViews(p.tr)
				if err := indexer.CheckViews(p.tr); err != nil {
					p.fatalf("between pieces: %v", err)
				}
			}
		})
	}
	return p.tr.Apply(r, op)
}

type propStore struct {
	r indexer.Rank
	s indexer.Stored
}

func (p *propRun) logf(format string, args ...any) {
	p.trace = append(p.trace, fmt.Sprintf(format, args...))
}

func (p *propRun) fatalf(format string, args ...any) {
	p.t.Fatalf("%s\ntrace:\n  %s", fmt.Sprintf(format, args...), strings.Join(p.trace, "\n  "))
}

func (p *propRun) drawRank(label string) indexer.Rank {
	return rapid.SampledFrom(p.w.ranks).Draw(p.t, label)
}

func (p *propRun) drawTier(deviceBias bool) indexer.Tier {
	if deviceBias && rapid.IntRange(0, 9).Draw(p.t, "deviceTier") < 7 {
		return indexer.TierDevice
	}
	return indexer.Tier(rapid.IntRange(0, indexer.NumTiers-1).Draw(p.t, "tier"))
}

// drawRun draws a document, a seed and a run of its blocks [a, b).
func (p *propRun) drawRun() (d, s, a, b int) {
	d = rapid.IntRange(0, len(p.w.docs)-1).Draw(p.t, "doc")
	s = rapid.IntRange(0, len(p.w.seeds)-1).Draw(p.t, "seed")
	nb := len(p.w.docs[d]) / p.w.bs
	a = rapid.IntRange(0, nb-1).Draw(p.t, "from")
	b = rapid.IntRange(a+1, nb).Draw(p.t, "to")
	return
}

func (p *propRun) applyStore(r indexer.Rank, s indexer.Stored) {
	want := p.m.Store(r, s)
	got := p.apply(r, indexer.Op{Kind: indexer.OpStore, Store: s})
	if err := checkOpError(got, want); err != nil {
		p.fatalf("Store(%v, %+v): %v", r, s, err)
	}
	p.last = &propStore{r, s}
}

func (p *propRun) applyRemove(r indexer.Rank, rm indexer.Removed) {
	want := p.m.Remove(r, rm)
	got := p.apply(r, indexer.Op{Kind: indexer.OpRemove, Remove: rm})
	if err := checkOpError(got, want); err != nil {
		p.fatalf("Remove(%v, %+v): %v", r, rm, err)
	}
}

// store draws a BlockStored event continuing (usually) from a parent the
// rank holds, sometimes corrupted on purpose.
func (p *propRun) store() {
	r := p.drawRank("rank")
	d, si, a, b := p.drawRun()
	w := p.w
	if rapid.Bool().Draw(p.t, "continue") {
		// Continue after the blocks of the document the rank holds, as an
		// engine does after a prefix hit.
		nb := len(w.docs[d]) / w.bs
		held := 0
		for held < nb && p.m.entry(r, w.ext(r, d, si, held)) != nil {
			held++
		}
		if held < nb {
			a = held
			b = rapid.IntRange(a+1, nb).Draw(p.t, "continueTo")
		}
	}
	s := indexer.Stored{
		Tokens:    slices.Clone(w.docs[d][a*w.bs : b*w.bs]),
		BlockSize: w.bs,
		Tier:      p.drawTier(true),
		Seed:      w.seeds[si],
	}
	for i := a; i < b; i++ {
		s.Hashes = append(s.Hashes, w.ext(r, d, si, i))
	}
	parent := rapid.IntRange(0, 19).Draw(p.t, "parentMode")
	switch {
	case a > 0 && parent < 17:
		s.Parent, s.HasParent = w.ext(r, d, si, a-1), true
	case a > 0 && parent < 19:
		// A mid-document run stored at the root.
	case parent == 19 || (a == 0 && parent >= 17):
		// Some other block the rank may hold: chains documents.
		d2, s2, _, b2 := p.drawRun()
		s.Parent, s.HasParent = w.ext(r, d2, s2, b2-1), true
	}
	n := len(s.Hashes)
	switch c := rapid.IntRange(0, 99).Draw(p.t, "corrupt"); {
	case c < 6:
		s.Hashes[rapid.IntRange(0, n-1).Draw(p.t, "at")] = rapid.SampledFrom(junkHashes).Draw(p.t, "junk")
	case c < 10:
		// An engine hash naming another block of the rank.
		d2, s2, _, b2 := p.drawRun()
		s.Hashes[rapid.IntRange(0, n-1).Draw(p.t, "at")] = w.ext(r, d2, s2, b2-1)
	case c < 12:
		j := rapid.IntRange(0, n-1).Draw(p.t, "at")
		if n > 1 && rapid.Bool().Draw(p.t, "dupInEvent") {
			k := (j + 1 + rapid.IntRange(0, n-2).Draw(p.t, "other")) % n
			s.Hashes[j] = s.Hashes[k]
		} else if s.HasParent {
			s.Hashes[j] = s.Parent
		}
	case c < 14:
		s.BlockSize = rapid.SampledFrom([]int{w.bs + 1, 2 * w.bs, 0}).Draw(p.t, "badBlockSize")
	case c < 19:
		s.Tokens = s.Tokens[:rapid.IntRange(0, len(s.Tokens)-1).Draw(p.t, "shortTokens")]
	}
	p.logf("store %v %s", r, fmtStored(s))
	p.applyStore(r, s)
}

// offload draws an event with no tokens: adds a tier to held blocks.
func (p *propRun) offload() {
	r := p.drawRank("rank")
	d, si, a, b := p.drawRun()
	s := indexer.Stored{BlockSize: p.w.bs, Tier: indexer.Tier(rapid.IntRange(1, indexer.NumTiers-1).Draw(p.t, "offloadTier"))}
	for i := a; i < b; i++ {
		s.Hashes = append(s.Hashes, p.w.ext(r, d, si, i))
	}
	if rapid.IntRange(0, 9).Draw(p.t, "offloadJunk") == 0 {
		s.Hashes = append(s.Hashes, rapid.SampledFrom(junkHashes).Draw(p.t, "junk"))
	}
	if rapid.IntRange(0, 19).Draw(p.t, "offloadDevice") == 0 {
		s.Tier = indexer.TierDevice // no tokens on the device: a short store
	}
	p.logf("offload %v %s", r, fmtStored(s))
	p.applyStore(r, s)
}

// remove draws a BlockRemoved event over blocks the rank holds, in random
// order, plus sometimes unknown hashes and wrong tiers.
func (p *propRun) remove() {
	r := p.drawRank("rank")
	held := p.m.sortedHashes(r)
	var rm indexer.Removed
	mode := rapid.IntRange(0, 9).Draw(p.t, "removeMode")
	switch {
	case mode < 7 && len(held) > 0:
		k := rapid.IntRange(1, min(len(held), 6)).Draw(p.t, "removeCount")
		for _, i := range rapid.Permutation(seqInts(len(held))).Draw(p.t, "removeOrder")[:k] {
			rm.Hashes = append(rm.Hashes, held[i])
		}
		// Usually a tier the first block is held in.
		e := p.m.entry(r, rm.Hashes[0])
		var tiers []indexer.Tier
		for tier, c := range e.counts {
			if c > 0 {
				tiers = append(tiers, indexer.Tier(tier))
			}
		}
		if rapid.IntRange(0, 9).Draw(p.t, "heldTier") < 8 {
			rm.Tier = rapid.SampledFrom(tiers).Draw(p.t, "tier")
		} else {
			rm.Tier = p.drawTier(false)
		}
	default:
		// A document run in order or reversed (children first).
		d, si, a, b := p.drawRun()
		for i := a; i < b; i++ {
			rm.Hashes = append(rm.Hashes, p.w.ext(r, d, si, i))
		}
		if rapid.Bool().Draw(p.t, "reverse") {
			slices.Reverse(rm.Hashes)
		}
		rm.Tier = p.drawTier(true)
	}
	if rapid.IntRange(0, 9).Draw(p.t, "removeJunk") == 0 {
		at := rapid.IntRange(0, len(rm.Hashes)).Draw(p.t, "at")
		rm.Hashes = slices.Insert(rm.Hashes, at, rapid.SampledFrom(junkHashes).Draw(p.t, "junk"))
	}
	p.logf("remove %v tier=%v %x", r, rm.Tier, rm.Hashes)
	p.applyRemove(r, rm)
}

func seqInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func fmtStored(s indexer.Stored) string {
	var b strings.Builder
	if s.HasParent {
		fmt.Fprintf(&b, "parent=%x ", s.Parent)
	}
	fmt.Fprintf(&b, "hashes=%x tokens=%v bs=%d tier=%v seed=%d", s.Hashes, s.Tokens, s.BlockSize, s.Tier, s.Seed)
	return b.String()
}

// step draws and applies one action.
func (p *propRun) step() {
	switch op := rapid.IntRange(0, 99).Draw(p.t, "op"); {
	case op < 50:
		p.store()
	case op < 56:
		if p.last != nil {
			p.logf("duplicate store %v %s", p.last.r, fmtStored(p.last.s))
			p.applyStore(p.last.r, p.last.s)
		} else {
			p.store()
		}
	case op < 66:
		p.offload()
	case op < 88:
		p.remove()
	case op < 92:
		r := p.drawRank("rank")
		p.logf("clear %v", r)
		p.m.Clear(r)
		p.tr.Clear(r)
	case op < 95:
		r := p.drawRank("rank")
		p.logf("remove rank %v", r)
		p.m.RemoveRank(r)
		p.tr.RemoveRank(r)
	case op < 97:
		id := p.drawRank("rank").WorkerID
		p.logf("remove worker %d", id)
		p.m.RemoveWorker(id)
		p.tr.RemoveWorker(id)
	default:
		r := p.drawRank("rank")
		p.seq++
		p.logf("watermark %v %d", r, p.seq)
		p.m.SetWatermark(r, p.seq)
		p.tr.SetWatermark(r, p.seq)
	}
}

// probes returns the queries checked after every action: every document
// path under every seed (these extend past most stored paths), every
// maximal stored path, half of it, it extended by an unknown block, and it
// with its last block replaced, plus queries matching nothing.
func (p *propRun) probes() [][]uint64 {
	var qs [][]uint64
	for d := range p.w.docs {
		for s := range p.w.seeds {
			qs = append(qs, p.w.local[d][s])
		}
	}
	for _, path := range p.m.maximalPaths() {
		qs = append(qs,
			path,
			path[:(len(path)+1)/2],
			append(slices.Clip(path), 0xdead),
			append(slices.Clone(path[:len(path)-1]), path[len(path)-1]^1))
	}
	return append(qs, nil, []uint64{0xdead}, []uint64{0xdead, p.w.local[0][0][0]})
}

func (p *propRun) check(what string) {
	probes := p.probes()
	if err := compareTree(p.tr, p.m, probes, p.w.ranks); err != nil {
		p.fatalf("after %s: %v", what, err)
	}
	if p.views {
		indexer.PublishViews(p.tr)
		if err := indexer.CheckViews(p.tr); err != nil {
			p.fatalf("after %s: %v", what, err)
		}
		for _, q := range probes {
			// The same walk as the tree's (checked against the model
			// above), so the same overlaps in the same order.
			got, ok := indexer.MatchViews(p.tr, q, nil)
			if want := p.tr.Match(q, nil); !ok || !sameOverlaps(got, want) {
				p.fatalf("after %s: the views match %x as %v (ok %v), the tree %v", what, q, got, ok, want)
			}
		}
	}
}

// TestTreeMatchesModel drives a Tree and the brute-force model with the
// same random events and compares every observable after every action.
// Every run ends by emptying the tree, through remove events or through
// RemoveRank/RemoveWorker, and checks nothing is left behind. In half the
// runs the tree publishes views, which every check compares with the
// tree, and matches on them with the model.
func TestTreeMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { treeMatchesModel(t, 0, rapid.Bool().Draw(t, "views")) })
}

// TestTreeMatchesModelInPieces is TestTreeMatchesModel with every store
// and remove applied in pieces of 1 to 5 blocks, as Index.ApplyBatch
// applies ops of more than one block: the same tree, counts and errors.
// In half the runs the tree publishes views between pieces too, which
// are checked there.
func TestTreeMatchesModelInPieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		treeMatchesModel(t, rapid.IntRange(1, 5).Draw(t, "chunk"), rapid.Bool().Draw(t, "views"))
	})
}

func treeMatchesModel(t *rapid.T, chunk int, views bool) {
	{
		w := drawWorld(t)
		p := &propRun{t: t, w: w, tr: indexer.NewTree(w.bs), m: newRefModel(w.bs), chunk: chunk, views: views}
		if views {
			indexer.EnableViews(p.tr)
			if rapid.Bool().Draw(t, "nearWrap") {
				// The epochs wrap during the run (Tree.rewind).
				indexer.NearEpochWrap(p.tr, uint32(rapid.IntRange(1, 50).Draw(t, "publishesToWrap")))
			}
		}
		p.check("start")
		ops := rapid.IntRange(50, 200).Draw(t, "ops")
		for i := 0; i < ops; i++ {
			p.step()
			p.check(p.trace[len(p.trace)-1])
		}
		if rapid.Bool().Draw(t, "drainByEvents") {
			// Evict every copy through remove events, in random order.
			for _, r := range p.m.sortedRanks() {
				held := p.m.sortedHashes(r)
				for _, i := range rapid.Permutation(seqInts(len(held))).Draw(t, "drainOrder") {
					h := held[i]
					for tier, c := range p.m.entry(r, h).counts {
						for ; c > 0; c-- {
							p.logf("drain %v tier=%v %x", r, indexer.Tier(tier), h)
							p.applyRemove(r, indexer.Removed{Hashes: []uint64{h}, Tier: indexer.Tier(tier)})
						}
					}
				}
				p.check("draining " + r.String())
			}
			if st := p.tr.Stats(); st.Entries != 0 || st.Blocks != 0 || st.Nodes != 0 {
				p.fatalf("after removing every block: %+v, want no entries, blocks or nodes", st)
			}
		}
		for _, r := range w.ranks {
			if rapid.Bool().Draw(t, "byWorker") {
				p.logf("final remove worker %d", r.WorkerID)
				p.m.RemoveWorker(r.WorkerID)
				p.tr.RemoveWorker(r.WorkerID)
			} else {
				p.logf("final remove rank %v", r)
				p.m.RemoveRank(r)
				p.tr.RemoveRank(r)
			}
			p.check(p.trace[len(p.trace)-1])
		}
		if st := p.tr.Stats(); st.Entries != 0 || st.Blocks != 0 || st.Nodes != 0 || st.Ranks != 0 {
			p.fatalf("after removing every rank: %+v, want an empty tree", st)
		}
	}
}
