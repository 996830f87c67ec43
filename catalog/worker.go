package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// RecordVersion is the version of the worker record format this package
// reads and writes (the record's "version" field).
const RecordVersion = 1

// DefaultRoutingGroup is the routing group of a worker that names none.
const DefaultRoutingGroup = "default"

// MaxDataParallelSize bounds data_parallel_size, so a bogus record cannot
// make a consumer start millions of streams.
const MaxDataParallelSize = 4096

// Role is what a worker does in (possibly disaggregated) serving.
type Role string

// The roles a worker record may carry.
const (
	RoleAggregated Role = "aggregated" // prefill and decode in one engine (the default)
	RolePrefill    Role = "prefill"
	RoleDecode     Role = "decode"
	RoleEncoder    Role = "encoder"
)

// Enforcement says how a kv-transfer domain constrains the other pool.
type Enforcement string

// The kv-transfer enforcement modes.
const (
	EnforcementRequired  Enforcement = "required"  // hard filter
	EnforcementPreferred Enforcement = "preferred" // weighted preference
)

// Lifecycle is the registrant's declared state of a worker.
type Lifecycle string

// The lifecycle states a worker record may carry.
const (
	LifecycleActive   Lifecycle = "active"   // schedulable (the default)
	LifecycleDraining Lifecycle = "draining" // finishing its work; send no new requests
)

// Worker is the catalog record of one engine (one worker_id) serving one
// (model_name, routing_group) partition with one or more data-parallel
// ranks. It is stored as JSON; json.Marshal of a Worker is stable (fields
// in declaration order, map keys sorted), so equal records encode to equal
// bytes.
//
// Defaults are not applied implicitly: call WithDefaults on a record built
// from user input, then Validate. Records read from a Store have had
// WithDefaults applied and passed Validate.
//
// A Worker holds maps and a slice; copies share them. Treat records handed
// out by this package as read-only.
type Worker struct {
	// Version is the record format; must be RecordVersion.
	Version int `json:"version"`
	// WorkerID is chosen by the registrant and stays stable across lease
	// renewals and re-registration (it is not an etcd lease id).
	WorkerID     uint64 `json:"worker_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"` // default DefaultRoutingGroup
	// Attributes are what the registrant says about the engine.
	Attributes

	// Endpoint is the engine's HTTP base URL, where requests are sent.
	// Optional (a worker without one is indexed but not schedulable).
	Endpoint string `json:"endpoint,omitempty"`

	// KV-events PUB endpoints: either EventsEndpoint, a base that each rank
	// offsets as vLLM does (see EventsEndpointFor), or EventsEndpoints, one
	// per rank keyed by the global dp rank. At most one may be set; with
	// neither the worker publishes no events. EventsEndpoints also names
	// the worker's ranks, which may be sparse (ranks registered one at a
	// time, in any order).
	EventsEndpoint  string            `json:"events_endpoint,omitempty"`
	EventsEndpoints map[uint32]string `json:"events_endpoints,omitempty"`
	// Replay ROUTER endpoints, in the same two forms. Optional; requires
	// events endpoints. In the per-rank form a rank may have none.
	ReplayEndpoint  string            `json:"replay_endpoint,omitempty"`
	ReplayEndpoints map[uint32]string `json:"replay_endpoints,omitempty"`

	BlockSize uint32 `json:"block_size"`
	// The worker's ranks are [DataParallelStartRank, +DataParallelSize),
	// or, with EventsEndpoints, that map's keys: then the start is the
	// lowest key and the size the number of keys.
	DataParallelStartRank uint32    `json:"data_parallel_start_rank"`
	DataParallelSize      uint32    `json:"data_parallel_size"` // default 1
	Lifecycle             Lifecycle `json:"lifecycle"`          // default LifecycleActive
	// SeqBase is the first event seq of an engine incarnation (0 for vLLM).
	SeqBase uint64 `json:"seq_base,omitempty"`
	// Sources says where the registrant took the record's values from,
	// keyed by JSON field name: a sidecar that asked its engine writes e.g.
	// "block_size": "engine: GET /metrics vllm:cache_config_info" and
	// "model_name": "flag --model". Informational and optional (records
	// written before it have none); at most MaxSources entries.
	Sources map[string]string `json:"sources,omitempty"`
}

