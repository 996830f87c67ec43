package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/proxy"
)

type proxyOptions struct {
	server       serverOptions
	listen       string
	policy       proxy.Policy
	disagg       bool
	plans        disaggFlags
	group        string
	prefillGroup string
	timeout      time.Duration
	queueWait    time.Duration
	readTimeout  time.Duration
	maxBody      int64
	bodyBudget   int64
	cache        int
	cacheBytes   int64
	passThrough  []string
	refresh      time.Duration
	logLevel     string
}

// Validate checks the values the flags' types do not.
func (o *proxyOptions) Validate() error {
	switch {
	case o.timeout <= 0:
		return fmt.Errorf("--request-timeout %v: want > 0", o.timeout)
	case o.queueWait < 0 || o.queueWait > time.Hour:
		return fmt.Errorf("--queue-wait %v: want 0 to 1h", o.queueWait)
	case o.readTimeout <= 0:
		return fmt.Errorf("--read-timeout %v: want > 0", o.readTimeout)
	case o.maxBody <= 0:
		return fmt.Errorf("--max-body-bytes %d: want > 0", o.maxBody)
	case o.bodyBudget <= o.maxBody:
		return fmt.Errorf("--body-budget-bytes %d: want more than --max-body-bytes (%d)", o.bodyBudget, o.maxBody)
	case o.cache <= 0:
		return fmt.Errorf("--tokenize-cache %d: want > 0", o.cache)
	case o.cacheBytes <= 0:
		return fmt.Errorf("--tokenize-cache-bytes %d: want > 0", o.cacheBytes)
	case o.refresh <= 0:
		return fmt.Errorf("--refresh %v: want > 0", o.refresh)
	}
	for _, path := range o.passThrough {
		if !strings.HasPrefix(path, "/") {
			return fmt.Errorf("--pass-through %q: a path starts with /", path)
		}
	}
	return nil
}

func newProxyCommand() *cobra.Command {
	o := &proxyOptions{listen: "127.0.0.1:8000", plans: newDisaggFlags(), timeout: 10 * time.Minute, readTimeout: proxy.DefaultReadTimeout,
		maxBody: 32 << 20, bodyBudget: proxy.DefaultBodyBudget, cache: 4096, cacheBytes: proxy.DefaultTokenizeCacheBytes,
		passThrough: proxy.DefaultPassThrough, refresh: 2 * time.Second, logLevel: "info"}
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Run the OpenAI-compatible KV-aware router in front of the engines",
		Long: "proxy serves POST /v1/completions and /v1/chat/completions (streaming or not), GET /v1/models,\n" +
			"/health and /metrics, and passes the --pass-through routes (vLLM's /tokenize and /detokenize)\n" +
			"to an engine, no other. It tokenizes with the engines' own /tokenize, asks prefixd serve\n" +
			"(--server) where to run each request, and runs it there:\n" +
			"aggregated (select and reserve), or with --disagg as a decode-first plan over the prefill\n" +
			"and decode pools (vLLM's KV-connector handoff). Every flag can also be set as PREFIXD_<FLAG>.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), o); err != nil {
				return err
			}
			c, err := o.server.client()
			if err != nil {
				return err
			}
			pol, failure, err := o.plans.overrides(cmd.Flags())
			if err != nil {
				return err
			}
			if !o.disagg && (cmd.Flags().Changed("disagg-order") || pol != nil || failure != "") {
				return errors.New("--disagg-order, --disagg-policy, --prefill-failure and the bypass thresholds need --disagg")
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			p, err := proxy.New(proxy.Config{Prefixd: c, Policy: o.policy, Disagg: o.disagg, Order: o.plans.order, PlanPolicy: pol, PrefillFailure: failure,
				RoutingGroup: o.group, PrefillRoutingGroup: o.prefillGroup, RequestTimeout: o.timeout, QueueWait: o.queueWait, ReadTimeout: o.readTimeout, MaxBodyBytes: o.maxBody, BodyBudget: o.bodyBudget,
				TokenizeCache: o.cache, TokenizeCacheBytes: o.cacheBytes, PassThrough: o.passThrough, Refresh: o.refresh, Logger: log})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", o.listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", o.listen, err)
			}
			mode := "aggregated"
			if o.disagg {
				mode = "disaggregated " + o.plans.order.String()
			}
			log.Info("prefixd proxy serving", "http", ln.Addr().String(), "prefixd", c.BaseURL, "mode", mode, "policy", o.policy.String())
			defer stoppedLine(cmd.Context(), log, "prefixd proxy stopped")()
			return p.Serve(cmd.Context(), ln, 30*time.Second)
		},
	}
	fs := cmd.Flags()
	o.server.AddFlags(fs)
	fs.StringVar(&o.listen, "listen", o.listen, "HTTP listen address of the OpenAI routes")
	fs.TextVar(&o.policy, "policy", o.policy, "aggregated routing: kv (prefixd's selection) or random (a baseline)")
	fs.BoolVar(&o.disagg, "disagg", o.disagg, "run requests as disaggregated plans (vLLM P/D over a KV connector)")
	o.plans.AddFlags(fs)
	fs.StringVar(&o.group, "routing-group", o.group, "routing group of the (decode) engines (default: default)")
	fs.StringVar(&o.prefillGroup, "prefill-routing-group", o.prefillGroup, "routing group of the prefill engines (default: --routing-group)")
	fs.DurationVar(&o.timeout, "request-timeout", o.timeout, "deadline of each request, from its arrival to its last byte")
	fs.DurationVar(&o.queueWait, "queue-wait", o.queueWait, "the longest a request waits in prefixd serve's router queue while every engine is busy (serve --queue-threshold; 0 = serve's --queue-max-wait and the request's deadline alone); the client then gets 429 with Retry-After")
	fs.DurationVar(&o.readTimeout, "read-timeout", o.readTimeout, "time to receive a request, headers and body, from its first byte (408 beyond)")
	fs.Int64Var(&o.maxBody, "max-body-bytes", o.maxBody, "largest request body accepted (413 beyond)")
	fs.Int64Var(&o.bodyBudget, "body-budget-bytes", o.bodyBudget,
		"bytes the bodies of the requests in flight may hold together, counted as they arrive (503 beyond); its last quarter is lent only to bodies that keep arriving")
	fs.IntVar(&o.cache, "tokenize-cache", o.cache, "tokenize answers kept (identical prompts only)")
	fs.Int64Var(&o.cacheBytes, "tokenize-cache-bytes", o.cacheBytes,
		"bytes the tokenize answers kept may take (their ids); an answer larger than a sixteenth of it is not kept")
	fs.StringSliceVar(&o.passThrough, "pass-through", o.passThrough,
		"paths of the engines' own routes passed to an engine, exactly (any other path is a 404); \"\" for none")
	fs.DurationVar(&o.refresh, "refresh", o.refresh, "how often the fleet is listed from prefixd serve")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "debug, info, warn or error")
	enum(fs, "policy", "kv", "random")
	enum(fs, "log-level", "debug", "info", "warn", "error")
	return cmd
}
