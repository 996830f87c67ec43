package mocker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// This file is the OpenAI-compatible adapter over the Engine, with vLLM's
// request and response shapes: /v1/completions, /v1/chat/completions,
// /tokenize, /v1/models, and the NIXL connector's kv_transfer_params.

// maxMessages bounds a chat request's messages.
const maxMessages = 4096

// apiError is an OpenAI/vLLM error body's "error" object.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// reqError is a request's failure: an HTTP status, the field at fault
// ("" if none) and the message (which names the field).
type reqError struct {
	status int
	param  string
	msg    string
}

func (e *reqError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *reqError {
	msg := fmt.Sprintf(format, args...)
	if param != "" {
		msg = param + ": " + msg
	}
	return &reqError{status: http.StatusBadRequest, param: param, msg: msg}
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// writeError answers {"error": {"message", "type", "param", "code"}}.
func writeError(w http.ResponseWriter, re *reqError) {
	body := struct {
		Error apiError `json:"error"`
	}{apiError{Message: re.msg, Type: errorType(re.status), Code: re.status}}
	if re.param != "" {
		body.Error.Param = &re.param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(re.status)
	_ = json.NewEncoder(w).Encode(body)
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, &reqError{status: http.StatusMethodNotAllowed, msg: "method not allowed; use " + allow})
}

// servedModel is the model name the OpenAI routes serve.
func (e *Engine) servedModel() string {
	if e.cfg.Worker.ModelName != "" {
		return e.cfg.Worker.ModelName
	}
	return "mock-model"
}

// readBody reads r's body within the engine's limit (413 beyond it).
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *reqError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &reqError{status: http.StatusRequestEntityTooLarge, param: "body", msg: fmt.Sprintf("body: larger than %d bytes", mbe.Limit)}
		}
		return nil, badRequest("body", "reading: %v", err)
	}
	return body, nil
}

// decodeJSON decodes body into v (unknown fields ignored, as vLLM does),
// naming the field of a type error.
func decodeJSON(body []byte, v any) *reqError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("body", "empty; want a JSON object")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return badRequest("body", "invalid JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		if te.Field == "" {
			return badRequest("body", "want a JSON object, got %s", te.Value)
		}
		// The field path names an embedded struct by its Go name; the
		// JSON names are the promoted fields'.
		field := strings.TrimPrefix(te.Field, "genFields.")
		return badRequest(field, "want %s, got %s", kindName(te.Type), te.Value)
	}
	return badRequest("body", "%v", err)
}

func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// checkModel accepts "" (the served model) or the served model's name.
func (e *Engine) checkModel(model string) *reqError {
	if model == "" || model == e.servedModel() {
		return nil
	}
	return &reqError{status: http.StatusNotFound, param: "model", msg: fmt.Sprintf("model: the model `%s` does not exist (this engine serves %q)", model, e.servedModel())}
}

// chatMessage is a chat message as sent: content is a string, null, or an
// array of {"type": "text", "text": ...} parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func parseMessages(msgs []chatMessage) ([]Message, *reqError) {
	if len(msgs) == 0 {
		return nil, badRequest("messages", "want at least one message")
	}
	if len(msgs) > maxMessages {
		return nil, badRequest("messages", "%d messages, more than %d", len(msgs), maxMessages)
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		field := "messages[" + strconv.Itoa(i) + "]"
		if m.Role == "" {
			return nil, badRequest(field+".role", "required")
		}
		content, rerr := parseContent(m.Content, field+".content")
		if rerr != nil {
			return nil, rerr
		}
		out[i] = Message{Role: m.Role, Content: content}
	}
	return out, nil
}

func parseContent(raw json.RawMessage, field string) (string, *reqError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest(field, "%v", err)
		}
		return s, nil
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", badRequest(field, "want a string or an array of {\"type\": \"text\", \"text\": ...} parts")
		}
		texts := make([]string, 0, len(parts))
		for j, p := range parts {
			pf := field + "[" + strconv.Itoa(j) + "]"
			if p.Type != "text" {
				return "", badRequest(pf+".type", "%q is not supported (text only)", p.Type)
			}
			if p.Text == nil {
				return "", badRequest(pf+".text", "required")
			}
			texts = append(texts, *p.Text)
		}
		return strings.Join(texts, "\n"), nil // as vLLM joins text parts
	}
	return "", badRequest(field, "want a string or an array of text parts")
}

