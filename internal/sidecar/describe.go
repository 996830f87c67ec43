package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/prefixd/prefixd/internal/leaf/clip"
)

// What an engine says about itself, and where: Describe asks the routes
// vLLM and SGLang serve.
//
//   - vLLM, GET /metrics: the info gauge vllm:cache_config_info, one
//     sample per engine (label "engine", the dp rank) whose labels are
//     CacheConfig's fields as Python strs (block_size, num_gpu_blocks,
//     enable_prefix_caching "True"/"False", …): PrometheusStatLogger's
//     log_metrics_info in vllm/v1/metrics/loggers.py, CacheConfig's
//     metrics_info in vllm/config/cache.py.
//   - vLLM, GET /v1/models: the served model names (adapters carry a
//     parent) and max_model_len (vllm/entrypoints/openai/protocol.py,
//     ModelCard).
//   - vLLM, GET /server_info?config_format=json, served only with
//     VLLM_SERVER_DEV_MODE=1: {"vllm_config": VllmConfig as JSON}, whose
//     kv_events_config (vllm/config/kv_events.py: enable_kv_cache_events,
//     publisher, endpoint, replay_endpoint, topic), parallel_config
//     (data_parallel_size, data_parallel_rank), scheduler_config
//     (max_num_batched_tokens), model_config and cache_config the sidecar
//     reads (vllm/entrypoints/serve/instrumentator/server_info.py). Without
//     config_format=json, or in older releases, vllm_config is a string,
//     which says nothing here.
//   - SGLang, GET /server_info (GET /get_server_info before it was
//     renamed): ServerArgs' fields flat (page_size, dp_size,
//     kv_events_config as a JSON string, disable_radix_cache,
//     served_model_name, chunked_prefill_size, context_length), the
//     scheduler's info (max_total_num_tokens) and, in newer releases, a
//     "kv_events" block {publisher, endpoint_host, endpoint_port_base,
//     topic, block_size, dp_size}, null when nothing is published
//     (python/sglang/srt/entrypoints/http_server.py, server_info).
//
// SGLang ignores the query string, so one GET /server_info?config_format=json
// asks both engines.

// Said is a value the engine reported and the route it came from; From is
// "" when the engine did not say.
type Said[T comparable] struct {
	V    T
	From string
}

// Known reports whether the engine said.
func (s Said[T]) Known() bool { return s.From != "" }

// Description is what an engine said about itself.
type Description struct {
	Flavor string // "vllm" or "sglang"
	// Models are the served model names (adapters excluded); Model is
	// set when there is exactly one.
	Models []string
	Model  Said[string]
	// BlockSize is the KV block size in tokens (SGLang's page size);
	// TotalKVBlocks one rank's KV capacity in blocks.
	BlockSize     Said[uint32]
	TotalKVBlocks Said[uint64]
	PrefixCaching Said[bool]
	// KVEvents says whether the engine publishes KV events; the endpoints
	// are the configured ones (wildcard hosts as configured, the base port
	// that rank r offsets by r).
	KVEvents       Said[bool]
	EventsEndpoint Said[string]
	ReplayEndpoint Said[string]
	Topic          Said[string]
	DPStart        Said[uint32]
	DPSize         Said[uint32]
	// MaxModelLen is logged only (the record has no field for it).
	MaxModelLen         Said[uint64]
	MaxNumBatchedTokens Said[uint64]
}

// Limits of one route's answer.
const (
	// MaxDescribeBytes bounds the body Describe reads from one route
	// (vLLM's /metrics and /server_info, with its environment report, are
	// the large ones: tens to hundreds of kilobytes).
	MaxDescribeBytes = 8 << 20
	// DescribeTimeout bounds one route's request. vLLM's first
	// /server_info collects the system environment, which takes seconds.
	DescribeTimeout = 30 * time.Second
	// maxModelCards bounds /v1/models' list.
	maxModelCards = 4096
)

