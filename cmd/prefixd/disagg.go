package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/coordinator"
)

// disaggFlags are the disaggregated plans' flags, which serve (the
// daemon's defaults) and proxy (per-request overrides) share.
type disaggFlags struct {
	order       coordinator.Order
	prefillFail coordinator.FailurePolicy
	policy      coordinator.PolicyKind
	effISL      float64
	effISLRatio float64
	decodeBusy  float64
	prefillBusy float64
}

func newDisaggFlags() disaggFlags {
	return disaggFlags{order: coordinator.DecodeFirst, prefillFail: coordinator.FreeDecode, policy: coordinator.PolicyOff,
		effISL: coordinator.DefaultEffISLThreshold, effISLRatio: coordinator.DefaultEffISLRatioThreshold}
}

func (o *disaggFlags) AddFlags(fs *pflag.FlagSet) {
	fs.TextVar(&o.order, "disagg-order", o.order, "disaggregated plans: decode-first or prefill-first")
	fs.TextVar(&o.prefillFail, "prefill-failure", o.prefillFail, "when prefill cannot be booked or fails after decode is booked: free_decode or bypass_on_decode")
	fs.TextVar(&o.policy, "disagg-policy", o.policy, "conditional disaggregation, whether a plan may skip remote prefill and prefill on its decode engine: "+
		"off (the default) never does, so every plan prefills remotely, even a 10-token prompt; "+
		"isl_bounding bypasses prompts with few uncached tokens (--bypass-max-eff-isl, --bypass-max-eff-isl-ratio; prefixd demo uses it at 256 tokens); "+
		"prefill_load bypasses when the prefill engine is busy (--prefill-busy-threshold); isl_or_load when either says so")
	fs.Float64Var(&o.effISL, "bypass-max-eff-isl", o.effISL, "isl_bounding: bypass only below this many uncached prompt tokens")
	fs.Float64Var(&o.effISLRatio, "bypass-max-eff-isl-ratio", o.effISLRatio, "isl_bounding: bypass only below this uncached share of the prompt")
	fs.Float64Var(&o.decodeBusy, "decode-busy-threshold", o.decodeBusy, "decode busy gate: veto a bypass above this fraction of total_kv_blocks (0 = no gate)")
	fs.Float64Var(&o.prefillBusy, "prefill-busy-threshold", o.prefillBusy, "prefill_load: busy above this fraction of max_num_batched_tokens (0 = no probe)")
	enum(fs, "disagg-order", "decode-first", "prefill-first")
	enum(fs, "prefill-failure", "free_decode", "bypass_on_decode")
	enum(fs, "disagg-policy", "off", "isl_bounding", "prefill_load", "isl_or_load")
}

// coordinator maps the flags onto the coordinator's config (the names
// were parsed by the flags themselves) and checks the thresholds.
func (o *disaggFlags) coordinator() (coordinator.CoordinatorConfig, error) {
	c := coordinator.CoordinatorConfig{Order: o.order, PrefillFailure: o.prefillFail, Policy: coordinator.DefaultPolicy()}
	c.Policy.Kind = o.policy
	if o.effISL <= 0 || o.effISLRatio <= 0 || o.effISLRatio > 1 {
		return c, fmt.Errorf("--bypass-max-eff-isl %v and --bypass-max-eff-isl-ratio %v: want > 0 and a ratio in (0, 1]", o.effISL, o.effISLRatio)
	}
	if o.decodeBusy < 0 || o.prefillBusy < 0 {
		return c, fmt.Errorf("--decode-busy-threshold and --prefill-busy-threshold must not be negative")
	}
	c.Policy.EffISLThreshold, c.Policy.EffISLRatioThreshold = o.effISL, o.effISLRatio
	c.Policy.DecodeBusyThreshold, c.Policy.PrefillBusyThreshold = o.decodeBusy, o.prefillBusy
	return c, nil
}

// overrides are the plan fields a proxy sends with every plan: only the
// flags given on its command line, so that serve's own configuration
// holds for the rest.
func (o *disaggFlags) overrides(fs *pflag.FlagSet) (*api.PlanPolicy, string, error) {
	if _, err := o.coordinator(); err != nil {
		return nil, "", err
	}
	var failure string
	if fs.Changed("prefill-failure") {
		failure = o.prefillFail.String()
	}
	for _, f := range []string{"disagg-policy", "bypass-max-eff-isl", "bypass-max-eff-isl-ratio", "decode-busy-threshold", "prefill-busy-threshold"} {
		if fs.Changed(f) {
			return &api.PlanPolicy{Kind: o.policy.String(), EffISLThreshold: o.effISL, EffISLRatioThreshold: o.effISLRatio,
				DecodeBusyThreshold: o.decodeBusy, PrefillBusyThreshold: o.prefillBusy}, failure, nil
		}
	}
	return nil, failure, nil
}
