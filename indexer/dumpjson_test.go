package indexer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// referenceMarshal is MarshalJSON as it was written with encoding/json
// before the streaming writer (plus the truncated flag, omitted when
// false): the specification WriteJSON must match byte for byte.
func referenceMarshal(s *Snapshot) ([]byte, error) {
	js := jsonSnapshot{BlockSize: s.BlockSize, Events: make([]jsonEvent, 0, len(s.Events)), Watermarks: []jsonWatermark{}}
	for _, w := range s.Ranks {
		jw := jsonWatermark{WorkerID: w.Rank.WorkerID, DPRank: w.Rank.DPRank, Digest: w.Digest, Truncated: w.Truncated, Shard: w.Shard}
		if w.HasSeq {
			seq := w.Seq
			jw.Seq = &seq
		}
		js.Watermarks = append(js.Watermarks, jw)
	}
	for _, d := range s.Structural {
		js.Structural = append(js.Structural, jsonNode(d))
	}
	for _, g := range s.Groups {
		jg := jsonGroup{WorkerID: g.Rank.WorkerID, DPRank: g.Rank.DPRank, Idx: g.Idx, Attention: g.Attention.String(),
			Kind: g.Kind, Window: g.Window, Main: g.Main, Tracked: g.Tracked}
		for _, b := range g.Blocks {
			jb := jsonGroupBlock{BlockHash: b.Hash}
			if b.Counts != ([NumTiers]uint32{TierDevice: 1}) {
				jb.Counts = map[string]uint32{}
				for tier, c := range b.Counts {
					if c > 0 {
						jb.Counts[Tier(tier).String()] = c
					}
				}
			}
			jg.Blocks = append(jg.Blocks, jb)
		}
		js.Groups = append(js.Groups, jg)
	}
	for i, ev := range s.Events {
		st := &jsonStored{Blocks: make([]jsonBlock, len(ev.Blocks))}
		if ev.HasParent {
			p := ev.ParentHash
			st.ParentHash = &p
		}
		for j, b := range ev.Blocks {
			jb := jsonBlock{BlockHash: b.Hash, TokensHash: b.TokensHash}
			var single [NumTiers]uint32
			single[ev.Tier] = 1
			if b.Counts != single {
				jb.Counts = map[string]uint32{}
				for tier, c := range b.Counts {
					if c > 0 {
						jb.Counts[Tier(tier).String()] = c
					}
				}
			}
			st.Blocks[j] = jb
		}
		js.Events = append(js.Events, jsonEvent{
			WorkerID: ev.Rank.WorkerID, StorageTier: ev.Tier.String(),
			Event: jsonKvEvent{EventID: uint64(i), DPRank: ev.Rank.DPRank, Data: jsonKvData{Stored: st}},
			Node:  ev.Node, ParentNode: ev.ParentNode, Offset: ev.Offset,
		})
	}
	return json.Marshal(js)
}

