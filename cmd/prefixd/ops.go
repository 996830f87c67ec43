package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/client"
	"github.com/prefixd/prefixd/internal/cli"
	"github.com/prefixd/prefixd/internal/status"
)

type serverOptions struct {
	server string
	token  string
}

func (o *serverOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.server, "server", "http://127.0.0.1:8090", "prefixd API base URL (host:port means http://host:port)")
	fs.StringVar(&o.token, "api-token", "", "bearer token: the API token, or the read token for reads (prefer PREFIXD_API_TOKEN)")
}

// client returns a client of --server; a server given without a scheme
// is plain HTTP.
func (o *serverOptions) client() (*client.Client, error) {
	base := strings.TrimRight(o.server, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server %q: want host:port or http(s)://host:port", o.server)
	}
	return &client.Client{BaseURL: base, Token: o.token}, nil
}

// unknownModel explains an empty answer for a model: it names the models
// the server knows.
func unknownModel(ctx context.Context, c *client.Client, model, group string) error {
	what := "model " + model
	if group != "" {
		what += " routing group " + group
	}
	all, err := c.Workers(ctx, "", "")
	if err != nil {
		return fmt.Errorf("no workers for %s", what)
	}
	var known []string
	for _, w := range all {
		if k := w.ModelName + "/" + w.RoutingGroup; !slices.Contains(known, k) {
			known = append(known, k)
		}
	}
	slices.Sort(known)
	if len(known) == 0 {
		return fmt.Errorf("no workers for %s: the server knows no workers", what)
	}
	return fmt.Errorf("no workers for %s; known (model/routing group): %s", what, strings.Join(known, ", "))
}

func newWorkersCommand() *cobra.Command {
	var o serverOptions
	var model, group string
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List workers and the state of each rank's event stream",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.FromEnv(cmd.Flags()); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			ws, err := c.Workers(cmd.Context(), model, group)
			if err != nil {
				return err
			}
			if len(ws) == 0 && (model != "" || group != "") {
				return unknownModel(cmd.Context(), c, model, group)
			}
			return status.RenderWorkers(cmd.OutOrStdout(), ws)
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&model, "model", "", "only this model")
	cmd.Flags().StringVar(&group, "routing-group", "", "only this routing group")
	return cmd
}

type queryOptions struct {
	serverOptions
	req    api.QueryRequest
	tokens string
	file   string
	asJSON bool
}

func (o *queryOptions) Validate() error {
	if o.req.ModelName == "" {
		return fmt.Errorf("--model: required")
	}
	if (o.tokens == "") == (o.file == "") {
		return fmt.Errorf("give the prompt as --tokens 1,2,3 or --tokens-file FILE (a JSON array)")
	}
	if o.file != "" {
		raw, err := os.ReadFile(o.file)
		if err != nil {
			return fmt.Errorf("--tokens-file: %w", err)
		}
		if err := json.Unmarshal(raw, &o.req.TokenIDs); err != nil {
			return fmt.Errorf("--tokens-file %s: want a JSON array of token ids: %w", o.file, err)
		}
		return nil
	}
	for _, f := range strings.Split(o.tokens, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return fmt.Errorf("--tokens: %q is not a token id", f)
		}
		o.req.TokenIDs = append(o.req.TokenIDs, uint32(v))
	}
	return nil
}

func newQueryCommand() *cobra.Command {
	var o queryOptions
	cmd := &cobra.Command{
		Use:   "query",
		Short: "Show how many tokens of a prompt each worker rank already caches",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Prepare(cmd.Flags(), &o); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			resp, err := c.Query(cmd.Context(), o.req)
			var he *client.Error
			if errors.As(err, &he) && he.Status == http.StatusNotFound {
				return fmt.Errorf("%w (%v)", unknownModel(cmd.Context(), c, o.req.ModelName, o.req.RoutingGroup), err)
			}
			if err != nil {
				return err
			}
			if o.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(resp)
			}
			return status.RenderScores(cmd.OutOrStdout(), resp)
		},
	}
	o.AddFlags(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&o.req.ModelName, "model", "", "model name (required)")
	fs.StringVar(&o.req.RoutingGroup, "routing-group", "", "routing group (default \"default\")")
	fs.StringVar(&o.req.LoraName, "lora", "", "LoRA adapter name")
	fs.StringVar(&o.req.CacheSalt, "cache-salt", "", "cache salt (namespace)")
	fs.StringVar(&o.tokens, "tokens", "", "comma-separated token ids")
	fs.StringVar(&o.file, "tokens-file", "", "file with a JSON array of token ids")
	fs.BoolVar(&o.asJSON, "json", false, "print the raw score response")
	return cmd
}
