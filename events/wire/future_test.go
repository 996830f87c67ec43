package wire

import (
	"reflect"
	"testing"
)

// TestDecodeFutureForms: what the engines' open work may put on the wire
// (docs/wire.md, "Where the engines are going") is read as today's
// batches, never misread. A publisher epoch, a resume seq or a heartbeat
// marker after the envelope's rank, or as map-envelope keys, is skipped
// (vLLM PR #57789, SGLang PR #34407); an idle heartbeat with no events is
// an empty batch; session_id on BlockStored (vLLM PR #51381, SGLang PR
// #37482) is kept and never reaches the hash; new keys (continuation_id,
// vLLM RFC #48501) and new event tags (BlockInactive, vLLM PR #50732) are
// skipped, the rest of the batch decoded.
func TestDecodeFutureForms(t *testing.T) {
	epoch := []byte{0x9b, 0x1d, 0xeb, 0x4d, 0x3b, 0x7d, 0x4b, 0xad, 0x9b, 0xdd, 0x2b, 0x0d, 0x7b, 0x3d, 0xcb, 0x6d}
	withSession := stored91()
	withSession.SessionID = "sess-1"
	tests := []struct {
		name    string
		payload []byte
		want    *Batch
	}{
		{"epoch (16-byte bin) and resume seq after the rank",
			mp([]any{ts15, []any{map91()}, 1, epoch, uint64(41)}), batchOf(1, true, stored91())},
		{"epoch as a UUID string after the rank",
			mp([]any{ts15, []any{map91()}, 0, "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d"}), batchOf(0, true, stored91())},
		{"idle heartbeat: no events, epoch and a flag after the rank",
			mp([]any{ts15, []any{}, 0, epoch, true}), batchOf(0, true)},
		{"map envelope with epoch, heartbeat and snapshot keys",
			mp(kvs{"ts", ts15, "publisher_epoch", epoch, "events", []any{map91()}, "heartbeat", false,
				"snapshot", kvs{"resume_seq", 41, "blocks", []any{1, 2}}, "data_parallel_rank", 2}),
			batchOf(2, true, stored91())},
		{"map envelope heartbeat with empty events",
			mp(kvs{"ts", ts15, "heartbeat", true, "events", []any{}, "publisher_epoch", "e-2", "data_parallel_rank", 0}), batchOf(0, true)},
		{"session_id and continuation_id on a map BlockStored",
			mp([]any{ts15, []any{append(map91(), "session_id", "sess-1", "continuation_id", kvs{"turn", 3})}, 0}),
			batchOf(0, true, withSession)},
		{"a new event tag between known ones",
			mp([]any{ts15, []any{kvs{"type", "BlockInactive", "block_hashes", []any{H}, "session_id", "s"}, map91(),
				[]any{"BlockInactive", []any{H}}}, 0}),
			&Batch{TS: ts15, HasDPRank: true, Events: []Event{stored91()}, Unknown: 2}},
		{"array-era BlockStored grown past 15 elements",
			mp([]any{ts15, []any{[]any{"BlockStored", []any{H}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", nil, nil, nil, nil, nil,
				nil, nil, nil, "future", kvs{"epoch", 1}}}, 0}),
			batchOf(0, true, stored91())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			var got Batch
			if err := d.Decode(tc.payload, &got); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got.Unknown != tc.want.Unknown || got.Skipped.Total() != 0 || got.HasDPRank != tc.want.HasDPRank ||
				got.DPRank != tc.want.DPRank || len(got.Events) != len(tc.want.Events) {
				t.Fatalf("got %+v\nwant %+v", got, *tc.want)
			}
			for i := range got.Events {
				g, w := got.Events[i], tc.want.Events[i]
				if g.Kind != w.Kind || g.Tag != w.Tag || g.SessionID != w.SessionID || g.BlockSize != w.BlockSize ||
					!reflect.DeepEqual(g.BlockHashes, w.BlockHashes) || !reflect.DeepEqual(g.TokenIDs, w.TokenIDs) {
					t.Errorf("event %d: got %+v\nwant %+v", i, g, w)
				}
			}
			// session_id never reaches the hash: the ops equal the plain event's.
			var f [NumFilters]uint64
			ops := AppendOps(nil, &got, &f)
			plain := AppendOps(nil, &Batch{Events: []Event{stored91()}}, nil)
			for _, op := range ops {
				if !reflect.DeepEqual(op, plain[0]) {
					t.Errorf("op %+v, want the plain event's %+v", op, plain[0])
				}
			}
		})
	}
}