// richSnapshots returns snapshots with every feature of the format: tiers
// and multi-tier blocks, copy counts past 255, structural nodes, missing
// and present watermarks and digests, truncated ranks, empty parts.
func richSnapshots(t testing.TB) map[string]*Snapshot {
	must := func(_ testing.TB, err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]*Snapshot{
		"empty":              {BlockSize: 16},
		"empty slices":       {BlockSize: 16, Ranks: []RankWatermark{}, Events: []DumpEvent{}, Structural: []DumpNode{}},
		"nil structural":     {BlockSize: 4, Structural: []DumpNode{{Node: 3, ParentNode: 1}, {Node: 4, Hashes: []uint64{}}}},
		"event of no blocks": {BlockSize: 4, Events: []DumpEvent{{Rank: Rank{1, 2}, Tier: TierDisk, Node: 1}}},
		"zero counts":        {BlockSize: 4, Events: []DumpEvent{{Rank: Rank{1, 2}, Tier: TierHost, Node: 1, Blocks: []DumpBlock{{Hash: 1}}}}},
		"extremes": {BlockSize: 1<<31 - 1, Ranks: []RankWatermark{{Rank: Rank{^uint64(0), ^uint32(0)}, Seq: ^uint64(0), HasSeq: true, Digest: ^uint64(0), Truncated: true}},
			Events: []DumpEvent{{Rank: Rank{^uint64(0), ^uint32(0)}, Tier: TierExternal, ParentHash: ^uint64(0), HasParent: true, Node: ^uint32(0), ParentNode: ^uint32(0), Offset: ^uint32(0),
				Blocks: []DumpBlock{{Hash: ^uint64(0), TokensHash: 1 << 63, Counts: [NumTiers]uint32{^uint32(0), 1, 2, 3}}}}}},
	}
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		s := &tierSim{sim: newSim(seed, 4), offloaded: map[Rank]map[uint64]bool{}}
		ix := New(Options{MaxEntries: 40 * int(seed)})
		must(t, ix.AddPartition(testKey, 4))
		ranks := []Rank{{1, 0}, {1, 1}, {2, 0}, {3, 0}}
		for i := 0; i < 300; i++ {
			r := ranks[rng.IntN(len(ranks))]
			ops := s.batch(r)
			if rng.IntN(5) == 0 && len(s.held[r]) > 0 {
				// Remove a block inside a chain (the sim only removes tails):
				// leaves edges no rank holds.
				keys := slices.Sorted(maps.Keys(s.held[r]))
				k := keys[rng.IntN(len(keys))]
				ops = append(ops, Op{Kind: OpRemove, Remove: Removed{Hashes: []uint64{s.held[r][k]}}})
				delete(s.held[r], k)
			}
			if rng.IntN(7) == 0 {
				if hs := sortedValues(s.held[r]); len(hs) > 0 { // many copies of one block
					for range 300 {
						ops = append(ops, Op{Kind: OpStore, Store: Stored{Hashes: hs[:1], Tier: TierDisk, BlockSize: 4}})
					}
				}
			}
			_, err := ix.ApplyBatch(testKey, r, Mark{Seq: uint64(i), Digest: uint64(rng.IntN(3)) * rng.Uint64(), Degraded: i%5 == 0, Reason: []string{"", "lost \"history\""}[i%2]}, ops)
			must(t, err)
		}
		for _, r := range ranks {
			// Each rank drops the first three blocks of every document:
			// the edges above the rest become structural.
			var rm Removed
			for _, doc := range s.docs {
				for b := 1; b <= 3; b++ {
					rm.Hashes = append(rm.Hashes, extHash(r, doc[:4*b]))
				}
			}
			_, err := ix.Apply(testKey, r, 1000, []Op{{Kind: OpRemove, Remove: rm}})
			must(t, err)
		}
		snap, err := ix.Snapshot(testKey)
		must(t, err)
		out[fmt.Sprintf("stream %d", seed)] = snap
	}
	{
		// A hybrid rank: main group 2, a sliding-window group with host
		// copies and many copies of a block, an untracked group whose kind
		// needs escaping.
		tr := NewTree(4)
		r := Rank{5, 1}
		sw := Group{Idx: 0, Attention: AttentionSlidingWindow, Kind: "sliding_window", Window: 9}
		ops := []Op{
			{Kind: OpStore, Group: sw, Store: chainOp(4, 1, 5, 100).Store},
			{Kind: OpStore, Group: Group{Idx: 2, Kind: "full_attention"}, Store: chainOp(4, 1, 5, 100).Store},
			{Kind: OpStore, Group: Group{Idx: 3, Attention: AttentionOther, Kind: "<odd \"kind\">"}, Store: chainOp(4, 1, 5, 100).Store},
			{Kind: OpStore, Group: sw, Store: Stored{Hashes: []uint64{103, 104}, Tier: TierHost}},
			{Kind: OpRemove, Group: Group{Idx: 0}, Remove: Removed{Hashes: []uint64{100}}},
		}
		for range 300 {
			ops = append(ops, Op{Kind: OpStore, Group: sw, Store: Stored{Hashes: []uint64{101}, Tier: TierDisk}})
		}
		for _, op := range ops {
			must(t, tr.Apply(r, op))
		}
		out["hybrid"] = tr.Dump()
	}
	var have struct{ structural, multiTier, overflow, truncated, noSeq, groups bool }
	for name, s := range out {
		have.structural = have.structural || (len(s.Structural) > 0 && strings.HasPrefix(name, "stream"))
		for _, ev := range s.Events {
			for _, b := range ev.Blocks {
				n := 0
				for _, c := range b.Counts {
					if c > 0 {
						n++
					}
					have.overflow = have.overflow || c > 255
				}
				have.multiTier = have.multiTier || n > 1
			}
		}
		for _, w := range s.Ranks {
			have.truncated = have.truncated || w.Truncated
			have.noSeq = have.noSeq || !w.HasSeq
		}
		have.groups = have.groups || len(s.Groups) > 2
	}
	if !have.structural || !have.multiTier || !have.overflow || !have.truncated || !have.groups {
		t.Fatalf("snapshots lack a feature: %+v", have)
	}
	return out
}