// The routes, as a record's sources name them.
const (
	routeVLLMMetrics    = "GET /metrics vllm:cache_config_info"
	routeModels         = "GET /v1/models"
	routeVLLMServerInfo = "GET /server_info vllm_config"
	routeSGLangInfo     = "GET /server_info"
	routeSGLangOldInfo  = "GET /get_server_info"
	routeSGLangEvents   = "GET /server_info kv_events"
)

// PermanentError is an answer Describe cannot use however often it asks:
// the engine describes itself on none of the routes, or contradicts
// itself.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

func permanent(format string, args ...any) error {
	return &PermanentError{fmt.Errorf(format, args...)}
}

// Describe asks the engine at base (its HTTP base URL) what it is. An
// engine not answering, or answering 5xx, is an error to retry; one that
// describes itself nowhere, or contradicts itself, a *PermanentError.
// Every body is read within MaxDescribeBytes and every request within
// DescribeTimeout.
func Describe(ctx context.Context, c *http.Client, base string) (Description, error) {
	if c == nil {
		c = http.DefaultClient
	}
	base = strings.TrimSuffix(base, "/")
	var d Description
	// vLLM's metrics first: always served, so the values every vLLM
	// reports are named by the route every vLLM has.
	body, status, err := get(ctx, c, base, "/metrics")
	if err != nil {
		return d, err
	}
	if status == http.StatusOK {
		if err := d.vllmMetrics(body); err != nil {
			return d, err
		}
	}
	body, status, err = get(ctx, c, base, "/server_info?config_format=json")
	if err != nil {
		return d, err
	}
	infoFound := status == http.StatusOK
	if infoFound {
		if err := d.serverInfo(body, routeSGLangInfo); err != nil {
			return d, err
		}
	}
	if d.Flavor == "" && !infoFound {
		body, status, err = get(ctx, c, base, "/get_server_info")
		if err != nil {
			return d, err
		}
		if status == http.StatusOK {
			if err := d.serverInfo(body, routeSGLangOldInfo); err != nil {
				return d, err
			}
		}
	}
	if d.Flavor == "" {
		return d, permanent("the engine at %s describes itself on none of GET /server_info, GET /metrics (vllm:cache_config_info) and GET /get_server_info: is it vLLM or SGLang? (--ask-engine=false registers from flags alone)", base)
	}
	body, status, err = get(ctx, c, base, "/v1/models")
	if err != nil {
		return d, err
	}
	if status == http.StatusOK {
		if err := d.models(body); err != nil {
			return d, err
		}
	}
	return d, nil
}

// get fetches base+path: the body of a 200, the status of a 404 or 405
// (a route this engine does not serve), an error otherwise.
func get(ctx context.Context, c *http.Client, base, path string) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, DescribeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, 0, permanent("GET %s: %v", path, err)
	}
	req.Header.Set("Accept", "application/json, text/plain;version=0.0.4;q=0.9")
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, resp.StatusCode, nil
	case resp.StatusCode != http.StatusOK:
		return nil, resp.StatusCode, fmt.Errorf("GET %s: HTTP %s", path, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDescribeBytes+1))
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: reading the body: %w", path, err)
	}
	if len(body) > MaxDescribeBytes {
		return nil, 0, permanent("GET %s: the body is larger than %d bytes", path, MaxDescribeBytes)
	}
	return body, http.StatusOK, nil
}

// set records v from route in s, refusing a value that contradicts what
// another route said.
func set[T comparable](s *Said[T], field string, v T, from string) error {
	if s.Known() && s.V != v {
		return permanent("the engine contradicts itself: %s %v (%s), but %v (%s)", field, s.V, s.From, v, from)
	}
	if !s.Known() {
		s.V, s.From = v, from
	}
	return nil
}

