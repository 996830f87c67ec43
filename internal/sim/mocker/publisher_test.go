package mocker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/testsupport"
)

// Publisher tests run real go-zeromq sockets over TCP loopback. They never
// sleep to synchronise: they wait for conditions with deadlines. The only
// fixed windows are the probe interval of joinLive (publish, wait briefly
// for the SUB, repeat: a SUB misses what is published before its
// subscription reaches the PUB, the ZMQ slow joiner) and the window in which
// a stalled replay must stay silent.

const (
	loopback = "tcp://127.0.0.1:0"
	waitFor  = 10 * time.Second // deadline for anything that must happen
)

// startPublisher runs a Publisher until the test ends and waits for Ready.
// The cleanup cancels Run and fails the test if Run does not return.
func startPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runPublisher(t, p)
	t.Cleanup(stop)
	return p
}

// runPublisher starts p.Run, waits for Ready and returns a function that
// cancels Run and waits for it to return.
func runPublisher(t *testing.T, p *Publisher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("Run returned before Ready: %v", err)
	case <-time.After(waitFor):
		cancel()
		t.Fatal("publisher not ready")
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(waitFor):
				t.Error("Run did not return after cancel")
			}
		})
	}
}

// recvAll receives from s in a goroutine until s is closed at the end of the
// test, and returns the messages.
func recvAll(t *testing.T, s zmq4.Socket) <-chan zmq4.Msg {
	ch := make(chan zmq4.Msg, 4096)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			select {
			case ch <- m:
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		close(done)
		<-exited
	})
	return ch
}

func dialSub(t *testing.T, ep string, prefixes ...string) <-chan zmq4.Msg {
	t.Helper()
	s := zmq4.NewSub(context.Background())
	if err := s.Dial(ep); err != nil {
		s.Close()
		t.Fatal(err)
	}
	for _, pr := range prefixes {
		if err := s.SetOption(zmq4.OptionSubscribe, pr); err != nil {
			s.Close()
			t.Fatal(err)
		}
	}
	return recvAll(t, s)
}

func dialDealer(t *testing.T, ep string) (zmq4.Socket, <-chan zmq4.Msg) {
	t.Helper()
	s := zmq4.NewDealer(context.Background())
	if err := s.Dial(ep); err != nil {
		s.Close()
		t.Fatal(err)
	}
	return s, recvAll(t, s)
}

func recvMsg(t *testing.T, ch <-chan zmq4.Msg) zmq4.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitFor):
		t.Fatal("no message")
		return zmq4.Msg{}
	}
}

func payloadOf(tag string, seq uint64) []byte { return fmt.Appendf(nil, "%s-%d", tag, seq) }

func publish(t *testing.T, p *Publisher, tag string) uint64 {
	t.Helper()
	seq, err := p.Publish(context.Background(), payloadOf(tag, p.Seq()))
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func publishN(t *testing.T, p *Publisher, tag string, n int) {
	t.Helper()
	for range n {
		publish(t, p, tag)
	}
}

// joinLive publishes probe batches tagged tag until the SUB receives one,
// and returns that message (the slow joiner: the first seq a SUB sees is
// unpredictable, so contiguity is checked from there).
func joinLive(t *testing.T, p *Publisher, sub <-chan zmq4.Msg, tag string) zmq4.Msg {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		publish(t, p, tag)
		select {
		case m := <-sub:
			return m
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			t.Fatal("SUB never received a live batch")
		}
	}
}

// liveSeq parses a live message, checking the topic frame and the payload.
func liveSeq(t *testing.T, m zmq4.Msg, topic, tag string) uint64 {
	t.Helper()
	seq, payload, err := wire.ParseLive(m.Frames, []byte(topic))
	if err != nil {
		t.Fatalf("live message %q: %v", m.Frames, err)
	}
	if string(m.Frames[0]) != topic {
		t.Fatalf("topic frame %q, want %q", m.Frames[0], topic)
	}
	if want := payloadOf(tag, seq); !bytes.Equal(payload, want) {
		t.Fatalf("seq %d: payload %q, want %q", seq, payload, want)
	}
	return seq
}

// replayed is one replay as received up to its end marker: the batch seqs
// and payloads.
type replayed struct {
	seqs     []uint64
	payloads [][]byte
}

