package api

// QueryRequest is the body of POST /query. Unknown fields are ignored.
type QueryRequest struct {
	TokenIDs     TokenIDs `json:"token_ids"`               // required; each in [0, 2^32-1]
	ModelName    string   `json:"model_name"`              // required
	RoutingGroup string   `json:"routing_group,omitempty"` // absent, null or "" → DefaultRoutingGroup
	// LoraName and CacheSalt salt the block hashes (indexer.Seed), so
	// equal tokens under another adapter or salt do not match.
	LoraName  string `json:"lora_name,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
}

// QueryByHashRequest is the body of POST /query_by_hash: local block
// hashes (indexer.HashBlocks with the caller's salt), not engine hashes.
// On the wire each hash is a JSON integer, an int64 bit pattern as Dynamo
// sends them; plain unsigned values ≥ 2^63 are accepted too. cache_salt
// must be absent or null (400 otherwise): the hashes are already salted.
type QueryByHashRequest struct {
	BlockHashes  []int64 `json:"block_hashes"` // required
	ModelName    string  `json:"model_name"`   // required
	RoutingGroup string  `json:"routing_group,omitempty"`
}

// ScoreResponse is the answer to both queries (Dynamo's score response).
// Counts are matched tokens (blocks × block size). Ranks and instances that
// match nothing are absent; clients treat absence as 0.
type ScoreResponse struct {
	// Scores is the device-tier match per instance and rank (ranks with
	// a device match only); it equals Instances[id].DP.
	Scores map[uint64]map[uint32]uint64 `json:"scores"`
	// Frequencies is always empty (Dynamo's legacy field).
	Frequencies []uint64 `json:"frequencies"`
	// Instances has every instance with a match in any tier.
	Instances map[uint64]InstanceScore `json:"instances"`
	// Predicted is, when the daemon runs with booking predictions
	// (serve --predicted-ttl), the tokens each instance and rank is
	// predicted to hold because a booking sent it the prompt and its
	// events have not arrived yet; selection scores the larger of the two.
	// Absent without predictions.
	Predicted map[uint64]map[uint32]uint64 `json:"predicted,omitempty"`
}

// InstanceScore is one instance's match, cumulative over tiers:
// GPU ≤ CPU ≤ Disk = LongestMatched.
type InstanceScore struct {
	LongestMatched uint64            `json:"longest_matched"` // max(gpu, cpu, disk)
	GPU            uint64            `json:"gpu"`             // longest device-tier prefix over the ranks
	DP             map[uint32]uint64 `json:"dp"`              // device-tier match per rank
	CPU            uint64            `json:"cpu"`             // through host memory, including the device prefix
	Disk           uint64            `json:"disk"`            // through disk or external storage, including host
}