// parseTokenIDs reads a JSON array of non-negative integers below limitID,
// at most maxLen of them, without allocating for more.
func parseTokenIDs(raw []byte, field string, maxLen int, limitID uint64) ([]uint32, *reqError) {
	i := 0
	skip := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i >= len(raw) || raw[i] != '[' {
		return nil, badRequest(field, "want an array of integers")
	}
	i++
	out := make([]uint32, 0, min(maxLen, len(raw)/2+1))
	skip()
	if i < len(raw) && raw[i] == ']' {
		i++
		skip()
		if i != len(raw) {
			return nil, badRequest(field, "trailing data after the array")
		}
		return out, nil
	}
	for {
		skip()
		at := field + "[" + strconv.Itoa(len(out)) + "]"
		start := i
		for i < len(raw) && (raw[i] == '-' || raw[i] == '+' || raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E' || (raw[i] >= '0' && raw[i] <= '9')) {
			i++
		}
		num := string(raw[start:i])
		if num == "" {
			return nil, badRequest(at, "want an integer")
		}
		v, err := strconv.ParseUint(num, 10, 64)
		if err != nil || v >= limitID {
			return nil, badRequest(at, "%s: want an integer from 0 to %d", num, limitID-1)
		}
		if len(out) == maxLen {
			return nil, badRequest(field, "more than %d entries", maxLen)
		}
		out = append(out, uint32(v))
		skip()
		if i >= len(raw) {
			return nil, badRequest(field, "unterminated array")
		}
		if raw[i] == ']' {
			i++
			break
		}
		if raw[i] != ',' {
			return nil, badRequest(at, "want an integer")
		}
		i++
	}
	skip()
	if i != len(raw) {
		return nil, badRequest(field, "trailing data after the array")
	}
	return out, nil
}

