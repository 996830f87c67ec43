package tokenize

import (
	"bytes"
	"encoding/json"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Route is the OpenAI route of a request.
type Route int

const (
	Completions Route = iota // POST /v1/completions
	Chat                     // POST /v1/chat/completions
)

// Path is the route's path on an engine.
func (r Route) Path() string {
	if r == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Label names the route in metrics: "completions" or "chat".
func (r Route) Label() string {
	if r == Chat {
		return "chat"
	}
	return "completions"
}

// Request is what a frontend reads of an OpenAI completions or chat
// body: the model, whether it streams, the prompt's token ids when the
// client sent them, and every member as it came, for the /tokenize body
// and for rewrites. It refers to the body it was read from: the caller
// must keep Body unchanged while it uses the Request.
type Request struct {
	Route  Route
	Body   []byte // as the client sent it
	Model  string
	Stream bool
	// Tokens is the prompt as token ids when the client sent them (a
	// completions prompt of integers, or a batch of such arrays, whose
	// first routes the batch); nil otherwise.
	Tokens []uint32
	// Fields are the body's members, each value a slice of Body (valid
	// JSON, as it came): read only.
	Fields map[string]json.RawMessage
	first  json.RawMessage // the first prompt of a batch of other prompts
}

// chatTemplateFields are the members of a chat body's /tokenize body:
// the model and what the chat template reads, in the order of their
// names.
var chatTemplateFields = []string{"add_generation_prompt", "add_special_tokens", "chat_template", "chat_template_kwargs", "continue_final_message", "documents", "messages", "model", "tools"}

// Read reads an OpenAI body of route with jsonlex, once and in place:
// model, stream, and the prompt or messages are checked; every other
// member only for its syntax. A prompt of token ids is read with its
// count bounded before anything is allocated for it (a *jsonlex.Error
// with Over beyond MaxPromptTokens). Every error is a *jsonlex.Error
// naming the field, and never repeats more than a clipped piece of the
// body.
func Read(route Route, body []byte) (*Request, error) {
	r := &Request{Route: route, Body: body, Fields: make(map[string]json.RawMessage, 8)}
	l := jsonlex.New(body, "model", "stream", "prompt", "messages", "max_tokens")
	err := l.Document(func(key string) error {
		l.Peek() // the value's first byte
		start := l.Pos()
		var err error
		switch {
		case key == "model":
			r.Model, err = l.String(key, true)
		case key == "stream":
			if isNull, nerr := l.Null(); isNull || nerr != nil {
				r.Stream, err = false, nerr
				break
			}
			r.Stream, err = l.Bool(key)
		case key == "prompt" && route == Completions:
			r.Tokens, r.first, err = readPrompt(&l, body)
		case key == "messages" && route == Chat:
			if c := l.Peek(); c != '[' && c != 'n' {
				return &jsonlex.Error{Field: "messages", Problem: "must be an array of messages"}
			}
			err = l.Skip(key, 1)
		default:
			err = l.Skip(clip.String(key), 1)
		}
		r.Fields[key] = body[start:l.Pos()]
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.Model == "" {
		return nil, &jsonlex.Error{Field: "model", Problem: "required"}
	}
	required := "prompt"
	if route == Chat {
		required = "messages"
	}
	if raw, ok := r.Fields[required]; !ok || IsNull(raw) {
		return nil, &jsonlex.Error{Field: required, Problem: "required"}
	}
	return r, nil
}

// IsNull reports whether a JSON value is null.
func IsNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

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
		tokens, err = l.Tokens("prompt", nil, MaxPromptTokens)
		return tokens, nil, err
	}
	err = l.Array("prompt", 1, func(i int) error {
		field := jsonlex.At("prompt", i)
		if i > 0 {
			return l.Skip(field, 2)
		}
		if l.Peek() == '[' {
			var err error
			tokens, err = l.Tokens(field, nil, MaxPromptTokens)
			return err
		}
		start := l.Pos()
		err := l.Skip(field, 2)
		first = body[start:l.Pos()]
		return err
	})
	return tokens, first, err
}

// AppendTokenizeBody appends the POST /tokenize body for r to dst and
// returns it: a JSON object of its model and prompt (a completions
// request; a batch's first prompt) or of its model, messages and the
// chat template's inputs (a chat request), and add_special_tokens when
// the client set it; members in the order of their names. The values
// are r's, byte for byte: Read checked them, so they are joined as
// they are (encoding/json would check and compact them again, the
// bulk of a long prompt's cost).
func (r *Request) AppendTokenizeBody(dst []byte) []byte {
	dst = append(dst, '{')
	n := 0
	add := func(k string, v json.RawMessage) {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = append(dst, '"')
		dst = append(dst, k...)
		dst = append(dst, '"', ':')
		dst = append(dst, v...)
	}
	switch r.Route {
	case Chat:
		for _, f := range chatTemplateFields {
			if v, ok := r.Fields[f]; ok {
				add(f, v)
			}
		}
	case Completions:
		if v, ok := r.Fields["add_special_tokens"]; ok {
			add("add_special_tokens", v)
		}
		add("model", r.Fields["model"])
		prompt := r.Fields["prompt"]
		if r.first != nil {
			prompt = r.first
		}
		add("prompt", prompt)
	}
	return append(dst, '}')
}

// CloneFields returns a copy of r's Fields with room for extra more,
// for a rewrite of the body.
func (r *Request) CloneFields(extra int) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(r.Fields)+extra)
	for k, v := range r.Fields {
		out[k] = v
	}
	return out
}
