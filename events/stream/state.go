package stream

import (
	"time"

	"github.com/prefixd/prefixd/events/cursor"
	"github.com/prefixd/prefixd/indexer"
)

// State is what a stream's subscriber reports about its source.
type State struct {
	Connected  bool
	Mode       cursor.Mode
	Applied    uint64
	HasApplied bool
	// LastLive is the highest seq received on the live socket of the
	// current connection (HasLive false before the first): LastLive −
	// Applied batches have arrived but wait for a replay to close a gap.
	// It restarts with each connection, and falls back with the seq when
	// the engine restarts.
	LastLive uint64
	HasLive  bool
	Degraded bool
	// Synced is true once the first replay (or, without a replay
	// endpoint, the first live batch) has completed or failed: the rank's
	// history is as good as it is going to get.
	Synced bool
	// Replay is what the rank's replay is doing: ReplayNone, ReplayQueued
	// (an attempt waits for a slot; ReplayQueuedSince says since when) or
	// ReplayRunning. While a session runs the index lags the engine. An
	// idle probe (the stream quiet, asking for anything newer) is none.
	Replay            ReplayPhase
	ReplayQueuedSince time.Time
	Stats             cursor.Stats
}

// CaughtUp reports whether the stream is live and has applied seq.
func (s State) CaughtUp(seq uint64) bool {
	return s.Mode == cursor.ModeLive && s.HasApplied && s.Applied == seq
}

// ReplayPhase says what a rank's replay is doing.
type ReplayPhase uint8

// The replay phases.
const (
	ReplayNone    ReplayPhase = iota // no replay session
	ReplayQueued                     // an attempt waits for a replay slot
	ReplayRunning                    // an attempt holds a slot, or waits for its backoff
)

func (p ReplayPhase) String() string {
	switch p {
	case ReplayQueued:
		return "queued"
	case ReplayRunning:
		return "running"
	}
	return ""
}

// Rank is the state of one worker rank's stream, as the stream manager
// reports it.
type Rank struct {
	Worker    uint64
	Rank      uint32
	Partition indexer.PartitionKey
	Endpoint  string
	State
	// Running: the rank's stream runs (State is its subscriber's).
	Running bool
	Blocks  int
	// Truncated: the index dropped some of the rank's blocks (memory cap
	// or the rank's capacity), so it holds a strict subset of the engine's
	// cache: the rank is degraded whatever its stream says.
	Truncated bool
	// Degraded (in State) is the index's word on the rank or'd with its
	// stream's: the rank is known to hold a strict subset of its engine's
	// cache, whether its stream runs or not. DegradedReason is why, as the
	// index holds it (recorded with the rank's last batch or reset,
	// restored from a peer with its dump, a foreign batch's, or
	// indexer.TruncatedReason).
	DegradedReason string
	// Indexed: the index holds something of the rank (blocks, a
	// watermark or a degraded flag), e.g. restored from a peer before its
	// stream runs.
	Indexed bool
	Err     string // why the rank is not indexed, if it is not
}
