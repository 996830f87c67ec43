package apiserver

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/coordinator"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// The mapping between the selection routes' bodies and the coordinator's
// types, both ways, and of the coordinator's errors onto the API's.

// parseRole is the pool role of a selection request; "" is aggregated.
func parseRole(role string) (coordinator.Role, *httpError) {
	if role == "" {
		return coordinator.RoleAggregated, nil
	}
	var r coordinator.Role
	if err := r.UnmarshalText([]byte(role)); err != nil {
		var ne *coordinator.NameError
		errors.As(err, &ne)
		return 0, badRequest("role", "%q is not one of %s", clip.N(role, maxEcho), strings.Join(ne.Names, ", "))
	}
	return r, nil
}

// nameError is the 400 of a coordinator name that field does not accept.
func nameError(field string, err error) *httpError {
	var ne *coordinator.NameError
	if !errors.As(err, &ne) {
		return badRequest(field, "%v", err)
	}
	return badRequest(field, "%q: want %s", clip.N(ne.Name, maxEcho), ne.Want())
}

func constraints(rc *api.RoutingConstraints) coordinator.Constraints {
	if rc == nil {
		return coordinator.Constraints{}
	}
	return coordinator.Constraints{Required: rc.RequiredTaints, Preferred: rc.PreferredTaints}
}

func rank(r *api.WorkerRef) *indexer.Rank {
	if r == nil {
		return nil
	}
	return &indexer.Rank{WorkerID: r.WorkerID, DPRank: r.DPRank}
}

// selectRequest maps a validated /select or /select_and_reserve body.
func selectRequest(r *api.SelectRequest, role coordinator.Role) coordinator.SelectRequest {
	return coordinator.SelectRequest{ID: r.SelectionID, Pool: coordinator.PoolKey{Model: r.ModelName, Group: r.RoutingGroup, Role: role},
		Tokens: r.TokenIDs, Lora: r.LoraName, Salt: r.CacheSalt, Hashes: r.BlockHashes, PromptTokens: r.ISLTokens,
		Pin: rank(r.PinnedWorker), Allowed: r.AllowedWorkerIDs, Constraints: constraints(r.RoutingConstraints), Temperature: r.Temperature, Session: r.SessionID}
}

// reserveRequest maps a validated /reservations body.
func reserveRequest(r *api.ReserveRequest, role coordinator.Role) coordinator.SelectRequest {
	return coordinator.SelectRequest{ID: r.SelectionID, Pool: coordinator.PoolKey{Model: r.ModelName, Group: r.RoutingGroup, Role: role},
		Tokens: r.TokenIDs, Lora: r.LoraName, Salt: r.CacheSalt, Hashes: r.BlockHashes, PromptTokens: r.ISLTokens,
		Pin: &indexer.Rank{WorkerID: *r.WorkerID, DPRank: r.DPRank}}
}

// selection renders a choice; a booked one also says its prompt length
// and whether it holds prefill load.
func selection(r *api.SelectRequest, c coordinator.Choice, booked bool) api.Selection {
	bs := c.BlockSize
	out := api.Selection{SelectionID: r.SelectionID, ModelName: r.ModelName, RoutingGroup: r.RoutingGroup,
		WorkerID: c.Rank.WorkerID, DPRank: c.Rank.DPRank, Endpoint: c.Endpoint, BlockSize: bs,
		Overlap: api.OverlapInfo{LongestMatched: int(c.Overlap.Disk) * bs, GPU: int(c.Overlap.Device) * bs,
			CPU: int(c.Overlap.Host) * bs, Disk: int(c.Overlap.Disk) * bs},
		EffectivePrefillTokens: c.EffectivePrefillTokens, PotentialDecodeBlocks: c.PotentialDecodeBlocks}
	if booked {
		track := c.TrackPrefillTokens
		out.ISLTokens, out.TrackPrefillTokens = c.PromptTokens, &track
	}
	return out
}