// TestWriteJSONMatchesMarshal: WriteJSON (and MarshalJSON, which uses it)
// writes exactly the bytes of the encoding/json form, through writers that
// take any number of bytes per write.
func TestWriteJSONMatchesMarshal(t *testing.T) {
	for name, s := range richSnapshots(t) {
		want, err := referenceMarshal(s)
		must(t, err)
		var got bytes.Buffer
		must(t, s.WriteJSON(&got))
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("%s: WriteJSON differs from encoding/json at byte %d:\n got  %.300s\n want %.300s", name, firstDiff(got.Bytes(), want), got.Bytes(), want)
		}
		m, err := json.Marshal(s)
		must(t, err)
		if !bytes.Equal(m, want) {
			t.Fatalf("%s: json.Marshal differs", name)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n -= len(p); w.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriteJSONReturnsWriteError(t *testing.T) {
	s := richSnapshots(t)["stream 6"]
	if err := s.WriteJSON(&failWriter{n: 100}); err == nil || err.Error() != "disk full" {
		t.Fatalf("WriteJSON to a failing writer: %v", err)
	}
}

func decodeOne(raw []byte, lim DecodeLimits) (*Snapshot, error) {
	return DecodeSnapshot(json.NewDecoder(bytes.NewReader(raw)), lim)
}

// variants rewrites a snapshot's JSON in ways UnmarshalJSON reads the same:
// keys in another order (storage_tier after the blocks it applies to),
// unknown keys and values, keys in another case, explicit nulls.
func variants(t *testing.T, raw []byte) map[string][]byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	must(t, dec.Decode(&v))
	sorted, err := json.Marshal(v) // map keys sorted: "event" before "storage_tier"
	must(t, err)
	var walk func(v any, depth int) any
	walk = func(v any, depth int) any {
		switch x := v.(type) {
		case map[string]any:
			out := map[string]any{"zz_unknown": []any{map[string]any{"a": []any{1, "}"}}, nil}}
			for k, e := range x {
				if k != "counts" { // a map, not a struct: keys are data
					e = walk(e, depth+1)
				}
				if k == "dp_rank" || k == "tokens_hash" {
					k = strings.ToUpper(k)
				}
				out[k] = e
			}
			delete(out, "start_position")
			if _, ok := out["digest"]; !ok {
				if _, ok := out["last_event_id"]; ok {
					out["digest"] = nil
				}
			}
			return out
		case []any:
			for i := range x {
				x[i] = walk(x[i], depth+1)
			}
			return x
		}
		return v
	}
	w, err := json.Marshal(walk(v, 0))
	must(t, err)
	return map[string][]byte{"as written": raw, "sorted keys": sorted, "rewritten": w}
}

// TestDecodeSnapshotMatchesUnmarshal: DecodeSnapshot yields exactly what
// UnmarshalJSON yields, for rich snapshots and rewritten forms of them,
// and leaves the decoder at the next value.
func TestDecodeSnapshotMatchesUnmarshal(t *testing.T) {
	for name, s := range richSnapshots(t) {
		raw, err := s.MarshalJSON()
		must(t, err)
		for vname, data := range variants(t, raw) {
			var want Snapshot
			must(t, json.Unmarshal(data, &want))
			dec := json.NewDecoder(io.MultiReader(bytes.NewReader(data), strings.NewReader(` 42`)))
			got, err := DecodeSnapshot(dec, DecodeLimits{})
			if err != nil {
				t.Fatalf("%s, %s: %v\n%.400s", name, vname, err, data)
			}
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("%s, %s: decoded\n %+v\nUnmarshalJSON\n %+v", name, vname, *got, want)
			}
			var next int
			if err := dec.Decode(&next); err != nil || next != 42 {
				t.Fatalf("%s, %s: decoder not left at the next value: %v %v", name, vname, next, err)
			}
		}
	}
}

