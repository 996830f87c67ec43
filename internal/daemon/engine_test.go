package daemon

import (
	"context"
	"testing"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/mocker"
)

// testEngine is one engine rank for the daemon's tests: a Go publisher
// on loopback and the encoder of its batches.
type testEngine struct {
	t    *testing.T
	pub  *mocker.Publisher
	stop context.CancelFunc
	done chan error
	enc  wire.Encoder
	last uint64
	blk  uint64
}

func startTestEngine(t *testing.T) *testEngine {
	t.Helper()
	return startTestEngineBuffer(t, 0)
}

// startTestEngineBuffer starts an engine whose replay buffer holds steps
// batches (0 = the default).
func startTestEngineBuffer(t *testing.T, steps int) *testEngine {
	t.Helper()
	pub, err := mocker.NewPublisher(mocker.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: steps})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &testEngine{t: t, pub: pub, stop: cancel, done: make(chan error, 1), blk: 1}
	go func() { e.done <- pub.Run(ctx) }()
	<-pub.Ready()
	t.Cleanup(func() { cancel(); <-e.done })
	return e
}

// store publishes one root BlockStored of n fresh blocks (16 tokens each).
func (e *testEngine) store(n int) {
	e.t.Helper()
	ev := wire.Event{Kind: wire.KindBlockStored, BlockSize: 16, Medium: "GPU"}
	for i := 0; i < n; i++ {
		ev.BlockHashes = append(ev.BlockHashes, e.blk)
		for j := 0; j < 16; j++ {
			ev.TokenIDs = append(ev.TokenIDs, uint32(e.blk*100+uint64(j)))
		}
		e.blk++
	}
	p, err := e.enc.AppendBatch(nil, &wire.Batch{Events: []wire.Event{ev}})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.last, err = e.pub.Publish(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
}

// publishEvents publishes one batch of evs.
func (e *testEngine) publishEvents(evs ...wire.Event) {
	e.t.Helper()
	p, err := e.enc.AppendBatch(nil, &wire.Batch{Events: evs})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.last, err = e.pub.Publish(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
}
