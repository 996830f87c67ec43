package apiserver

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

	"github.com/prefixd/prefixd/indexer"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// referenceMarshal is the snapshot's JSON as it was written with
// encoding/json before the streaming writer (plus the truncated and
// degraded flags, omitted when false): the specification WriteSnapshot
// must match byte for byte.
func referenceMarshal(s *indexer.Snapshot) ([]byte, error) {
	js := jsonSnapshot{BlockSize: s.BlockSize, Events: make([]jsonEvent, 0, len(s.Events)), Watermarks: []jsonWatermark{}}
	for _, w := range s.Ranks {
		jw := jsonWatermark{WorkerID: w.Rank.WorkerID, DPRank: w.Rank.DPRank, Digest: w.Digest, Truncated: w.Truncated,
			Degraded: w.Degraded, DegradedReason: w.DegradedReason, Shard: w.Shard}
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
			if b.Counts != ([indexer.NumTiers]uint32{indexer.TierDevice: 1}) {
				jb.Counts = map[string]uint32{}
				for tier, c := range b.Counts {
					if c > 0 {
						jb.Counts[indexer.Tier(tier).String()] = c
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
			var single [indexer.NumTiers]uint32
			single[ev.Tier] = 1
			if b.Counts != single {
				jb.Counts = map[string]uint32{}
				for tier, c := range b.Counts {
					if c > 0 {
						jb.Counts[indexer.Tier(tier).String()] = c
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

// dumpSim is an engine stand-in that drives an index through its exported
// API only: each rank stores chains of blocks along a few documents that
// share prefixes (continuing from the longest prefix it holds, naming
// the parent), evicts the deepest block of a document, sometimes clears,
// offloads held blocks to host memory and drops host copies again.
type dumpSim struct {
	rng  *rand.Rand
	bs   int
	docs [][]uint32
	held map[indexer.Rank]map[string]uint64 // path of tokens → engine hash
	host map[indexer.Rank]map[uint64]bool   // engine hashes with a host copy
}

func newDumpSim(seed uint64, bs int) *dumpSim {
	s := &dumpSim{rng: rand.New(rand.NewPCG(seed, 7)), bs: bs,
		held: map[indexer.Rank]map[string]uint64{}, host: map[indexer.Rank]map[uint64]bool{}}
	for d := 0; d < 6; d++ {
		doc := make([]uint32, bs*(4+s.rng.IntN(20)))
		for i := range doc {
			doc[i] = uint32(s.rng.IntN(50))
		}
		if d > 0 && s.rng.IntN(2) == 0 { // share a prefix with an earlier document
			copy(doc, s.docs[0][:min(len(doc), len(s.docs[0]))/2])
		}
		s.docs = append(s.docs, doc)
	}
	return s
}

func pathOf(tokens []uint32) string { return fmt.Sprint(tokens) }

// engineHash is rank r's hash of the block that ends tokens.
func engineHash(r indexer.Rank, tokens []uint32) uint64 {
	return indexer.HashBlocks(nil, tokens, len(tokens), r.WorkerID*1000+uint64(r.DPRank))[0]
}

// heldHashes returns r's held engine hashes in path order.
func (s *dumpSim) heldHashes(r indexer.Rank) []uint64 {
	var out []uint64
	for _, k := range slices.Sorted(maps.Keys(s.held[r])) {
		out = append(out, s.held[r][k])
	}
	return out
}

// batch returns the next batch of ops for rank r.
func (s *dumpSim) batch(r indexer.Rank) []indexer.Op {
	held := s.held[r]
	if held == nil {
		held = map[string]uint64{}
		s.held[r] = held
	}
	var ops []indexer.Op
	for n := 1 + s.rng.IntN(3); n > 0; n-- {
		doc := s.docs[s.rng.IntN(len(s.docs))]
		blocks := len(doc) / s.bs
		if s.rng.IntN(4) == 0 && len(held) > 0 {
			for b := blocks; b > 0; b-- { // evict the deepest held block
				k := pathOf(doc[:b*s.bs])
				if x, ok := held[k]; ok {
					delete(held, k)
					ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{x}}})
					break
				}
			}
			continue
		}
		start := 0
		for start < blocks {
			if _, ok := held[pathOf(doc[:(start+1)*s.bs])]; !ok {
				break
			}
			start++
		}
		end := min(blocks, start+1+s.rng.IntN(6))
		if start == end {
			continue
		}
		st := indexer.Stored{BlockSize: s.bs, Seed: indexer.BaseSeed, Tokens: doc[start*s.bs : end*s.bs]}
		if start > 0 {
			st.Parent, st.HasParent = held[pathOf(doc[:start*s.bs])], true
		}
		for b := start; b < end; b++ {
			x := engineHash(r, doc[:(b+1)*s.bs])
			st.Hashes = append(st.Hashes, x)
			held[pathOf(doc[:(b+1)*s.bs])] = x
		}
		ops = append(ops, indexer.Op{Kind: indexer.OpStore, Store: st})
	}
	if s.host[r] == nil {
		s.host[r] = map[uint64]bool{}
	}
	host := s.host[r]
	if s.rng.IntN(40) == 0 {
		clear(held)
		clear(host)
		ops = append(ops, indexer.Op{Kind: indexer.OpClear})
	}
	if s.rng.IntN(3) == 0 { // offload some held blocks
		var hs []uint64
		for _, x := range s.heldHashes(r) {
			if s.rng.IntN(3) == 0 && !host[x] {
				hs = append(hs, x)
				host[x] = true
			}
		}
		if len(hs) > 0 {
			ops = append(ops, indexer.Op{Kind: indexer.OpStore, Store: indexer.Stored{Hashes: hs, Tier: indexer.TierHost, BlockSize: s.bs}})
		}
	}
	if s.rng.IntN(4) == 0 && len(host) > 0 { // drop a host copy
		xs := slices.Sorted(maps.Keys(host))
		x := xs[s.rng.IntN(len(xs))]
		ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{x}, Tier: indexer.TierHost}})
		delete(host, x)
	}
	return ops
}

// richSnapshots returns snapshots with every feature of the format, made
// through the index's exported API and by hand: tiers and multi-tier
// blocks, copy counts past 255, structural nodes, missing and present
// watermarks and digests, truncated ranks (the memory cap and rank
// capacities), degraded ranks with reasons that need escaping, ranks over
// several shards, hybrid models' KV-cache groups, empty parts.
func richSnapshots(t testing.TB) map[string]*indexer.Snapshot {
	type (
		Rank       = indexer.Rank
		DumpEvent  = indexer.DumpEvent
		DumpBlock  = indexer.DumpBlock
		DumpNode   = indexer.DumpNode
		Watermark  = indexer.RankWatermark
		Snapshot   = indexer.Snapshot
		tierCounts = [indexer.NumTiers]uint32
	)
	out := map[string]*Snapshot{
		"empty":              {BlockSize: 16},
		"empty slices":       {BlockSize: 16, Ranks: []Watermark{}, Events: []DumpEvent{}, Structural: []DumpNode{}},
		"nil structural":     {BlockSize: 4, Structural: []DumpNode{{Node: 3, ParentNode: 1}, {Node: 4, Hashes: []uint64{}}}},
		"event of no blocks": {BlockSize: 4, Events: []DumpEvent{{Rank: Rank{WorkerID: 1, DPRank: 2}, Tier: indexer.TierDisk, Node: 1}}},
		"zero counts": {BlockSize: 4, Events: []DumpEvent{{Rank: Rank{WorkerID: 1, DPRank: 2}, Tier: indexer.TierHost, Node: 1,
			Blocks: []DumpBlock{{Hash: 1}}}}},
		"extremes": {BlockSize: 1<<31 - 1,
			Ranks: []Watermark{{Rank: Rank{WorkerID: ^uint64(0), DPRank: ^uint32(0)}, Seq: ^uint64(0), HasSeq: true, Digest: ^uint64(0),
				Truncated: true, Degraded: true, DegradedReason: "\x00\"\\<>&\u2028é", Shard: ^uint32(0)}},
			Events: []DumpEvent{{Rank: Rank{WorkerID: ^uint64(0), DPRank: ^uint32(0)}, Tier: indexer.TierExternal, ParentHash: ^uint64(0),
				HasParent: true, Node: ^uint32(0), ParentNode: ^uint32(0), Offset: ^uint32(0),
				Blocks: []DumpBlock{{Hash: ^uint64(0), TokensHash: 1 << 63, Counts: tierCounts{^uint32(0), 1, 2, 3}}}}}},
	}
	key := indexer.PartitionKey{Model: "m", Group: "default"}
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		s := newDumpSim(seed, 4)
		ix := indexer.New(indexer.Options{MaxEntries: 60 * int(seed), Shards: 1 + int(seed%3)})
		must(t, ix.AddPartition(key, 4))
		ranks := []Rank{{WorkerID: 1}, {WorkerID: 1, DPRank: 1}, {WorkerID: 2}, {WorkerID: 3}}
		// Rank 2's device capacity truncates it.
		must(t, ix.SetRankCapacity(key, ranks[2], indexer.Capacity{indexer.TierDevice: 6 + int(seed)}))
		// Rank 3 is a hybrid model's: every store of its main group 0 goes
		// to a sliding-window group 1 too, some removes as well.
		sw := indexer.Group{Idx: 1, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 6}
		for i := 0; i < 300; i++ {
			r := ranks[rng.IntN(len(ranks))]
			ops := s.batch(r)
			if rng.IntN(5) == 0 && len(s.held[r]) > 0 {
				// Remove a block inside a chain (the sim only removes tails):
				// leaves edges no rank holds.
				keys := slices.Sorted(maps.Keys(s.held[r]))
				k := keys[rng.IntN(len(keys))]
				ops = append(ops, indexer.Op{Kind: indexer.OpRemove, Remove: indexer.Removed{Hashes: []uint64{s.held[r][k]}}})
				delete(s.held[r], k)
			}
			if rng.IntN(7) == 0 {
				if hs := s.heldHashes(r); len(hs) > 0 { // many copies of one block
					for range 300 {
						ops = append(ops, indexer.Op{Kind: indexer.OpStore, Store: indexer.Stored{Hashes: hs[:1], Tier: indexer.TierDisk, BlockSize: 4}})
					}
				}
			}
			if r == ranks[3] {
				for _, op := range slices.Clone(ops) {
					if op.Kind == indexer.OpStore || (op.Kind == indexer.OpRemove && rng.IntN(2) == 0) {
						op.Group = sw
						if op.Kind == indexer.OpRemove {
							op.Group = indexer.Group{Idx: sw.Idx}
						}
						ops = append(ops, op)
					}
				}
			}
			_, err := ix.ApplyBatch(key, r, indexer.Mark{Seq: uint64(i), Digest: uint64(rng.IntN(3)) * rng.Uint64(), Degraded: i%5 == 0,
				Reason: []string{"", "lost \"history\""}[i%2]}, ops)
			must(t, err)
		}
		for _, r := range ranks {
			// Each rank drops the first three blocks of every document:
			// the edges above the rest become structural. Rank 1's batch
			// leaves it degraded, with a reason that needs escaping.
			var rm indexer.Removed
			for _, doc := range s.docs {
				for b := 1; b <= 3; b++ {
					rm.Hashes = append(rm.Hashes, engineHash(r, doc[:4*b]))
				}
			}
			m := indexer.Mark{Seq: 1000, Digest: seed}
			if r.WorkerID == 1 {
				m.Degraded, m.Reason = true, `lost history: "replay" <gone> & the engine restarted`
			}
			_, err := ix.ApplyBatch(key, r, m, []indexer.Op{{Kind: indexer.OpRemove, Remove: rm}})
			must(t, err)
		}
		if seed%2 == 0 {
			// A rank started over: no watermark, no blocks, degraded.
			must(t, ix.Reset(key, ranks[1], true, "replay: the engine no longer has the batches"))
		}
		snap, err := ix.Snapshot(key)
		must(t, err)
		out[fmt.Sprintf("stream %d", seed)] = snap
	}
	{
		// A hybrid rank: main group 2, a sliding-window group with host
		// copies and many copies of a block, an untracked group whose kind
		// needs escaping.
		tr := indexer.NewTree(4)
		r := Rank{WorkerID: 5, DPRank: 1}
		chain := indexer.Stored{BlockSize: 4, Seed: indexer.BaseSeed}
		for i := range 5 {
			for j := range 4 {
				chain.Tokens = append(chain.Tokens, uint32((1+i)*4+j))
			}
			chain.Hashes = append(chain.Hashes, 100+uint64(i))
		}
		sw := indexer.Group{Idx: 0, Attention: indexer.AttentionSlidingWindow, Kind: "sliding_window", Window: 9}
		ops := []indexer.Op{
			{Kind: indexer.OpStore, Group: sw, Store: chain},
			{Kind: indexer.OpStore, Group: indexer.Group{Idx: 2, Kind: "full_attention"}, Store: chain},
			{Kind: indexer.OpStore, Group: indexer.Group{Idx: 3, Attention: indexer.AttentionOther, Kind: "<odd \"kind\">"}, Store: chain},
			{Kind: indexer.OpStore, Group: sw, Store: indexer.Stored{Hashes: []uint64{103, 104}, Tier: indexer.TierHost}},
			{Kind: indexer.OpRemove, Group: indexer.Group{Idx: 0}, Remove: indexer.Removed{Hashes: []uint64{100}}},
		}
		for range 300 {
			ops = append(ops, indexer.Op{Kind: indexer.OpStore, Group: sw, Store: indexer.Stored{Hashes: []uint64{101}, Tier: indexer.TierDisk}})
		}
		for _, op := range ops {
			must(t, tr.Apply(r, op))
		}
		out["hybrid"] = tr.Dump()
	}
	var have struct{ structural, multiTier, overflow, truncated, noSeq, groups, degraded, shards bool }
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
		shards := map[uint32]bool{}
		for _, w := range s.Ranks {
			have.truncated = have.truncated || w.Truncated
			have.noSeq = have.noSeq || !w.HasSeq
			have.degraded = have.degraded || (w.Degraded && strings.ContainsAny(w.DegradedReason, `"<&`) && strings.HasPrefix(name, "stream"))
			shards[w.Shard] = true
		}
		have.shards = have.shards || (len(shards) > 1 && strings.HasPrefix(name, "stream"))
		have.groups = have.groups || len(s.Groups) > 2
	}
	if !have.structural || !have.multiTier || !have.overflow || !have.truncated || !have.noSeq || !have.groups || !have.degraded || !have.shards {
		t.Fatalf("snapshots lack a feature: %+v", have)
	}
	return out
}

