package daemon

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/catalog/storetest"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/sim/mocker/publishtest"
	"github.com/prefixd/prefixd/internal/status"
	"github.com/prefixd/prefixd/internal/testsupport"
	"github.com/prefixd/prefixd/internal/testsupport/pypub"
	"github.com/prefixd/prefixd/internal/testsupport/testlog"
)

// sizeEngine is an engine rank publishing over real ZMQ: the mocker's Go
// publisher (vLLM's map era) or pypub, libzmq's (any era it speaks).
type sizeEngine struct {
	endpoint, replay string
	publish          func(evs ...map[string]any) uint64 // one batch; returns its seq
}

func goEngine(t *testing.T) sizeEngine {
	e := publishtest.Start(t, 0)
	return sizeEngine{endpoint: e.Pub.Endpoint(), replay: e.Pub.ReplayEndpoint(), publish: func(evs ...map[string]any) uint64 {
		var batch []wire.Event
		for _, ev := range evs {
			if ev["type"] == "AllBlocksCleared" {
				batch = append(batch, wire.Event{Kind: wire.KindAllBlocksCleared})
				continue
			}
			w := wire.Event{Kind: wire.KindBlockStored, Medium: "GPU", BlockHashes: ev["block_hashes"].([]uint64), TokenIDs: ev["token_ids"].([]uint32)}
			if bs, ok := ev["block_size"].(int); ok {
				w.BlockSize = bs // 0: the field carries nothing
			}
			batch = append(batch, w)
		}
		e.Publish(batch...)
		return e.Last
	}}
}

func pyEngine(t *testing.T, args ...string) sizeEngine {
	p := pypub.Start(t, args...)
	return sizeEngine{endpoint: p.Endpoint, replay: p.ReplayEndpoint, publish: func(evs ...map[string]any) uint64 {
		return p.Publish(evs, false)
	}}
}

// stored is a root-or-child BlockStored of n blocks of size tokens each
// (hashes from h, tokens from tok), with block_size field.
func stored(h uint64, parent any, n, size, field int, tok uint32) map[string]any {
	ev := map[string]any{"type": "BlockStored", "parent_block_hash": parent, "medium": "GPU", "block_size": field}
	var hashes []uint64
	var tokens []uint32
	for i := range n {
		hashes = append(hashes, h+uint64(i))
		for range size {
			tokens = append(tokens, tok)
			tok++
		}
	}
	ev["block_hashes"], ev["token_ids"] = hashes, tokens
	return ev
}

