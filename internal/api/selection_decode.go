package api

import (
	"math"
)

// Limits of the selection and plan bodies, checked while a body is read,
// before anything is allocated for the value (docs/api.md lists them all).
const (
	// DefaultMaxBlockHashes is Config.MaxBlockHashes' default: block hashes
	// per request, DefaultMaxTokens / 16 rounded up to a power of two (a
	// block holds 16 tokens or more).
	DefaultMaxBlockHashes = 1 << 16
	// MaxAllowedWorkerIDs bounds allowed_worker_ids.
	MaxAllowedWorkerIDs = 4096
	// MaxTaints bounds required_taints and preferred_taints (each) of a
	// request, and the taints and topology_domains of a /register.
	MaxTaints = 256
	// MaxTaintBytes bounds one taint of a request, as the catalog bounds
	// names: a longer taint matches no worker.
	MaxTaintBytes = 512
	// MaxTaintWeight bounds |weight| of a preferred taint: a worker's
	// cost is scaled by exp(−tanh Σ weights), which is flat long before.
	MaxTaintWeight = 1000
)

// selDecoder reads the body of a selection or plan route with the lexer,
// bounding every list and number while it reads it.
type selDecoder struct {
	lexer
	maxTokens, maxHashes int
}

func (h *handler) selDecoder(body []byte) *selDecoder {
	return &selDecoder{lexer: lexer{data: body}, maxTokens: h.cfg.MaxTokens, maxHashes: h.cfg.MaxBlockHashes}
}

// decodeSelect reads a /select or /select_and_reserve body.
func (d *selDecoder) decodeSelect() (SelectRequest, error) {
	var req SelectRequest
	err := d.document(func(key string) error {
		if ok, err := d.prompt(key, &req.Prompt); ok {
			return err
		}
		var err error
		switch key {
		case "model_name":
			req.ModelName, err = d.string(key, true)
		case "routing_group":
			req.RoutingGroup, err = d.string(key, true)
		case "role":
			req.Role, err = d.string(key, true)
		case "selection_id":
			req.SelectionID, err = d.string(key, true)
		case "pinned_worker":
			req.PinnedWorker, err = d.workerRef(key)
		case "allowed_worker_ids":
			req.AllowedWorkerIDs, err = d.workerIDs(key)
		case "routing_constraints":
			req.RoutingConstraints, err = d.constraints(key)
		case "router_temperature":
			req.Temperature, err = d.optFloat(key)
		default:
			err = d.skip(clip(key, maxEcho), 1) // unknown: tolerated for forward compatibility
		}
		return err
	})
	return req, err
}

// decodeReserve reads a /reservations body.
func (d *selDecoder) decodeReserve() (ReserveRequest, error) {
	var req ReserveRequest
	err := d.document(func(key string) error {
		if ok, err := d.prompt(key, &req.Prompt); ok {
			return err
		}
		var err error
		switch key {
		case "selection_id":
			req.SelectionID, err = d.string(key, true)
		case "model_name":
			req.ModelName, err = d.string(key, true)
		case "routing_group":
			req.RoutingGroup, err = d.string(key, true)
		case "role":
			req.Role, err = d.string(key, true)
		case "worker_id":
			var isNull bool
			if isNull, err = d.null(); !isNull && err == nil {
				var v uint64
				v, err = d.uint(key, math.MaxUint64)
				req.WorkerID = &v
			}
		case "dp_rank":
			var v uint64
			v, err = d.optUint(key, math.MaxUint32)
			req.DPRank = uint32(v)
		default:
			err = d.skip(clip(key, maxEcho), 1)
		}
		return err
	})
	return req, err
}

// decodePlan reads a POST /disagg/plans body.
func (d *selDecoder) decodePlan() (PlanRequest, error) {
	var req PlanRequest
	err := d.document(func(key string) error {
		if ok, err := d.prompt(key, &req.Prompt); ok {
			return err
		}
		var err error
		switch key {
		case "request_id":
			req.ID, err = d.string(key, true)
		case "model_name":
			req.ModelName, err = d.string(key, true)
		case "routing_group":
			req.RoutingGroup, err = d.string(key, true)
		case "prefill_routing_group":
			req.PrefillRoutingGroup, err = d.string(key, true)
		case "policy":
			req.Policy, err = d.policy(key)
		case "prefill_failure":
			req.PrefillFailure, err = d.string(key, true)
		case "pinned_prefill_worker":
			req.PinnedPrefillWorker, err = d.workerRef(key)
		case "allowed_worker_ids":
			req.AllowedWorkerIDs, err = d.workerIDs(key)
		case "routing_constraints":
			req.RoutingConstraints, err = d.constraints(key)
		default:
			err = d.skip(clip(key, maxEcho), 1)
		}
		return err
	})
	return req, err
}