// TestDecodeSnapshotEdgeCases compares DecodeSnapshot and UnmarshalJSON on
// hand-written inputs, including ones both reject.
func TestDecodeSnapshotEdgeCases(t *testing.T) {
	for _, in := range []string{
		`{}`,
		`null`,
		`{"block_size":4,"events":null,"watermarks":null}`,
		`{"block_size":4,"block_size":8}`,
		`{"events":[{"storage_tier":"host_pinned","event":{"data":{"stored":{"blocks":[{"block_hash":1},{"block_hash":2,"counts":{}}]}}}}]}`,
		`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"parent_hash":5},"stored":{"blocks":[]}}}}]}`,
		`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"parent_hash":5},"stored":null,"stored":{"blocks":[]}}}}]}`,
		`{"events":[{"event":{"data":{"stored":{"blocks":[{"block_hash":1}]}}},"storage_tier":"disk"}]}`,
		`{"watermarks":[{"worker_id":1,"last_event_id":null},{"dp_rank":3,"last_event_id":0,"truncated":true}]}`,
		`{"structural_nodes":[{"node":1,"tokens_hashes":null},{"node":2,"tokens_hashes":[]},{"tokens_hashes":[1,2]}]}`,
		`{"events":[{"storage_tier":"device","event":{"data":{}}}]}`,
		`{"events":[{"storage_tier":"gpu","event":{"data":{"stored":{}}}}]}`,
		`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"blocks":[{"counts":{"gpu":1}}]}}}}]}`,
		`{"events":[{"worker_id":-1}]}`,
		`{"block_size":"4"}`,
		`{"events":{}}`,
		`[]`,
		`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"blocks":[{"block_hash":1.5}]}}}}]}`,
		`{"groups":null}`,
		`{"groups":[]}`,
		`{"groups":[{"attention":"full","main":true},{"ATTENTION":"sliding_window","sliding_window":5,"blocks":[{"block_hash":1},{"block_hash":2,"counts":{}}]}]}`,
		`{"groups":[{"attention":"sliding_window","blocks":[{"block_hash":3}],"blocks":null,"blocks":[{"block_hash":4,"counts":{"disk":2}}]}]}`,
		`{"groups":[{"attention":"bogus"}]}`,
		`{"groups":[{"worker_id":1}]}`,
		`{"groups":[{"attention":"other","blocks":[{"counts":{"gpu":1}}]}]}`,
		`{"groups":[{"attention":"full","group_idx":1.5}]}`,
	} {
		var want Snapshot
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := decodeOne([]byte(in), DecodeLimits{})
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%s: DecodeSnapshot error %v, UnmarshalJSON error %v", in, err, wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(*got, want) {
			t.Errorf("%s: decoded %+v, UnmarshalJSON %+v", in, *got, want)
		}
	}
	if _, err := decodeOne([]byte(`{"error":"partition m:g: boom"}`), DecodeLimits{}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("error object: %v", err)
	}
}