// vllmMetrics reads vllm:cache_config_info from a /metrics body; a body
// without it says nothing.
func (d *Description) vllmMetrics(body []byte) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return permanent("GET /metrics: not the Prometheus text format: %s", clip.N(err.Error(), 200))
	}
	fam, ok := fams["vllm:cache_config_info"]
	if !ok || len(fam.GetMetric()) == 0 {
		return nil
	}
	d.Flavor = "vllm"
	ranks := map[uint32]bool{}
	var gpuBlocks uint64
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if v, ok := labels["block_size"]; ok {
			bs, err := strconv.ParseUint(v, 10, 32)
			if err != nil || bs == 0 {
				return permanent("%s: block_size %q is not a positive integer", routeVLLMMetrics, clip.N(v, 40))
			}
			if err := set(&d.BlockSize, "block_size", uint32(bs), routeVLLMMetrics); err != nil {
				return err
			}
		}
		if v, ok := labels["enable_prefix_caching"]; ok {
			on, err := strconv.ParseBool(v)
			if err != nil {
				return permanent("%s: enable_prefix_caching %q is not a boolean", routeVLLMMetrics, clip.N(v, 40))
			}
			if err := set(&d.PrefixCaching, "enable_prefix_caching", on, routeVLLMMetrics); err != nil {
				return err
			}
		}
		// num_gpu_blocks is "None" until the engine profiled its memory;
		// each dp engine profiles its own, and a rank's capacity is
		// registered once: the largest.
		if v, err := strconv.ParseUint(labels["num_gpu_blocks"], 10, 64); err == nil && v > 0 {
			gpuBlocks = max(gpuBlocks, v)
		}
		if v, ok := labels["engine"]; ok && v != "" {
			r, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return permanent("%s: engine %q is not a dp rank", routeVLLMMetrics, clip.N(v, 40))
			}
			ranks[uint32(r)] = true
		}
	}
	if gpuBlocks > 0 {
		d.TotalKVBlocks = Said[uint64]{gpuBlocks, routeVLLMMetrics}
	}
	if len(ranks) > 0 {
		rs := slices.Sorted(maps.Keys(ranks))
		if uint64(rs[len(rs)-1])-uint64(rs[0])+1 != uint64(len(rs)) {
			return permanent("%s: the engines' dp ranks %v are not contiguous", routeVLLMMetrics, rs)
		}
		d.DPStart = Said[uint32]{rs[0], routeVLLMMetrics + " engine"}
		d.DPSize = Said[uint32]{uint32(len(rs)), routeVLLMMetrics + " engine"}
	}
	return nil
}

