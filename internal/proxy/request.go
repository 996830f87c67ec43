package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// kind is the OpenAI route of a request.
type kind int

const (
	completions kind = iota // POST /v1/completions
	chat                    // POST /v1/chat/completions
)

func (k kind) path() string {
	if k == chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// request is what the proxy reads of an OpenAI body: the rest is passed
// to the engine as it came.
type request struct {
	kind   kind
	body   []byte                     // as the client sent it
	fields map[string]json.RawMessage // the body's members, for the rewrites of disaggregated serving
	model  string
	stream bool
	// tokens is the prompt as token ids when the client sent them
	// (completions with an array of integers).
	tokens []uint32
}

// maxPromptTokens bounds a prompt given as token ids.
const maxPromptTokens = 1 << 20

// parseRequest reads an OpenAI completions or chat body. Errors name the
// field.
func parseRequest(k kind, body []byte) (*request, error) {
	r := &request{kind: k, body: body}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return nil, fmt.Errorf("body: not a JSON object: %v", shortErr(err))
	}
	if err := unmarshalField(r.fields, "model", &r.model); err != nil {
		return nil, err
	}
	if r.model == "" {
		return nil, fmt.Errorf("model: required")
	}
	if err := unmarshalField(r.fields, "stream", &r.stream); err != nil {
		return nil, err
	}
	switch k {
	case chat:
		raw, ok := r.fields["messages"]
		if !ok || isNull(raw) {
			return nil, fmt.Errorf("messages: required")
		}
		var msgs []json.RawMessage
		if err := json.Unmarshal(raw, &msgs); err != nil {
			return nil, fmt.Errorf("messages: must be an array of messages")
		}
	case completions:
		raw, ok := r.fields["prompt"]
		if !ok || isNull(raw) {
			return nil, fmt.Errorf("prompt: required")
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && raw[0] == '[' {
			// An array of token ids, or a batch (an array of strings or
			// of token arrays): the first prompt routes the batch.
			var ids []int64
			if json.Unmarshal(raw, &ids) == nil {
				if len(ids) > maxPromptTokens {
					return nil, fmt.Errorf("prompt: more than %d token ids", maxPromptTokens)
				}
				r.tokens = make([]uint32, len(ids))
				for i, id := range ids {
					if id < 0 || id > math.MaxUint32 {
						return nil, fmt.Errorf("prompt[%d]: %d is not a token id", i, id)
					}
					r.tokens[i] = uint32(id)
				}
			}
		}
	}
	return r, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func unmarshalField(fields map[string]json.RawMessage, name string, v any) error {
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %v", name, shortErr(err))
	}
	return nil
}

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

// tokenizeBody is the POST /tokenize body for r: its prompt, or its
// messages with the chat template's inputs, for the same model.
func (r *request) tokenizeBody() ([]byte, error) {
	out := map[string]json.RawMessage{"model": r.fields["model"]}
	switch r.kind {
	case chat:
		for _, f := range []string{"messages", "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs", "tools", "add_special_tokens", "documents"} {
			if v, ok := r.fields[f]; ok {
				out[f] = v
			}
		}
	case completions:
		prompt := r.fields["prompt"]
		var batch []json.RawMessage
		if json.Unmarshal(prompt, &batch) == nil && len(batch) > 0 {
			prompt = batch[0]
		}
		out["prompt"] = prompt
		if v, ok := r.fields["add_special_tokens"]; ok {
			out["add_special_tokens"] = v
		}
	}
	return json.Marshal(out)
}

// emptyTransfer is what a prefill request carries: vLLM's NixlConnector
// reads do_remote_decode and leaves the remote fields unset.
var emptyTransfer = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillBody is r rewritten for the prefill worker of a disaggregated
// plan: compute the prompt's KV and hand it over, generating one token,
// in one answer.
func (r *request) prefillBody() ([]byte, error) {
	out := cloneFields(r.fields)
	out["kv_transfer_params"] = emptyTransfer
	out["stream"] = json.RawMessage("false")
	out["max_tokens"] = json.RawMessage("1")
	if r.kind == chat {
		out["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(out, "stream_options")
	delete(out, "min_tokens") // held back for decode
	return json.Marshal(out)
}

// decodeBody is r for the decode worker, carrying the prefill answer's
// kv_transfer_params.
func (r *request) decodeBody(params json.RawMessage) ([]byte, error) {
	out := cloneFields(r.fields)
	out["kv_transfer_params"] = params
	return json.Marshal(out)
}

func cloneFields(in map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(in)+2)
	for k, v := range in {
		out[k] = v
	}
	return out
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