// TestWriteSnapshotMatchesMarshal: WriteSnapshot (and MarshalSnapshot,
// which uses it) writes exactly the bytes of the encoding/json form,
// through writers that take any number of bytes per write.
func TestWriteSnapshotMatchesMarshal(t *testing.T) {
	for name, s := range richSnapshots(t) {
		want, err := referenceMarshal(s)
		must(t, err)
		var got bytes.Buffer
		must(t, WriteSnapshot(&got, s))
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("%s: WriteSnapshot differs from encoding/json at byte %d:\n got  %.300s\n want %.300s", name, firstDiff(got.Bytes(), want), got.Bytes(), want)
		}
		m, err := MarshalSnapshot(s)
		must(t, err)
		if !bytes.Equal(m, want) {
			t.Fatalf("%s: MarshalSnapshot differs", name)
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

func TestWriteSnapshotReturnsWriteError(t *testing.T) {
	s := richSnapshots(t)["stream 6"]
	if err := WriteSnapshot(&failWriter{n: 100}, s); err == nil || err.Error() != "disk full" {
		t.Fatalf("WriteSnapshot to a failing writer: %v", err)
	}
}

func decodeOne(raw []byte, lim DecodeLimits) (*indexer.Snapshot, error) {
	return DecodeSnapshot(json.NewDecoder(bytes.NewReader(raw)), lim)
}

// variants rewrites a snapshot's JSON in ways UnmarshalSnapshot reads the
// same: keys in another order (storage_tier after the blocks it applies
// to), unknown keys and values, keys in another case, explicit nulls.
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
// UnmarshalSnapshot yields, for rich snapshots and rewritten forms of
// them, and leaves the decoder at the next value.
func TestDecodeSnapshotMatchesUnmarshal(t *testing.T) {
	for name, s := range richSnapshots(t) {
		raw, err := MarshalSnapshot(s)
		must(t, err)
		for vname, data := range variants(t, raw) {
			want, err := UnmarshalSnapshot(data)
			must(t, err)
			dec := json.NewDecoder(io.MultiReader(bytes.NewReader(data), strings.NewReader(` 42`)))
			got, err := DecodeSnapshot(dec, DecodeLimits{})
			if err != nil {
				t.Fatalf("%s, %s: %v\n%.400s", name, vname, err, data)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s, %s: decoded\n %+v\nUnmarshalSnapshot\n %+v", name, vname, *got, *want)
			}
			var next int
			if err := dec.Decode(&next); err != nil || next != 42 {
				t.Fatalf("%s, %s: decoder not left at the next value: %v %v", name, vname, next, err)
			}
		}
	}
}

// TestDecodeSnapshotEdgeCases compares DecodeSnapshot and
// UnmarshalSnapshot on hand-written inputs, including ones both reject.
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
		want, wantErr := UnmarshalSnapshot([]byte(in))
		got, err := decodeOne([]byte(in), DecodeLimits{})
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%s: DecodeSnapshot error %v, UnmarshalSnapshot error %v", in, err, wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, UnmarshalSnapshot %+v", in, *got, *want)
		}
	}
	if _, err := decodeOne([]byte(`{"error":"partition m:g: boom"}`), DecodeLimits{}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("error object: %v", err)
	}
}

