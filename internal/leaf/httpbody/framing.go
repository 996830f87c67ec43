package httpbody

import (
	"net/http"
	"slices"
)

// CloseChunked wraps h so that a request whose body came chunked
// (Transfer-Encoding) is answered with "Connection: close", and its
// connection closed after the response.
//
// A request that carries both Content-Length and Transfer-Encoding may be
// an attempt at request smuggling: RFC 9112 §6.3 lets a server process it
// by its Transfer-Encoding alone, but says the server MUST close the
// connection after responding. net/http reads such a request as chunked
// and drops its Content-Length before any handler runs (readTransfer in
// net/http/transfer.go), so a handler cannot tell it from an honest
// chunked request, and refusing it with a 400 would take a second HTTP
// parser. Closing after every chunked request keeps the MUST; it costs
// honest chunked uploads their keep-alive, which the JSON clients of
// prefixd's servers (they send a Content-Length) do not use.
func CloseChunked(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(r.TransferEncoding, "chunked") {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
