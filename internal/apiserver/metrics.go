package apiserver

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// timed wraps a route's handler h to observe each request's latency in
// vec (prefixd_http_request_duration_seconds, curried with the route's
// handler label) under {method, code}, labelled as
// promhttp.InstrumentHandlerDuration labels them — the method lower case
// (or "unknown", methodLabel), the code the handler
// answered with (200 if it wrote nothing) — without its label map and
// hashed lookup per request: the observers of the route's own methods
// (with HEAD for GET) and of the statuses the API answers with are
// looked up once each, then read from a table.
func timed(vec prometheus.ObserverVec, m methods, h http.Handler) http.Handler {
	t := &timedRoute{vec: vec, next: h}
	for method := range m {
		t.methods = append(t.methods, method)
		if method == http.MethodGet {
			t.methods = append(t.methods, http.MethodHead)
		}
	}
	t.cache = make([][len(timedCodes)]atomic.Pointer[prometheus.Observer], len(t.methods))
	return t
}

// timedCodes are the statuses whose observers timedRoute caches.
var timedCodes = [...]int{200, 201, 400, 401, 403, 404, 405, 408, 409, 413, 429, 500, 503}

type timedRoute struct {
	vec     prometheus.ObserverVec
	next    http.Handler
	methods []string
	// cache[i][j] is the observer of methods[i] and timedCodes[j], once
	// looked up; it is set at most once per value (a race stores the
	// same child twice).
	cache [][len(timedCodes)]atomic.Pointer[prometheus.Observer]
}

func (t *timedRoute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	t.next.ServeHTTP(sw, r)
	t.observer(r.Method, sw.status).Observe(time.Since(start).Seconds())
}

func (t *timedRoute) observer(method string, code int) prometheus.Observer {
	if code == 0 {
		code = http.StatusOK // nothing written: net/http answers 200
	}
	i, j := slices.Index(t.methods, method), slices.Index(timedCodes[:], code)
	if i < 0 || j < 0 {
		return t.vec.With(prometheus.Labels{"method": methodLabel(method), "code": strconv.Itoa(code)})
	}
	slot := &t.cache[i][j]
	if o := slot.Load(); o != nil {
		return *o
	}
	o := t.vec.With(prometheus.Labels{"method": methodLabel(method), "code": strconv.Itoa(code)})
	slot.Store(&o)
	return o
}

// methodLabel is promhttp's method label: the usual methods, upper or
// lower case, in lower case, and "unknown" for any other, so that a
// client cannot make series of its own.
func methodLabel(m string) string {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "NOTIFY":
		return strings.ToLower(m)
	case "get", "head", "post", "put", "patch", "delete", "connect", "options", "trace", "notify":
		return m
	}
	return "unknown"
}

// statusWriter records the status a handler answers with: that of its
// first final WriteHeader, or 200 at its first Write.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the response, if the writer underneath can; as
// http.Flusher's, it has no error to report.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap is for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