// TestBlockSizeMismatch: an engine whose BlockStored events contradict
// the block size its worker was registered with (16) — by their
// block_size field, in vLLM's map era and in an older array era, by their
// token_ids per block_hashes when the field says nothing, and SGLang's
// page size — through a daemon on a real etcd, over real ZMQ. The
// contradicting stores are never indexed (the rank keeps only its good
// blocks), the rank is degraded in every view with a reason naming both
// sizes, prefixd_stream_block_size_mismatch_total counts every one, and
// the WARN line is printed once. The engine's AllBlocksCleared lifts the
// flag, and the next contradicting store sets it again.
func TestBlockSizeMismatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		engine func(t *testing.T) sizeEngine
		good   bool                       // publish a good 16-token chain first
		bad    func(i int) map[string]any // the i-th contradicting store
		says   string                     // in the reason
		field  int                        // the engine's size, as the log names it
	}{
		{name: "vLLM map era, block_size field", engine: goEngine, good: true,
			bad: func(i int) map[string]any { return stored(uint64(100+10*i), nil, 2, 32, 32, uint32(5000+100*i)) }, says: "block size 32 (block_size 32, 64 token_ids for 2 block_hashes)", field: 32},
		{name: "vLLM map era, tokens only", engine: goEngine, good: true,
			bad: func(i int) map[string]any { return stored(uint64(100+10*i), nil, 4, 8, 0, uint32(5000+100*i)) }, says: "block size 8 (no block_size, 32 token_ids for 4 block_hashes)", field: 8},
		{name: "vLLM array era, block_size field", engine: func(t *testing.T) sizeEngine { return pyEngine(t, "--era", "array") }, good: true,
			bad: func(i int) map[string]any { return stored(uint64(100+10*i), nil, 4, 8, 8, uint32(5000+100*i)) }, says: "block size 8 (block_size 8, 32 token_ids for 4 block_hashes)", field: 8},
		{name: "SGLang page size 1", engine: func(t *testing.T) sizeEngine {
			return pyEngine(t, "--era", "sglang", "--layout", "legacy", "--hash", "signed")
		},
			bad: func(i int) map[string]any {
				var parent any
				if i > 0 {
					parent = uint64(100 + i - 1)
				}
				return stored(uint64(100+i), parent, 1, 1, 1, uint32(5000+i))
			}, says: "block size 1 (block_size 1, 1 token_ids for 1 block_hashes)", field: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			etcd := storetest.StartEtcd(t)
			logs, log := testlog.New(t)
			d := startDaemonWith(t, etcd.Endpoints(), func(c *Config) { c.Logger = log })
			e := tc.engine(t)
			good := 0
			if tc.good {
				e.publish(stored(1, nil, 3, 16, 16, 1000))
				good = 3
			}
			if code, body := register(t, d, map[string]any{"instance_id": 1, "endpoint": e.endpoint, "replay_endpoint": e.replay,
				"model_name": "m", "block_size": 16}); code != http.StatusCreated {
				t.Fatalf("register: %d %s", code, body)
			}
			last := e.publish(tc.bad(0))
			why := "block size mismatch: the engine's BlockStored says " + tc.says + ", the worker is registered with block_size 16"
			caught := func(n int) func() bool {
				return func() bool {
					l, ok := listener(t, d, "m", 1, 0)
					if !ok || l.LastSeq == nil || *l.LastSeq != last {
						return false
					}
					_, body := call(t, "GET", d.url+"/metrics", "", nil)
					m, err := status.ParseMetrics(bytes.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					got, _ := m.Get("prefixd_stream_block_size_mismatch_total", "worker", "1", "rank", "0")
					return got == float64(n)
				}
			}
			testsupport.Eventually(t, 20*time.Second, "the mismatch applied and counted", caught(1))
			v := mustAgree(t, d, "after a mismatch", true, why)
			if l, _ := listener(t, d, "m", 1, 0); l.Blocks != good || !strings.HasSuffix(v.dumpWhy, "its blocks are not indexed") {
				t.Fatalf("rank holds %d blocks (want the %d good ones only); reason %q", l.Blocks, good, v.dumpWhy)
			}
			const msg = "block size mismatch: the engine's blocks are not of the registered block size; its BlockStored events are not indexed and the rank is marked degraded (check the worker's block_size)"
			logs.Wait(t, 10*time.Second, msg, "worker=1", "rank=0", "registered_block_size=16", fmt.Sprintf("engine_block_size=%d", tc.field))

			// More of the same: counted, not logged again, still not indexed.
			for i := 1; i < 3; i++ {
				last = e.publish(tc.bad(i))
			}
			testsupport.Eventually(t, 20*time.Second, "every mismatch counted", caught(3))
			if n := logs.Count(msg); n != 1 {
				t.Fatalf("the mismatch was logged %d times, want once", n)
			}
			if l, _ := listener(t, d, "m", 1, 0); !l.Degraded || l.Blocks != good {
				t.Fatalf("after three mismatches: %+v (want degraded, %d blocks)", l, good)
			}

			// The engine clears: exact (and empty) again, until the next
			// contradicting store.
			last = e.publish(map[string]any{"type": "AllBlocksCleared"})
			testsupport.Eventually(t, 20*time.Second, "exact after the clear", func() bool {
				l, ok := listener(t, d, "m", 1, 0)
				return ok && l.LastSeq != nil && *l.LastSeq == last && !l.Degraded && l.Blocks == 0 && l.Status == api.StatusActive
			})
			mustAgree(t, d, "after the clear", false, "")
			last = e.publish(tc.bad(3))
			testsupport.Eventually(t, 20*time.Second, "degraded again", caught(4))
			mustAgree(t, d, "after the next mismatch", true, why)
		})
	}
}
