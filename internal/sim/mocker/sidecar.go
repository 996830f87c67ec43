package mocker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// This file is the decode pod's routing sidecar, as llm-d's runs next to a
// decode vLLM (llm-d-routing-sidecar, its NIXL v2 connector): a
// completion or chat request that names a prefill engine in
// PrefillerHeader is first sent there as a prefill for a remote decode,
// and the kv_transfer_params it answers go into the request this engine
// then decodes — the exchange prefixd proxy --disagg runs as the router
// (internal/proxy: prefillBody, transferParams, decodeBody).

// PrefillerHeader names the prefill engine of a disaggregated request,
// "host:port" (an endpoint picker writes ip:port), as llm-d's routing
// sidecar reads it.
const PrefillerHeader = "X-Prefiller-Host-Port"

const (
	// maxPrefillerHeader bounds PrefillerHeader: a DNS name of 253 bytes,
	// a colon and a port.
	maxPrefillerHeader = 253 + 1 + 5
	// maxPrefillAnswer bounds a prefill engine's answer.
	maxPrefillAnswer = 4 << 20
	// prefillDialTimeout bounds connecting to a prefill engine.
	prefillDialTimeout = 5 * time.Second
)

// SidecarStats counts the requests the engine's routing sidecar sent to a
// prefill engine.
type SidecarStats struct {
	// Prefills answered with kv_transfer_params.
	Prefills uint64
	// Failures: the prefill engine unreachable, answering an error, or
	// answering without kv_transfer_params. Each was answered with an
	// error object (the prefill's status, or 502).
	Failures uint64
}

// Sidecar returns the routing sidecar's counters.
func (e *Engine) Sidecar() SidecarStats {
	return SidecarStats{Prefills: e.sidecarPrefills.Load(), Failures: e.sidecarFailures.Load()}
}

// prefillTransfer is what a prefill request carries: vLLM's NixlConnector
// reads do_remote_decode and leaves the remote fields unset.
var prefillTransfer = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// newPrefillClient is the sidecar's client: connections to a prefill
// engine time out, a prefill itself runs as long as the request lasts.
func newPrefillClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: prefillDialTimeout}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// prefillerAddr reads PrefillerHeader: absent (ok false), or one host:port
// with a port from 1 to 65535.
func prefillerAddr(h http.Header) (addr string, ok bool, rerr *reqError) {
	vs := h.Values(PrefillerHeader)
	if len(vs) == 0 {
		return "", false, nil
	}
	const param = "x-prefiller-host-port"
	if len(vs) > 1 {
		return "", false, badRequest(param, "given %d times; want one host:port", len(vs))
	}
	v := vs[0]
	if len(v) > maxPrefillerHeader {
		return "", false, badRequest(param, "%d bytes, longer than a host:port (%d)", len(v), maxPrefillerHeader)
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" {
		return "", false, badRequest(param, "%q: want host:port", v)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", false, badRequest(param, "%q: want a port from 1 to 65535", v)
	}
	return v, true, nil
}

// remotePrefill runs the sidecar's prefill on the engine at addr for the
// request r whose body is body, and returns the body this engine decodes:
// the request with the prefill's kv_transfer_params. A request this engine
// would refuse is refused before the prefill (400). gone is true when the
// client went away during the prefill: nothing is to be written.
func (e *Engine) remotePrefill(r *http.Request, addr string, body []byte, chat bool) (decode []byte, gone bool, rerr *reqError) {
	var fields map[string]json.RawMessage
	if rerr := decodeJSON(body, &fields); rerr != nil {
		return nil, false, rerr
	}
	delete(fields, "kv_transfer_params") // the sidecar's to set
	clean, err := json.Marshal(fields)
	if err != nil {
		return nil, false, badRequest("body", "%v", err)
	}
	if chat {
		_, rerr = e.parseChat(clean)
	} else {
		_, rerr = e.parseCompletion(clean)
	}
	if rerr != nil {
		return nil, false, rerr
	}

	params, perr := e.prefill(r.Context(), addr, r, prefillBody(fields, chat))
	if perr != nil {
		if r.Context().Err() != nil {
			return nil, true, nil
		}
		e.sidecarFailures.Add(1)
		e.log.Info("remote prefill failed", "prefiller", addr, "path", r.URL.Path, "status", perr.status, "err", perr.msg)
		return nil, false, perr
	}
	e.sidecarPrefills.Add(1)
	fields["kv_transfer_params"] = params
	decode, err = json.Marshal(fields)
	if err != nil {
		return nil, false, &reqError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	return decode, false, nil
}

// prefillBody is the request rewritten for the prefill engine: compute the
// prompt's KV and hand it over, generating one token, in one answer.
func prefillBody(fields map[string]json.RawMessage, chat bool) []byte {
	out := make(map[string]json.RawMessage, len(fields)+2)
	for k, v := range fields {
		out[k] = v
	}
	out["kv_transfer_params"] = prefillTransfer
	out["stream"] = json.RawMessage("false")
	out["max_tokens"] = json.RawMessage("1")
	if chat {
		out["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(out, "stream_options")
	delete(out, "min_tokens") // held back for the decode
	b, _ := json.Marshal(out) // raw messages that decoded: cannot fail
	return b
}

// prefill posts body to the prefill engine at addr on r's path and returns
// the kv_transfer_params of its answer. Its errors are what the client
// is answered: the prefill's own status and message when it refused, 502
// when it could not be reached or answered no parameters.
func (e *Engine) prefill(ctx context.Context, addr string, r *http.Request, body []byte) (json.RawMessage, *reqError) {
	badGateway := func(format string, args ...any) *reqError {
		return &reqError{status: http.StatusBadGateway, msg: "x-prefiller-host-port: prefill engine " + addr + ": " + fmt.Sprintf(format, args...)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return nil, badGateway("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 256 {
		req.Header.Set("X-Request-Id", id)
	}
	resp, err := e.prefillClient.Do(req)
	if err != nil {
		return nil, badGateway("unreachable: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	switch {
	case err != nil:
		return nil, badGateway("reading the answer: %v", err)
	case len(raw) > maxPrefillAnswer:
		return nil, badGateway("answer longer than %d bytes", maxPrefillAnswer)
	}
	var answer struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	jerr := json.Unmarshal(raw, &answer)
	if resp.StatusCode != http.StatusOK {
		msg := "no error message"
		if jerr == nil && answer.Error != nil {
			msg = clipString(answer.Error.Message, 256)
		}
		status := resp.StatusCode
		if status < 400 || status > 599 {
			status = http.StatusBadGateway
		}
		return nil, &reqError{status: status, msg: fmt.Sprintf("x-prefiller-host-port: prefill engine %s answered %d: %s", addr, resp.StatusCode, msg)}
	}
	if jerr != nil {
		return nil, badGateway("answer is not JSON: %v", jerr)
	}
	if p := bytes.TrimSpace(answer.Params); len(p) == 0 || string(p) == "null" || p[0] != '{' {
		return nil, badGateway("answer has no kv_transfer_params object (is it a prefill engine with a KV connector?)")
	}
	return answer.Params, nil
}

// clipString is at most n bytes of s.
func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