// readReplay receives one replay up to and including its end marker,
// checking every message's frames for layout.
func readReplay(t *testing.T, ch <-chan zmq4.Msg, layout ReplayLayout, topic string) replayed {
	t.Helper()
	var r replayed
	for {
		m := recvMsg(t, ch)
		seq, payload, end, err := wire.ParseReplay(m.Frames)
		if err != nil {
			t.Fatalf("replay message %q: %v", m.Frames, err)
		}
		checkReplayFrames(t, m.Frames, layout, topic, end)
		if end {
			return r
		}
		r.seqs = append(r.seqs, seq)
		r.payloads = append(r.payloads, payload)
	}
}

func checkReplayFrames(t *testing.T, frames [][]byte, layout ReplayLayout, topic string, end bool) {
	t.Helper()
	switch layout {
	case ReplayTopic:
		if len(frames) != 4 {
			t.Fatalf("topic layout: %d frames %q, want 4", len(frames), frames)
		}
		want := topic
		if end {
			want = "" // the end marker's topic frame is always empty
		}
		if string(frames[1]) != want {
			t.Fatalf("topic frame %q, want %q (end=%v)", frames[1], want, end)
		}
	case ReplayLegacy:
		if len(frames) != 3 {
			t.Fatalf("legacy layout: %d frames %q, want 3", len(frames), frames)
		}
	}
}

// checkReplay checks that r is exactly the batches first..last (inclusive;
// none if last < first) with their tag's payloads.
func checkReplay(t *testing.T, r replayed, tag string, first, last int) {
	t.Helper()
	var want []uint64
	for s := first; s <= last; s++ {
		want = append(want, uint64(s))
	}
	if !slices.Equal(r.seqs, want) {
		t.Fatalf("replayed seqs %v, want %v", r.seqs, want)
	}
	for i, s := range r.seqs {
		if w := payloadOf(tag, s); !bytes.Equal(r.payloads[i], w) {
			t.Fatalf("replayed seq %d: payload %q, want %q", s, r.payloads[i], w)
		}
	}
}

func requestReplay(t *testing.T, d zmq4.Socket, start uint64) {
	t.Helper()
	if err := d.SendMulti(zmq4.NewMsgFrom(wire.ReplayRequest(start)...)); err != nil {
		t.Fatal(err)
	}
}

func TestPublisherConfig(t *testing.T) {
	t.Parallel()
	bad := []PublisherConfig{
		{},
		{Endpoint: loopback, BufferSteps: -1},
		{Endpoint: loopback, Layout: 2},
		{Endpoint: loopback, DropLive: -0.1},
		{Endpoint: loopback, DropReplay: 1.5},
		{Endpoint: loopback, DropLive: math.NaN()},
	}
	for _, cfg := range bad {
		if _, err := NewPublisher(cfg); err == nil {
			t.Errorf("NewPublisher(%+v) accepted", cfg)
		}
	}
	p, err := NewPublisher(PublisherConfig{Endpoint: loopback})
	if err != nil {
		t.Fatal(err)
	}
	if p.cfg.BufferSteps != DefaultBufferSteps || p.cfg.Layout != ReplayTopic {
		t.Errorf("defaults: BufferSteps %d, Layout %v", p.cfg.BufferSteps, p.cfg.Layout)
	}
	if _, err := p.Publish(context.Background(), []byte("x")); !errors.Is(err, ErrPublisherNotRunning) {
		t.Errorf("Publish before Run: %v, want ErrPublisherNotRunning", err)
	}
	if p.Endpoint() != "" || p.Seq() != 0 {
		t.Errorf("before Run: Endpoint %q, Seq %d", p.Endpoint(), p.Seq())
	}
}

