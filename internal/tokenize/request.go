package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/prefixd/prefixd/internal/leaf/clip"
	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// Route is the OpenAI route of a request.
type Route int

const (
	Completions Route = iota // POST /v1/completions
	Chat                     // POST /v1/chat/completions
)

// Request is what routing reads of an OpenAI completions or chat body:
// the model, the prompt's token ids when the client sent them, and what
// the engine's tokenizer needs. It refers to the body it was read from.
type Request struct {
	Route Route
	Model string
	// Tokens is the prompt as token ids when the client sent them (a
	// completions prompt of integers, or a batch of such arrays, whose
	// first routes the batch); nil otherwise.
	Tokens []uint32
	fields map[string]json.RawMessage // the members TokenizeBody needs, slices of the body
	first  json.RawMessage            // the first prompt of a batch of strings
}

// tokenizeFields are the members of a chat body the chat template reads.
var tokenizeFields = []string{"model", "messages", "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs", "tools", "add_special_tokens", "documents", "prompt"}

// Read reads an OpenAI body of route with jsonlex, once and in place:
// model, and the prompt or messages, are checked; every other member
// only for its syntax. A prompt of token ids is read with its count
// bounded before anything is allocated for it (a *jsonlex.Error with
// Over beyond MaxPromptTokens). Errors name the field and never repeat
// more than a clipped piece of the body.
func Read(route Route, body []byte) (*Request, error) {
	r := &Request{Route: route, fields: map[string]json.RawMessage{}}
	l := jsonlex.New(body, "model", "prompt", "messages")
	err := l.Document(func(key string) error {
		l.Peek()
		start := l.Pos()
		var err error
		switch {
		case key == "model":
			r.Model, err = l.String(key, true)
		case key == "prompt" && route == Completions:
			r.Tokens, r.first, err = readPrompt(&l, body)
		case key == "messages" && route == Chat:
			if c := l.Peek(); c != '[' && c != 'n' {
				return fmt.Errorf("messages: must be an array of messages")
			}
			err = l.Skip(key, 1)
		default:
			err = l.Skip(clip.String(key), 1)
		}
		for _, f := range tokenizeFields {
			if f == key {
				r.fields[key] = body[start:l.Pos()]
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.Model == "" {
		return nil, fmt.Errorf("model: required")
	}
	required := map[Route]string{Completions: "prompt", Chat: "messages"}[route]
	if raw, ok := r.fields[required]; !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
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

// TokenizeBody is the POST /tokenize body for r: its prompt, or its
// messages with the chat template's inputs, for the same model.
func (r *Request) TokenizeBody() ([]byte, error) {
	out := map[string]json.RawMessage{"model": r.fields["model"]}
	switch r.Route {
	case Chat:
		for _, f := range tokenizeFields {
			if v, ok := r.fields[f]; ok && f != "prompt" {
				out[f] = v
			}
		}
	case Completions:
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