// MaxSources bounds a record's sources, and MaxSourceBytes each key and
// value.
const (
	MaxSources     = 32
	MaxSourceBytes = 256
)

// Attributes are a worker record's fields that describe the engine
// (everything but its identity, its ranks' endpoints and the record's
// bookkeeping). They are embedded in Worker and, with the same JSON names,
// in the API's /register body and /workers listing, so a field added here
// is stored, registered and listed. Zero values mean "not given".
type Attributes struct {
	Role Role `json:"role,omitempty"` // default RoleAggregated
	// Topic is the ZMQ topic prefix the engine publishes under ("" = all).
	Topic string `json:"topic,omitempty"`
	// TotalKVBlocks is one rank's KV cache capacity in blocks;
	// HostKVBlocks and DiskKVBlocks its offload capacities (CPU memory;
	// local disk), for engines that offload KV blocks. The index never
	// holds more of a rank in a tier than that tier's capacity, with a
	// margin; a tier without one is bounded only by the index's memory cap.
	TotalKVBlocks uint64 `json:"total_kv_blocks,omitempty"`
	HostKVBlocks  uint64 `json:"host_kv_blocks,omitempty"`
	DiskKVBlocks  uint64 `json:"disk_kv_blocks,omitempty"`
	// MaxNumBatchedTokens is the engine's prefill budget per step.
	MaxNumBatchedTokens uint64 `json:"max_num_batched_tokens,omitempty"`

	// TopologyDomains maps a domain (e.g. "rack") to this worker's value.
	TopologyDomains map[string]string `json:"topology_domains,omitempty"`
	// KVTransferDomain names the topology domain (a key of
	// TopologyDomains) within which KV blocks must or should move.
	KVTransferDomain string `json:"kv_transfer_domain,omitempty"`
	// KVTransferEnforcement is required whenever KVTransferDomain is set.
	KVTransferEnforcement Enforcement `json:"kv_transfer_enforcement,omitempty"`
	// KVTransferPreferredWeight ∈ [0, 1] is required with preferred
	// enforcement and only allowed with it (nil = unset).
	KVTransferPreferredWeight *float64 `json:"kv_transfer_preferred_weight,omitempty"`

	// Taints is a set of opaque labels ("key" or "key=value") that a
	// selection policy may filter on; a list like Dynamo's selection API.
	// WithDefaults sorts it; duplicates are invalid.
	Taints []string `json:"taints,omitempty"`
}

// Stream is one rank's KV-events source as a subscriber dials it.
type Stream struct {
	Rank           uint32
	Endpoint       string // ZMQ PUB endpoint
	ReplayEndpoint string // ZMQ ROUTER endpoint; "" when the worker has none
}

// WithDefaults returns w with its zero fields defaulted: version
// RecordVersion, routing group "default", role aggregated, data parallel
// size 1, lifecycle active. It also returns Taints sorted (in a new slice).
// It does not default kv_transfer_enforcement: a domain without an
// enforcement is an error.
func (w Worker) WithDefaults() Worker {
	if w.Version == 0 {
		w.Version = RecordVersion
	}
	if w.RoutingGroup == "" {
		w.RoutingGroup = DefaultRoutingGroup
	}
	if w.Role == "" {
		w.Role = RoleAggregated
	}
	if w.DataParallelSize == 0 {
		w.DataParallelSize = 1
	}
	if w.Lifecycle == "" {
		w.Lifecycle = LifecycleActive
	}
	if len(w.Taints) > 0 {
		w.Taints = slices.Sorted(slices.Values(w.Taints))
	}
	return w
}

// Key returns the record's identity.
func (w Worker) Key() Key {
	return Key{Model: w.ModelName, Group: w.RoutingGroup, WorkerID: w.WorkerID}
}

// Ranks returns the worker's global dp ranks in order: the keys of
// EventsEndpoints when it is set (possibly sparse), otherwise
// [start, start+size).
func (w Worker) Ranks() []uint32 {
	if len(w.EventsEndpoints) > 0 {
		return slices.Sorted(maps.Keys(w.EventsEndpoints))
	}
	rs := make([]uint32, 0, min(w.DataParallelSize, MaxDataParallelSize))
	for i := uint32(0); i < w.DataParallelSize; i++ {
		rs = append(rs, w.DataParallelStartRank+i)
	}
	return rs
}

