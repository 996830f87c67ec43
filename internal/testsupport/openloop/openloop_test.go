package openloop

import (
	"sync/atomic"
	"testing"
	"time"
)

// marker is a Sender whose measured answer comes at the start of a
// longer exchange.
type marker struct {
	work time.Duration
	mark time.Time
	sent *atomic.Int64
}

func (m *marker) Send() error {
	m.mark = time.Now()
	m.sent.Add(1)
	<-time.After(m.work) // the rest of the exchange: not measured
	return nil
}

func (m *marker) Close()          {}
func (m *marker) Mark() time.Time { return m.mark }

// TestRunMarker: a Marker's requests are measured to its Mark, not to
// its Send's return; every request due is sent, none dropped.
func TestRunMarker(t *testing.T) {
	const work, rate, window = 200 * time.Millisecond, 200, 500 * time.Millisecond
	var sent atomic.Int64
	r := Run(func() (Sender, error) { return &marker{work: work, sent: &sent}, nil }, rate, 0, window)
	if r.Failed > 0 || r.Dropped > 0 || len(r.Latencies) != rate*int(window/time.Millisecond)/1000 || sent.Load() != int64(len(r.Latencies)) {
		t.Fatalf("%d answered, %d sent, %d failed, %d dropped", len(r.Latencies), sent.Load(), r.Failed, r.Dropped)
	}
	if p50 := Micros(r.Latencies, 0.5); p50 >= float64(work.Microseconds())/2 {
		t.Fatalf("p50 %.0f µs: measured to Send's return (%v), not to the mark", p50, work)
	}
}
