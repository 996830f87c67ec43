// Package httpbody reads HTTP request bodies within limits, for every
// server prefixd runs (the daemon's API and the proxy): a body grows its
// buffer only as its bytes arrive, each growth is taken from a Budget
// shared by all requests in flight before it is allocated, and a body
// that does not arrive in time is cut off. A client that claims a large
// Content-Length and sends little costs what it sent, not what it
// claimed.
//
// Errors are *Error, carrying the HTTP status they map to, so that each
// server writes them in its own format.
package httpbody
