package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixd/prefixd/client"
)

// booking is whether the proxy can book with prefixd: whether prefixd
// serve accepts the proxy's token on its booking routes.
type booking int

const (
	bookingUnknown      booking = iota // not known yet: prefixd has not answered
	bookingOK                          // prefixd accepts the token
	bookingUnauthorized                // prefixd refuses it (401, 403): routed by load
	bookingOff                         // the policy books nothing (random)
)

var bookingNames = []string{bookingUnknown: "unknown", bookingOK: "ok", bookingUnauthorized: "unauthorized", bookingOff: "off"}

func (b booking) String() string { return bookingNames[b] }

// Intervals of the token check: while prefixd refuses the token (or has
// not answered) the check runs at every fleet refresh, so that a fixed
// token is seen at once; while it accepts it, every accessRecheck (the
// requests' own bookings show a refusal meanwhile).
const accessRecheck = 30 * time.Second

// accessProbeID is the booking the token check frees: none by that id
// exists, so prefixd answers 404 when it accepts the token, 401 or 403
// when it does not, and changes nothing.
const accessProbeID = "prefixd-proxy-token-check"

// access follows whether prefixd accepts the proxy's token, logs each
// change once, and shows it on the booking gauge and /health. Safe for
// concurrent use.
type access struct {
	c     *client.Client
	log   *slog.Logger
	gauge *prometheus.GaugeVec

	mu     sync.Mutex // guards state and detail
	state  booking
	detail string // what prefixd answered, when it refuses the token
}

func newAccess(c *client.Client, log *slog.Logger, needed bool) *access {
	a := &access{c: c, log: log, gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixd_proxy_booking",
		Help: "Whether the proxy can book with prefixd (1 for the current state): ok, unauthorized (prefixd refuses the proxy's token: requests are routed by load), unknown (prefixd has not answered yet), off (--policy random books nothing)."},
		[]string{"state"})}
	if !needed {
		a.state = bookingOff
	}
	a.setGauge(a.state)
	return a
}

func (a *access) setGauge(s booking) {
	for i, name := range bookingNames {
		v := 0.0
		if booking(i) == s {
			v = 1
		}
		a.gauge.WithLabelValues(name).Set(v)
	}
}

// current returns the state and, when prefixd refuses the token, what it
// answered.
func (a *access) current() (booking, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state, a.detail
}

// observe records what prefixd answered a booking call (err nil: it
// booked). Only an answer about the token changes the state: prefixd
// not answering, or refusing a request for another reason, says nothing
// about it.
func (a *access) observe(err error) {
	if err == nil {
		a.set(bookingOK, "")
		return
	}
	var ce *client.Error
	if !errors.As(err, &ce) {
		return // no answer
	}
	if ce.Status == http.StatusUnauthorized || ce.Status == http.StatusForbidden {
		a.set(bookingUnauthorized, fmt.Sprintf("HTTP %d: %s", ce.Status, errMsg(err)))
		return
	}
	a.set(bookingOK, "") // past the token check
}

// set moves to state s, logging the change once: a refused token as an
// ERROR (every request is then routed by load, without prefixd), its
// return as a WARN.
func (a *access) set(s booking, detail string) {
	a.mu.Lock()
	if a.state == bookingOff || a.state == s && a.detail == detail {
		a.mu.Unlock()
		return
	}
	from := a.state
	a.state, a.detail = s, detail
	a.setGauge(s)
	a.mu.Unlock()
	token := "none"
	if a.c.Token != "" {
		token = "given"
	}
	switch {
	case s == bookingUnauthorized:
		a.log.Error("proxy: prefixd refuses the proxy's token: nothing is booked, every request is routed by load; give prefixd proxy the API token prefixd serve was started with (--api-token, or PREFIXD_API_TOKEN)",
			"prefixd", a.c.BaseURL, "token", token, "answer", detail)
	case from == bookingUnauthorized:
		a.log.Warn("proxy: prefixd accepts the proxy's token again: booking", "prefixd", a.c.BaseURL, "token", token)
	default:
		a.log.Info("proxy: prefixd accepts the proxy's token", "prefixd", a.c.BaseURL, "token", token)
	}
}

// check asks prefixd whether it accepts the token: it frees a booking
// that does not exist (a route that needs the API token).
func (a *access) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := a.c.FreeReservation(ctx, accessProbeID)
	if errors.Is(err, client.ErrNotFound) {
		err = nil
	}
	a.observe(err)
}

// run checks the token at start, then again every interval while it is
// not known to be accepted and every accessRecheck while it is, until
// ctx ends.
func (a *access) run(ctx context.Context, interval time.Duration) error {
	if s, _ := a.current(); s == bookingOff {
		return nil
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		a.check(ctx)
		next := interval
		if s, _ := a.current(); s == bookingOK {
			next = max(interval, accessRecheck)
		}
		t.Reset(next)
	}
}