// HasRank reports whether r is one of the worker's ranks.
func (w Worker) HasRank(r uint32) bool {
	if len(w.EventsEndpoints) > 0 {
		_, ok := w.EventsEndpoints[r]
		return ok
	}
	return r >= w.DataParallelStartRank && uint64(r) < uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize)
}

// rankRange describes the worker's ranks for error messages.
func (w Worker) rankRange() string {
	if len(w.EventsEndpoints) > 0 {
		return fmt.Sprintf("%v", w.Ranks())
	}
	return fmt.Sprintf("[%d, %d)", w.DataParallelStartRank, uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize))
}

// EventsEndpointFor returns the KV-events endpoint of global dp rank r:
// EventsEndpoints[r], or EventsEndpoint offset by r as vLLM does (a tcp
// port grows by r, an inproc name gets "_dp<r>", an ipc path cannot be
// offset for r > 0). vLLM offsets by the global dp rank, so a worker whose
// ranks start at 2 publishes rank 2 at base port + 2. It returns "" when
// the worker publishes no events, and an error for a rank that is not the
// worker's or a base that cannot be offset.
func (w Worker) EventsEndpointFor(r uint32) (string, error) {
	return w.endpointFor("events_endpoint", w.EventsEndpoint, w.EventsEndpoints, r)
}

// ReplayEndpointFor is EventsEndpointFor for the replay endpoints.
func (w Worker) ReplayEndpointFor(r uint32) (string, error) {
	return w.endpointFor("replay_endpoint", w.ReplayEndpoint, w.ReplayEndpoints, r)
}

func (w Worker) endpointFor(field, base string, per map[uint32]string, r uint32) (string, error) {
	if !w.HasRank(r) {
		return "", fmt.Errorf("%s: dp rank %d is not one of the worker's ranks %s", field, r, w.rankRange())
	}
	if len(per) > 0 {
		return per[r], nil
	}
	if base == "" {
		return "", nil
	}
	return OffsetEndpoint(base, r)
}

// Streams returns one Stream per rank, in rank order, or nil when the
// worker publishes no events. It fails only for a record that would not
// pass Validate.
func (w Worker) Streams() ([]Stream, error) {
	if w.EventsEndpoint == "" && len(w.EventsEndpoints) == 0 {
		return nil, nil
	}
	ss := make([]Stream, 0, w.DataParallelSize)
	for _, r := range w.Ranks() {
		ev, err := w.EventsEndpointFor(r)
		if err != nil {
			return nil, err
		}
		if ev == "" {
			return nil, fmt.Errorf("events_endpoints: no endpoint for dp rank %d", r)
		}
		rp, err := w.ReplayEndpointFor(r)
		if err != nil {
			return nil, err
		}
		ss = append(ss, Stream{Rank: r, Endpoint: ev, ReplayEndpoint: rp})
	}
	return ss, nil
}

// Equal reports whether w and o encode to the same JSON (so a nil and an
// empty map are equal).
func (w Worker) Equal(o Worker) bool {
	a, errA := json.Marshal(w)
	b, errB := json.Marshal(o)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// DecodeWorker parses a stored record: the JSON must carry "version": 1;
// defaults are applied, then the record must pass Validate. Unknown fields
// are ignored (a newer writer may add optional fields).
func DecodeWorker(data []byte) (Worker, error) {
	var w Worker
	if err := json.Unmarshal(data, &w); err != nil {
		return Worker{}, fmt.Errorf("decode worker record: %w", err)
	}
	if w.Version != RecordVersion {
		return Worker{}, &ValidationError{Fields: []FieldError{versionError(w.Version)}}
	}
	w = w.WithDefaults()
	if err := w.Validate(); err != nil {
		return Worker{}, err
	}
	return w, nil
}

func versionError(v int) FieldError {
	if v == 0 {
		return FieldError{"version", fmt.Sprintf("missing (must be %d)", RecordVersion)}
	}
	return FieldError{"version", fmt.Sprintf("unsupported record version %d (this build reads %d)", v, RecordVersion)}
}

// FieldError is one problem with one field of a record.
type FieldError struct {
	Field  string // the JSON field name, e.g. "block_size"
	Reason string
}

func (e FieldError) Error() string { return e.Field + ": " + e.Reason }

// ValidationError lists every problem Validate found, in field order.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Error()
	}
	return strings.Join(parts, "; ")
}

