package indexdemo

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/workload"
)

func small() Options {
	o := NewOptions()
	o.Workers, o.TargetEntries, o.ChurnBlocks, o.Queries = 8, 30000, 20000, 300
	return o
}

// TestRunIsExact runs the whole demo on a small fleet in both wire eras: it
// must ingest real payloads and end with the index equal to the truth.
func TestRunIsExact(t *testing.T) {
	for _, era := range []wire.Era{wire.EraMap, wire.EraArray} {
		o := small()
		o.Era = era
		var out bytes.Buffer
		if err := Run(context.Background(), o, &out); err != nil {
			t.Fatalf("%v era: %v\n%s", era, err, out.String())
		}
		for _, want := range []string{"exact:", "=== report ===", "verdict          index == engine truth", "dropped          none"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("%v era: report lacks %q:\n%s", era, want, out.String())
			}
		}
		// What the demo leaves out exists now: it points to it.
		if strings.Contains(out.String(), "later issues") || !strings.Contains(out.String(), "`prefixd demo` runs the whole system") {
			t.Fatalf("%v era: the header does not point to prefixd demo:\n%s", era, out.String())
		}
	}
}

// TestEncodeNumbersBatchesPerRank: every rank's batches are numbered 0, 1,
// 2, … in stream order and carry every block of the workload.
func TestEncodeNumbersBatchesPerRank(t *testing.T) {
	w, err := workload.Generate(small().config())
	if err != nil {
		t.Fatal(err)
	}
	stream, total, err := Encode(w, wire.EraMap)
	if err != nil {
		t.Fatal(err)
	}
	next := map[indexer.Rank]uint64{}
	blocks, size := 0, 0
	for _, p := range stream {
		if p.Seq != next[p.Rank] {
			t.Fatalf("rank %v: batch seq %d, want %d", p.Rank, p.Seq, next[p.Rank])
		}
		next[p.Rank]++
		blocks += p.Blocks
		size += len(p.Bytes)
	}
	if blocks != w.Stats.StoredBlocks+w.Stats.RemovedBlocks || size != total {
		t.Fatalf("blocks %d (want %d), bytes %d (reported %d)", blocks, w.Stats.StoredBlocks+w.Stats.RemovedBlocks, size, total)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, small(), &bytes.Buffer{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run returned %v", err)
	}
}

func TestValidate(t *testing.T) {
	o := small()
	o.Queries = 0
	if err := o.Validate(); err == nil {
		t.Fatal("zero queries accepted")
	}
	o = small()
	o.Workers = 0
	if err := o.Validate(); err == nil {
		t.Fatal("zero workers accepted")
	}
}
