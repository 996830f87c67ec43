package stream

// Interop tests against internal/testsupport/pypub/pypub.py, a clean-room vLLM-compatible
// publisher on real libzmq (pyzmq), consumed here with go-zeromq sockets and
// the events Decoder. The publisher needs /usr/bin/python3 with the Debian
// packages python3-zmq and python3-msgpack; without them these tests fail
// (they never skip), because the libzmq ↔ go-zeromq boundary is the interop
// risk they exist to cover.

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prefixd/prefixd/events/wire"
	"github.com/prefixd/prefixd/internal/testsupport/pypub"
)

const (
	// pyPubWait bounds every single wait (a command answer, one message).
	pyPubWait = pypub.Wait
	// pyPubTopic is the live topic the tests publish under (llm-d style).
	pyPubTopic = "kv@w1@m"
)

// pyPubSock is a go-zeromq socket whose Recv runs in a goroutine, so that the
// test can wait with a deadline.
type pyPubSock struct {
	s    zmq4.Socket
	msgs chan pyPubMsg
}

type pyPubMsg struct {
	frames [][]byte
	err    error
}

func pyPubDial(t testing.TB, s zmq4.Socket, ep string) *pyPubSock {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ps := &pyPubSock{s: s, msgs: make(chan pyPubMsg, 64)}
	t.Cleanup(func() {
		cancel()
		s.Close()
	})
	if err := s.Dial(ep); err != nil {
		t.Fatalf("dial %s: %v", ep, err)
	}
	go func() {
		for {
			m, err := s.Recv()
			select {
			case ps.msgs <- pyPubMsg{m.Frames, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ps
}

// pyPubSubscribe dials a SUB with a topic prefix filter.
func pyPubSubscribe(t testing.TB, ep, prefix string) *pyPubSock {
	t.Helper()
	s := zmq4.NewSub(context.Background())
	if err := s.SetOption(zmq4.OptionSubscribe, prefix); err != nil {
		t.Fatal(err)
	}
	return pyPubDial(t, s, ep)
}

// pyPubDealer dials a DEALER with a fixed identity.
func pyPubDealer(t testing.TB, ep, id string) *pyPubSock {
	t.Helper()
	return pyPubDial(t, zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity(id))), ep)
}

// tryRecv waits up to d for a message; ok is false on timeout.
func (ps *pyPubSock) tryRecv(t testing.TB, d time.Duration) (frames [][]byte, ok bool) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case m := <-ps.msgs:
		if m.err != nil {
			t.Fatalf("recv: %v", m.err)
		}
		return m.frames, true
	case <-timer.C:
		return nil, false
	}
}

func (ps *pyPubSock) recv(t testing.TB) [][]byte {
	t.Helper()
	frames, ok := ps.tryRecv(t, pyPubWait)
	if !ok {
		t.Fatalf("no message within %v", pyPubWait)
	}
	return frames
}

// requestReplay sends the DEALER replay request ["", start as 8 bytes BE].
func (ps *pyPubSock) requestReplay(t testing.TB, start uint64) {
	t.Helper()
	if err := ps.s.Send(zmq4.NewMsgFrom(wire.ReplayRequest(start)...)); err != nil {
		t.Fatalf("replay request: %v", err)
	}
}

// pyPubLive is one parsed live message [topic, seq, payload].
type pyPubLive struct {
	topic   string
	seq     uint64
	payload []byte
}

// pyPubParseLive checks a live message with the package's ParseLive.
func pyPubParseLive(t testing.TB, frames [][]byte) pyPubLive {
	t.Helper()
	seq, payload, err := wire.ParseLive(frames, nil)
	if err != nil {
		t.Fatalf("live message %x: %v", frames, err)
	}
	return pyPubLive{string(frames[0]), seq, payload}
}

// pyPubReplayMsg is one replay reply message as ParseReplay classifies it.
type pyPubReplayMsg struct {
	layout  string // "topic" (4 frames at the DEALER) or "legacy" (3)
	topic   string // topic layout only
	seq     uint64
	payload []byte
	end     bool
}

// pyPubParseReplay classifies a replay reply as received by a DEALER with the
// package's ParseReplay, and adds which layout it used and its topic frame.
func pyPubParseReplay(frames [][]byte) (pyPubReplayMsg, error) {
	var m pyPubReplayMsg
	var err error
	m.seq, m.payload, m.end, err = wire.ParseReplay(frames)
	if err != nil {
		return m, err
	}
	m.layout = "legacy"
	if len(frames) == 4 {
		m.layout, m.topic = "topic", string(frames[1])
	}
	return m, nil
}

