package coordinator

// Busy is a tri-state busy signal: a missing capacity or a failed probe
// makes it unknown.
type Busy int8

const (
	BusyUnknown Busy = iota
	NotBusy
	IsBusy
)

func (b Busy) String() string {
	switch b {
	case NotBusy:
		return "not-busy"
	case IsBusy:
		return "busy"
	}
	return "unknown"
}

func busyIf(b bool) Busy {
	if b {
		return IsBusy
	}
	return NotBusy
}

// PolicyKind is a conditional-disaggregation policy (Dynamo
// lib/kv-router/src/conditional_disagg.rs), or none.
type PolicyKind uint8

const (
	// PolicyOff never bypasses remote prefill: conditional disaggregation
	// is disabled.
	PolicyOff PolicyKind = iota
	// PolicyISLBounding bypasses remote prefill for small, mostly cached prompts.
	PolicyISLBounding
	// PolicyPrefillLoad bypasses when the chosen prefill worker is busy.
	PolicyPrefillLoad
	// PolicyISLOrLoad bypasses when either rule says so; an unknown load
	// signal falls back to the ISL rule alone.
	PolicyISLOrLoad
)

// ConsumesPrefillLoad reports whether the policy reads the prefill busy signal.
func (k PolicyKind) ConsumesPrefillLoad() bool { return k == PolicyPrefillLoad || k == PolicyISLOrLoad }

// Defaults of Policy.
const (
	DefaultEffISLThreshold      = 2048
	DefaultEffISLRatioThreshold = 0.7
)

// Policy is the conditional-disaggregation configuration. The zero value
// is disabled (PolicyOff); DefaultPolicy returns an isl_bounding policy.
type Policy struct {
	Kind PolicyKind
	// EffISLThreshold and EffISLRatioThreshold bound isl_bounding:
	// bypass iff eff_isl < EffISLThreshold and eff_isl / max(prompt, 1) < EffISLRatioThreshold.
	EffISLThreshold      float64
	EffISLRatioThreshold float64
	// PrefillBusyThreshold (> 0 to enable the probe): the prefill worker is
	// busy when active prefill tokens > threshold · MaxNumBatchedTokens.
	PrefillBusyThreshold float64
	// DecodeBusyThreshold (> 0 to enable the gate): a bypass stands only if
	// the previewed decode worker's potential decode blocks are at most
	// threshold · TotalKVBlocks. An unknown capacity vetoes the bypass.
	DecodeBusyThreshold float64
}

// DefaultPolicy returns isl_bounding with thresholds 2048 and 0.7, no gate.
func DefaultPolicy() Policy {
	return Policy{Kind: PolicyISLBounding, EffISLThreshold: DefaultEffISLThreshold, EffISLRatioThreshold: DefaultEffISLRatioThreshold}
}

// Enabled reports whether the policy is not PolicyOff.
func (p Policy) Enabled() bool { return p.Kind != PolicyOff }

// DecisionInput is what a policy decides on.
type DecisionInput struct {
	PromptTokens int
	// CachedTokens on the previewed decode worker, weighted by tier and not
	// rounded to a block.
	CachedTokens float64
	PrefillBusy  Busy
}

// EffISL is the net new tokens: prompt − min(cached, prompt), never negative.
func (in DecisionInput) EffISL() float64 {
	p := float64(in.PromptTokens)
	return p - min(max(in.CachedTokens, 0), p)
}

// SaysBypass reports whether the policy would run prefill on the decode
// worker (before the decode busy gate). A disabled policy never does.
func (p Policy) SaysBypass(in DecisionInput) bool {
	if !p.Enabled() {
		return false
	}
	switch p.Kind {
	case PolicyISLBounding:
		return p.isl(in)
	case PolicyPrefillLoad:
		return in.PrefillBusy == IsBusy
	case PolicyISLOrLoad:
		return in.PrefillBusy == IsBusy || p.isl(in)
	}
	return false
}

func (p Policy) isl(in DecisionInput) bool {
	eff := in.EffISL()
	return eff < p.EffISLThreshold && eff/float64(max(in.PromptTokens, 1)) < p.EffISLRatioThreshold
}

// Decision is the recorded outcome of the policy and the decode busy gate.
type Decision struct {
	PolicySaysBypass bool
	PrefillBusy      Busy
	// DecodeBusy is read only when the policy says bypass (else unknown).
	DecodeBusy Busy
	Bypass     bool
}

// Decide applies the policy, then the decode busy gate: a bypass stands only
// if no gate is configured or decodeBusy is NotBusy (unknown never allows one).
func (p Policy) Decide(in DecisionInput, decodeBusy Busy) Decision {
	d := Decision{PolicySaysBypass: p.SaysBypass(in), PrefillBusy: in.PrefillBusy}
	if !d.PolicySaysBypass {
		return d
	}
	d.DecodeBusy = decodeBusy
	d.Bypass = p.DecodeBusyThreshold <= 0 || decodeBusy == NotBusy
	return d
}
