package apiserver

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/indexer"
)

// The index's snapshots through their JSON form: what the index tests
// prove of a Snapshot value (it restores to the same index, flags and
// shards survive) holds after WriteSnapshot and either decoder.

// chain stores n blocks of bs tokens each, the i-th holding the tokens
// (first+i)*bs …, with engine hashes base, base+1, ….
func chain(bs int, first uint32, n int, base uint64) indexer.Op {
	st := indexer.Stored{BlockSize: bs, Seed: indexer.BaseSeed}
	for i := 0; i < n; i++ {
		for j := 0; j < bs; j++ {
			st.Tokens = append(st.Tokens, (first+uint32(i))*uint32(bs)+uint32(j))
		}
		st.Hashes = append(st.Hashes, base+uint64(i))
	}
	return indexer.Op{Kind: indexer.OpStore, Store: st}
}

// throughJSON returns s after MarshalSnapshot and UnmarshalSnapshot, and
// after WriteSnapshot and DecodeSnapshot, failing t if the two writers'
// bytes differ.
func throughJSON(t *testing.T, s *indexer.Snapshot) (raw []byte, viaUnmarshal, viaDecode *indexer.Snapshot) {
	t.Helper()
	raw, err := MarshalSnapshot(s)
	must(t, err)
	var buf bytes.Buffer
	must(t, WriteSnapshot(&buf, s))
	if !bytes.Equal(buf.Bytes(), raw) {
		t.Fatalf("WriteSnapshot and MarshalSnapshot differ at byte %d", firstDiff(buf.Bytes(), raw))
	}
	viaUnmarshal, err = UnmarshalSnapshot(raw)
	must(t, err)
	viaDecode, err = DecodeSnapshot(json.NewDecoder(&buf), DecodeLimits{})
	must(t, err)
	return raw, viaUnmarshal, viaDecode
}

// TestSnapshotJSONRoundTrip: a snapshot the index made comes back from
// its JSON exactly (both decoders), so a restore through JSON is a restore
// of the snapshot itself.
func TestSnapshotJSONRoundTrip(t *testing.T) {
	n := 0
	for name, s := range richSnapshots(t) {
		if !strings.HasPrefix(name, "stream") && name != "hybrid" {
			continue // hand-built: not all in the index's canonical form
		}
		n++
		_, viaUnmarshal, viaDecode := throughJSON(t, s)
		for how, back := range map[string]*indexer.Snapshot{"UnmarshalSnapshot": viaUnmarshal, "DecodeSnapshot": viaDecode} {
			if !reflect.DeepEqual(back, s) {
				t.Fatalf("%s through JSON and %s:\n %+v\nwas\n %+v", name, how, *back, *s)
			}
		}
	}
	if n != 7 {
		t.Fatalf("%d snapshots made by the index, want 7", n)
	}
}

