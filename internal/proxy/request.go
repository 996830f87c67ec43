package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/prefixd/prefixd/api"
	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
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
	kind kind
	body []byte // as the client sent it
	// fields are the body's members, each value a slice of body, for the
	// rewrites of disaggregated serving and the tokenize body.
	fields map[string]json.RawMessage
	model  string
	stream bool
	// tokens is the prompt as token ids when the client sent them
	// (completions with an array of integers, or a batch of such arrays,
	// whose first routes the batch).
	tokens []uint32
	// first is the first prompt of a batch of other prompts (strings).
	first json.RawMessage
}

// maxPromptTokens bounds a prompt given as token ids, as prefixd serve
// bounds the token ids it is sent.
const maxPromptTokens = api.DefaultMaxTokens

// parseRequest reads an OpenAI completions or chat body with jsonlex,
// once and in place: model, stream, and the prompt or messages are
// checked; every other member only for its syntax. A prompt of token ids
// is read with its count bounded before anything is allocated for it (a
// *jsonlex.Error with Over beyond maxPromptTokens). Errors name the field.
func parseRequest(k kind, body []byte) (*request, error) {
	r := &request{kind: k, body: body, fields: map[string]json.RawMessage{}}
	l := jsonlex.New(body, "model", "stream", "prompt", "messages")
	err := l.Document(func(key string) error {
		l.Peek() // the value's first byte
		start := l.Pos()
		var err error
		switch {
		case key == "model":
			r.model, err = l.String(key, true)
		case key == "stream":
			if isNull, nerr := l.Null(); isNull || nerr != nil {
				r.stream, err = false, nerr
				break
			}
			r.stream, err = l.Bool(key)
		case key == "prompt" && k == completions:
			r.tokens, r.first, err = readPrompt(&l, body)
		case key == "messages" && k == chat:
			if c := l.Peek(); c != '[' && c != 'n' {
				return fmt.Errorf("messages: must be an array of messages")
			}
			err = l.Skip(key, 1)
		default:
			err = l.Skip(clip.String(key), 1)
		}
		r.fields[key] = body[start:l.Pos()]
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.model == "" {
		return nil, fmt.Errorf("model: required")
	}
	required := map[kind]string{completions: "prompt", chat: "messages"}[k]
	if raw, ok := r.fields[required]; !ok || isNull(raw) {
		return nil, fmt.Errorf("%s: required", required)
	}
	return r, nil
}

// readPrompt reads a completions prompt: token ids when it is an array of
// integers or a batch of such arrays (its first), the first prompt of a
// batch of strings, and nothing of a string.
func readPrompt(l *jsonlex.Lexer, body []byte) (tokens []uint32, first json.RawMessage, err error) {
	if l.Peek() != '[' {
		return nil, nil, l.Skip("prompt", 1)
	}
	i := l.Pos() + 1
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	if i < len(body) && (body[i] == '-' || body[i] >= '0' && body[i] <= '9') {
		tokens, err = l.Tokens("prompt", nil, maxPromptTokens)
		return tokens, nil, err
	}
	err = l.Array("prompt", 1, func(i int) error {
		field := jsonlex.At("prompt", i)
		if i > 0 {
			return l.Skip(field, 2)
		}
		if l.Peek() == '[' {
			var err error
			tokens, err = l.Tokens(field, nil, maxPromptTokens)
			return err
		}
		start := l.Pos()
		err := l.Skip(field, 2)
		first = body[start:l.Pos()]
		return err
	})
	return tokens, first, err
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

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
		if r.first != nil {
			prompt = r.first
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