// recvReplay collects one replay's batches up to and including its end
// marker, checking the layout.
func (ps *pyPubSock) recvReplay(t testing.TB, layout string) []pyPubReplayMsg {
	t.Helper()
	var out []pyPubReplayMsg
	for {
		m, err := pyPubParseReplay(ps.recv(t))
		if err != nil {
			t.Fatal(err)
		}
		if m.layout != layout {
			t.Fatalf("replay message in the %s layout, want %s", m.layout, layout)
		}
		if m.end {
			if m.topic != "" {
				t.Fatalf("end marker with topic frame %q, want empty", m.topic)
			}
			return out
		}
		out = append(out, m)
	}
}

// ---------------------------------------------------------------------------
// Test batches: Events (the expected decode) and their pypub JSON form.

func pyPubEventJSON(ev wire.Event) map[string]any {
	m := map[string]any{"type": ev.Kind.String()}
	hashes := func() []uint64 { return append([]uint64{}, ev.BlockHashes...) }
	strOrNil := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	switch ev.Kind {
	case wire.KindBlockStored:
		m["block_hashes"] = hashes()
		m["parent_block_hash"] = nil
		if ev.HasParent {
			m["parent_block_hash"] = ev.ParentHash
		}
		m["token_ids"] = append([]uint32{}, ev.TokenIDs...)
		m["block_size"] = ev.BlockSize
		m["medium"] = strOrNil(ev.Medium)
		if ev.HasLoraID {
			m["lora_id"] = ev.LoraID
		}
		m["lora_name"] = strOrNil(ev.LoraName)
	case wire.KindBlockRemoved:
		m["block_hashes"] = hashes()
		m["medium"] = strOrNil(ev.Medium)
	}
	return m
}

func pyPubJSON(evs []wire.Event) []map[string]any {
	out := make([]map[string]any, len(evs))
	for i, ev := range evs {
		out[i] = pyPubEventJSON(ev)
	}
	return out
}

func pyPubTokens(n int, vals ...uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = vals[i%len(vals)]
	}
	return out
}

// pyPubBatches are the interop batches: every hash width (fixint … u64 and
// values ≥ 2^63), token ids of every width, parents, nil media, LoRA fields,
// several events per batch and AllBlocksCleared.
func pyPubBatches() [][]wire.Event {
	const h = 0xFEDCBA9876543210
	return [][]wire.Event{
		{{Kind: wire.KindBlockStored, BlockHashes: []uint64{h, 1, 200, 70000, 1<<32 + 5, 1 << 63},
			TokenIDs:  pyPubTokens(24, 0, 1, 127, 128, 255, 256, 65535, 65536, 151000, 1<<32-1),
			BlockSize: 4, Medium: "GPU"}},
		{{Kind: wire.KindBlockStored, BlockHashes: []uint64{^uint64(0)}, ParentHash: h, HasParent: true,
			TokenIDs: pyPubTokens(16, 42), BlockSize: 16, LoraID: 7, HasLoraID: true, LoraName: "adapter"}},
		{
			{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{h, 1}, Medium: "CPU"},
			{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{0}},
			{Kind: wire.KindBlockStored, BlockHashes: []uint64{5}, ParentHash: 0, HasParent: true,
				TokenIDs: []uint32{9, 8}, BlockSize: 2, Medium: "GPU"},
		},
		{{Kind: wire.KindAllBlocksCleared}},
	}
}

// pyPubProbe is the batch published until a late SUB starts receiving.
var pyPubProbe = []wire.Event{{Kind: wire.KindAllBlocksCleared}}