// TestSnapshotIsDynamoShaped checks the JSON field names Dynamo readers use.
func TestSnapshotIsDynamoShaped(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 7}
	must(t, tr.Store(r, indexer.Stored{Hashes: []uint64{1 << 63, 5}, Tokens: make([]uint32, 8), BlockSize: 4, Seed: indexer.BaseSeed}))
	raw, err := MarshalSnapshot(tr.Dump())
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		BlockSize int `json:"block_size"`
		Events    []struct {
			WorkerID    uint64 `json:"worker_id"`
			StorageTier string `json:"storage_tier"`
			Event       struct {
				EventID uint64 `json:"event_id"`
				DPRank  uint32 `json:"dp_rank"`
				Data    struct {
					Stored struct {
						ParentHash *uint64 `json:"parent_hash"`
						Blocks     []struct {
							BlockHash  uint64 `json:"block_hash"`
							TokensHash uint64 `json:"tokens_hash"`
						} `json:"blocks"`
					} `json:"stored"`
				} `json:"data"`
			} `json:"event"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.BlockSize != 4 || len(v.Events) != 1 || v.Events[0].WorkerID != 7 || v.Events[0].StorageTier != "device" {
		t.Fatalf("unexpected dump %s", raw)
	}
	st := v.Events[0].Event.Data.Stored
	if st.ParentHash != nil || len(st.Blocks) != 2 || st.Blocks[0].BlockHash != 1<<63 || st.Blocks[1].BlockHash != 5 {
		t.Fatalf("unexpected stored event %s", raw)
	}
	if want := indexer.HashBlocks(nil, make([]uint32, 4), 4, indexer.BaseSeed)[0]; st.Blocks[0].TokensHash != want {
		t.Fatalf("tokens_hash %d, want %d", st.Blocks[0].TokensHash, want)
	}
	if !strings.Contains(string(raw), `"block_hash":9223372036854775808`) {
		t.Fatalf("hashes must be unsigned JSON integers: %s", raw)
	}
}

// TestSnapshotFlagsJSON: a rank the memory cap truncated, and a rank the
// stream layer marked degraded, carry their flags in the JSON
// ("truncated":true; "degraded":true with the reason), and a restore
// through it keeps them, with the watermark and digest.
func TestSnapshotFlagsJSON(t *testing.T) {
	const bs = 4
	ix := indexer.New(indexer.Options{MaxEntries: 30})
	a, b := indexer.PartitionKey{Model: "a", Group: "g"}, indexer.PartitionKey{Model: "b", Group: "g"}
	must(t, ix.AddPartition(a, bs))
	must(t, ix.AddPartition(b, bs))
	r1, r2, r3 := indexer.Rank{WorkerID: 1}, indexer.Rank{WorkerID: 2}, indexer.Rank{WorkerID: 3}
	apply := func(k indexer.PartitionKey, r indexer.Rank, ops ...indexer.Op) {
		t.Helper()
		_, err := ix.Apply(k, r, 0, ops)
		must(t, err)
	}
	apply(a, r1, chain(bs, 0, 10, 100))
	apply(b, r2, chain(bs, 10, 10, 200))
	apply(b, r3, chain(bs, 20, 10, 300))
	apply(b, r3, chain(bs, 30, 5, 400)) // 35 > 30: r1's chain in a is the oldest
	if st, err := ix.Rank(a, r1); err != nil || !st.Truncated || st.Blocks != 0 {
		t.Fatalf("r1 after the cap took its chain: %+v %v", st, err)
	}
	snap, err := ix.Snapshot(a)
	must(t, err)
	raw, viaUnmarshal, viaDecode := throughJSON(t, snap)
	if !strings.Contains(string(raw), `"truncated":true`) {
		t.Fatalf("dump lacks the truncated flag: %s", raw)
	}
	for how, back := range map[string]*indexer.Snapshot{"UnmarshalSnapshot": viaUnmarshal, "DecodeSnapshot": viaDecode} {
		other := indexer.New(indexer.Options{})
		must(t, other.Restore(a, back))
		if st, _ := other.Rank(a, r1); !st.Truncated {
			t.Fatalf("restored through JSON and %s %s: r1 not truncated", how, raw)
		}
	}

	const why = "lost history: the engine no longer has the batches"
	k, r := indexer.PartitionKey{Model: "m", Group: "default"}, indexer.Rank{WorkerID: 3}
	ix = indexer.New(indexer.Options{})
	must(t, ix.AddPartition(k, 4))
	st := indexer.Stored{Hashes: []uint64{10}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Seed: indexer.BaseSeed}
	_, err = ix.ApplyBatch(k, r, indexer.Mark{Seq: 9, Digest: 99, Degraded: true, Reason: why}, []indexer.Op{{Kind: indexer.OpStore, Store: st}})
	must(t, err)
	snap, err = ix.Snapshot(k)
	must(t, err)
	raw, viaUnmarshal, viaDecode = throughJSON(t, snap)
	if !strings.Contains(string(raw), `"degraded":true,"degraded_reason":"`+why+`"`) {
		t.Fatalf("dump lacks the degraded flag: %s", raw)
	}
	for how, back := range map[string]*indexer.Snapshot{"UnmarshalSnapshot": viaUnmarshal, "DecodeSnapshot": viaDecode} {
		other := indexer.New(indexer.Options{})
		must(t, other.Restore(k, back))
		rs, err := other.Rank(k, r)
		must(t, err)
		if !rs.Degraded || rs.DegradedReason != why || rs.Watermark != 9 || rs.Digest != 99 || rs.Blocks != 1 {
			t.Fatalf("restored through JSON and %s: %+v", how, rs)
		}
	}
}

// TestShardedSnapshotJSON: a 3-shard partition's snapshot is the same
// bytes from both writers and the same snapshot from both decoders, and
// restores from either into indexes of fewer and more shards with each
// rank in the shard it was dumped from and the live index's scores.
func TestShardedSnapshotJSON(t *testing.T) {
	k := indexer.PartitionKey{Model: "m", Group: "default"}
	s := newDumpSim(7, 4)
	live := indexer.New(indexer.Options{Shards: 3})
	must(t, live.AddPartition(k, 4))
	ranks := []indexer.Rank{{WorkerID: 1}, {WorkerID: 1, DPRank: 1}, {WorkerID: 2}, {WorkerID: 3}}
	for i := range 300 {
		r := ranks[s.rng.IntN(len(ranks))]
		_, err := live.Apply(k, r, uint64(i), s.batch(r))
		must(t, err)
	}
	snap, err := live.Snapshot(k)
	must(t, err)
	shards := map[uint32]bool{}
	for _, w := range snap.Ranks {
		shards[w.Shard] = true
	}
	if len(snap.Ranks) != 4 || len(shards) != 3 {
		t.Fatalf("snapshot ranks %+v, want 4 ranks over 3 shards", snap.Ranks)
	}
	_, viaUnmarshal, viaDecode := throughJSON(t, snap)
	if !reflect.DeepEqual(viaDecode, viaUnmarshal) || !reflect.DeepEqual(viaUnmarshal, snap) {
		t.Fatal("the decoders disagree on a sharded snapshot, or it did not come back")
	}
	scores := func(ix *indexer.Index) string {
		var out []string
		for _, d := range s.docs {
			o, err := ix.MatchTokens(k, d, indexer.BaseSeed, nil)
			must(t, err)
			slices.SortFunc(o, func(a, b indexer.Overlap) int {
				return cmp.Or(cmp.Compare(a.Rank.WorkerID, b.Rank.WorkerID), cmp.Compare(a.Rank.DPRank, b.Rank.DPRank))
			})
			out = append(out, fmt.Sprint(o))
		}
		return strings.Join(out, "\n")
	}
	for how, back := range map[string]*indexer.Snapshot{"UnmarshalSnapshot": viaUnmarshal, "DecodeSnapshot": viaDecode} {
		for _, n := range []int{1, 3, 5} {
			restored := indexer.New(indexer.Options{Shards: n})
			must(t, restored.Restore(k, back))
			if got, _ := restored.Shards(k); got != max(3, n) {
				t.Fatalf("%s into %d: %d shards, want %d", how, n, got, max(3, n))
			}
			again, err := restored.Snapshot(k)
			must(t, err)
			if !reflect.DeepEqual(again.Ranks, snap.Ranks) {
				t.Fatalf("%s into %d: restored partition dumps ranks\n %+v\nwas\n %+v", how, n, again.Ranks, snap.Ranks)
			}
			if scores(restored) != scores(live) {
				t.Fatalf("%s into %d: restored scores differ", how, n)
			}
		}
	}
}

// TestUnshardedSnapshotJSON: a dump of one tree names no shard, the shape
// dumps had before shards.
func TestUnshardedSnapshotJSON(t *testing.T) {
	k := indexer.PartitionKey{Model: "m", Group: "default"}
	one := indexer.New(indexer.Options{Shards: 1})
	must(t, one.AddPartition(k, 4))
	for i, r := range []indexer.Rank{{WorkerID: 1}, {WorkerID: 2}} {
		_, err := one.Apply(k, r, 0, []indexer.Op{chain(4, uint32(i), 3, uint64(10*i+1))})
		must(t, err)
	}
	snap, err := one.Snapshot(k)
	must(t, err)
	raw, err := MarshalSnapshot(snap)
	must(t, err)
	if strings.Contains(string(raw), `"shard"`) {
		t.Fatalf("a one-tree dump names shards: %s", raw)
	}
}

// TestHybridSnapshotJSON: a hybrid rank's layout and group blocks survive
// WriteSnapshot and DecodeSnapshot, whose MaxBlocks bounds the group
// blocks too.
func TestHybridSnapshotJSON(t *testing.T) {
	tr := indexer.NewTree(4)
	r := indexer.Rank{WorkerID: 7, DPRank: 2}
	hs := []uint64{100, 101, 102}
	// store stores blocks of ids in group g, four tokens each, the id's
	// block of tokens.
	store := func(g indexer.Group, hashes []uint64, ids ...uint32) indexer.Op {
		st := indexer.Stored{Hashes: hashes, BlockSize: 4, Seed: indexer.BaseSeed}
		for _, id := range ids {
			for j := range uint32(4) {
				st.Tokens = append(st.Tokens, id*4+j)
			}
		}
		return indexer.Op{Kind: indexer.OpStore, Group: g, Store: st}
	}
	sw := indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 5} // needs 1 block of 4
	fa := indexer.Group{Idx: 1, Kind: "full_attention"}
	for _, op := range []indexer.Op{
		store(sw, hs, 1, 2, 3),
		store(sw, hs[:1], 1),
		store(fa, hs, 1, 2, 3),
		{Kind: indexer.OpStore, Group: sw, Store: indexer.Stored{Hashes: hs[1:2], Tier: indexer.TierDisk}},
		store(indexer.Group{Idx: 2, Attention: indexer.AttentionOther, Kind: "mamba"}, hs, 1, 2, 3),
	} {
		must(t, tr.Apply(r, op))
	}
	snap := tr.Dump()
	if len(snap.Groups) != 3 {
		t.Fatalf("groups %+v, want 3", snap.Groups)
	}
	var buf bytes.Buffer
	must(t, WriteSnapshot(&buf, snap))
	got, err := DecodeSnapshot(json.NewDecoder(&buf), DecodeLimits{MaxBlocks: 3})
	must(t, err)
	if !reflect.DeepEqual(got.Groups, snap.Groups) {
		t.Fatalf("decoded groups %+v\nwant %+v", got.Groups, snap.Groups)
	}
	if !reflect.DeepEqual(got, snap) {
		t.Fatalf("decoded %+v\nwant %+v", *got, *snap)
	}
	buf.Reset()
	must(t, WriteSnapshot(&buf, snap))
	if _, err := DecodeSnapshot(json.NewDecoder(&buf), DecodeLimits{MaxBlocks: 2}); !errors.Is(err, ErrSnapshotTooLarge) {
		t.Fatalf("group blocks past the limit: %v", err)
	}
}
