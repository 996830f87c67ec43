package apiserver

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prefixd/prefixd/internal/leaf/httpbody"
)

// Defaults for the zero values of ServerConfig.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
)

// ServerConfig configures the HTTP server of NewServer. Zero fields take
// the defaults above.
type ServerConfig struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body, from
	// its first byte: a body still arriving then is cut off (408, and
	// the connection is closed), so a client cannot hold a request open
	// by trickling its body. It does not bound the response: net/http
	// lifts the read deadline once the body is read (or at once when
	// there is none), so a long response (GET /dump) keeps its context
	// (TestServerLongResponse).
	ReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (431 beyond).
	MaxHeaderBytes int
	// Logger receives the server's own errors (failed accepts, handler
	// panics) at WARN; nil leaves them to the log package's default.
	Logger *slog.Logger
}

// NewServer returns an http.Server for h with cfg's timeouts and limits;
// a request whose body came chunked is answered with its connection
// closed (httpbody.CloseChunked: a chunked request may be one that also
// sent a Content-Length, which RFC 9112 says to close after).
// It sets no WriteTimeout: /dump streams the whole index, which can take
// longer than any fixed bound; it sets a deadline on each of its writes
// instead (Config.DumpProgressTimeout), so a client that stops reading is
// cut off. The caller serves it (Serve) and owns the listener.
func NewServer(h http.Handler, cfg ServerConfig) *http.Server {
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	srv := &http.Server{
		Handler:           httpbody.CloseChunked(h),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
	}
	if cfg.Logger != nil {
		srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	}
	return srv
}