// pyPubDiffEvents compares decoded events with the published ones.
func pyPubDiffEvents(want, got []wire.Event) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d events, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		switch {
		case w.Kind != g.Kind:
			return fmt.Sprintf("event %d: kind %v, want %v", i, g.Kind, w.Kind)
		case !slices.Equal(w.BlockHashes, g.BlockHashes):
			return fmt.Sprintf("event %d: hashes %x, want %x", i, g.BlockHashes, w.BlockHashes)
		case w.HasParent != g.HasParent || w.ParentHash != g.ParentHash:
			return fmt.Sprintf("event %d: parent %v/%x, want %v/%x", i, g.HasParent, g.ParentHash, w.HasParent, w.ParentHash)
		case !slices.Equal(w.TokenIDs, g.TokenIDs):
			return fmt.Sprintf("event %d: tokens %v, want %v", i, g.TokenIDs, w.TokenIDs)
		case w.BlockSize != g.BlockSize:
			return fmt.Sprintf("event %d: block size %d, want %d", i, g.BlockSize, w.BlockSize)
		case w.Medium != g.Medium:
			return fmt.Sprintf("event %d: medium %q, want %q", i, g.Medium, w.Medium)
		case w.HasLoraID != g.HasLoraID || w.LoraID != g.LoraID:
			return fmt.Sprintf("event %d: lora_id %v/%d, want %v/%d", i, g.HasLoraID, g.LoraID, w.HasLoraID, w.LoraID)
		case w.LoraName != g.LoraName:
			return fmt.Sprintf("event %d: lora_name %q, want %q", i, g.LoraName, w.LoraName)
		}
	}
	return ""
}

// pyPubCheckPayload decodes payload and compares it with the published
// events and rank; when enc is not nil it also re-encodes the decoded batch
// with the Go Encoder and requires the Python bytes.
func pyPubCheckPayload(t testing.TB, seq uint64, payload []byte, want []wire.Event, rank int32, enc *wire.Encoder) {
	t.Helper()
	var d wire.Decoder
	var b wire.Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatalf("seq %d: decode %x: %v", seq, payload, err)
	}
	if diff := pyPubDiffEvents(want, b.Events); diff != "" {
		t.Fatalf("seq %d: %s", seq, diff)
	}
	if !b.HasDPRank || b.DPRank != rank {
		t.Fatalf("seq %d: rank %v/%d, want %d", seq, b.HasDPRank, b.DPRank, rank)
	}
	if b.TS < 1e9 {
		t.Fatalf("seq %d: ts %v is not wall-clock seconds", seq, b.TS)
	}
	if enc != nil {
		again, err := enc.AppendBatch(nil, &b)
		if err != nil {
			t.Fatalf("seq %d: re-encode: %v", seq, err)
		}
		if !bytes.Equal(again, payload) {
			t.Fatalf("seq %d: Go Encoder{%v, %v} differs from pypub:\n go %x\n py %x", seq, enc.Era, enc.Hash, again, payload)
		}
	}
}

// pyPubJoin beats the slow joiner: it publishes probe batches until sub
// receives one, then consumes the probes still in flight. It returns the last
// seq received; every later batch reaches sub.
func pyPubJoin(t testing.TB, p *pypub.Pub, sub *pyPubSock) uint64 {
	t.Helper()
	deadline := time.Now().Add(pyPubWait)
	var first, last uint64
	for n := 0; ; n++ {
		last = p.Publish(pyPubJSON(pyPubProbe), false)
		if n == 0 {
			first = last
		}
		if frames, ok := sub.tryRecv(t, 20*time.Millisecond); ok {
			m := pyPubParseLive(t, frames)
			got := m.seq
			for m.seq < last {
				next := pyPubParseLive(t, sub.recv(t))
				if next.seq != m.seq+1 {
					t.Fatalf("live seq %d after %d", next.seq, m.seq)
				}
				m = next
			}
			t.Logf("slow joiner: %d probes (seqs %d..%d), the SUB's first live seq was %d",
				last-first+1, first, last, got)
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("SUB received nothing within %v of probing", pyPubWait)
		}
	}
}

// ---------------------------------------------------------------------------