func TestPublisherRunErrors(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{Endpoint: loopback})
	if p.ReplayEndpoint() != "" {
		t.Errorf("ReplayEndpoint %q without a replay socket", p.ReplayEndpoint())
	}
	if err := p.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
	if _, err := p.Publish(context.Background(), nil); err == nil {
		t.Error("empty payload accepted")
	}
	if p.Seq() != 0 {
		t.Errorf("rejected Publish consumed a seq: next %d", p.Seq())
	}

	// Binding a port in use fails Run and leaves Ready open.
	for _, cfg := range []PublisherConfig{
		{Endpoint: p.Endpoint()},
		{Endpoint: loopback, ReplayEndpoint: p.Endpoint()},
		{Endpoint: "nope://x"},
	} {
		q, err := NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Run(context.Background()); err == nil {
			t.Errorf("Run(%+v) succeeded", cfg)
		}
		select {
		case <-q.Ready():
			t.Errorf("Ready closed after a failed Run(%+v)", cfg)
		default:
		}
	}

	// After Run has returned, Publish refuses.
	q, err := NewPublisher(PublisherConfig{Endpoint: loopback})
	if err != nil {
		t.Fatal(err)
	}
	runPublisher(t, q)()
	if _, err := q.Publish(context.Background(), []byte("x")); !errors.Is(err, ErrPublisherNotRunning) {
		t.Errorf("Publish after Run: %v, want ErrPublisherNotRunning", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Publish(ctx, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a cancelled ctx: %v", err)
	}
}

// TestPublisherLiveFraming: a go-zeromq SUB receives [topic, seq8, payload]
// with contiguous seqs, and Publish numbers batches 0, 1, 2, ….
func TestPublisherLiveFraming(t *testing.T) {
	t.Parallel()
	const topic = "kv@pod1@m"
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, Topic: topic})
	if ep := p.Endpoint(); !strings.HasPrefix(ep, "tcp://127.0.0.1:") || strings.HasSuffix(ep, ":0") {
		t.Fatalf("Endpoint() = %q, want the real port", ep)
	}
	sub := dialSub(t, p.Endpoint(), "kv@pod1")

	first := liveSeq(t, joinLive(t, p, sub, "live"), topic, "live")
	const more = 100
	var want uint64
	for range more {
		want = publish(t, p, "live")
	}
	if want != p.Seq()-1 {
		t.Fatalf("Publish returned %d, Seq() %d", want, p.Seq())
	}
	for s := first + 1; s <= want; s++ {
		if got := liveSeq(t, recvMsg(t, sub), topic, "live"); got != s {
			t.Fatalf("live seq %d after %d, want %d (no loss without DropLive)", got, s-1, s)
		}
	}
}

// TestPublisherLiveTopicFilter: the topic frame is what SUB prefix filters
// select on. One SUB is connected to two publishers and subscribes to one's
// topic only.
func TestPublisherLiveTopicFilter(t *testing.T) {
	t.Parallel()
	p1 := startPublisher(t, PublisherConfig{Endpoint: loopback, Topic: "kv@pod1@m"})
	p2 := startPublisher(t, PublisherConfig{Endpoint: loopback, Topic: "kv@pod2@m"})
	s := zmq4.NewSub(context.Background())
	for _, ep := range []string{p1.Endpoint(), p2.Endpoint()} {
		if err := s.Dial(ep); err != nil {
			s.Close()
			t.Fatal(err)
		}
	}
	if err := s.SetOption(zmq4.OptionSubscribe, "kv@pod2"); err != nil {
		s.Close()
		t.Fatal(err)
	}
	sub := recvAll(t, s)

	// Publish on both until pod2's batches flow, then a further 50 on both.
	first := liveSeq(t, joinLive(t, p2, sub, "b"), "kv@pod2@m", "b")
	for range 50 {
		publish(t, p1, "a")
		publish(t, p2, "b")
	}
	last := p2.Seq() - 1
	for s := first + 1; s <= last; s++ {
		m := recvMsg(t, sub)
		if string(m.Frames[0]) != "kv@pod2@m" {
			t.Fatalf("received topic %q through a kv@pod2 subscription", m.Frames[0])
		}
		if got := liveSeq(t, m, "kv@pod2@m", "b"); got != s {
			t.Fatalf("seq %d, want %d", got, s)
		}
	}
}

