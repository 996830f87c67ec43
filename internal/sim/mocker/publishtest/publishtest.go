// Package publishtest is test support: one engine rank on loopback — the
// mocker's Go publisher and the encoder of its batches — for the tests of
// the stream manager and the daemon.
package publishtest

import (
	"context"
	"testing"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/sim/mocker"
)

// Engine is one engine rank: Pub publishes what Store and Publish encode,
// Last is the seq of the last batch published.
type Engine struct {
	t    testing.TB
	Pub  *mocker.Publisher
	Enc  wire.Encoder
	Last uint64
	blk  uint64
}

// Start starts an engine on loopback with a replay endpoint whose buffer
// holds steps batches (0: the default), stopped when t ends.
func Start(t testing.TB, steps int) *Engine {
	t.Helper()
	pub, err := mocker.NewPublisher(mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: steps})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	<-pub.Ready()
	t.Cleanup(func() { cancel(); <-done })
	return &Engine{t: t, Pub: pub, blk: 1}
}

// Store publishes one root BlockStored of n fresh blocks (block size 16;
// block i's tokens are i*100 … i*100+15, its hash i).
func (e *Engine) Store(n int) {
	e.t.Helper()
	var tokens []uint32
	for i := 0; i < n; i++ {
		for j := 0; j < 16; j++ {
			tokens = append(tokens, uint32((e.blk+uint64(i))*100+uint64(j)))
		}
	}
	e.StoreTokens(tokens)
}

// StoreTokens publishes one root BlockStored of tokens (block size 16),
// its complete blocks under fresh hashes.
func (e *Engine) StoreTokens(tokens []uint32) {
	e.t.Helper()
	ev := wire.Event{Kind: wire.KindBlockStored, BlockSize: 16, Medium: "GPU", TokenIDs: tokens}
	for i := 0; i < len(tokens)/16; i++ {
		ev.BlockHashes = append(ev.BlockHashes, e.blk)
		e.blk++
	}
	e.Publish(ev)
}

// Publish publishes one batch of evs.
func (e *Engine) Publish(evs ...wire.Event) {
	e.t.Helper()
	p, err := e.Enc.AppendBatch(nil, &wire.Batch{Events: evs})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.Last, err = e.Pub.Publish(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
}