func TestPyPubSelfTest(t *testing.T) {
	t.Parallel()
	pypub.RequireDeps(t)
	out, err := exec.Command(pypub.Python, pypub.Script, "--self-test").CombinedOutput()
	if err != nil {
		t.Fatalf("pypub --self-test: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("PASS")) || bytes.Count(out, []byte("ok ")) < 18 {
		t.Fatalf("pypub --self-test output:\n%s", out)
	}
}

func TestPyPubLiveInterop(t *testing.T) {
	t.Parallel()
	for _, era := range []wire.Era{wire.EraMap, wire.EraArray} {
		for _, hash := range []wire.HashType{wire.HashInt, wire.HashBytes} {
			t.Run(era.String()+"/"+hash.String(), func(t *testing.T) {
				const rank = 3
				p := pypub.Start(t, "--era", era.String(), "--hash", hash.String(),
					"--topic", pyPubTopic, "--rank", fmt.Sprint(rank))
				sub := pyPubSubscribe(t, p.Endpoint, "kv@w1@")
				last := pyPubJoin(t, p, sub)

				want := map[uint64][]wire.Event{}
				var lastSeq uint64
				for _, evs := range pyPubBatches() {
					lastSeq = p.Publish(pyPubJSON(evs), false)
					want[lastSeq] = evs
				}
				enc := &wire.Encoder{Era: era, Hash: hash}
				for seq := last + 1; seq <= lastSeq; seq++ {
					m := pyPubParseLive(t, sub.recv(t))
					if m.topic != pyPubTopic {
						t.Fatalf("topic %q, want %q", m.topic, pyPubTopic)
					}
					if m.seq != seq {
						t.Fatalf("live seq %d, want %d (contiguous)", m.seq, seq)
					}
					pyPubCheckPayload(t, m.seq, m.payload, want[m.seq], rank, enc)
				}
				p.Quit()
			})
		}
	}
}

func TestPyPubReplayInterop(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"topic", "legacy"} {
		t.Run(layout, func(t *testing.T) {
			p := pypub.Start(t, "--layout", layout, "--buffer-steps", "5", "--topic", pyPubTopic)
			batches := pyPubBatches()
			payloads := map[uint64][]byte{}
			events := map[uint64][]wire.Event{}
			for i := range 8 {
				evs := batches[i%len(batches)]
				seq, payload := p.PublishEcho(pyPubJSON(evs), false)
				if seq != uint64(i) {
					t.Fatalf("publish %d got seq %d", i, seq)
				}
				payloads[seq], events[seq] = payload, evs
			}
			if st := p.State(); st.Seq != 8 || st.Buffered == nil || *st.Buffered != [2]int64{3, 7} {
				t.Fatalf("state %+v, want seq 8 buffered [3 7]", st)
			}

			const id = "prefixd-test-dealer"
			d := pyPubDealer(t, p.ReplayEndpoint, id)
			// A DEALER request without the empty delimiter is invalid: no reply
			// at all (vLLM's ROUTER wants [identity, "", start]). The valid
			// request after it proves that.
			if err := d.s.Send(zmq4.NewMsg(wire.AppendSeq(nil, 0))); err != nil {
				t.Fatal(err)
			}
			replays := 0
			for _, tc := range []struct {
				start uint64
				want  []uint64
			}{
				{0, []uint64{3, 4, 5, 6, 7}}, // buffer rolled over: 3 > 0 means history lost
				{5, []uint64{5, 6, 7}},
				{7, []uint64{7}},
				{8, nil},
				{1 << 63, nil},
			} {
				d.requestReplay(t, tc.start)
				got := d.recvReplay(t, layout)
				var seqs []uint64
				for _, m := range got {
					seqs = append(seqs, m.seq)
					if layout == "topic" && m.topic != pyPubTopic {
						t.Fatalf("replayed topic %q, want %q", m.topic, pyPubTopic)
					}
					if !bytes.Equal(m.payload, payloads[m.seq]) {
						t.Fatalf("replayed seq %d payload differs from the live one", m.seq)
					}
					pyPubCheckPayload(t, m.seq, m.payload, events[m.seq], 0, nil)
				}
				if !slices.Equal(seqs, tc.want) {
					t.Fatalf("replay from %d: seqs %v, want %v", tc.start, seqs, tc.want)
				}
				replays++
			}
			st := p.State()
			if st.Replays != replays {
				t.Fatalf("pypub serviced %d requests, want %d (the invalid one must not count)", st.Replays, replays)
			}
			if st.LastReplay == nil || st.LastReplay.Identity != hex.EncodeToString([]byte(id)) {
				t.Fatalf("ROUTER saw identity %+v, want %x", st.LastReplay, id)
			}
			p.Quit()
		})
	}
}