// streamOptions is stream_options.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// genFields are the fields the completion and chat routes share.
type genFields struct {
	Model            string          `json:"model"`
	MaxTokens        *int            `json:"max_tokens"`
	MinTokens        *int            `json:"min_tokens"`
	N                *int            `json:"n"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type completionRequest struct {
	genFields
	Prompt json.RawMessage `json:"prompt"`
}

type chatRequest struct {
	genFields
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
}

// generation is a validated completion or chat request.
type generation struct {
	chat         bool
	tokens       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
	kv           kvParams
}

// kvParams is a request's kv_transfer_params, as vLLM's NixlConnector
// reads them.
type kvParams struct {
	doRemoteDecode  bool // this engine runs the prefill; a remote one decodes
	doRemotePrefill bool // this engine receives the prompt's KV and decodes
	remoteEngineID  string
	remoteRequestID string
	remoteHost      string
	remotePort      int
	remoteBlockIDs  []uint32
	remoteDomain    string // mock-only: the prefill engine's KV-transfer domain value
}

// parseCompletion validates a /v1/completions body.
func (e *Engine) parseCompletion(body []byte) (generation, *reqError) {
	var req completionRequest
	if rerr := decodeJSON(body, &req); rerr != nil {
		return generation{}, rerr
	}
	g := generation{}
	if rerr := e.checkModel(req.Model); rerr != nil {
		return g, rerr
	}
	raw := bytes.TrimSpace(req.Prompt)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return g, badRequest("prompt", "required: a string or an array of token ids")
	case raw[0] == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return g, badRequest("prompt", "%v", err)
		}
		g.tokens = Tokenize(text)
	case raw[0] == '[':
		inner := bytes.TrimSpace(raw[1:])
		if len(inner) > 0 && (inner[0] == '"' || inner[0] == '[') {
			return g, badRequest("prompt", "a batch of prompts is not supported: send one prompt, a string or an array of token ids")
		}
		toks, rerr := parseTokenIDs(raw, "prompt", e.cfg.MaxModelLen, VocabSize)
		if rerr != nil {
			return g, rerr
		}
		g.tokens = toks
	default:
		return g, badRequest("prompt", "want a string or an array of token ids")
	}
	maxTokens := 16 // OpenAI's and vLLM's default for completions
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	return e.finishGeneration(g, req.genFields, maxTokens, "max_tokens", "prompt")
}

// parseChat validates a /v1/chat/completions body.
func (e *Engine) parseChat(body []byte) (generation, *reqError) {
	var req chatRequest
	if rerr := decodeJSON(body, &req); rerr != nil {
		return generation{}, rerr
	}
	g := generation{chat: true}
	if rerr := e.checkModel(req.Model); rerr != nil {
		return g, rerr
	}
	msgs, rerr := parseMessages(req.Messages)
	if rerr != nil {
		return g, rerr
	}
	g.tokens = Tokenize(ChatPrompt(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt))
	// vLLM: max_completion_tokens, else max_tokens, else what the context
	// has room for.
	maxTokens, param := e.cfg.MaxModelLen-len(g.tokens), "max_tokens"
	switch {
	case req.MaxCompletionTokens != nil:
		maxTokens, param = *req.MaxCompletionTokens, "max_completion_tokens"
	case req.MaxTokens != nil:
		maxTokens = *req.MaxTokens
	}
	return e.finishGeneration(g, req.genFields, maxTokens, param, "messages")
}

// finishGeneration applies the checks both routes share.
func (e *Engine) finishGeneration(g generation, f genFields, maxTokens int, maxParam, promptParam string) (generation, *reqError) {
	if len(g.tokens) == 0 {
		return g, badRequest(promptParam, "the prompt is empty")
	}
	if len(g.tokens) > e.cfg.MaxModelLen {
		return g, badRequest(promptParam, "%d prompt tokens, more than this model's maximum context length of %d tokens", len(g.tokens), e.cfg.MaxModelLen)
	}
	if maxTokens < 1 {
		return g, badRequest(maxParam, "want at least 1, got %d", maxTokens)
	}
	if maxTokens > e.cfg.MaxModelLen-len(g.tokens) {
		return g, badRequest(maxParam, "this model's maximum context length is %d tokens; you requested %d tokens (%d in the prompt, %d in the completion)",
			e.cfg.MaxModelLen, len(g.tokens)+maxTokens, len(g.tokens), maxTokens)
	}
	g.maxTokens = maxTokens
	if f.MinTokens != nil && (*f.MinTokens < 0 || *f.MinTokens > maxTokens) {
		return g, badRequest("min_tokens", "want 0 to %s (%d), got %d", maxParam, maxTokens, *f.MinTokens)
	}
	if f.N != nil && *f.N != 1 {
		return g, badRequest("n", "only 1 is supported, got %d", *f.N)
	}
	if f.StreamOptions != nil && !f.Stream {
		return g, badRequest("stream_options", "only allowed with stream: true")
	}
	g.stream = f.Stream
	g.includeUsage = f.StreamOptions != nil && f.StreamOptions.IncludeUsage
	kv, rerr := e.parseKVParams(f.KVTransferParams, len(g.tokens))
	if rerr != nil {
		return g, rerr
	}
	if kv.doRemoteDecode && g.stream {
		return g, badRequest("stream", "a prefill for a remote decode (kv_transfer_params.do_remote_decode) answers its kv_transfer_params in one response: want stream false")
	}
	g.kv = kv
	return g, nil
}

// parseKVParams reads kv_transfer_params (absent or null: none). A
// request to decode after a remote prefill must name the remote engine,
// request, host and port, and exactly the prompt's blocks.
func (e *Engine) parseKVParams(raw json.RawMessage, promptTokens int) (kvParams, *reqError) {
	var kv kvParams
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return kv, nil
	}
	const field = "kv_transfer_params"
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return kv, badRequest(field, "want an object")
	}
	isNull := func(name string) bool {
		v, ok := m[name]
		return !ok || string(bytes.TrimSpace(v)) == "null"
	}
	boolOf := func(name string, dst *bool) *reqError {
		if isNull(name) {
			return nil
		}
		if err := json.Unmarshal(m[name], dst); err != nil {
			return badRequest(field+"."+name, "want a boolean, got %s", clipJSON(m[name]))
		}
		return nil
	}
	stringOf := func(name string, required bool, dst *string) *reqError {
		if isNull(name) {
			if required {
				return badRequest(field+"."+name, "required with do_remote_prefill")
			}
			return nil
		}
		if err := json.Unmarshal(m[name], dst); err != nil {
			return badRequest(field+"."+name, "want a string, got %s", clipJSON(m[name]))
		}
		if required && *dst == "" {
			return badRequest(field+"."+name, "must not be empty")
		}
		return nil
	}
	if rerr := boolOf("do_remote_decode", &kv.doRemoteDecode); rerr != nil {
		return kv, rerr
	}
	if rerr := boolOf("do_remote_prefill", &kv.doRemotePrefill); rerr != nil {
		return kv, rerr
	}
	if kv.doRemoteDecode && kv.doRemotePrefill {
		return kv, badRequest(field, "do_remote_decode and do_remote_prefill are both true; a request is either a prefill for a remote decode or a decode after a remote prefill")
	}
	if rerr := stringOf("remote_domain", false, &kv.remoteDomain); rerr != nil {
		return kv, rerr
	}
	if !kv.doRemotePrefill {
		return kv, nil
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"remote_engine_id", &kv.remoteEngineID}, {"remote_request_id", &kv.remoteRequestID}, {"remote_host", &kv.remoteHost}} {
		if rerr := stringOf(f.name, true, f.dst); rerr != nil {
			return kv, rerr
		}
	}
	if isNull("remote_port") {
		return kv, badRequest(field+".remote_port", "required with do_remote_prefill")
	}
	if err := json.Unmarshal(m["remote_port"], &kv.remotePort); err != nil || kv.remotePort < 1 || kv.remotePort > 65535 {
		return kv, badRequest(field+".remote_port", "want a port from 1 to 65535, got %s", clipJSON(m["remote_port"]))
	}
	if !isNull("tp_size") {
		var tp int
		if err := json.Unmarshal(m["tp_size"], &tp); err != nil || tp < 1 {
			return kv, badRequest(field+".tp_size", "want a positive integer, got %s", clipJSON(m["tp_size"]))
		}
	}
	if isNull("remote_block_ids") {
		return kv, badRequest(field+".remote_block_ids", "required with do_remote_prefill")
	}
	bs := e.cfg.BlockSize
	blocks := (promptTokens + bs - 1) / bs
	ids, rerr := parseTokenIDs(m["remote_block_ids"], field+".remote_block_ids", blocks+1, 1<<31)
	if rerr != nil {
		return kv, rerr
	}
	if len(ids) != blocks {
		return kv, badRequest(field+".remote_block_ids", "%d blocks, but the prompt fills %d blocks of %d tokens: the prefill ran another prompt (or another block size)", len(ids), blocks, bs)
	}
	kv.remoteBlockIDs = ids
	return kv, nil
}

// clipJSON is a client's value as an error repeats it: at most 64 bytes.
func clipJSON(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 64 {
		return string(raw[:64]) + "…"
	}
	return string(raw)
}

// domainValue is this engine's KV-transfer domain value ("" if none).
func (e *Engine) domainValue() string {
	w := e.cfg.Worker
	if w.KVTransferDomain == "" {
		return ""
	}
	return w.TopologyDomains[w.KVTransferDomain]
}

func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// The response shapes (vLLM's).
type (
	usage struct {
		PromptTokens        int                 `json:"prompt_tokens"`
		TotalTokens         int                 `json:"total_tokens"`
		CompletionTokens    int                 `json:"completion_tokens"`
		PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
	}
	promptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	chatContent struct {
		Role    string  `json:"role,omitempty"`
		Content *string `json:"content,omitempty"`
	}
	choice struct {
		Index        int          `json:"index"`
		Text         *string      `json:"text,omitempty"`
		Message      *chatContent `json:"message,omitempty"`
		Delta        *chatContent `json:"delta,omitempty"`
		Logprobs     any          `json:"logprobs"`
		FinishReason *string      `json:"finish_reason"`
		StopReason   any          `json:"stop_reason"`
	}
	completion struct {
		ID               string      `json:"id"`
		Object           string      `json:"object"`
		Created          int64       `json:"created"`
		Model            string      `json:"model"`
		Choices          []choice    `json:"choices"`
		Usage            *usage      `json:"usage,omitempty"`
		KVTransferParams *kvResponse `json:"kv_transfer_params,omitempty"`
	}
	// kvResponse is what a prefill for a remote decode answers, as vLLM's
	// NixlConnector.request_finished returns it, plus the mock-only
	// remote_domain.
	kvResponse struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		RemoteBlockIDs  []int  `json:"remote_block_ids"`
		RemoteEngineID  string `json:"remote_engine_id"`
		RemoteRequestID string `json:"remote_request_id"`
		RemoteHost      string `json:"remote_host"`
		RemotePort      int    `json:"remote_port"`
		TPSize          int    `json:"tp_size"`
		RemoteDomain    string `json:"remote_domain,omitempty"`
	}
)

// serveGeneration serves POST /v1/completions (chat false) and POST
// /v1/chat/completions.
func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, chat bool) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, http.MethodPost)
		return
	}
	fault, faulty := e.takeFault()
	if faulty && fault.afterTokens < 0 {
		e.log.Info("fault injected", "path", r.URL.Path, "status", fault.status)
		writeError(w, &reqError{status: fault.status, msg: fmt.Sprintf("injected fault: %d before the first byte", fault.status)})
		return
	}
	if !e.isRunning() {
		writeError(w, &reqError{status: http.StatusServiceUnavailable, msg: ErrNotRunning.Error()})
		return
	}
	body, rerr := e.readBody(w, r)
	if rerr != nil {
		writeError(w, rerr)
		return
	}
	addr, remote, rerr := prefillerAddr(r.Header)
	if rerr != nil {
		writeError(w, rerr)
		return
	}
	if remote { // the routing sidecar's prefill, then the decode here
		var gone bool
		if body, gone, rerr = e.remotePrefill(r, addr, body, chat); gone {
			return
		}
		if rerr != nil {
			writeError(w, rerr)
			return
		}
	}
	var g generation
	if chat {
		g, rerr = e.parseChat(body)
	} else {
		g, rerr = e.parseCompletion(body)
	}
	if rerr != nil {
		writeError(w, rerr)
		return
	}
	q := &Seq{Tokens: g.tokens, MaxTokens: g.maxTokens, RemoteKV: g.kv.doRemotePrefill}
	if g.kv.doRemotePrefill {
		own := e.domainValue()
		q.CrossDomain = own != "" && g.kv.remoteDomain != "" && own != g.kv.remoteDomain
	}
	ch, err := e.submit(r.Context(), q)
	switch {
	case errors.Is(err, ErrNotRunning):
		writeError(w, &reqError{status: http.StatusServiceUnavailable, msg: err.Error()})
		return
	case errors.Is(err, ErrNoSpace):
		param := "prompt"
		if chat {
			param = "messages"
		}
		writeError(w, badRequest(param, "%v", err))
		return
	case err != nil:
		return // the client is gone
	}
	gen := &genResponse{e: e, w: w, g: g, q: q, ch: ch, created: e.clock.Now().Unix(), seed: OutputSeed(g.tokens), cut: -1}
	gen.id = newID("cmpl-")
	if chat {
		gen.id = newID("chatcmpl-")
	}
	if faulty {
		gen.cut = fault.afterTokens
	}
	if g.stream {
		gen.stream(r.Context())
	} else {
		gen.complete(r.Context())
	}
}

// genResponse writes one generation's response as its tokens arrive.
type genResponse struct {
	e       *Engine
	w       http.ResponseWriter
	g       generation
	q       *Seq
	ch      chan struct{}
	id      string
	created int64
	seed    uint64
	cut     int // cut the response after this many tokens (an injected fault); -1: never
}

func (gr *genResponse) object(chunk bool) string {
	switch {
	case gr.g.chat && chunk:
		return "chat.completion.chunk"
	case gr.g.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (gr *genResponse) text(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		_, piece := OutputToken(gr.seed, i)
		b.WriteString(piece)
	}
	return b.String()
}

func (gr *genResponse) usage(v seqView) *usage {
	return &usage{PromptTokens: len(gr.g.tokens), CompletionTokens: v.output, TotalTokens: len(gr.g.tokens) + v.output,
		PromptTokensDetails: promptTokensDetails{CachedTokens: v.cached}}
}

// failed writes the error a sequence ended with, before any byte of the
// response.
func (gr *genResponse) failed(err error) {
	switch {
	case errors.Is(err, ErrNotRunning):
		gr.w.Header().Set("Connection", "close")
		writeError(gr.w, &reqError{status: http.StatusServiceUnavailable, msg: err.Error()})
	case errors.Is(err, ErrNoSpace):
		writeError(gr.w, &reqError{status: http.StatusBadRequest, msg: err.Error()})
	default:
		writeError(gr.w, &reqError{status: http.StatusInternalServerError, msg: err.Error()})
	}
}

// cutNow ends the response abruptly (an injected fault after the first
// byte): the request is aborted in the engine and the connection dropped
// without the rest of the body.
func (gr *genResponse) cutNow(sent int) {
	gr.e.abort(gr.q, "injected fault")
	gr.e.log.Info("fault injected", "seq", gr.q.ID, "cut_after_tokens", sent)
	if f, ok := gr.w.(http.Flusher); ok {
		f.Flush()
	}
	panic(http.ErrAbortHandler) // net/http closes the connection, unlogged
}

func (gr *genResponse) complete(ctx context.Context) {
	seen := gr.q.MaxTokens
	if gr.cut >= 0 {
		seen = min(gr.cut, gr.q.MaxTokens) - 1 // wait for the cut's token count
	}
	var v seqView
	var err error
	for {
		v, err = gr.e.wait(ctx, gr.q, gr.ch, seen)
		if err != nil {
			return // the client is gone; the request was aborted
		}
		if v.state == SeqDone || v.output > seen {
			break
		}
	}
	if v.err != nil {
		gr.failed(v.err)
		return
	}
	finish := "length"
	resp := completion{ID: gr.id, Object: gr.object(false), Created: gr.created, Model: gr.e.servedModel(), Usage: gr.usage(v)}
	text := gr.text(0, v.output)
	c := choice{Index: 0, FinishReason: &finish}
	if gr.g.chat {
		c.Message = &chatContent{Role: "assistant", Content: &text}
	} else {
		c.Text = &text
	}
	resp.Choices = []choice{c}
	if gr.g.kv.doRemoteDecode {
		resp.KVTransferParams = &kvResponse{DoRemotePrefill: true, RemoteBlockIDs: v.blockIDs, RemoteEngineID: gr.e.cfg.KVEngineID,
			RemoteRequestID: gr.id, RemoteHost: gr.e.cfg.KVHost, RemotePort: gr.e.cfg.KVPort, TPSize: 1, RemoteDomain: gr.e.domainValue()}
		if resp.KVTransferParams.RemoteBlockIDs == nil {
			resp.KVTransferParams.RemoteBlockIDs = []int{}
		}
	}
	gr.logTransfer(v)
	body, _ := json.Marshal(resp)
	gr.w.Header().Set("Content-Type", "application/json")
	if gr.cut >= 0 {
		gr.w.WriteHeader(http.StatusOK)
		_, _ = gr.w.Write(body[:len(body)/2])
		gr.cutNow(v.output)
	}
	_, _ = gr.w.Write(append(body, '\n'))
}

func (gr *genResponse) logTransfer(v seqView) {
	if gr.g.kv.doRemotePrefill {
		gr.e.log.Info("kv transfer taken", "seq", gr.q.ID, "remote_engine_id", gr.g.kv.remoteEngineID,
			"remote_request_id", gr.g.kv.remoteRequestID, "blocks", v.transferred, "cross_domain", gr.q.CrossDomain,
			"queue_and_transfer", v.first.Sub(v.arrived))
	}
}

// stream answers server-sent events: the headers at once (as vLLM's
// StreamingResponse), then one event per token as the steps produce them,
// the usage if asked for, and [DONE]. A sequence the engine refuses
// afterwards ends with an error event, as vLLM's; one the engine drops
// (crash) with a cut connection.
func (gr *genResponse) stream(ctx context.Context) {
	h := gr.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	gr.w.WriteHeader(http.StatusOK)
	flusher, _ := gr.w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	var buf bytes.Buffer
	event := func(v any) bool {
		buf.Reset()
		buf.WriteString("data: ")
		if s, ok := v.(string); ok {
			buf.WriteString(s)
		} else {
			b, _ := json.Marshal(v)
			buf.Write(b)
		}
		buf.WriteString("\n\n")
		if _, err := gr.w.Write(buf.Bytes()); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	chunk := func(c choice) completion {
		return completion{ID: gr.id, Object: gr.object(true), Created: gr.created, Model: gr.e.servedModel(), Choices: []choice{c}}
	}
	if gr.cut == 0 {
		gr.cutNow(0)
	}
	v, err := gr.e.wait(ctx, gr.q, gr.ch, 0)
	if err != nil {
		return
	}
	if v.err != nil && !errors.Is(v.err, ErrNotRunning) {
		event(struct {
			Error apiError `json:"error"`
		}{apiError{Message: v.err.Error(), Type: errorType(http.StatusBadRequest), Code: http.StatusBadRequest}})
		event("[DONE]")
		return
	}
	if gr.g.chat {
		empty := ""
		if !event(chunk(choice{Delta: &chatContent{Role: "assistant", Content: &empty}})) {
			gr.e.abort(gr.q, "client gone")
			return
		}
	}
	sent := 0
	for {
		for ; sent < v.output; sent++ {
			piece := gr.text(sent, sent+1)
			c := choice{}
			if sent == gr.q.MaxTokens-1 {
				finish := "length"
				c.FinishReason = &finish
			}
			if gr.g.chat {
				c.Delta = &chatContent{Content: &piece}
			} else {
				c.Text = &piece
			}
			if !event(chunk(c)) {
				gr.e.abort(gr.q, "client gone")
				return
			}
			if sent+1 == gr.cut {
				gr.cutNow(sent + 1)
			}
		}
		if v.state == SeqDone {
			break
		}
		if v, err = gr.e.wait(ctx, gr.q, gr.ch, sent); err != nil {
			return
		}
	}
	if v.err != nil {
		gr.e.log.Info("stream cut", "seq", gr.q.ID, "err", v.err)
		panic(http.ErrAbortHandler) // as an engine that died mid-stream: no [DONE]
	}
	if gr.cut >= 0 { // after every token, before the end of the stream
		gr.cutNow(sent)
	}
	gr.logTransfer(v)
	if gr.g.includeUsage {
		u := completion{ID: gr.id, Object: gr.object(true), Created: gr.created, Model: gr.e.servedModel(), Choices: []choice{}, Usage: gr.usage(v)}
		if !event(u) {
			return
		}
	}
	event("[DONE]")
}

type tokenizeRequest struct {
	Model               string        `json:"model"`
	Prompt              *string       `json:"prompt"`
	Messages            []chatMessage `json:"messages"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
	AddSpecialTokens    *bool         `json:"add_special_tokens"` // accepted, ignored: the mock has no BOS
}

