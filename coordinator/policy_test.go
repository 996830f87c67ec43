package coordinator

import "testing"

func TestConditionalDisaggPolicies(t *testing.T) {
	isl := DefaultPolicy()
	load := Policy{Kind: PolicyPrefillLoad, PrefillBusyThreshold: 0.5}
	or := Policy{Kind: PolicyISLOrLoad, EffISLThreshold: 2048, EffISLRatioThreshold: 0.7, PrefillBusyThreshold: 0.5}
	for _, tc := range []struct {
		name string
		p    Policy
		in   DecisionInput
		want bool
	}{
		{"small_and_mostly_cached_bypasses", isl, DecisionInput{PromptTokens: 1000, CachedTokens: 800}, true},
		{"large_eff_isl_does_not_bypass_even_if_ratio_low", isl, DecisionInput{PromptTokens: 100000, CachedTokens: 97000}, false},
		{"small_eff_isl_but_ratio_at_or_above_threshold_does_not_bypass", isl, DecisionInput{PromptTokens: 1000, CachedTokens: 300}, false},
		{"small_eff_isl_ratio_above_threshold", isl, DecisionInput{PromptTokens: 1000, CachedTokens: 100}, false},
		{"boundary_eff_isl_equals_threshold_does_not_bypass", isl, DecisionInput{PromptTokens: 10000, CachedTokens: 10000 - 2048}, false},
		{"zero_prompt_tokens_does_not_panic", isl, DecisionInput{}, true},
		{"overlap_exceeding_prompt_clamps_to_zero_eff_isl", isl, DecisionInput{PromptTokens: 100, CachedTokens: 500}, true},
		// 1000 tokens, 299.5 weighted cached: eff 700.5 → ratio 0.7005 ≥ 0.7. Rounding up to a
		// block (304 cached) would give eff 696 → bypass.
		{"weighted_cached_tokens_do_not_round_up_to_full_block", isl, DecisionInput{PromptTokens: 1000, CachedTokens: 299.5}, false},
		{"disabled_never_bypasses", Policy{}, DecisionInput{PromptTokens: 10, CachedTokens: 10}, false},
		{"prefill_load_busy_bypasses", load, DecisionInput{PromptTokens: 10000, PrefillBusy: IsBusy}, true},
		{"prefill_load_not_busy", load, DecisionInput{PromptTokens: 10, CachedTokens: 10, PrefillBusy: NotBusy}, false},
		{"prefill_load_signal_none_does_not_bypass", load, DecisionInput{PromptTokens: 10, CachedTokens: 10}, false},
		{"isl_or_load_busy_and_isl_yes", or, DecisionInput{PromptTokens: 1000, CachedTokens: 800, PrefillBusy: IsBusy}, true},
		{"isl_or_load_busy_and_isl_no", or, DecisionInput{PromptTokens: 100000, PrefillBusy: IsBusy}, true},
		{"isl_or_load_not_busy_and_isl_yes", or, DecisionInput{PromptTokens: 1000, CachedTokens: 800, PrefillBusy: NotBusy}, true},
		{"isl_or_load_not_busy_and_isl_no", or, DecisionInput{PromptTokens: 100000, PrefillBusy: NotBusy}, false},
		{"isl_or_load_signal_none_falls_back_to_isl_only", or, DecisionInput{PromptTokens: 1000, CachedTokens: 800}, true},
		{"isl_or_load_signal_none_and_isl_no", or, DecisionInput{PromptTokens: 100000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.SaysBypass(tc.in); got != tc.want {
				t.Fatalf("bypass %v, want %v (eff_isl %v)", got, tc.want, tc.in.EffISL())
			}
		})
	}
}

func TestDecodeBusyGate(t *testing.T) {
	in := DecisionInput{PromptTokens: 1000, CachedTokens: 900}
	gated := DefaultPolicy()
	gated.DecodeBusyThreshold = 0.8
	for _, tc := range []struct {
		name   string
		p      Policy
		decode Busy
		want   bool
	}{
		{"no_gate_allows", DefaultPolicy(), BusyUnknown, true},
		{"gate_not_busy_allows", gated, NotBusy, true},
		{"gate_busy_vetoes", gated, IsBusy, false},
		{"gate_unknown_never_allows", gated, BusyUnknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.Decide(in, tc.decode)
			if !d.PolicySaysBypass || d.Bypass != tc.want {
				t.Fatalf("decision %+v, want bypass %v", d, tc.want)
			}
		})
	}
	if d := gated.Decide(DecisionInput{PromptTokens: 100000}, IsBusy); d.DecodeBusy != BusyUnknown || d.Bypass {
		t.Fatalf("decode busy read without a policy bypass: %+v", d)
	}
}