// planRequest maps a /disagg/plans body whose partition and prompt are
// checked, validating its policy fields.
func planRequest(r *api.PlanRequest) (coordinator.Request, *httpError) {
	out := coordinator.Request{ID: r.ID, Model: r.ModelName, PrefillGroup: cmp.Or(r.PrefillRoutingGroup, r.RoutingGroup), DecodeGroup: r.RoutingGroup,
		Tokens: r.TokenIDs, Lora: r.LoraName, Salt: r.CacheSalt, Hashes: r.BlockHashes, PromptTokens: r.ISLTokens,
		PinnedPrefill: rank(r.PinnedPrefillWorker), Allowed: r.AllowedWorkerIDs, Constraints: constraints(r.RoutingConstraints)}
	if r.PrefillFailure != "" {
		var f coordinator.FailurePolicy
		if err := f.UnmarshalText([]byte(r.PrefillFailure)); err != nil {
			return out, nameError("prefill_failure", err)
		}
		out.PrefillFailure = &f
	}
	if r.Order != "" {
		var o coordinator.Order
		if err := o.UnmarshalText([]byte(r.Order)); err != nil {
			return out, nameError("order", err)
		}
		out.Order = &o
	}
	switch {
	case r.DeferDecode && (out.Order == nil || *out.Order != coordinator.PrefillFirst):
		return out, badRequest("defer_decode", `needs "order": "prefill-first"`)
	case r.DeferDecode:
		out.DeferDecode = true
	}
	if r.Policy != nil {
		pol, herr := planPolicy(r.Policy)
		if herr != nil {
			return out, herr
		}
		out.Policy = &pol
	}
	return out, nil
}

// planPolicy maps a per-request policy onto the coordinator's: zero
// thresholds of isl_bounding keep the defaults.
func planPolicy(p *api.PlanPolicy) (coordinator.Policy, *httpError) {
	pol := coordinator.DefaultPolicy()
	if err := pol.Kind.UnmarshalText([]byte(p.Kind)); err != nil {
		return pol, nameError("policy.kind", err)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"policy.eff_isl_threshold", p.EffISLThreshold}, {"policy.eff_isl_ratio_threshold", p.EffISLRatioThreshold},
		{"policy.decode_busy_threshold", p.DecodeBusyThreshold}, {"policy.prefill_busy_threshold", p.PrefillBusyThreshold}} {
		if f.v < 0 {
			return pol, badRequest(f.name, "%v must not be negative", f.v)
		}
	}
	if p.EffISLRatioThreshold > 1 {
		return pol, badRequest("policy.eff_isl_ratio_threshold", "%v must be at most 1", p.EffISLRatioThreshold)
	}
	if p.EffISLThreshold > 0 {
		pol.EffISLThreshold = p.EffISLThreshold
	}
	if p.EffISLRatioThreshold > 0 {
		pol.EffISLRatioThreshold = p.EffISLRatioThreshold
	}
	pol.DecodeBusyThreshold, pol.PrefillBusyThreshold = p.DecodeBusyThreshold, p.PrefillBusyThreshold
	return pol, nil
}

// promptLen is a plan request's prompt length in tokens, -1 if only the
// plan's signals know it (block hashes without isl_tokens).
func promptLen(p *api.Prompt) int {
	if len(p.BlockHashes) > 0 {
		return cmp.Or(p.ISLTokens, -1)
	}
	return len(p.TokenIDs)
}

// planInfo renders a plan; tokens < 0 means unknown (taken from the
// decode signals when present).
func planInfo(p coordinator.Plan, tokens int) api.PlanInfo {
	if tokens < 0 && p.Signals != nil {
		tokens = p.Signals.PromptTokens
	}
	tokens = max(tokens, 0)
	out := api.PlanInfo{ID: p.ID, Order: p.Order.String(), State: p.State.String(), Transitions: []api.PlanTransition{}}
	booking := func(b *coordinator.Booking) *api.PlanBooking {
		if b == nil {
			return nil
		}
		return &api.PlanBooking{WorkerID: b.Rank.WorkerID, DPRank: b.Rank.DPRank, Endpoint: b.Endpoint, Tokens: tokens}
	}
	out.Decode, out.Prefill = booking(p.Decode), booking(p.Prefill)
	if w := p.PrefillWorker; w != nil {
		out.PrefillWorker = &api.WorkerRef{WorkerID: w.WorkerID, DPRank: w.DPRank}
	}
	if d := p.Decision; d != nil {
		kind := "remote_prefill"
		if d.Bypass || p.IsBypass() {
			kind = "bypass"
		}
		out.Decision = &api.PlanDecision{Kind: kind, PolicySaysBypass: d.PolicySaysBypass, PrefillBusy: d.PrefillBusy.String(), DecodeBusy: d.DecodeBusy.String()}
	}
	for _, t := range p.Transitions {
		out.Transitions = append(out.Transitions, api.PlanTransition{From: t.From.String(), To: t.To.String(), Reason: t.Reason})
	}
	return out
}