// TestPublisherReplay: a DEALER's ReplayRequest(start) gets exactly the
// buffered batches >= start, then the end marker, in both layouts.
func TestPublisherReplay(t *testing.T) {
	t.Parallel()
	for _, layout := range []ReplayLayout{ReplayTopic, ReplayLegacy} {
		t.Run(layout.String(), func(t *testing.T) {
			const topic = "kv@pod1@m"
			p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback, Topic: topic, Layout: layout})
			q := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback, Topic: topic, Layout: layout, BufferSteps: 5})
			d, replies := dialDealer(t, p.ReplayEndpoint())
			dq, qreplies := dialDealer(t, q.ReplayEndpoint())

			// Empty buffer: only the end marker.
			requestReplay(t, d, 0)
			checkReplay(t, readReplay(t, replies, layout, topic), "r", 0, -1)

			publishN(t, p, "r", 20)
			publishN(t, q, "r", 20)
			for _, tc := range []struct {
				name        string
				dealer      zmq4.Socket
				ch          <-chan zmq4.Msg
				start       uint64
				first, last int
			}{
				{"all", d, replies, 0, 0, 19},
				{"from the middle", d, replies, 7, 7, 19},
				{"only the newest", d, replies, 19, 19, 19},
				{"newer than the buffer", d, replies, 20, 0, -1},
				{"far newer", d, replies, 1 << 40, 0, -1},
				// BufferSteps 5: asked for 0, the publisher sends what it
				// still has, 15..19, with no signal of the loss.
				{"older than the buffer", dq, qreplies, 0, 15, 19},
				{"just inside the buffer", dq, qreplies, 15, 15, 19},
				{"inside the buffer", dq, qreplies, 17, 17, 19},
			} {
				requestReplay(t, tc.dealer, tc.start)
				r := readReplay(t, tc.ch, layout, topic)
				t.Logf("%s: start %d → %v", tc.name, tc.start, r.seqs)
				checkReplay(t, r, "r", tc.first, tc.last)
			}
			// The counter moves after the write returns, possibly after
			// the DEALER has read the message.
			testsupport.Eventually(t, waitFor, "40 replay messages counted", func() bool { return p.Stats().ReplaySent == 20+13+1+6 })
			if st := p.Stats(); st.ReplayRequests != 6 || st.InvalidRequests != 0 || st.ReplaySent != 20+13+1+6 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestPublisherReplayRequestParse(t *testing.T) {
	t.Parallel()
	id := []byte("client")
	tests := []struct {
		frames [][]byte
		start  uint64
		ok     bool
	}{
		{[][]byte{id, {}, wire.AppendSeq(nil, 5)}, 5, true},
		{[][]byte{id, nil, wire.AppendSeq(nil, 1<<63)}, 1 << 63, true},
		// vLLM parses start as a big-endian integer of any length.
		{[][]byte{id, {}, {}}, 0, true},
		{[][]byte{id, {}, {0x01, 0x02}}, 0x0102, true},
		{[][]byte{id, {}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 7}}, 7, true},
		{[][]byte{id, {}, {1, 0, 0, 0, 0, 0, 0, 0, 0}}, math.MaxUint64, true},
		// Invalid: a DEALER without the delimiter, extra frames, a
		// non-empty delimiter.
		{[][]byte{id, wire.AppendSeq(nil, 5)}, 0, false},
		{[][]byte{id, {}, wire.AppendSeq(nil, 5), {}}, 0, false},
		{[][]byte{id, {'x'}, wire.AppendSeq(nil, 5)}, 0, false},
		{[][]byte{id}, 0, false},
	}
	for _, tt := range tests {
		gotID, start, ok := parseReplayRequest(tt.frames)
		if ok != tt.ok || start != tt.start || (ok && !bytes.Equal(gotID, id)) {
			t.Errorf("parseReplayRequest(%q) = (%q, %d, %v), want (%q, %d, %v)", tt.frames, gotID, start, ok, id, tt.start, tt.ok)
		}
	}
}

// TestPublisherReplayInvalidRequest: requests the ROUTER does not see as
// [identity, "", start] get no reply at all.
func TestPublisherReplayInvalidRequest(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback})
	publishN(t, p, "r", 5)
	d, replies := dialDealer(t, p.ReplayEndpoint())

	// A DEALER forgetting the empty delimiter (the ROUTER sees
	// [identity, start8]), and one sending a non-empty delimiter.
	if err := d.SendMulti(zmq4.NewMsgFrom(wire.AppendSeq(nil, 0))); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte("x"), wire.AppendSeq(nil, 1))); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, waitFor, "2 invalid requests counted", func() bool { return p.Stats().InvalidRequests == 2 })

	// The next reply on the same socket belongs to the valid request that
	// follows: 3, 4, end — not 0.. or 1.. from the invalid ones.
	requestReplay(t, d, 3)
	checkReplay(t, readReplay(t, replies, ReplayTopic, ""), "r", 3, 4)
	requestReplay(t, d, 4)
	checkReplay(t, readReplay(t, replies, ReplayTopic, ""), "r", 4, 4)
	if st := p.Stats(); st.ReplayRequests != 2 || st.InvalidRequests != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestPublisherReplayToRequester: replies go to the requesting identity