func TestPyPubRestartAndDrops(t *testing.T) {
	t.Parallel()
	p := pypub.Start(t, "--topic", pyPubTopic, "--layout", "topic", "--era", "map")
	sub := pyPubSubscribe(t, p.Endpoint, pyPubTopic)
	d := pyPubDealer(t, p.ReplayEndpoint, "prefixd-restart")
	last := pyPubJoin(t, p, sub)
	batches := pyPubBatches()
	replays := 0
	replay := func(start uint64) []pyPubReplayMsg {
		t.Helper()
		d.requestReplay(t, start)
		replays++
		return d.recvReplay(t, "topic")
	}

	// A simulated PUB HWM drop: the seq is consumed and replayable, never live.
	dropped := p.Publish(pyPubJSON(batches[0]), true)
	sent := p.Publish(pyPubJSON(batches[1]), false)
	if dropped != last+1 || sent != last+2 {
		t.Fatalf("seqs %d, %d after %d", dropped, sent, last)
	}
	if m := pyPubParseLive(t, sub.recv(t)); m.seq != sent {
		t.Fatalf("live seq %d, want %d (the dropped %d must not arrive)", m.seq, sent, dropped)
	}
	got := replay(dropped)
	if len(got) != 2 || got[0].seq != dropped || got[1].seq != sent {
		t.Fatalf("replay from %d returned %d messages", dropped, len(got))
	}
	pyPubCheckPayload(t, dropped, got[0].payload, batches[0], 0, nil)
	pyPubCheckPayload(t, sent, got[1].payload, batches[1], 0, nil)

	// A new incarnation on the same sockets: seq restarts at 0, buffer empty.
	p.Restart()
	if st := p.State(); st.Seq != 0 || st.Buffered != nil {
		t.Fatalf("after restart: %+v", st)
	}
	if got := replay(0); len(got) != 0 {
		t.Fatalf("replay after restart returned %d batches, want only the end marker", len(got))
	}
	if seq := p.Publish(pyPubJSON(batches[2]), false); seq != 0 {
		t.Fatalf("first seq after restart %d, want 0", seq)
	}
	m := pyPubParseLive(t, sub.recv(t))
	if m.seq != 0 {
		t.Fatalf("live seq after restart %d, want 0", m.seq)
	}
	pyPubCheckPayload(t, 0, m.payload, batches[2], 0, nil)

	// A stalled replay servicer answers only after the stall.
	const stall = 300 * time.Millisecond
	p.StallReplay(stall)
	begin := time.Now()
	if got := replay(0); len(got) != 1 || got[0].seq != 0 {
		t.Fatalf("replay after stall returned %d batches, want seq 0", len(got))
	}
	if elapsed := time.Since(begin); elapsed < stall-50*time.Millisecond {
		t.Fatalf("replay answered after %v during a %v stall", elapsed, stall)
	}

	// Simulated ROUTER loss: deterministic per seed, counted by pypub so the
	// test knows how many messages to expect (no idle timeout needed).
	for range 30 {
		p.Publish(pyPubJSON(batches[3]), false)
	}
	for range 30 {
		pyPubParseLive(t, sub.recv(t))
	}
	lossy := func() (seqs []uint64, end bool) {
		t.Helper()
		p.DropReplay(0.5, 1)
		d.requestReplay(t, 0)
		replays++
		st := p.WaitReplays(replays)
		lr := st.LastReplay
		if lr.Sent+lr.Dropped != 32 { // 31 batches + end marker
			t.Fatalf("lossy replay: %+v, want 32 messages in all", lr)
		}
		for i := 0; i < lr.Sent; i++ {
			r, err := pyPubParseReplay(d.recv(t))
			if err != nil {
				t.Fatal(err)
			}
			if r.end {
				if i != lr.Sent-1 {
					t.Fatalf("end marker before the last sent message")
				}
				end = true
				continue
			}
			if len(seqs) > 0 && r.seq <= seqs[len(seqs)-1] {
				t.Fatalf("replay seq %d after %d", r.seq, seqs[len(seqs)-1])
			}
			seqs = append(seqs, r.seq)
		}
		if end != lr.EndSent {
			t.Fatalf("end marker received %v, pypub sent it %v", end, lr.EndSent)
		}
		return seqs, end
	}
	a, endA := lossy()
	b, endB := lossy()
	if !slices.Equal(a, b) || endA != endB {
		t.Fatalf("same seed, different loss: %v/%v vs %v/%v", a, endA, b, endB)
	}
	if len(a) == 0 || len(a) == 31 {
		t.Fatalf("drop_replay 0.5 kept %d of 31 batches", len(a))
	}
	t.Logf("drop_replay 0.5 seed 1: kept %d of 31 batches %v, end marker %v", len(a), a, endA)

	p.DropReplay(0, 0)
	if got := replay(0); len(got) != 31 {
		t.Fatalf("replay after drop_replay 0 returned %d batches, want 31", len(got))
	}
	p.Quit()
}
