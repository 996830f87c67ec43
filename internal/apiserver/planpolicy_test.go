package apiserver

import (
	"testing"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/coordinator"
)

func TestPlanPolicyMapping(t *testing.T) {
	for _, tc := range []struct {
		in   api.PlanPolicy
		want coordinator.Policy
	}{
		{api.PlanPolicy{Kind: "off"}, func() coordinator.Policy { p := coordinator.DefaultPolicy(); p.Kind = coordinator.PolicyOff; return p }()},
		{api.PlanPolicy{Kind: "isl_bounding"}, coordinator.DefaultPolicy()},
		{api.PlanPolicy{Kind: "isl_or_load", EffISLThreshold: 512, EffISLRatioThreshold: 0.5, DecodeBusyThreshold: 0.9, PrefillBusyThreshold: 0.8},
			coordinator.Policy{Kind: coordinator.PolicyISLOrLoad, EffISLThreshold: 512, EffISLRatioThreshold: 0.5, DecodeBusyThreshold: 0.9, PrefillBusyThreshold: 0.8}},
		{api.PlanPolicy{Kind: "prefill_load", PrefillBusyThreshold: 0.5},
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
