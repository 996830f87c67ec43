package api

import "github.com/prefixd/prefixd/catalog"

// DefaultRoutingGroup is the routing group of requests that name none.
const DefaultRoutingGroup = catalog.DefaultRoutingGroup

// MaxDataParallelSize bounds data_parallel_size on /register (the
// catalog's bound).
const MaxDataParallelSize = catalog.MaxDataParallelSize

// RegisterRequest is the body of POST /register: Dynamo's standalone
// indexer fields (instance_id … replay_endpoint) plus prefixd's optional
// Extensions. The JSON tags are the wire names; additional_salt (alias
// additionalsalt) and tenant_id are accepted and ignored, and unknown
// fields are ignored, as Dynamo does.
type RegisterRequest struct {
	InstanceID   uint64 `json:"instance_id"`             // required
	Endpoint     string `json:"endpoint"`                // required: ZMQ PUB address, tcp://host:port, ipc://path or inproc://name
	ModelName    string `json:"model_name"`              // required
	BlockSize    uint32 `json:"block_size"`              // required, > 0; the first registration fixes it for (model, group)
	RoutingGroup string `json:"routing_group,omitempty"` // absent, null or "" → DefaultRoutingGroup
	// DPRank is the rank this socket publishes (a batch's
	// data_parallel_rank overrides it); default 0.
	DPRank         uint32 `json:"dp_rank"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"` // ZMQ ROUTER for gap replay; optional
	Extensions
}

// Extensions are prefixd's optional worker fields beyond Dynamo's
// /register, with the same wire names in RegisterRequest and WorkerInfo:
// the catalog record's attributes (catalog.Attributes: a field added there
// is registered and listed), the number of ranks registered at once, and
// the engine's HTTP endpoint. Zero values mean "not given".
//
// The handler checks only their JSON types; what the values mean (known
// roles, the kv-transfer domain rules, well-formed taints) is checked by
// the catalog's record validation, which names the field at fault (400).
type Extensions struct {
	catalog.Attributes
	// DataParallelSize > 1 registers ranks DPRank … DPRank+size-1 in one
	// request, each at vLLM's per-rank endpoint (the tcp port, or the
	// inproc name, offset by the rank's distance from DPRank); 0 means 1.
	// At most MaxDataParallelSize, and DPRank+size-1 must be a dp rank
	// (400 otherwise).
	DataParallelSize uint32 `json:"data_parallel_size,omitempty"`
	// EngineEndpoint is where clients send requests (e.g.
	// http://10.0.0.2:8000); Endpoint is the KV-event stream.
	EngineEndpoint string `json:"engine_endpoint,omitempty"`
}

// Registration is r as the catalog takes it. On the API a
// kv_transfer_preferred_weight of 0 means absent, as it always has.
func (r RegisterRequest) Registration() catalog.Registration {
	reg := catalog.Registration{Key: catalog.Key{Model: r.ModelName, Group: r.RoutingGroup, WorkerID: r.InstanceID},
		Rank: r.DPRank, Size: r.DataParallelSize, EventsEndpoint: r.Endpoint, ReplayEndpoint: r.ReplayEndpoint,
		BlockSize: r.BlockSize, Endpoint: r.EngineEndpoint, Attributes: r.Attributes}
	if w := reg.KVTransferPreferredWeight; w != nil && *w == 0 {
		reg.KVTransferPreferredWeight = nil
	}
	return reg
}

// UnregisterRequest is the body of POST /unregister.
type UnregisterRequest struct {
	InstanceID uint64 `json:"instance_id"` // required
	ModelName  string `json:"model_name"`  // required
	// RoutingGroup "" (absent) removes the instance from every group of
	// the model.
	RoutingGroup string `json:"routing_group,omitempty"`
	// DPRank, with RoutingGroup, removes only that rank. The handler
	// clears it when RoutingGroup is empty (Dynamo ignores it then).
	DPRank *uint32 `json:"dp_rank,omitempty"`
}

// Listener statuses, best to worst as WorkerInfo.Status aggregates them
// (paused < active < pending < failed).
const (
	StatusPaused  = "paused"
	StatusActive  = "active"
	StatusPending = "pending"
	StatusFailed  = "failed"
)

// WorkerInfo is one element of GET /workers: Dynamo's standalone indexer
// shape (instance_id … listeners) extended with prefixd's per-rank stream
// state and the catalog fields, so indexer and selection clients read one
// shape. Maps are keyed by dp rank (decimal strings on the wire).
type WorkerInfo struct {
	InstanceID uint64 `json:"instance_id"`
	// Source is always "zmq"; the handler fills it in if empty.
	Source string `json:"source"`
	// Status is the worst listener status (failed > pending > active >
	// paused); the handler computes it if empty.
	Status       string              `json:"status"`
	ModelName    string              `json:"model_name"`
	RoutingGroup string              `json:"routing_group"`
	BlockSize    uint32              `json:"block_size"`
	Endpoints    map[uint32]string   `json:"endpoints"` // the handler fills it from Listeners if nil
	Listeners    map[uint32]Listener `json:"listeners"`
	// ReplayEndpoint is the registered replay endpoint (of the first rank).
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	// Lifecycle is the catalog's view ("schedulable", "draining", …).
	Lifecycle string `json:"lifecycle,omitempty"`
	Extensions
}

