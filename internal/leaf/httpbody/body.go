package httpbody

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Reasons of an Error, for metrics.
const (
	TooLarge   = "too_large" // over the body limit (413)
	OverBudget = "budget"    // the budget is full (503)
	Timeout    = "timeout"   // the server's read deadline passed (408)
	Stalled    = "stalled"   // a body lent the reserve did not keep arriving (408)
	Broken     = "read"      // the connection failed otherwise (400)
)

// Error is a body that was not read, with the status a server answers.
// Msg is what the client is told: "body: <problem>".
type Error struct {
	Status int
	Reason string // one of the reasons above
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Budget bounds the bytes of request bodies that requests in flight hold
// together, over every request of a server (one per process). Read takes
// bytes from it as a body's buffer grows; the caller gives them back
// (Give) when it is done with the body.
//
// Reserve, when set, is the last part of Limit, lent only to bodies that
// keep arriving: a body whose buffer grows while the budget holds more
// than Limit − Reserve must fill that buffer (or end) within Hold, or
// Read cuts it off with a 408. So bodies that stall hold at most
// Limit − Reserve for longer than Hold, and the reserve stays for bodies
// that are being sent. (Proof: the bodies whose latest growth came out of
// the part below the line hold together no more than the budget held at
// the latest of those growths, which was at most Limit − Reserve.)
//
// Set the fields before the first Read; the zero Reserve lends nothing
// and sets no deadline. Safe for concurrent use.
type Budget struct {
	Limit   int64
	Reserve int64
	Hold    time.Duration
	// ReadTimeout is the server's http.Server.ReadTimeout (0: none). The
	// deadline Read sets for a body lent the reserve is never later than
	// ReadTimeout from the start of Read, and a body that stops being lent
	// gets that deadline back. (The server's own deadline runs from the
	// request's first byte, a little earlier: a body lent the reserve may
	// gain the time its headers took.)
	ReadTimeout time.Duration

	used atomic.Int64
}

// Used returns the bytes the budget holds now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Give gives back n bytes taken by Read (the caller's held count).
func (b *Budget) Give(n int64) { b.used.Add(-n) }

// Take takes n bytes, or reports !ok (taking nothing) if they do not fit;
// lent says the budget then holds more than Limit − Reserve. Read takes
// what it reads; a reader of bodies that are not HTTP requests (the
// endpoint picker's gRPC messages) takes and gives back itself.
func (b *Budget) Take(n int64) (lent, ok bool) {
	u := b.used.Add(n)
	if u > b.Limit {
		b.used.Add(-n)
		return false, false
	}
	return b.Reserve > 0 && u > b.Limit-b.Reserve, true
}

// Read reads r's body into buf (reused) and returns it. A body over limit
// bytes is a 413. buf grows only as bytes arrive, by doubling, and never
// beyond the claimed Content-Length (+1 to see the end) or limit+1: a
// client that claims 8 MiB and sends 10 bytes costs 4 KiB, not 8 MiB.
// Every byte buf grows by is taken from b before it is allocated and
// added to *held, which the caller gives back (b.Give) when it is done
// with the body, error or not: the budget bounds the memory the bodies in
// flight hold, not only the bytes that arrived (doubling allocates up to
// twice those). A body that does not fit the budget is a 503, and Read
// sets Retry-After: 1 on w. A body still arriving when the server's read
// deadline passes is a 408 (the server closes the connection), and so is
// a body lent b's reserve that does not keep arriving.
func Read(w http.ResponseWriter, r *http.Request, buf []byte, limit int, b *Budget, held *int64) ([]byte, *Error) {
	if r.ContentLength > int64(limit) {
		return buf[:0], &Error{http.StatusRequestEntityTooLarge, TooLarge, fmt.Sprintf("body: %d bytes exceeds the limit of %d", r.ContentLength, limit)}
	}
	want := limit // the most the body can be
	if r.ContentLength >= 0 {
		want = int(r.ContentLength)
	}
	body := http.MaxBytesReader(w, r.Body, int64(limit))
	d := deadlines{b: b}
	if b.Reserve > 0 {
		d.rc, d.start = http.NewResponseController(w), time.Now()
	}
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			// Full of bytes that did arrive: double, up to the room needed
			// to see the end of the longest body still possible.
			c := max(2*cap(buf), 4096)
			if c >= want {
				c = want + 1
			}
			c = max(c, len(buf)+1)
			grow := int64(c - cap(buf))
			lent, ok := b.Take(grow)
			if !ok {
				w.Header().Set("Retry-After", "1")
				return buf, &Error{http.StatusServiceUnavailable, OverBudget,
					fmt.Sprintf("body: request bodies in flight exceed the server's budget of %d bytes; retry later", b.Limit)}
			}
			*held += grow
			d.grew(lent)
			nb := make([]byte, len(buf), c)
			copy(nb, buf)
			buf = nb
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			var ne net.Error
			switch {
			case errors.As(err, &mbe):
				return buf, &Error{http.StatusRequestEntityTooLarge, TooLarge, fmt.Sprintf("body: exceeds the limit of %d bytes", limit)}
			case errors.As(err, &ne) && ne.Timeout() && d.stalled():
				return buf, &Error{http.StatusRequestTimeout, Stalled,
					fmt.Sprintf("body: not received in time: it held the last of the server's budget for request bodies and stopped arriving for %v (%d bytes arrived)", b.Hold, len(buf))}
			case errors.As(err, &ne) && ne.Timeout():
				return buf, &Error{http.StatusRequestTimeout, Timeout, fmt.Sprintf("body: not received in time (%d bytes arrived)", len(buf))}
			}
			return buf, &Error{http.StatusBadRequest, Broken, fmt.Sprintf("body: read: %v", err)}
		}
	}
}

// deadlines sets the read deadline of a body lent a budget's reserve.
type deadlines struct {
	b     *Budget
	rc    *http.ResponseController // nil: the budget has no reserve
	start time.Time
	lent  bool // the deadline is Hold from the body's latest growth
}

// grew sets the deadline after a growth: Hold from now if it was lent the
// reserve, else the server's again if it was lent before.
func (d *deadlines) grew(lent bool) {
	if d.rc == nil || (!lent && !d.lent) {
		return
	}
	var t time.Time // no deadline
	if d.b.ReadTimeout > 0 {
		t = d.start.Add(d.b.ReadTimeout)
	}
	if hold := time.Now().Add(d.b.Hold); lent && (t.IsZero() || hold.Before(t)) {
		t = hold
	}
	// Not supported only by a ResponseWriter that is not net/http's
	// (a test's recorder): then the server's deadline alone applies.
	_ = d.rc.SetReadDeadline(t)
	d.lent = lent
}

// stalled reports whether a read deadline that passed was the reserve's
// rather than the server's.
func (d *deadlines) stalled() bool {
	return d.lent && (d.b.ReadTimeout <= 0 || time.Now().Before(d.start.Add(d.b.ReadTimeout)))
}
