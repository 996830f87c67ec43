// Package testlog records log/slog output for tests that prove a log line
// is printed: docs/operations.md quotes lines, and each quoted line has a
// test that waits for it here. Test support only; no production code
// imports it.
package testlog

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Record is one logged line: its level, message and attributes (values
// formatted with fmt.Sprint; groups flattened as "group.key").
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (r Record) String() string {
	keys := make([]string, 0, len(r.Attrs))
	for k := range r.Attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.Level, r.Msg)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, r.Attrs[k])
	}
	return b.String()
}

// Recorder keeps every record logged through its Logger. Safe for
// concurrent use.
type Recorder struct {
	mu      sync.Mutex
	recs    []Record
	changed chan struct{} // closed and replaced on every record
	tb      testing.TB    // also logs each line to the test, if set
}

// New returns a Recorder and a Logger (every level) writing to it. With
// tb, each line is also written to the test's log.
func New(tb testing.TB) (*Recorder, *slog.Logger) {
	r := &Recorder{changed: make(chan struct{}), tb: tb}
	return r, slog.New(&handler{r: r})
}

// Records returns a copy of everything logged so far.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// Find returns the first record with message msg and every attribute in
// attrs ("key=value").
func (r *Recorder) Find(msg string, attrs ...string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.matches(msg, attrs) {
			return rec, true
		}
	}
	return Record{}, false
}

// Count returns how many records have message msg and attrs.
func (r *Recorder) Count(msg string, attrs ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.matches(msg, attrs) {
			n++
		}
	}
	return n
}

// Wait waits until a record with msg and attrs is logged, failing tb
// after timeout with what was logged instead.
func (r *Recorder) Wait(tb testing.TB, timeout time.Duration, msg string, attrs ...string) Record {
	tb.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		changed := r.changed
		for _, rec := range r.recs {
			if rec.matches(msg, attrs) {
				r.mu.Unlock()
				return rec
			}
		}
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			var seen []string
			for _, rec := range r.Records() {
				seen = append(seen, rec.String())
			}
			tb.Fatalf("no log line %q %v within %v; logged:\n%s", msg, attrs, timeout, strings.Join(seen, "\n"))
		}
	}
}

func (rec Record) matches(msg string, attrs []string) bool {
	if rec.Msg != msg {
		return false
	}
	for _, a := range attrs {
		k, v, _ := strings.Cut(a, "=")
		if got, ok := rec.Attrs[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (r *Recorder) add(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	close(r.changed)
	r.changed = make(chan struct{})
	tb := r.tb
	r.mu.Unlock()
	if tb != nil {
		tb.Log(rec.String())
	}
}

type handler struct {
	r      *Recorder
	attrs  []slog.Attr
	prefix string // group prefix, "a.b."
}

func (h *handler) Enabled(context.Context, slog.Level) bool { return true }

func (h *handler) Handle(_ context.Context, rec slog.Record) error {
	out := Record{Level: rec.Level, Msg: rec.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		flatten(out.Attrs, "", a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		flatten(out.Attrs, h.prefix, a)
		return true
	})
	h.r.add(out)
	return nil
}

func flatten(m map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			flatten(m, p, g)
		}
		return
	}
	m[prefix+a.Key] = fmt.Sprint(v.Any())
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	for _, a := range as {
		n.attrs = append(slices.Clip(n.attrs), slog.Attr{Key: h.prefix + a.Key, Value: a.Value})
	}
	return &n
}

func (h *handler) WithGroup(name string) slog.Handler {
	n := *h
	if name != "" {
		n.prefix += name + "."
	}
	return &n
}