// TestDecodeSnapshotLimits: limits fail with ErrSnapshotTooLarge naming
// the field, and a snapshot exactly at them decodes.
func TestDecodeSnapshotLimits(t *testing.T) {
	var s *Snapshot
	most := 0
	for _, c := range richSnapshots(t) {
		n := 0
		for _, d := range c.Structural {
			n += len(d.Hashes)
		}
		if n > most && len(c.Events) > 10 {
			s, most = c, n
		}
	}
	if most < 2 {
		t.Fatal("no snapshot with structural nodes")
	}
	raw, err := s.MarshalJSON()
	must(t, err)
	blocks, hashes := 0, 0
	for _, ev := range s.Events {
		blocks += len(ev.Blocks)
	}
	for _, n := range s.Structural {
		hashes += len(n.Hashes)
	}
	for _, c := range []struct {
		lim   DecodeLimits
		field string // "" = must decode
	}{
		{DecodeLimits{MaxEvents: len(s.Events), MaxBlocks: max(blocks, hashes)}, ""},
		{DecodeLimits{MaxEvents: len(s.Events) - 1}, "events: more than"},
		{DecodeLimits{MaxBlocks: blocks - 1}, ".event.data.stored.blocks: more than"},
		{DecodeLimits{MaxBlocks: blocks, MaxEvents: len(s.Events)}, ""},
	} {
		if c.lim.MaxBlocks == blocks && hashes > blocks {
			continue
		}
		_, err := decodeOne(raw, c.lim)
		switch {
		case c.field == "" && err != nil:
			t.Errorf("limits %+v: %v", c.lim, err)
		case c.field != "" && (!errors.Is(err, ErrSnapshotTooLarge) || !strings.Contains(err.Error(), c.field)):
			t.Errorf("limits %+v: error %v, want ErrSnapshotTooLarge naming %q", c.lim, err, c.field)
		}
	}
}

func TestDecodeSnapshotLimitsStructural(t *testing.T) {
	s := &Snapshot{BlockSize: 4, Structural: []DumpNode{{Node: 1, Hashes: []uint64{1, 2}}, {Node: 2, ParentNode: 1, Hashes: []uint64{3}}}}
	raw, err := s.MarshalJSON()
	must(t, err)
	if _, err := decodeOne(raw, DecodeLimits{MaxBlocks: 3}); err != nil {
		t.Fatal(err)
	}
	_, err = decodeOne(raw, DecodeLimits{MaxBlocks: 2})
	if !errors.Is(err, ErrSnapshotTooLarge) || !strings.Contains(err.Error(), "structural_nodes[1].tokens_hashes: more than 2") {
		t.Fatalf("error %v, want ErrSnapshotTooLarge naming structural_nodes[1].tokens_hashes", err)
	}
}

// FuzzDecodeSnapshot: DecodeSnapshot never panics, accepts what
// UnmarshalJSON accepts (within its limits) and yields the same.
func FuzzDecodeSnapshot(f *testing.F) {
	for _, s := range richSnapshots(f) {
		raw, _ := s.MarshalJSON()
		if len(raw) < 4096 {
			f.Add(raw)
		}
	}
	f.Add([]byte(`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"blocks":[{"block_hash":1}]}}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeOne(data, DecodeLimits{MaxBlocks: 1000, MaxEvents: 1000})
		var want Snapshot
		if json.Unmarshal(data, &want) != nil {
			return
		}
		switch {
		case err != nil && !errors.Is(err, ErrSnapshotTooLarge) && !strings.Contains(err.Error(), "snapshot is an error"):
			t.Fatalf("%q: UnmarshalJSON accepts it, DecodeSnapshot: %v", data, err)
		case err == nil && !reflect.DeepEqual(*got, want):
			t.Fatalf("%q: decoded %+v, UnmarshalJSON %+v", data, *got, want)
		}
	})
}
