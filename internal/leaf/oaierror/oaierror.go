// Package oaierror is OpenAI's error object as vLLM's OpenAI server
// answers it, {"error": {"message", "type", "param", "code"}}, for the
// errors prefixd's frontends (prefixd proxy, the endpoint picker) make
// themselves: a client sees the same error from them as from an engine.
package oaierror

import (
	"encoding/json"
	"net/http"
)

// Type is the "type" vLLM gives an error of this status (its
// create_error_response: BadRequestError for a request it refuses,
// NotFoundError for an unknown model, InternalServerError for its own
// failures). The OpenAI SDKs choose their error class by the status; the
// type is for people.
func Type(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// Object is the "error" member: Param is the field at fault (null when
// none), Code the status.
type Object struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// Body returns the error body for status; param names the field at
// fault, "" for none.
func Body(status int, param, msg string) []byte {
	body := struct {
		Error Object `json:"error"`
	}{Object{Message: msg, Type: Type(status), Code: status}}
	if param != "" {
		body.Error.Param = &param
	}
	b, _ := json.Marshal(body) // strings and an int: cannot fail
	return b
}

// Write writes the error as a JSON response of status.
func Write(w http.ResponseWriter, status int, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(Body(status, param, msg), '\n'))
}