// serveTokenize serves vLLM's POST /tokenize: a prompt, or messages
// rendered with the chat template (add_generation_prompt, default true).
func (e *Engine) serveTokenize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, http.MethodPost)
		return
	}
	var req tokenizeRequest
	body, rerr := e.readBody(w, r)
	if rerr == nil {
		rerr = decodeJSON(body, &req)
	}
	if rerr != nil {
		writeError(w, rerr)
		return
	}
	if rerr := e.checkModel(req.Model); rerr != nil {
		writeError(w, rerr)
		return
	}
	var toks []uint32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("prompt", "give prompt or messages, not both"))
		return
	case req.Prompt != nil:
		toks = Tokenize(*req.Prompt)
	case req.Messages != nil:
		msgs, rerr := parseMessages(req.Messages)
		if rerr != nil {
			writeError(w, rerr)
			return
		}
		toks = Tokenize(ChatPrompt(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt))
	default:
		writeError(w, badRequest("prompt", "required (or messages)"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}{len(toks), e.cfg.MaxModelLen, toks})
}

// serveModels serves GET /v1/models: the one served model.
func (e *Engine) serveModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, http.MethodGet)
		return
	}
	type card struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Root        string `json:"root"`
		Parent      any    `json:"parent"`
		MaxModelLen int    `json:"max_model_len"`
	}
	m := e.servedModel()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{"list", []card{{ID: m, Object: "model", Created: e.clock.Now().Unix(), OwnedBy: "vllm", Root: m, MaxModelLen: e.cfg.MaxModelLen}}})
}
