package cursor

import (
	"testing"
	"time"
)

// BenchmarkCursorLive is the cursor's per-batch cost on the common path:
// live batches in order, each applied (digest included).
func BenchmarkCursorLive(b *testing.B) {
	c := New(Config{HasReplay: true})
	now := time.Now()
	c.Connected(now)
	c.ReplayEnd(c.Attempt(), now)
	payload := make([]byte, 1024) // a batch of ~32 stored blocks
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	var seq uint64
	for b.Loop() {
		if acts := c.Live(seq, payload, now); len(acts) != 1 || acts[0].Kind != ActApply {
			b.Fatalf("seq %d: %v", seq, acts)
		}
		seq++
	}
}