// Listener is the event stream of one rank.
type Listener struct {
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	Status         string `json:"status"`
	LastError      string `json:"last_error,omitempty"`
	// Degraded: a gap could not be replayed, so the rank's index may miss
	// blocks until the engine clears or the gap ages out.
	Degraded bool `json:"degraded"`
	// DegradedReason says why, when Degraded: lost history (and its
	// cause), or the index's own truncation (memory cap, capacity). A
	// replica restored from a peer keeps the peer's reason.
	DegradedReason string `json:"degraded_reason,omitempty"`
	// LastSeq (the last batch applied, null before the first) and Blocks
	// (blocks indexed for the rank) are filled in by the handler from the
	// index; implementations leave them zero.
	LastSeq *uint64 `json:"last_seq"`
	Blocks  int     `json:"blocks"`
	// RedundantStoreBlocks counts the blocks of the rank's redundant
	// stores (indexer.RankState.RedundantBlocks): BlockStored events that
	// only re-reported blocks the rank already held on the device, as
	// vLLM's kv_cache_report_mode="full" does (docs/wire.md). Filled in by
	// the handler from the index; absent when 0.
	RedundantStoreBlocks uint64 `json:"redundant_store_blocks,omitempty"`
	// LastSeenSeq is the last seq received on the rank's live socket
	// since it last connected (null before the first live batch): while
	// it is above LastSeq, that many batches wait for a replay. Filled in
	// by the implementation.
	LastSeenSeq *uint64 `json:"last_seen_seq"`
	// Replay is "queued" while the rank waits for a replay slot (Status is
	// then pending: its index lags the engine until the replay runs),
	// "running" while a replay runs, and absent otherwise.
	Replay string `json:"replay,omitempty"`
	// ReplayQueuedSeconds is how long the rank has waited for its slot.
	ReplayQueuedSeconds float64 `json:"replay_queued_seconds,omitempty"`
	// KVCacheGroups are the rank's KV-cache groups as the index learned
	// them from its stores, by group_idx (absent before the first store):
	// one for most models, one per attention type for a hybrid model
	// (docs/index.md, "Hybrid models"). Filled in by the handler.
	KVCacheGroups []KVCacheGroup `json:"kv_cache_groups,omitempty"`
	// Load is the rank's load as selection sees it, from the engine's
	// own /metrics and the bookings made through this replica (absent
	// while the rank is in no pool: no endpoint, or not admitted yet).
	// Filled in by the implementation.
	Load *RankLoad `json:"load,omitempty"`
}

// RankLoad is a rank's load in /workers: the engine's figure, the
// bookings, and what selection uses. Effective is Engine's figure plus
// Since, term by term (decode blocks from the KV usage when the rank's
// capacity is known), or Booked alone without a figure; prefill tokens
// are always Booked's (docs/architecture.md, "Load").
type RankLoad struct {
	// Engine is the engine's last figure, absent when none counts (none
	// yet, stale, or the engine unreachable).
	Engine *EngineLoad `json:"engine,omitempty"`
	// Booked is every live booking on the rank.
	Booked LoadTerms `json:"booked"`
	// Since is the bookings made after the engine's figure (blocks and
	// requests), counted on top of it.
	Since     LoadTerms `json:"since"`
	Effective LoadTerms `json:"effective"`
}

// EngineLoad is an engine rank's own report of its load.
type EngineLoad struct {
	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
	KVUsage float64 `json:"kv_usage"` // in [0, 1]
	// AgeSeconds is how old the figure is (since its scrape began).
	AgeSeconds float64 `json:"age_seconds"`
}

// LoadTerms are the terms of the cost function's load.
type LoadTerms struct {
	Blocks        int `json:"blocks"`
	PrefillTokens int `json:"prefill_tokens"`
	Requests      int `json:"requests"`
}

// KVCacheGroup is one KV-cache group of a rank in /workers.
type KVCacheGroup struct {
	GroupIdx int `json:"group_idx"`
	// Attention is how the group's blocks make a hit: "full",
	// "sliding_window" or "other" (a rule the index does not model).
	Attention     string `json:"attention"`
	Kind          string `json:"kind,omitempty"`           // kv_cache_spec_kind as sent
	SlidingWindow int    `json:"sliding_window,omitempty"` // tokens
	// Main: the group the radix tree indexes (the lowest-numbered
	// full-attention group); Blocks of the listener are its blocks.
	Main bool `json:"main,omitempty"`
	// Tracked: the index keeps the group's blocks and limits the hit it
	// reports by the group's rule; an untracked group makes the reported
	// hit an upper bound.
	Tracked bool `json:"tracked"`
	Blocks  int  `json:"blocks"` // blocks held, in any tier
}
