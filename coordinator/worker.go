package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/prefixd/prefixd/indexer"
)

// Role is what a worker does in disaggregated serving.
type Role uint8

const (
	// RoleAggregated workers prefill and decode.
	RoleAggregated Role = iota
	// RolePrefill workers only prefill and hand the KV cache off.
	RolePrefill
	// RoleDecode workers decode (and may prefill locally on a bypass).
	RoleDecode
)

// Enforcement says how a KV-transfer domain constrains the other pool.
// The zero value is "not set", which is incomplete metadata when a worker
// names a KVTransferDomain.
type Enforcement uint8

const (
	EnforcementUnset Enforcement = iota
	// EnforcementRequired adds the domain taint to the required taints (hard filter).
	EnforcementRequired
	// EnforcementPreferred adds it as a preferred taint with the worker's weight.
	EnforcementPreferred
)

func (e Enforcement) String() string {
	switch e {
	case EnforcementUnset:
		return "unset"
	case EnforcementRequired:
		return "required"
	case EnforcementPreferred:
		return "preferred"
	}
	return fmt.Sprintf("Enforcement(%d)", uint8(e))
}

// TopologyTaintPrefix prefixes the taint every topology domain becomes:
// "dynamo.topology/<domain>=<value>".
const TopologyTaintPrefix = "dynamo.topology/"

// TopologyTaint returns the taint of a topology domain value.
func TopologyTaint(domain, value string) string {
	return TopologyTaintPrefix + domain + "=" + value
}

// PoolKey names a pool: one (model, routing group, role).
type PoolKey struct {
	Model string
	Group string
	Role  Role
}

func (k PoolKey) String() string { return k.Model + "/" + k.Group + "/" + k.Role.String() }

// Worker is one schedulable (worker id, dp rank) of a pool.
//
// Zero capacities mean "unknown": TotalKVBlocks == 0 disables the decode
// busy check for the worker (and makes its decode busy signal unknown);
// MaxNumBatchedTokens == 0 disables the fractional prefill check.
type Worker struct {
	Rank                indexer.Rank
	Model               string
	Group               string
	Role                Role
	TotalKVBlocks       int
	MaxNumBatchedTokens int
	// Taints are matched by required and preferred taints. Every entry of
	// TopologyDomains adds the taint TopologyTaint(domain, value).
	Taints          []string
	TopologyDomains map[string]string
	// KVTransferDomain, when set, is the topology domain that constrains the
	// other pool when this worker anchors a disaggregated plan.
	KVTransferDomain      string
	KVTransferEnforcement Enforcement
	// KVTransferPreferredWeight is required (non-nil) when the enforcement
	// is preferred; it should lie in [-1, 1].
	KVTransferPreferredWeight *float64
	// Endpoint is where the rank takes requests (its engine's HTTP
	// endpoint). The core only carries it: selections and plan bookings
	// report it.
	Endpoint string
}

// Key is the pool the worker belongs to.
func (w Worker) Key() PoolKey { return PoolKey{Model: w.Model, Group: w.Group, Role: w.Role} }

// AllTaints returns Taints plus one topology taint per topology domain,
// sorted and deduplicated. The slice is newly allocated.
func (w Worker) AllTaints() []string {
	out := slices.Clone(w.Taints)
	for d, v := range w.TopologyDomains {
		out = append(out, TopologyTaint(d, v))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func (w Worker) clone() Worker {
	w.Taints = slices.Clone(w.Taints)
	w.TopologyDomains = maps.Clone(w.TopologyDomains)
	if w.KVTransferPreferredWeight != nil {
		v := *w.KVTransferPreferredWeight
		w.KVTransferPreferredWeight = &v
	}
	return w
}

// Constraints restrict and bias selection by taints.
type Constraints struct {
	// Required taints must all be carried by an eligible worker.
	Required []string
	// Preferred maps a taint to a weight; a worker's cost is multiplied by
	// exp(−tanh(Σ weights of the taints it carries)), within [1/e, e].
	// Negative weights push selection away.
	Preferred map[string]float64
}

func (c Constraints) clone() Constraints {
	return Constraints{Required: slices.Clone(c.Required), Preferred: maps.Clone(c.Preferred)}
}

// TransferConstraint returns the constraint that anchor's KV-transfer
// domain puts on the other pool, added to base (which is not modified).
// A worker with no KVTransferDomain adds nothing. Incomplete metadata is an
// error wrapping ErrMissingTopologyDomain, ErrMissingEnforcement or
// ErrMissingPreferredWeight.
func TransferConstraint(anchor Worker, base Constraints) (Constraints, error) {
	out := base.clone()
	d := anchor.KVTransferDomain
	if d == "" {
		return out, nil
	}
	v, ok := anchor.TopologyDomains[d]
	if !ok || v == "" {
		return out, fmt.Errorf("worker %v kv-transfer domain %q: %w", anchor.Rank, d, ErrMissingTopologyDomain)
	}
	taint := TopologyTaint(d, v)
	switch anchor.KVTransferEnforcement {
	case EnforcementRequired:
		out.Required = append(out.Required, taint)
	case EnforcementPreferred:
		if anchor.KVTransferPreferredWeight == nil {
			return out, fmt.Errorf("worker %v kv-transfer domain %q: %w", anchor.Rank, d, ErrMissingPreferredWeight)
		}
		if out.Preferred == nil {
			out.Preferred = map[string]float64{}
		}
		out.Preferred[taint] += *anchor.KVTransferPreferredWeight
	default:
		return out, fmt.Errorf("worker %v kv-transfer domain %q: %w", anchor.Rank, d, ErrMissingEnforcement)
	}
	return out, nil
}
