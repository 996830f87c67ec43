package proxy

import (
	"encoding/json"
	"fmt"

	"github.com/prefixd/prefixd/internal/tokenize"
)

// kind is the OpenAI route of a request.
type kind = tokenize.Route

const (
	completions = tokenize.Completions // POST /v1/completions
	chat        = tokenize.Chat        // POST /v1/chat/completions
)

// request is what the proxy reads of an OpenAI body (tokenize.Request,
// shared with the endpoint picker): the rest is passed to the engine as
// it came.
type request = tokenize.Request

// maxPromptTokens bounds a prompt given as token ids, as prefixd serve
// bounds the token ids it is sent.
const maxPromptTokens = tokenize.MaxPromptTokens

// parseRequest reads an OpenAI completions or chat body (tokenize.Read).
func parseRequest(k kind, body []byte) (*request, error) { return tokenize.Read(k, body) }

func isNull(raw json.RawMessage) bool { return tokenize.IsNull(raw) }

// shortErr words an encoding/json error without repeating the input.
func shortErr(err error) string {
	switch e := err.(type) {
	case *json.SyntaxError:
		return fmt.Sprintf("invalid JSON at offset %d", e.Offset)
	case *json.UnmarshalTypeError:
		return fmt.Sprintf("must be %s, got %s", e.Type, e.Value)
	}
	return "invalid"
}

// emptyTransfer is what a prefill request carries: vLLM's NixlConnector
// reads do_remote_decode and leaves the remote fields unset.
var emptyTransfer = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillBody is r rewritten for the prefill worker of a disaggregated
// plan: compute the prompt's KV and hand it over, generating one token,
// in one answer.
func prefillBody(r *request) ([]byte, error) {
	out := r.CloneFields(2)
	out["kv_transfer_params"] = emptyTransfer
	out["stream"] = json.RawMessage("false")
	out["max_tokens"] = json.RawMessage("1")
	if r.Route == chat {
		out["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(out, "stream_options")
	delete(out, "min_tokens") // held back for decode
	return json.Marshal(out)
}

// decodeBody is r for the decode worker, carrying the prefill answer's
// kv_transfer_params.
func decodeBody(r *request, params json.RawMessage) ([]byte, error) {
	out := r.CloneFields(1)
	out["kv_transfer_params"] = params
	return json.Marshal(out)
}

// transferParams returns the kv_transfer_params of a prefill answer.
func transferParams(answer []byte) (json.RawMessage, error) {
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, fmt.Errorf("prefill answer: not JSON: %v", shortErr(err))
	}
	if len(a.Params) == 0 || isNull(a.Params) {
		return nil, fmt.Errorf("prefill answer: no kv_transfer_params (is the engine running with a KV connector, kv_role kv_producer or kv_both?)")
	}
	return a.Params, nil
}