// only, even with several DEALERs connected.
func TestPublisherReplayToRequester(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback})
	publishN(t, p, "r", 3)
	d1, r1 := dialDealer(t, p.ReplayEndpoint())
	d2, r2 := dialDealer(t, p.ReplayEndpoint())
	requestReplay(t, d1, 1)
	requestReplay(t, d2, 2)
	checkReplay(t, readReplay(t, r1, ReplayTopic, ""), "r", 1, 2)
	checkReplay(t, readReplay(t, r2, ReplayTopic, ""), "r", 2, 2)
	// d1 got nothing of d2's replay: its next replay starts clean.
	requestReplay(t, d1, 0)
	checkReplay(t, readReplay(t, r1, ReplayTopic, ""), "r", 0, 2)
}

// TestPublisherDropLive: with DropLive the SUB sees gaps, but the dropped
// batches are buffered and replay returns every seq.
func TestPublisherDropLive(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{
		Endpoint: loopback, ReplayEndpoint: loopback,
		DropLive: 0.3, Rand: rand.New(rand.NewPCG(1, 1)),
	})
	sub := dialSub(t, p.Endpoint(), "")
	prev := liveSeq(t, joinLive(t, p, sub, "l"), "", "l")
	publishN(t, p, "l", 300)
	last := p.Seq() - 1

	// Receive until a seq near the end (the tail may be dropped).
	gaps, got := 0, 1
	for prev < last-30 {
		s := liveSeq(t, recvMsg(t, sub), "", "l")
		if s <= prev {
			t.Fatalf("live seq %d after %d", s, prev)
		}
		if s > prev+1 {
			gaps++
		}
		prev = s
		got++
	}
	st := p.Stats()
	t.Logf("received %d live batches up to seq %d with %d gaps; stats %+v", got, prev, gaps, st)
	if gaps == 0 || st.LiveDropped == 0 {
		t.Fatalf("DropLive 0.3 made no gaps (%d dropped)", st.LiveDropped)
	}

	d, replies := dialDealer(t, p.ReplayEndpoint())
	requestReplay(t, d, 0)
	checkReplay(t, readReplay(t, replies, ReplayTopic, ""), "l", 0, int(last))
}

// TestPublisherDropReplay: with DropReplay some replay messages are missing
// (the end marker may be one of them, so the test waits on the counters).
func TestPublisherDropReplay(t *testing.T) {
	t.Parallel()
	for _, layout := range []ReplayLayout{ReplayTopic, ReplayLegacy} {
		t.Run(layout.String(), func(t *testing.T) {
			p := startPublisher(t, PublisherConfig{
				Endpoint: loopback, ReplayEndpoint: loopback, Topic: "t", Layout: layout,
				DropReplay: 0.5, Rand: rand.New(rand.NewPCG(7, 7)),
			})
			const n = 40
			publishN(t, p, "r", n)
			d, replies := dialDealer(t, p.ReplayEndpoint())
			requestReplay(t, d, 0)
			testsupport.Eventually(t, waitFor, "the replay to be written", func() bool {
				st := p.Stats()
				return st.ReplaySent+st.ReplayDropped == n+1
			})
			st := p.Stats()
			var seqs []uint64
			end := false
			for range st.ReplaySent { // TCP delivers every message written, in order
				m := recvMsg(t, replies)
				seq, payload, isEnd, err := wire.ParseReplay(m.Frames)
				if err != nil {
					t.Fatal(err)
				}
				checkReplayFrames(t, m.Frames, layout, "t", isEnd)
				if isEnd {
					end = true
					continue
				}
				if !bytes.Equal(payload, payloadOf("r", seq)) || (len(seqs) > 0 && seq <= seqs[len(seqs)-1]) {
					t.Fatalf("seq %d (payload %q) after %v", seq, payload, seqs)
				}
				seqs = append(seqs, seq)
			}
			t.Logf("received %v, end marker %v; stats %+v", seqs, end, st)
			if st.ReplayDropped == 0 || len(seqs) == n {
				t.Fatalf("DropReplay 0.5 dropped nothing")
			}
		})
	}
}

