package workload

import (
	"reflect"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// smallConfig is a 16-rank fleet (8 workers × 2 DP ranks) small enough to
// fill in a fraction of a second, with evictions on every rank.
func smallConfig() Config {
	c := DefaultConfig()
	c.Workers, c.DPRanks = 8, 2
	c.SystemPrompts = 6
	c.Active = 32
	c.RankCapacityBlocks = 2048
	c.TargetEntries = 30000 // of 32,768
	c.ChurnBlocks = 30000
	c.LongPrompts, c.LongPromptRanks = 2, 4
	return c
}

func mustGenerate(t testing.TB, c Config) *Workload {
	t.Helper()
	w, err := Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestGenerateDeterministic(t *testing.T) {
	c := smallConfig()
	a, b := mustGenerate(t, c), mustGenerate(t, c)
	if !reflect.DeepEqual(a.Events, b.Events) || a.Stats != b.Stats || !reflect.DeepEqual(a.Long, b.Long) {
		t.Fatal("the same seed gave different workloads")
	}
	if !reflect.DeepEqual(a.Queries(100), b.Queries(100)) {
		t.Fatal("Queries differ for the same workload")
	}
	c.Seed++
	if d := mustGenerate(t, c); reflect.DeepEqual(a.Events[:100], d.Events[:100]) {
		t.Fatal("different seeds gave the same events")
	}
}

// TestEventsConsistent replays the events against a per-rank set of engine
// hashes: every store's parent is held by the rank (stored earlier and not
// removed since), no store repeats a held hash, every remove names held
// hashes, ranks stay within capacity, and the counts match Stats.
func TestEventsConsistent(t *testing.T) {
	c := smallConfig()
	w := mustGenerate(t, c)
	held := map[indexer.Rank]map[uint64]bool{}
	var st Stats
	for i, e := range w.Events {
		h := held[e.Rank]
		if h == nil {
			h = map[uint64]bool{}
			held[e.Rank] = h
		}
		switch e.Op.Kind {
		case indexer.OpStore:
			s := e.Op.Store
			if s.HasParent && !h[s.Parent] {
				t.Fatalf("event %d: rank %v stores after %#x, which it does not hold", i, e.Rank, s.Parent)
			}
			if len(s.Tokens) != len(s.Hashes)*c.BlockSize || s.BlockSize != c.BlockSize || s.Seed != indexer.BaseSeed {
				t.Fatalf("event %d: %d tokens for %d blocks of %d, seed %d", i, len(s.Tokens), len(s.Hashes), s.BlockSize, s.Seed)
			}
			for _, x := range s.Hashes {
				if h[x] {
					t.Fatalf("event %d: rank %v stores %#x again", i, e.Rank, x)
				}
				h[x] = true
			}
			st.StoreEvents++
			st.StoredBlocks += len(s.Hashes)
		case indexer.OpRemove:
			for _, x := range e.Op.Remove.Hashes {
				if !h[x] {
					t.Fatalf("event %d: rank %v removes %#x, which it does not hold", i, e.Rank, x)
				}
				delete(h, x)
			}
			st.RemoveEvents++
			st.RemovedBlocks += len(e.Op.Remove.Hashes)
		default:
			t.Fatalf("event %d: op kind %d", i, e.Op.Kind)
		}
		if len(h) > c.RankCapacityBlocks {
			t.Fatalf("event %d: rank %v holds %d blocks, capacity %d", i, e.Rank, len(h), c.RankCapacityBlocks)
		}
	}
	for _, h := range held {
		st.Entries += len(h)
	}
	got := w.Stats
	if st.StoreEvents != got.StoreEvents || st.StoredBlocks != got.StoredBlocks || st.RemoveEvents != got.RemoveEvents ||
		st.RemovedBlocks != got.RemovedBlocks || st.Entries != got.Entries {
		t.Fatalf("replayed %+v, Stats %+v", st, got)
	}
	if got.Entries < c.TargetEntries {
		t.Fatalf("%d entries, target %d", got.Entries, c.TargetEntries)
	}
	if got.RemoveEvents == 0 || got.Forks == 0 || len(held) != c.Ranks() {
		t.Fatalf("expected evictions, forks and all %d ranks: %+v", c.Ranks(), got)
	}
	t.Logf("%+v", got)
}

func TestLongPromptsHeld(t *testing.T) {
	c := smallConfig()
	w := mustGenerate(t, c)
	if len(w.Long) != c.LongPrompts {
		t.Fatalf("%d long prompts, want %d", len(w.Long), c.LongPrompts)
	}
	for i, p := range w.Long {
		if len(p.Tokens) != c.LongPromptBlocks*c.BlockSize {
			t.Fatalf("long prompt %d: %d tokens", i, len(p.Tokens))
		}
		full := 0
		for _, h := range p.Holders {
			if h.Blocks == c.LongPromptBlocks {
				full++
			}
		}
		if full < c.LongPromptRanks {
			t.Fatalf("long prompt %d: %d ranks hold it all, want ≥ %d: %v", i, full, c.LongPromptRanks, p.Holders)
		}
	}
}

// TestTreeAgrees applies the workload to an indexer.Tree and checks that
// every event applies cleanly and that Match reports Holders for the
// queries and long prompts.
func TestTreeAgrees(t *testing.T) {
	c := smallConfig()
	w := mustGenerate(t, c)
	tree := indexer.NewTree(c.BlockSize)
	for i, e := range w.Events {
		if err := tree.Apply(e.Rank, e.Op); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if s := tree.Stats(); s.Entries != w.Stats.Entries || s.Blocks != w.Stats.Blocks {
		t.Fatalf("tree has %d entries and %d blocks, workload %d and %d", s.Entries, s.Blocks, w.Stats.Entries, w.Stats.Blocks)
	}
	queries := w.Queries(300)
	for _, p := range w.Long {
		queries = append(queries, p.Tokens)
	}
	kinds := [3]int{} // full, partial, miss
	for qi, q := range queries {
		want := w.Holders(q)
		got := matchHolds(tree, q, c.BlockSize)
		if !slices.Equal(got, want) {
			t.Fatalf("query %d (%d tokens): tree %v, want %v", qi, len(q), got, want)
		}
		best := 0
		for _, h := range want {
			best = max(best, h.Blocks)
		}
		switch {
		case best == 0:
			kinds[2]++
		case best == len(q)/c.BlockSize:
			kinds[0]++
		default:
			kinds[1]++
		}
	}
	if kinds[0] == 0 || kinds[1] == 0 || kinds[2] == 0 {
		t.Fatalf("queries by kind (full, partial, miss): %v", kinds)
	}
	t.Logf("queries by kind (full, partial, miss): %v", kinds)
}

func matchHolds(tree *indexer.Tree, q []uint32, bs int) []Hold {
	ov := tree.Match(indexer.HashBlocks(nil, q, bs, indexer.BaseSeed), nil)
	var out []Hold
	for _, o := range ov {
		if o.Device != o.Disk || o.Host != o.Disk {
			panic("device-only workload reported other tiers")
		}
		out = append(out, Hold{Rank: o.Rank, Blocks: int(o.Disk)})
	}
	slices.SortFunc(out, func(a, b Hold) int {
		if a.Rank.WorkerID != b.Rank.WorkerID {
			return int(a.Rank.WorkerID) - int(b.Rank.WorkerID)
		}
		return int(a.Rank.DPRank) - int(b.Rank.DPRank)
	})
	return out
}

func TestLLMDCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-block workload")
	}
	w := LLMDCompare(1)
	want := make([]Hold, LLMDRanks)
	for p := range want {
		want[p] = Hold{Rank: indexer.Rank{WorkerID: uint64(p)}, Blocks: LLMDStep * (p + 1)}
	}
	if !slices.Equal(w.Long[0].Holders, want) {
		t.Fatalf("holders %v, want %v", w.Long[0].Holders, want)
	}
	const entries = LLMDBackground + LLMDStep*LLMDRanks*(LLMDRanks+1)/2
	if w.Stats.Entries != entries || w.Stats.Blocks != LLMDBackground+LLMDPromptBlocks || len(w.Events) != entries/16 {
		t.Fatalf("stats %+v, %d events", w.Stats, len(w.Events))
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"no workers":       func(c *Config) { c.Workers = 0 },
		"turns reversed":   func(c *Config) { c.TurnsMin, c.TurnsMax = 5, 2 },
		"tiny capacity":    func(c *Config) { c.RankCapacityBlocks = 100 },
		"target too large": func(c *Config) { c.TargetEntries = c.Ranks()*c.RankCapacityBlocks + 1 },
		"long too short":   func(c *Config) { c.LongPromptBlocks = c.SystemPromptBlocksMax },
		"share above 1":    func(c *Config) { c.DecodeShare = 1.5 },
	} {
		c := DefaultConfig()
		mod(&c)
		if _, err := Generate(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
