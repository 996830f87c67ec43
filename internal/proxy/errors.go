package proxy

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
)

// errorType is the "type" of an error the proxy makes itself, as vLLM's
// OpenAI server names it for the same status (its create_error_response:
// BadRequestError for a request it refuses, NotFoundError for an unknown
// model, InternalServerError for its own failures), so that a client sees
// the same error from the proxy as from an engine. The OpenAI SDKs choose
// their error class by the status (BadRequestError, NotFoundError,
// RateLimitError, InternalServerError, …): the type is for people.
func errorType(status int) string {
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

// apiError is the "error" object of OpenAI's error body, as vLLM answers
// it: param is the field at fault (null when none), code the status.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// openAIError writes an error the proxy makes itself in OpenAI's shape,
// {"error": {"message", "type", "param", "code"}}; param names the field
// at fault, "" for none.
func openAIError(w http.ResponseWriter, status int, param, msg string) {
	body := struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: errorType(status), Code: status}}
	if param != "" {
		body.Error.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// fieldOf returns the field a request's parse error names ("" if none).
func fieldOf(err error) string {
	if le := (*jsonlex.Error)(nil); errors.As(err, &le) {
		return le.Field
	}
	return ""
}