// Validate checks the record as it is (it applies no defaults) and returns
// a *ValidationError naming each bad field, e.g. "block_size: must be
// positive", or nil.
func (w Worker) Validate() error {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{field, fmt.Sprintf(format, args...)})
	}
	if w.Version != RecordVersion {
		errs = append(errs, versionError(w.Version))
	}
	if err := checkName(w.ModelName); err != "" {
		add("model_name", "%s", err)
	}
	if err := checkName(w.RoutingGroup); err != "" {
		add("routing_group", "%s", err)
	}
	switch w.Role {
	case RoleAggregated, RolePrefill, RoleDecode, RoleEncoder:
	default:
		add("role", "%q is not one of aggregated, prefill, decode, encoder", w.Role)
	}
	if w.Endpoint != "" {
		if u, err := url.Parse(w.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add("endpoint", "%q is not an http(s) URL with a host", w.Endpoint)
		}
	}
	if w.BlockSize == 0 {
		add("block_size", "must be positive")
	}
	rankRangeOK := true
	switch {
	case w.DataParallelSize == 0:
		add("data_parallel_size", "must be positive")
		rankRangeOK = false
	case w.DataParallelSize > MaxDataParallelSize:
		add("data_parallel_size", "%d exceeds %d", w.DataParallelSize, MaxDataParallelSize)
		rankRangeOK = false
	case uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize) > math.MaxUint32+1:
		add("data_parallel_start_rank", "%d + data_parallel_size %d overflows a dp rank", w.DataParallelStartRank, w.DataParallelSize)
		rankRangeOK = false
	case len(w.EventsEndpoints) > 0 && int(w.DataParallelSize) != len(w.EventsEndpoints):
		add("data_parallel_size", "%d, but events_endpoints lists %d ranks", w.DataParallelSize, len(w.EventsEndpoints))
		rankRangeOK = false
	case len(w.EventsEndpoints) > 0 && w.DataParallelStartRank != slices.Min(slices.Collect(maps.Keys(w.EventsEndpoints))):
		add("data_parallel_start_rank", "%d, but the lowest rank in events_endpoints is %d", w.DataParallelStartRank, slices.Min(slices.Collect(maps.Keys(w.EventsEndpoints))))
		rankRangeOK = false
	}
	if rankRangeOK {
		errs = append(errs, w.checkEndpoints()...)
	}
	errs = append(errs, w.checkTopology()...)
	for i, t := range w.Taints {
		if t == "" || strings.IndexFunc(t, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 || !utf8.ValidString(t) {
			add("taints", "%q is empty or holds whitespace", t)
		} else if slices.Contains(w.Taints[:i], t) {
			add("taints", "%q is listed twice", t)
		}
	}
	if len(w.Sources) > MaxSources {
		add("sources", "%d entries, more than %d", len(w.Sources), MaxSources)
	} else {
		for _, k := range slices.Sorted(maps.Keys(w.Sources)) {
			if !printable(k) || !printable(w.Sources[k]) {
				add("sources", "an entry is empty, longer than %d bytes or not printable UTF-8", MaxSourceBytes)
				break
			}
		}
	}
	switch w.Lifecycle {
	case LifecycleActive, LifecycleDraining:
	default:
		add("lifecycle", "%q is not one of active, draining", w.Lifecycle)
	}
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Fields: errs}
}

// printable reports whether s is a non-empty sources key or value within
// MaxSourceBytes, UTF-8 and without control characters.
func printable(s string) bool {
	return s != "" && len(s) <= MaxSourceBytes && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// checkName validates a model name or routing group: non-empty, UTF-8,
// no control characters, at most 512 bytes. Anything else (slashes,
// spaces) is escaped in keys.
func checkName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 512:
		return fmt.Sprintf("longer than 512 bytes (%d)", len(s))
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fmt.Sprintf("%q holds a control character", s)
	}
	return ""
}

type rankEndpoint struct {
	field  string // JSON field it came from
	kind   string // "events" or "replay"
	rank   uint32
	ep     string
	parsed endpoint
}