// models reads GET /v1/models: the served names of base models (adapters
// carry a parent) and the first one's max_model_len.
func (d *Description) models(body []byte) error {
	var list struct {
		Data []struct {
			ID          string          `json:"id"`
			Parent      json.RawMessage `json:"parent"`
			MaxModelLen *uint64         `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return permanent("%s: %s", routeModels, clip.N(err.Error(), 200))
	}
	if len(list.Data) > maxModelCards {
		return permanent("%s: %d models, more than %d", routeModels, len(list.Data), maxModelCards)
	}
	var names []string
	for _, m := range list.Data {
		if p := bytes.TrimSpace(m.Parent); len(p) > 0 && string(p) != "null" {
			continue // a LoRA adapter of a served model
		}
		if m.ID == "" || slices.Contains(names, m.ID) {
			continue
		}
		names = append(names, m.ID)
		if m.MaxModelLen != nil && *m.MaxModelLen > 0 && !d.MaxModelLen.Known() {
			d.MaxModelLen = Said[uint64]{*m.MaxModelLen, routeModels}
		}
	}
	if len(names) == 0 {
		return nil
	}
	d.Models = names
	if len(names) == 1 {
		return set(&d.Model, "model", names[0], routeModels)
	}
	return nil
}

// serverInfo reads a /server_info body: vLLM's {"vllm_config": …} or
// SGLang's flat server args. Anything else says nothing.
func (d *Description) serverInfo(body []byte, route string) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil // not a JSON object: not a server_info this sidecar reads
	}
	if cfg, ok := top["vllm_config"]; ok {
		d.Flavor = "vllm"
		if c := bytes.TrimSpace(cfg); len(c) == 0 || c[0] != '{' {
			return nil // the text format: str(VllmConfig)
		}
		return d.vllmConfig(cfg)
	}
	_, hasPage := top["page_size"]
	_, hasEvents := top["kv_events"]
	if !hasPage && !hasEvents {
		return nil
	}
	d.Flavor = "sglang"
	return d.sglang(body, route)
}

// vllmConfig reads VllmConfig as server_info's JSON dump.
func (d *Description) vllmConfig(raw []byte) error {
	var c struct {
		Model *struct {
			ServedModelName json.RawMessage `json:"served_model_name"`
			MaxModelLen     *uint64         `json:"max_model_len"`
		} `json:"model_config"`
		Cache *struct {
			BlockSize           *uint32 `json:"block_size"`
			NumGPUBlocks        *uint64 `json:"num_gpu_blocks"`
			EnablePrefixCaching *bool   `json:"enable_prefix_caching"`
		} `json:"cache_config"`
		Parallel *struct {
			DataParallelSize *uint32 `json:"data_parallel_size"`
			DataParallelRank *uint32 `json:"data_parallel_rank"`
		} `json:"parallel_config"`
		Scheduler *struct {
			MaxNumBatchedTokens *uint64 `json:"max_num_batched_tokens"`
		} `json:"scheduler_config"`
		Events *struct {
			Enable         *bool   `json:"enable_kv_cache_events"`
			Publisher      *string `json:"publisher"`
			Endpoint       *string `json:"endpoint"`
			ReplayEndpoint *string `json:"replay_endpoint"`
			Topic          *string `json:"topic"`
		} `json:"kv_events_config"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return permanent("%s: %s", routeVLLMServerInfo, clip.N(err.Error(), 200))
	}
	r := routeVLLMServerInfo
	var errs []error
	if m := c.Model; m != nil {
		var names []string
		var one string
		if json.Unmarshal(m.ServedModelName, &one) == nil && one != "" {
			names = []string{one}
		} else if json.Unmarshal(m.ServedModelName, &names) != nil {
			names = nil
		}
		if len(names) > 0 {
			// vLLM's first served name is the one its metrics and
			// responses carry.
			errs = append(errs, set(&d.Model, "model", names[0], r+" model_config.served_model_name"))
		}
		if m.MaxModelLen != nil && *m.MaxModelLen > 0 {
			errs = append(errs, set(&d.MaxModelLen, "max_model_len", *m.MaxModelLen, r+" model_config.max_model_len"))
		}
	}
	if cc := c.Cache; cc != nil {
		if cc.BlockSize != nil && *cc.BlockSize > 0 {
			errs = append(errs, set(&d.BlockSize, "block_size", *cc.BlockSize, r+" cache_config.block_size"))
		}
		if cc.NumGPUBlocks != nil && *cc.NumGPUBlocks > 0 && !d.TotalKVBlocks.Known() {
			d.TotalKVBlocks = Said[uint64]{*cc.NumGPUBlocks, r + " cache_config.num_gpu_blocks"}
		}
		if cc.EnablePrefixCaching != nil {
			errs = append(errs, set(&d.PrefixCaching, "enable_prefix_caching", *cc.EnablePrefixCaching, r+" cache_config.enable_prefix_caching"))
		}
	}
	if p := c.Parallel; p != nil && p.DataParallelSize != nil && *p.DataParallelSize > 0 && !d.DPSize.Known() {
		// The engines this server fronts, when /metrics did not name them.
		d.DPSize = Said[uint32]{*p.DataParallelSize, r + " parallel_config.data_parallel_size"}
		if p.DataParallelRank != nil {
			d.DPStart = Said[uint32]{*p.DataParallelRank, r + " parallel_config.data_parallel_rank"}
		}
	}
	if s := c.Scheduler; s != nil && s.MaxNumBatchedTokens != nil && *s.MaxNumBatchedTokens > 0 {
		d.MaxNumBatchedTokens = Said[uint64]{*s.MaxNumBatchedTokens, r + " scheduler_config.max_num_batched_tokens"}
	}
	if e := c.Events; e != nil {
		from := r + " kv_events_config"
		on := e.Enable != nil && *e.Enable && (e.Publisher == nil || *e.Publisher != "null")
		d.KVEvents = Said[bool]{on, from}
		if on {
			ep := "tcp://*:5557" // KVEventsConfig's default
			if e.Endpoint != nil && *e.Endpoint != "" {
				ep = *e.Endpoint
			}
			d.EventsEndpoint = Said[string]{ep, from + ".endpoint"}
			replay := ""
			if e.ReplayEndpoint != nil {
				replay = *e.ReplayEndpoint
			}
			d.ReplayEndpoint = Said[string]{replay, from + ".replay_endpoint"}
			topic := ""
			if e.Topic != nil {
				topic = *e.Topic
			}
			d.Topic = Said[string]{topic, from + ".topic"}
		}
	}
	return errors.Join(errs...)
}

// sglang reads SGLang's server info.
func (d *Description) sglang(body []byte, route string) error {
	var s struct {
		ModelPath          string          `json:"model_path"`
		ServedModelName    *string         `json:"served_model_name"`
		PageSize           *int64          `json:"page_size"`
		DPSize             *int64          `json:"dp_size"`
		KVEventsConfig     *string         `json:"kv_events_config"`
		KVEvents           json.RawMessage `json:"kv_events"`
		DisableRadixCache  *bool           `json:"disable_radix_cache"`
		ContextLength      *int64          `json:"context_length"`
		ChunkedPrefillSize *int64          `json:"chunked_prefill_size"`
		MaxTotalNumTokens  *int64          `json:"max_total_num_tokens"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return permanent("%s: %s", route, clip.N(err.Error(), 200))
	}
	var errs []error
	switch {
	case s.ServedModelName != nil && *s.ServedModelName != "":
		errs = append(errs, set(&d.Model, "model", *s.ServedModelName, route+" served_model_name"))
	case s.ModelPath != "":
		errs = append(errs, set(&d.Model, "model", s.ModelPath, route+" model_path"))
	}
	if d.Model.Known() {
		d.Models = []string{d.Model.V}
	}
	if s.PageSize != nil && *s.PageSize > 0 && *s.PageSize <= 1<<20 {
		errs = append(errs, set(&d.BlockSize, "block_size", uint32(*s.PageSize), route+" page_size"))
	}
	if s.DisableRadixCache != nil {
		errs = append(errs, set(&d.PrefixCaching, "prefix caching (not disable_radix_cache)", !*s.DisableRadixCache, route+" disable_radix_cache"))
	}
	if s.DPSize != nil && *s.DPSize > 0 && *s.DPSize <= 1<<20 {
		d.DPStart = Said[uint32]{0, route + " dp_size"}
		errs = append(errs, set(&d.DPSize, "dp_size", uint32(*s.DPSize), route+" dp_size"))
	}
	if s.ContextLength != nil && *s.ContextLength > 0 {
		d.MaxModelLen = Said[uint64]{uint64(*s.ContextLength), route + " context_length"}
	}
	if s.ChunkedPrefillSize != nil && *s.ChunkedPrefillSize > 0 {
		d.MaxNumBatchedTokens = Said[uint64]{uint64(*s.ChunkedPrefillSize), route + " chunked_prefill_size"}
	}
	if s.MaxTotalNumTokens != nil && *s.MaxTotalNumTokens > 0 && d.BlockSize.V > 0 {
		d.TotalKVBlocks = Said[uint64]{uint64(*s.MaxTotalNumTokens) / uint64(d.BlockSize.V), route + " max_total_num_tokens / page_size"}
	}
	// kv_events_config: the raw --kv-events-config (vLLM's KVEventsConfig
	// shape); absent, null or publisher "null" publishes nothing.
	from := route + " kv_events_config"
	var cfg struct {
		Publisher      *string `json:"publisher"`
		Endpoint       string  `json:"endpoint"`
		ReplayEndpoint *string `json:"replay_endpoint"`
		Topic          string  `json:"topic"`
	}
	switch {
	case s.KVEventsConfig == nil || strings.TrimSpace(*s.KVEventsConfig) == "":
		d.KVEvents = Said[bool]{false, from}
	case json.Unmarshal([]byte(*s.KVEventsConfig), &cfg) != nil:
		return errors.Join(append(errs, permanent("%s: %q is not a JSON object", from, clip.N(*s.KVEventsConfig, 80)))...)
	case cfg.Publisher != nil && *cfg.Publisher == "null":
		d.KVEvents = Said[bool]{false, from}
	default:
		d.KVEvents = Said[bool]{true, from}
		ep := cfg.Endpoint
		if ep == "" {
			ep = "tcp://*:5557"
		}
		d.EventsEndpoint = Said[string]{ep, from + ".endpoint"}
		replay := ""
		if cfg.ReplayEndpoint != nil {
			replay = *cfg.ReplayEndpoint
		}
		d.ReplayEndpoint = Said[string]{replay, from + ".replay_endpoint"}
		d.Topic = Said[string]{cfg.Topic, from + ".topic"}
	}
	// The kv_events block of newer releases: what the publisher binds.
	if ev := bytes.TrimSpace(s.KVEvents); len(ev) > 0 && string(ev) != "null" {
		var b struct {
			Publisher string `json:"publisher"`
			Host      string `json:"endpoint_host"`
			PortBase  int64  `json:"endpoint_port_base"`
			Topic     string `json:"topic"`
			BlockSize int64  `json:"block_size"`
			DPSize    int64  `json:"dp_size"`
		}
		if err := json.Unmarshal(ev, &b); err != nil {
			return errors.Join(append(errs, permanent("%s: %s", routeSGLangEvents, clip.N(err.Error(), 200)))...)
		}
		if b.PortBase < 1 || b.PortBase > 65535 || b.Host == "" {
			return errors.Join(append(errs, permanent("%s: endpoint_host %q, endpoint_port_base %d: not a tcp endpoint", routeSGLangEvents, clip.N(b.Host, 80), b.PortBase))...)
		}
		host := strings.TrimSuffix(strings.TrimPrefix(b.Host, "["), "]")
		ep := "tcp://" + net.JoinHostPort(host, strconv.FormatInt(b.PortBase, 10))
		if host == "*" {
			ep = "tcp://*:" + strconv.FormatInt(b.PortBase, 10)
		}
		d.KVEvents = Said[bool]{true, routeSGLangEvents}
		if d.EventsEndpoint.Known() && sameEndpoint(d.EventsEndpoint.V, ep) {
			d.EventsEndpoint.V = ep
		} else {
			d.EventsEndpoint = Said[string]{}
			errs = append(errs, set(&d.EventsEndpoint, "events endpoint", ep, routeSGLangEvents))
		}
		d.Topic = Said[string]{b.Topic, routeSGLangEvents + ".topic"}
		if b.BlockSize > 0 && b.BlockSize <= 1<<20 {
			errs = append(errs, set(&d.BlockSize, "block_size", uint32(b.BlockSize), routeSGLangEvents+".block_size"))
		}
		if b.DPSize > 0 && b.DPSize <= 1<<20 {
			errs = append(errs, set(&d.DPSize, "dp_size", uint32(b.DPSize), routeSGLangEvents+".dp_size"))
		}
	}
	return errors.Join(errs...)
}

// sameEndpoint reports whether two ZMQ endpoints name the same socket,
// wildcard hosts (*, 0.0.0.0, [::]) being one.
func sameEndpoint(a, b string) bool {
	return Advertise(a, "wildcard") == Advertise(b, "wildcard")
}