// prompt decodes key into p if it is a Prompt field, reporting whether it
// was. token_ids stop at maxTokens and block_hashes at maxHashes (413);
// isl_tokens is at most maxTokens, the longest prompt token_ids may carry.
func (d *selDecoder) prompt(key string, p *Prompt) (bool, error) {
	var err error
	switch key {
	case "token_ids":
		var isNull bool
		if isNull, err = d.null(); !isNull && err == nil {
			p.TokenIDs, err = d.tokens(key, nil, d.maxTokens)
		} else {
			p.TokenIDs = nil
		}
	case "lora_name":
		p.LoraName, err = d.string(key, true)
	case "cache_salt":
		p.CacheSalt, err = d.string(key, true)
	case "block_hashes":
		var isNull bool
		var hs []uint64
		if isNull, err = d.null(); !isNull && err == nil {
			hs, err = d.hashes(key, nil, d.maxHashes)
		}
		p.BlockHashes = hs
	case "isl_tokens":
		var v uint64
		v, err = d.optUint(key, uint64(d.maxTokens))
		p.ISLTokens = int(v)
	default:
		return false, nil
	}
	return true, err
}

// optUint reads a non-negative integer no larger than max; null is 0.
func (d *selDecoder) optUint(field string, max uint64) (uint64, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return 0, err
	}
	return d.uint(field, max)
}

// optFloat reads a finite number; null is nil.
func (d *selDecoder) optFloat(field string) (*float64, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	f, err := d.float(field)
	return &f, err
}

// workerRef reads {"worker_id", "dp_rank"}; null is nil.
func (d *selDecoder) workerRef(field string) (*WorkerRef, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	ref := &WorkerRef{}
	err := d.object(field, 2, func(key string) error {
		var err error
		var v uint64
		switch key {
		case "worker_id":
			v, err = d.optUint(field+".worker_id", math.MaxUint64)
			ref.WorkerID = v
		case "dp_rank":
			v, err = d.optUint(field+".dp_rank", math.MaxUint32)
			ref.DPRank = uint32(v)
		default:
			err = d.skip(field+"."+clip(key, maxEcho), 2)
		}
		return err
	})
	return ref, err
}

// workerIDs reads at most MaxAllowedWorkerIDs worker ids; null is nil.
func (d *selDecoder) workerIDs(field string) ([]uint64, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	var out []uint64
	err := d.array(field, 2, func(i int) error {
		if i == MaxAllowedWorkerIDs {
			return tooLarge(field, "more than %d worker ids", MaxAllowedWorkerIDs)
		}
		v, err := d.uint(at(field, i), math.MaxUint64)
		out = append(out, v)
		return err
	})
	return out, err
}

// constraints reads routing_constraints; null is nil.
func (d *selDecoder) constraints(field string) (*RoutingConstraints, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	rc := &RoutingConstraints{}
	err := d.object(field, 2, func(key string) error {
		var err error
		switch key {
		case "required_taints":
			rc.RequiredTaints, err = d.strings(field+".required_taints", MaxTaints, MaxTaintBytes)
		case "preferred_taints":
			rc.PreferredTaints, err = d.weights(field + ".preferred_taints")
		default:
			err = d.skip(field+"."+clip(key, maxEcho), 2)
		}
		return err
	})
	return rc, err
}

// weights reads preferred_taints: at most MaxTaints taints of at most
// MaxTaintBytes, each weighing at most ±MaxTaintWeight; null is nil.
func (d *selDecoder) weights(field string) (map[string]float64, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	out := map[string]float64{}
	n := 0
	err := d.object(field, 3, func(taint string) error {
		if n++; n > MaxTaints {
			return tooLarge(field, "more than %d taints", MaxTaints)
		}
		name := field + "." + clip(taint, maxEcho)
		if len(taint) > MaxTaintBytes {
			return badRequest(name, "the taint is longer than %d bytes", MaxTaintBytes)
		}
		w, err := d.float(name)
		if err == nil && math.Abs(w) > MaxTaintWeight {
			return badRequest(name, "%v is out of range [-%d, %d]", w, MaxTaintWeight, MaxTaintWeight)
		}
		out[taint] = w
		return err
	})
	return out, err
}

// policy reads a per-request plan policy; null is nil. checkPlanPolicy
// validates its values.
func (d *selDecoder) policy(field string) (*PlanPolicy, error) {
	if isNull, err := d.null(); isNull || err != nil {
		return nil, err
	}
	p := &PlanPolicy{}
	err := d.object(field, 2, func(key string) error {
		var err error
		var f *float64
		name := field + "." + clip(key, maxEcho)
		switch key {
		case "kind":
			p.Kind, err = d.string(name, true)
			return err
		case "eff_isl_threshold", "eff_isl_ratio_threshold", "decode_busy_threshold", "prefill_busy_threshold":
			f, err = d.optFloat(name)
		default:
			return d.skip(name, 2)
		}
		v := 0.0
		if f != nil {
			v = *f
		}
		switch key {
		case "eff_isl_threshold":
			p.EffISLThreshold = v
		case "eff_isl_ratio_threshold":
			p.EffISLRatioThreshold = v
		case "decode_busy_threshold":
			p.DecodeBusyThreshold = v
		case "prefill_busy_threshold":
			p.PrefillBusyThreshold = v
		}
		return err
	})
	return p, err
}