// checkEndpoints validates both endpoint forms and that no two per-rank
// endpoints (live or replay) are the same socket.
func (w Worker) checkEndpoints() []FieldError {
	var errs []FieldError
	hasEvents := w.EventsEndpoint != "" || len(w.EventsEndpoints) > 0
	hasReplay := w.ReplayEndpoint != "" || len(w.ReplayEndpoints) > 0
	if hasReplay && !hasEvents {
		errs = append(errs, FieldError{replayField(w), "set without events_endpoint(s)"})
	}
	var all []rankEndpoint
	collect := func(kind, baseField, base, perField string, per map[uint32]string) {
		if base != "" && len(per) > 0 {
			errs = append(errs, FieldError{perField, fmt.Sprintf("set together with %s; use one", baseField)})
			return
		}
		if base != "" {
			ep, err := parseEndpoint(base)
			if err != nil {
				errs = append(errs, FieldError{baseField, err.Error()})
				return
			}
			for _, r := range w.Ranks() {
				s, err := OffsetEndpoint(base, r)
				if err != nil {
					errs = append(errs, FieldError{baseField, err.Error() + "; list " + perField + " instead"})
					return
				}
				if r != 0 {
					ep, _ = parseEndpoint(s)
				}
				all = append(all, rankEndpoint{baseField, kind, r, s, ep})
			}
			return
		}
		if len(per) == 0 {
			return
		}
		for _, r := range slices.Sorted(maps.Keys(per)) {
			if !w.HasRank(r) {
				errs = append(errs, FieldError{perField, fmt.Sprintf("dp rank %d is not one of the worker's ranks %s", r, w.rankRange())})
			}
		}
		for _, r := range w.Ranks() {
			s, ok := per[r]
			if !ok {
				if kind == "events" { // a rank may lack a replay endpoint, not its stream
					errs = append(errs, FieldError{perField, fmt.Sprintf("no endpoint for dp rank %d", r)})
				}
				continue
			}
			ep, err := parseEndpoint(s)
			if err != nil {
				errs = append(errs, FieldError{perField, fmt.Sprintf("dp rank %d: %v", r, err)})
				continue
			}
			all = append(all, rankEndpoint{perField, kind, r, s, ep})
		}
	}
	collect("events", "events_endpoint", w.EventsEndpoint, "events_endpoints", w.EventsEndpoints)
	collect("replay", "replay_endpoint", w.ReplayEndpoint, "replay_endpoints", w.ReplayEndpoints)
	for i, b := range all {
		for _, a := range all[:i] {
			if !a.parsed.sameSocket(b.parsed) {
				continue
			}
			why := ""
			if (a.field == "events_endpoint" || a.field == "replay_endpoint") && (b.field == "events_endpoint" || b.field == "replay_endpoint") && a.rank != b.rank {
				why = " (vLLM offsets each base port by the dp rank)"
			}
			errs = append(errs, FieldError{b.field, fmt.Sprintf("dp rank %d %s endpoint %q collides with dp rank %d %s endpoint %q%s", b.rank, b.kind, b.ep, a.rank, a.kind, a.ep, why)})
			return errs // one collision is enough; offsets make many
		}
	}
	return errs
}

func replayField(w Worker) string {
	if len(w.ReplayEndpoints) > 0 {
		return "replay_endpoints"
	}
	return "replay_endpoint"
}

func (w Worker) checkTopology() []FieldError {
	var errs []FieldError
	for _, k := range slices.Sorted(maps.Keys(w.TopologyDomains)) {
		v := w.TopologyDomains[k]
		switch {
		case checkName(k) != "" || strings.ContainsAny(k, "= "):
			errs = append(errs, FieldError{"topology_domains", fmt.Sprintf("domain %q is empty or holds '=', a space or a control character", k)})
		case checkName(v) != "" || strings.ContainsAny(v, " "):
			errs = append(errs, FieldError{"topology_domains", fmt.Sprintf("domain %q has an empty or malformed value %q", k, v)})
		}
	}
	if w.KVTransferDomain != "" {
		if _, ok := w.TopologyDomains[w.KVTransferDomain]; !ok {
			errs = append(errs, FieldError{"kv_transfer_domain", fmt.Sprintf("%q has no value in topology_domains", w.KVTransferDomain)})
		}
	}
	switch w.KVTransferEnforcement {
	case "":
		if w.KVTransferDomain != "" {
			errs = append(errs, FieldError{"kv_transfer_enforcement", "required when kv_transfer_domain is set (required or preferred)"})
		}
	case EnforcementRequired, EnforcementPreferred:
		if w.KVTransferDomain == "" {
			errs = append(errs, FieldError{"kv_transfer_enforcement", "set without kv_transfer_domain"})
		}
	default:
		errs = append(errs, FieldError{"kv_transfer_enforcement", fmt.Sprintf("%q is not one of required, preferred", w.KVTransferEnforcement)})
	}
	switch wt := w.KVTransferPreferredWeight; {
	case wt == nil:
		if w.KVTransferEnforcement == EnforcementPreferred {
			errs = append(errs, FieldError{"kv_transfer_preferred_weight", "required when kv_transfer_enforcement is preferred"})
		}
	case w.KVTransferEnforcement != EnforcementPreferred:
		errs = append(errs, FieldError{"kv_transfer_preferred_weight", "only allowed with kv_transfer_enforcement preferred"})
	case math.IsNaN(*wt) || *wt < 0 || *wt > 1:
		errs = append(errs, FieldError{"kv_transfer_preferred_weight", fmt.Sprintf("%v is outside [0, 1]", *wt)})
	}
	return errs
}

