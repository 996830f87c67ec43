package sidecar

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prefixd/prefixd/catalog"
)

// The sources Resolve writes for values not from the engine.
const (
	SourceFlagPrefix = "flag "    // "flag --block-size"
	SourceEngine     = "engine: " // "engine: GET /metrics vllm:cache_config_info"
	SourceDefault    = "default"
)

// Resolve is the record to register: flags, a worker record whose fields
// named in given (JSON field name → the flag that set it, e.g.
// "block_size": "--block-size") the operator set, completed with what the
// engine said in d. A given field wins, but one that contradicts the
// engine is refused, naming both values; so is an engine that runs with
// prefix caching off (nothing would ever be cached), one that says it
// publishes no KV events, and a record whose model
// or block size neither the operator nor the engine gave. The record's
// Sources say where each value came from.
func Resolve(flags catalog.Worker, given map[string]string, d Description) (catalog.Worker, error) {
	w := flags
	w.Sources = map[string]string{}
	var errs []string
	if d.PrefixCaching.Known() && !d.PrefixCaching.V {
		errs = append(errs, fmt.Sprintf("the engine runs with prefix caching off (%s): it never reuses a prefix, so prefixd would find nothing cached; start it with prefix caching on", d.PrefixCaching.From))
	}
	if d.KVEvents.Known() && !d.KVEvents.V {
		if flag, ok := given["events_endpoint"]; ok {
			errs = append(errs, fmt.Sprintf("%s %s contradicts the engine, which publishes no KV events (%s)", flag, show(w.EventsEndpoint), d.KVEvents.From))
		} else {
			errs = append(errs, fmt.Sprintf("the engine publishes no KV events (%s): start it with a ZMQ kv-events config", d.KVEvents.From))
		}
	}

	// The model: one the engine serves.
	if flag, ok := given["model_name"]; ok {
		if len(d.Models) > 0 && !slices.Contains(d.Models, w.ModelName) {
			errs = append(errs, fmt.Sprintf("%s %q contradicts the engine, which serves %s (%s)", flag, w.ModelName, quoteAll(d.Models), d.Model.From+routeIfUnknown(d)))
		} else {
			w.Sources["model_name"] = SourceFlagPrefix + flag
		}
	} else if d.Model.Known() {
		w.ModelName = d.Model.V
		w.Sources["model_name"] = SourceEngine + d.Model.From
	} else if len(d.Models) > 1 {
		errs = append(errs, fmt.Sprintf("the engine serves several models, %s (%s): say which with --model", quoteAll(d.Models), routeModels))
	}

	r := resolver{given: given, sources: w.Sources}
	pick(&r, "block_size", &w.BlockSize, d.BlockSize, eq)
	pick(&r, "total_kv_blocks", &w.TotalKVBlocks, d.TotalKVBlocks, eq)
	pick(&r, "max_num_batched_tokens", &w.MaxNumBatchedTokens, d.MaxNumBatchedTokens, eq)
	pick(&r, "data_parallel_start_rank", &w.DataParallelStartRank, d.DPStart, eq)
	pick(&r, "data_parallel_size", &w.DataParallelSize, d.DPSize, eq)
	if !d.KVEvents.Known() || d.KVEvents.V {
		pick(&r, "events_endpoint", &w.EventsEndpoint, d.EventsEndpoint, sameEndpoint)
		pick(&r, "replay_endpoint", &w.ReplayEndpoint, d.ReplayEndpoint, sameEndpoint)
		pick(&r, "topic", &w.Topic, d.Topic, eq)
	}
	errs = append(errs, r.errs...)

	for field, flag := range map[string]string{"model_name": "--model", "block_size": "--block-size"} {
		if src, ok := w.Sources[field]; (!ok || src == SourceDefault) && !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, flag) }) {
			errs = append(errs, fmt.Sprintf("%s: the engine did not say (%s), and %s is not set", field, whatWasAsked(d), flag))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return w, errors.New(strings.Join(errs, "; "))
	}
	if len(w.Sources) == 0 {
		w.Sources = nil
	}
	return w, nil
}

type resolver struct {
	given   map[string]string
	sources map[string]string
	errs    []string
}

func eq[T comparable](a, b T) bool { return a == b }

// pick resolves one field: the flag's value when given (refused if the
// engine says otherwise), else the engine's, else the flag default.
func pick[T comparable](r *resolver, field string, dst *T, said Said[T], same func(a, b T) bool) {
	var zero T
	flag, given := r.given[field]
	switch {
	case given && said.Known() && !same(*dst, said.V):
		r.errs = append(r.errs, fmt.Sprintf("%s %s contradicts the engine's %s %s (%s)", flag, show(*dst), field, show(said.V), said.From))
	case given:
		r.sources[field] = SourceFlagPrefix + flag
	case said.Known():
		*dst = said.V
		if said.V != zero {
			r.sources[field] = SourceEngine + said.From
		}
	case *dst != zero:
		r.sources[field] = SourceDefault
	}
}

func show(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" {
			return "(none)"
		}
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprint(v)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func routeIfUnknown(d Description) string {
	if d.Model.Known() {
		return ""
	}
	return routeModels
}

// whatWasAsked names the routes a value could have come from.
func whatWasAsked(d Description) string {
	if d.Flavor == "sglang" {
		return "GET /server_info"
	}
	return "GET /metrics, GET /v1/models, GET /server_info"
}
