package wire

import (
	"strconv"
	"strings"
	"testing"
)

// TestCheckBlockSize: which BlockStored events contradict a registered
// block size of 16, by vLLM's rules (whole blocks; hashes may skip null or
// cached blocks; a short last block) and SGLang's (one event per page,
// block_size = the page's tokens).
func TestCheckBlockSize(t *testing.T) {
	tokens := func(n int) []uint32 { return make([]uint32, n) }
	hashes := func(n int) []uint64 {
		h := make([]uint64, n)
		for i := range h {
			h[i] = uint64(i + 1)
		}
		return h
	}
	store := func(field, nTokens, nHashes int) Event {
		return Event{Kind: KindBlockStored, BlockSize: field, TokenIDs: tokens(nTokens), BlockHashes: hashes(nHashes), Medium: "GPU"}
	}
	with := func(ev Event, f func(*Event)) Event { f(&ev); return ev }
	for _, tc := range []struct {
		name      string
		ev        Event
		partialOK bool
		bad       bool
		engine    int
	}{
		{name: "whole blocks", ev: store(16, 64, 4)},
		{name: "vLLM skipped hashes (null or cached blocks)", ev: store(16, 64, 2)},
		{name: "a short last block", ev: store(16, 40, 3)},
		{name: "one short block", ev: store(16, 5, 1)},
		{name: "field 32", ev: store(32, 64, 2), bad: true, engine: 32},
		{name: "field 8", ev: store(8, 32, 4), bad: true, engine: 8},
		{name: "no field, 8 per hash", ev: store(0, 32, 4), bad: true, engine: 8},
		{name: "no field, whole blocks of 16", ev: store(0, 32, 2)},
		{name: "field 16, too few tokens", ev: store(16, 24, 3), bad: true, engine: 8},
		{name: "field 16, tokens not whole blocks", ev: store(16, 40, 2), bad: true, engine: 20},
		{name: "SGLang page of 1", ev: store(1, 1, 1), bad: true, engine: 1},
		{name: "SGLang short last page after full ones", ev: store(5, 5, 1), partialOK: true},
		{name: "SGLang short page, no full page seen", ev: store(5, 5, 1), bad: true, engine: 5},
		{name: "SGLang pages of 32", ev: store(32, 32, 1), partialOK: true, bad: true, engine: 32},
		{name: "offload (no tokens)", ev: with(store(256, 0, 2), func(e *Event) { e.Medium = "CPU" })},
		{name: "host tier from a connector", ev: with(store(256, 512, 2), func(e *Event) { e.Medium = "CPU" })},
		{name: "unknown medium", ev: with(store(32, 64, 2), func(e *Event) { e.Medium = "NVME" })},
		{name: "remote", ev: with(store(32, 64, 2), func(e *Event) { e.Locality = "REMOTE" })},
		{name: "mamba group", ev: with(store(32, 64, 2), func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.KVCacheSpecKind = 1, true, "mamba" })},
		{name: "sliding-window group", ev: with(store(32, 64, 2), func(e *Event) { e.GroupIdx, e.HasGroupIdx, e.KVCacheSpecKind = 1, true, "sliding_window" }),
			bad: true, engine: 32},
		{name: "remove", ev: Event{Kind: KindBlockRemoved, BlockHashes: hashes(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, bad := CheckBlockSize(&tc.ev, 16, tc.partialOK)
			if bad != tc.bad {
				t.Fatalf("bad = %v, want %v (%+v)", bad, tc.bad, m)
			}
			if !bad {
				return
			}
			if m.EngineSize() != tc.engine {
				t.Errorf("engine size %d, want %d", m.EngineSize(), tc.engine)
			}
			if r := m.Reason(); !strings.Contains(r, "registered with block_size 16") || (tc.engine > 0 && !strings.Contains(r, "says block size "+strconv.Itoa(tc.engine))) {
				t.Errorf("reason %q names not both sizes", r)
			}
		})
	}
}