// TestPublisherRestart: after Restart seqs start at 0 again, live and in
// replay, and the old buffer is gone.
func TestPublisherRestart(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback})
	sub := dialSub(t, p.Endpoint(), "")
	old := liveSeq(t, joinLive(t, p, sub, "old"), "", "old")
	publishN(t, p, "old", 5)
	p.Restart()
	if p.Seq() != 0 {
		t.Fatalf("Seq() = %d after Restart", p.Seq())
	}
	publishN(t, p, "new", 3)

	// Live: the old incarnation's batches, then 0, 1, 2 of the new one.
	for {
		m := recvMsg(t, sub)
		if bytes.HasPrefix(m.Frames[2], []byte("old-")) {
			if s := liveSeq(t, m, "", "old"); s < old {
				t.Fatalf("old seq %d after %d", s, old)
			}
			continue
		}
		if s := liveSeq(t, m, "", "new"); s != 0 {
			t.Fatalf("first seq after Restart %d, want 0", s)
		}
		break
	}
	for want := uint64(1); want < 3; want++ {
		if s := liveSeq(t, recvMsg(t, sub), "", "new"); s != want {
			t.Fatalf("seq %d, want %d", s, want)
		}
	}

	d, replies := dialDealer(t, p.ReplayEndpoint())
	requestReplay(t, d, 0)
	checkReplay(t, readReplay(t, replies, ReplayTopic, ""), "new", 0, 2)
}

// TestPublisherStall: a stalled publisher reads requests but writes
// nothing until the stall ends.
func TestPublisherStall(t *testing.T) {
	t.Parallel()
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback})
	publishN(t, p, "r", 3)
	d, replies := dialDealer(t, p.ReplayEndpoint())
	p.Stall(time.Hour)
	requestReplay(t, d, 0)
	testsupport.Eventually(t, waitFor, "the request to be read", func() bool { return p.Stats().ReplayRequests == 1 })
	select {
	case m := <-replies:
		t.Fatalf("stalled publisher replied %q", m.Frames)
	case <-time.After(100 * time.Millisecond):
	}
	p.Stall(0)
	checkReplay(t, readReplay(t, replies, ReplayTopic, ""), "r", 0, 2)
}