// coordinatorError maps a Selector's error onto the API's sentinels, its
// text kept after the sentinel's; the coordinator's typed errors are
// rendered here, with the names they echo clipped. An error that already
// wraps an API sentinel is returned as it is.
func coordinatorError(err error) error {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict),
		errors.Is(err, ErrUnavailable), errors.Is(err, ErrOverloaded):
		return err
	}
	sentinel := coordinatorSentinel(err)
	if sentinel == nil {
		return err
	}
	var (
		pe *coordinator.PartitionError
		ne *coordinator.NoEndpointError
		ee *coordinator.EmptyPoolError
		ue *coordinator.UnschedulableError
	)
	switch {
	case errors.As(err, &pe):
		what := "no such model (known models: " + listed(pe.Models) + ")"
		switch {
		case len(pe.Groups) > 0:
			what = "no such routing group (routing groups of the model: " + listed(pe.Groups) + ")"
		case len(pe.Models) == 0:
			what = "no such model (no model has workers)"
		}
		return fmt.Errorf("%w: model_name=%s routing_group=%s: %s", sentinel, clip.String(pe.Model), clip.String(pe.Group), what)
	case errors.As(err, &ne):
		return fmt.Errorf("%w: worker %d of pool %s is registered without an engine_endpoint: indexed, but not schedulable",
			sentinel, ne.WorkerID, poolName(ne.Pool))
	case errors.As(err, &ue):
		var b strings.Builder
		b.WriteString(ue.Err.Error())
		for _, p := range ue.Pools {
			fmt.Fprintf(&b, " (pool %s: %s registered without an engine_endpoint, not schedulable)", poolName(p.Pool), countWorkers(p.NoEndpoint))
		}
		return fmt.Errorf("%w: %s", sentinel, b.String())
	case errors.As(err, &ee):
		if ee.NoEndpoint > 0 {
			return fmt.Errorf("%w: pool %s has no schedulable workers: %s registered without an engine_endpoint (indexed, but requests cannot be sent to them)",
				sentinel, poolName(ee.Pool), countWorkers(ee.NoEndpoint))
		}
		return fmt.Errorf("%w: pool %s has no workers", sentinel, poolName(ee.Pool))
	case errors.Is(err, coordinator.ErrDuplicateReservation):
		return fmt.Errorf("%w: selection_id: %w", sentinel, err)
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

// coordinatorSentinel is the API's sentinel for a coordinator error, nil
// for an error the coordinator does not name (a 500).
func coordinatorSentinel(err error) error {
	switch {
	case errors.Is(err, coordinator.ErrAllOverloaded), errors.Is(err, coordinator.ErrPinnedOverloaded):
		return ErrOverloaded
	case errors.Is(err, coordinator.ErrPinnedNotAllowed), errors.Is(err, coordinator.ErrInvalidPrompt):
		return ErrInvalid
	case errors.Is(err, coordinator.ErrBadPinnedRank), errors.Is(err, coordinator.ErrPlanNotFound),
		errors.Is(err, coordinator.ErrReservationNotFound), errors.Is(err, coordinator.ErrUnknownPartition):
		return ErrNotFound
	case errors.Is(err, coordinator.ErrNoWorkers), errors.Is(err, coordinator.ErrAllFiltered),
		errors.Is(err, coordinator.ErrTooManyReservations), errors.Is(err, coordinator.ErrTooManyPlans):
		return ErrUnavailable
	case errors.Is(err, coordinator.ErrDuplicateReservation), errors.Is(err, coordinator.ErrDuplicatePlan),
		errors.Is(err, coordinator.ErrInvalidState), errors.Is(err, coordinator.ErrMissingTopologyDomain),
		errors.Is(err, coordinator.ErrMissingEnforcement), errors.Is(err, coordinator.ErrMissingPreferredWeight):
		return ErrConflict
	}
	return nil
}

// maxListed bounds the names an error lists.
const maxListed = 8

// listed renders sorted names, at most maxListed of them, each clipped.
func listed(sorted []string) string {
	out := make([]string, 0, min(len(sorted), maxListed)+1)
	for _, n := range sorted[:min(len(sorted), maxListed)] {
		out = append(out, clip.String(n))
	}
	if len(sorted) > maxListed {
		out = append(out, fmt.Sprintf("… %d more", len(sorted)-maxListed))
	}
	return strings.Join(out, ", ")
}

// poolName renders a pool for an error, its names clipped.
func poolName(k coordinator.PoolKey) string {
	return clip.String(k.Model) + "/" + clip.String(k.Group) + "/" + k.Role.String()
}

// countWorkers renders "1 worker", "2 workers".
func countWorkers(n int) string {
	if n == 1 {
		return "1 worker"
	}
	return fmt.Sprintf("%d workers", n)
}
