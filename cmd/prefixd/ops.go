package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prefixd/prefixd/internal/api"
	"github.com/prefixd/prefixd/internal/client"
)

type serverOptions struct {
	server string
	token  string
}

func (o *serverOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.server, "server", "http://127.0.0.1:8090", "prefixd API base URL")
	fs.StringVar(&o.token, "api-token", "", "bearer token (prefer PREFIXD_API_TOKEN)")
}

func (o *serverOptions) client() *client.Client {
	return &client.Client{BaseURL: o.server, Token: o.token}
}

func newWorkersCommand() *cobra.Command {
	var o serverOptions
	var model, group string
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List workers and the state of each rank's event stream",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fromEnv(cmd.Flags()); err != nil {
				return err
			}
			ws, err := o.client().Workers(cmd.Context(), model, group)
			if err != nil {
				return err
			}
			return client.RenderWorkers(cmd.OutOrStdout(), ws)
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
			if err := prepare(cmd.Flags(), &o); err != nil {
				return err
			}
			resp, err := o.client().Query(cmd.Context(), o.req)
			if err != nil {
				return err
			}
			if o.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(resp)
			}
			return client.RenderScores(cmd.OutOrStdout(), resp)
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