// TestPublisherConcurrent publishes from two goroutines while replays are
// served and a SUB reads the live stream; run with -race.
func TestPublisherConcurrent(t *testing.T) {
	t.Parallel()
	const (
		maxPerWriter = 20_000
		wantReplays  = 20
	)
	p := startPublisher(t, PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback, BufferSteps: 2*maxPerWriter + 1000})
	sub := dialSub(t, p.Endpoint(), "")
	firstLive := joinLive(t, p, sub, "probe")
	base := p.Seq()

	var (
		mu   sync.Mutex
		sent = map[uint64][]byte{} // seq → payload as published
		wg   sync.WaitGroup
	)
	for s := range base {
		sent[s] = payloadOf("probe", s)
	}
	stop := make(chan struct{})
	for w := range 2 {
		wg.Go(func() {
			for i := range maxPerWriter {
				select {
				case <-stop:
					return
				default:
				}
				payload := fmt.Appendf(nil, "w%d-%d", w, i)
				seq, err := p.Publish(context.Background(), payload)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sent[seq] = payload
				mu.Unlock()
			}
		})
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	// Replays of the latest ~100 batches while the writers run, then one of
	// everything: each is contiguous from its start.
	d, replies := dialDealer(t, p.ReplayEndpoint())
	var replays []replayed
	during := 0
	for done := false; !done; {
		select {
		case <-writersDone:
			done = true
		default:
			if during == wantReplays {
				close(stop)
				<-writersDone
				done = true
			}
		}
		start := uint64(0)
		if n := p.Seq(); !done && n > 100 {
			start = n - 100
		}
		requestReplay(t, d, start)
		r := readReplay(t, replies, ReplayTopic, "")
		for i, s := range r.seqs {
			if s != start+uint64(i) {
				t.Fatalf("replay from %d not contiguous: %v", start, r.seqs)
			}
		}
		replays = append(replays, r)
		if !done {
			during++
		}
	}
	total := p.Seq()
	if uint64(len(sent)) != total {
		t.Fatalf("Seq() %d, %d distinct seqs published", total, len(sent))
	}
	for _, r := range replays {
		for i, s := range r.seqs {
			if !bytes.Equal(r.payloads[i], sent[s]) {
				t.Fatalf("replayed seq %d: payload %q, published %q", s, r.payloads[i], sent[s])
			}
		}
	}
	if last := replays[len(replays)-1]; uint64(len(last.seqs)) != total {
		t.Fatalf("final replay has %d batches, want %d", len(last.seqs), total)
	}

	// Live: wire order is seq order, contiguous after the join.
	prev, _, _ := wire.ParseLive(firstLive.Frames, nil)
	for prev < total-1 {
		m := recvMsg(t, sub)
		s, payload, err := wire.ParseLive(m.Frames, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s != prev+1 || !bytes.Equal(payload, sent[s]) {
			t.Fatalf("live seq %d (payload %q) after %d", s, payload, prev)
		}
		prev = s
	}
	t.Logf("%d replays served during %d publishes", during, total-base)
	if during < wantReplays {
		t.Logf("the writers finished first: only %d replays overlapped them", during)
	}
}

// TestPublisherRunStopsStalledReplay: Run returns on cancel even while a
// reply write is blocked on a DEALER that stopped reading (go-zeromq's
// ROUTER blocks on TCP back-pressure; it has no high-water mark).
func TestPublisherRunStopsStalledReplay(t *testing.T) {
	t.Parallel()
	p, err := NewPublisher(PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback, BufferSteps: 40})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPublisher(t, p)
	defer stop()
	big := bytes.Repeat([]byte{'x'}, 1<<20)
	for range 40 {
		if _, err := p.Publish(context.Background(), big); err != nil {
			t.Fatal(err)
		}
	}
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	if err := d.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	requestReplay(t, d, 0) // and never Recv
	testsupport.Eventually(t, waitFor, "the replay to start", func() bool { return p.Stats().ReplaySent > 0 })
	stop() // fails the test if Run does not return
	t.Logf("stopped with %d of 41 replay messages written", p.Stats().ReplaySent)
}

// publisherGoroutines counts live goroutines in go-zeromq or the
// Publisher, except go-zeromq's PUB queue writer, which never exits (see
// Run).
func publisherGoroutines() (int, string) {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var ours []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "zmq4.(*pubMWriter).run") {
			continue
		}
		if strings.Contains(g, "go-zeromq/zmq4") || strings.Contains(g, "mocker.(*Publisher)") {
			n++
			ours = append(ours, g)
		}
	}
	return n, strings.Join(ours, "\n\n")
}

// TestPublisherRunNoLeak: after Run returns and the clients are closed,
// no goroutine of the Publisher or its sockets is left (but for the
// go-zeromq PUB writer). Not parallel: it counts the whole process's
// goroutines.
func TestPublisherRunNoLeak(t *testing.T) {
	baseline, _ := publisherGoroutines()
	running := 0
	func() {
		p, err := NewPublisher(PublisherConfig{Endpoint: loopback, ReplayEndpoint: loopback})
		if err != nil {
			t.Fatal(err)
		}
		stop := runPublisher(t, p)
		defer stop()

		sub := zmq4.NewSub(context.Background())
		defer sub.Close()
		if err := sub.Dial(p.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			t.Fatal(err)
		}
		d := zmq4.NewDealer(context.Background())
		defer d.Close()
		if err := d.Dial(p.ReplayEndpoint()); err != nil {
			t.Fatal(err)
		}
		publishN(t, p, "r", 3)
		requestReplay(t, d, 0)
		for {
			m, err := d.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if _, _, end, err := wire.ParseReplay(m.Frames); err != nil || end {
				break
			}
		}
		running, _ = publisherGoroutines()
	}()
	var n int
	var dump string
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for n, dump = publisherGoroutines(); n > baseline; n, dump = publisherGoroutines() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left, baseline %d:\n%s", n, baseline, dump)
		}
		<-tick.C
	}
	t.Logf("goroutines: %d before, %d while running, %d after", baseline, running, n)
}
