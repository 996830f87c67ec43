package api

import (
	"testing"

	"github.com/prefixd/prefixd/coordinator"
)

func TestPlanPolicyMapping(t *testing.T) {
	for _, tc := range []struct {
		in   PlanPolicy
		want coordinator.Policy
	}{
		{PlanPolicy{Kind: "off"}, func() coordinator.Policy { p := coordinator.DefaultPolicy(); p.Kind = coordinator.PolicyOff; return p }()},
		{PlanPolicy{Kind: "isl_bounding"}, coordinator.DefaultPolicy()},
		{PlanPolicy{Kind: "isl_or_load", EffISLThreshold: 512, EffISLRatioThreshold: 0.5, DecodeBusyThreshold: 0.9, PrefillBusyThreshold: 0.8},
			coordinator.Policy{Kind: coordinator.PolicyISLOrLoad, EffISLThreshold: 512, EffISLRatioThreshold: 0.5, DecodeBusyThreshold: 0.9, PrefillBusyThreshold: 0.8}},
		{PlanPolicy{Kind: "prefill_load", PrefillBusyThreshold: 0.5},
			func() coordinator.Policy {
				p := coordinator.DefaultPolicy()
				p.Kind, p.PrefillBusyThreshold = coordinator.PolicyPrefillLoad, 0.5
				return p
			}()},
	} {
		if got, herr := planPolicy(&tc.in); herr != nil || got != tc.want {
			t.Errorf("%+v: got %+v %v, want %+v", tc.in, got, herr, tc.want)
		}
	}
}
