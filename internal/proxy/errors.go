package proxy

import (
	"errors"
	"net/http"

	"github.com/prefixd/prefixd/internal/leaf/jsonlex"
	"github.com/prefixd/prefixd/internal/leaf/oaierror"
)

// openAIError writes an error the proxy makes itself in OpenAI's shape,
// as vLLM answers it (oaierror); param names the field at fault, "" for
// none.
func openAIError(w http.ResponseWriter, status int, param, msg string) {
	oaierror.Write(w, status, param, msg)
}

// fieldOf returns the field a request's parse error names ("" if none).
func fieldOf(err error) string {
	if le := (*jsonlex.Error)(nil); errors.As(err, &le) {
		return le.Field
	}
	return ""
}