// TestDecodeSnapshotLimits: limits fail with ErrSnapshotTooLarge naming
// the field, and a snapshot exactly at them decodes.
func TestDecodeSnapshotLimits(t *testing.T) {
	var s *indexer.Snapshot
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
	raw, err := MarshalSnapshot(s)
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
	s := &indexer.Snapshot{BlockSize: 4, Structural: []indexer.DumpNode{{Node: 1, Hashes: []uint64{1, 2}}, {Node: 2, ParentNode: 1, Hashes: []uint64{3}}}}
	raw, err := MarshalSnapshot(s)
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
// UnmarshalSnapshot accepts (within its limits) and yields the same.
func FuzzDecodeSnapshot(f *testing.F) {
	for _, s := range richSnapshots(f) {
		raw, _ := MarshalSnapshot(s)
		if len(raw) < 4096 {
			f.Add(raw)
		}
	}
	f.Add([]byte(`{"events":[{"storage_tier":"device","event":{"data":{"stored":{"blocks":[{"block_hash":1}]}}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeOne(data, DecodeLimits{MaxBlocks: 1000, MaxEvents: 1000})
		want, wantErr := UnmarshalSnapshot(data)
		if wantErr != nil {
			return
		}
		switch {
		case err != nil && !errors.Is(err, ErrSnapshotTooLarge) && !strings.Contains(err.Error(), "snapshot is an error"):
			t.Fatalf("%q: UnmarshalSnapshot accepts it, DecodeSnapshot: %v", data, err)
		case err == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("%q: decoded %+v, UnmarshalSnapshot %+v", data, *got, *want)
		}
	})
}