// endpoint is a parsed ZMQ endpoint.
type endpoint struct {
	scheme string // tcp, ipc or inproc
	host   string // tcp: lower-cased host without brackets
	port   uint16 // tcp
	addr   string // ipc path or inproc name
}

func (a endpoint) sameSocket(b endpoint) bool {
	if a.scheme != b.scheme {
		return false
	}
	if a.scheme == "tcp" {
		return a.port == b.port && a.host == b.host
	}
	return a.addr == b.addr
}

// parseEndpoint accepts tcp://host:port (a routable host: a wildcard
// bind address cannot be dialled), ipc://path and inproc://name.
func parseEndpoint(s string) (endpoint, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || rest == "" {
		return endpoint{}, fmt.Errorf("%q is not a tcp/ipc/inproc endpoint", s)
	}
	switch scheme {
	case "ipc", "inproc":
		return endpoint{scheme: scheme, addr: rest}, nil
	case "tcp":
	default:
		return endpoint{}, fmt.Errorf("%q is not a tcp/ipc/inproc endpoint", s)
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return endpoint{}, fmt.Errorf("%q has no port", s)
	}
	host, portStr := rest[:i], rest[i+1:]
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return endpoint{}, fmt.Errorf("%q has no valid port", s)
	}
	if strings.HasPrefix(host, "[") != strings.HasSuffix(host, "]") {
		return endpoint{}, fmt.Errorf("%q has a malformed host", s)
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	switch host {
	case "":
		return endpoint{}, fmt.Errorf("%q has no host", s)
	case "*", "0.0.0.0", "::":
		return endpoint{}, fmt.Errorf("%q is a wildcard bind address; advertise a routable host", s)
	}
	if strings.ContainsAny(host, "/?#@ ") {
		return endpoint{}, fmt.Errorf("%q has a malformed host", s)
	}
	return endpoint{scheme: "tcp", host: host, port: uint16(port)}, nil
}

// OffsetEndpoint returns the endpoint a vLLM publisher of dp rank uses when
// configured with base (the live and the replay endpoint alike): rank 0
// keeps base; a tcp port grows by rank; an inproc name gets "_dp<rank>";
// other transports (ipc) cannot be offset, which vLLM rejects too.
func OffsetEndpoint(base string, rank uint32) (string, error) {
	if rank == 0 {
		return base, nil
	}
	switch {
	case strings.HasPrefix(base, "inproc://"):
		return fmt.Sprintf("%s_dp%d", base, rank), nil
	case strings.HasPrefix(base, "tcp://"):
		i := strings.LastIndexByte(base, ':')
		port, err := strconv.ParseUint(base[i+1:], 10, 16)
		if i < len("tcp://") || err != nil {
			return "", fmt.Errorf("%q has no port to offset by dp rank %d", base, rank)
		}
		if port+uint64(rank) > 65535 {
			return "", fmt.Errorf("%q: port %d + dp rank %d exceeds 65535", base, port, rank)
		}
		return base[:i+1] + strconv.FormatUint(port+uint64(rank), 10), nil
	}
	return "", fmt.Errorf("%q cannot be offset by dp rank %d (only tcp and inproc can)", base, rank)
}
