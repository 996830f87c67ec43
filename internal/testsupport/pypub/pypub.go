// Package pypub runs pypub.py, a clean-room vLLM-compatible KV-event
// publisher on real libzmq (pyzmq), from Go tests, and drives it over its
// stdin/stdout JSON-line protocol (documented at the top of pypub.py). It
// is test infrastructure: the events interop tests use it against the
// subscriber, the daemon tests against the whole daemon.
//
// The publisher needs /usr/bin/python3 with the Debian packages
// python3-zmq and python3-msgpack; without them the tests that use it fail
// (they never skip), because the libzmq ↔ go-zeromq boundary is the
// interop risk they exist to cover.
package pypub

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/internal/testsupport"
)

const (
	// Python is the interpreter that can import Debian's python3-zmq.
	Python = "/usr/bin/python3"
	// Wait bounds every single wait (a command answer).
	Wait = 10 * time.Second
)

// Script is the path of pypub.py, next to this file.
var Script = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "pypub.py")
}()

var (
	depsOnce sync.Once
	depsErr  error
)

// RequireDeps fails t unless /usr/bin/python3 can import zmq and
// msgpack.
func RequireDeps(t testing.TB) {
	t.Helper()
	depsOnce.Do(func() {
		out, err := exec.Command(Python, "-c", "import zmq, msgpack").CombinedOutput()
		if err != nil {
			depsErr = fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
		}
	})
	if depsErr != nil {
		t.Fatalf("%s cannot run %s: %v\n"+
			"`make test` installs python3-zmq python3-msgpack (Debian packages; or run "+
			"`sudo apt-get install -y python3-zmq python3-msgpack`). The script must run with "+
			"%s, not a pyenv/venv python that cannot see Debian packages.",
			Python, Script, depsErr, Python)
	}
}

// Pub drives one pypub.py process over its stdin/stdout JSON-line protocol.
// Its methods must be called from the test goroutine.
type Pub struct {
	t              testing.TB
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	lines          chan string   // stdout lines; closed at EOF
	stop           chan struct{} // closed at cleanup: stop delivering lines
	stderr         *testsupport.Buffer
	exited         bool
	Endpoint       string // PUB endpoint as bound (LAST_ENDPOINT)
	ReplayEndpoint string // ROUTER endpoint as bound; "" without one
}

// Start starts pypub.py bound to ephemeral loopback ports (PUB and
// ROUTER) plus args (later flags override earlier ones), waits for its
// endpoints line and kills it when the test ends.
func Start(t testing.TB, args ...string) *Pub {
	t.Helper()
	RequireDeps(t)
	argv := append([]string{Script,
		"--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0"}, args...)
	cmd := exec.Command(Python, argv...)
	p := &Pub{
		t:      t,
		cmd:    cmd,
		lines:  make(chan string, 16),
		stop:   make(chan struct{}),
		stderr: &testsupport.Buffer{},
	}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", Python, err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 256<<20)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			case <-p.stop:
				for sc.Scan() { // drain until the process is gone
				}
				return
			}
		}
	}()
	t.Cleanup(p.cleanup)

	var hello struct {
		Endpoint       string  `json:"endpoint"`
		ReplayEndpoint *string `json:"replay_endpoint"`
	}
	line := p.readLine()
	if err := json.Unmarshal([]byte(line), &hello); err != nil || hello.Endpoint == "" {
		t.Fatalf("pypub: bad startup line %q: %v", line, err)
	}
	p.Endpoint = hello.Endpoint
	if hello.ReplayEndpoint != nil {
		p.ReplayEndpoint = *hello.ReplayEndpoint
	}
	return p
}

func (p *Pub) cleanup() {
	close(p.stop)
	p.stdin.Close()
	if !p.exited {
		p.cmd.Process.Kill()
	}
	for range p.lines { // EOF once the process is gone
	}
	p.cmd.Wait()
}

// readLine returns the next stdout line, failing the test on EOF or after
// Wait.
func (p *Pub) readLine() string {
	p.t.Helper()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("pypub exited early; stderr:\n%s", p.stderr)
		}
		return line
	case <-timer.C:
		p.t.Fatalf("pypub: no answer within %v; stderr:\n%s", Wait, p.stderr)
	}
	return ""
}

// Call sends one command and returns its answer, failing unless it is ok.
func (p *Pub) Call(req map[string]any) map[string]any {
	p.t.Helper()
	line, err := json.Marshal(req)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("pypub: write %s: %v; stderr:\n%s", line, err, p.stderr)
	}
	answer := p.readLine()
	dec := json.NewDecoder(strings.NewReader(answer))
	dec.UseNumber()
	var resp map[string]any
	if err := dec.Decode(&resp); err != nil {
		p.t.Fatalf("pypub: bad answer %q to %s: %v", answer, line, err)
	}
	if resp["ok"] != true {
		p.t.Fatalf("pypub: %s failed: %s", line, answer)
	}
	return resp
}

func Uint(t testing.TB, v any) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("pypub: %v is not a number", v)
	}
	var u uint64
	if _, err := fmt.Sscan(n.String(), &u); err != nil {
		t.Fatalf("pypub: %v: %v", n, err)
	}
	return u
}

// Publish encodes one batch of events (pypub's JSON event objects), buffers
// it for replay and sends it on the PUB unless drop (a simulated high-water
// mark loss). It returns the batch's seq. The payload does not come back
// (PublishEcho's does): hex in JSON, it was most of the exchange's cost for
// padded batches under the race detector.
func (p *Pub) Publish(events []map[string]any, drop bool) uint64 {
	p.t.Helper()
	resp := p.Call(map[string]any{"cmd": "publish", "events": events, "drop": drop})
	return Uint(p.t, resp["seq"])
}

// PublishEcho is Publish that also returns the payload bytes.
func (p *Pub) PublishEcho(events []map[string]any, drop bool) (uint64, []byte) {
	p.t.Helper()
	resp := p.Call(map[string]any{"cmd": "publish", "events": events, "drop": drop, "echo": true})
	payload, err := hex.DecodeString(resp["payload"].(string))
	if err != nil {
		p.t.Fatal(err)
	}
	return Uint(p.t, resp["seq"]), payload
}

// Restart starts a new engine incarnation: seq back to 0, buffer cleared.
func (p *Pub) Restart() {
	p.t.Helper()
	p.Call(map[string]any{"cmd": "restart"})
}

// DropReplay makes the ROUTER skip each replay message (batches and end
// markers) with probability f, deterministically for a seed. f = 0 stops it.
func (p *Pub) DropReplay(f float64, seed int) {
	p.t.Helper()
	p.Call(map[string]any{"cmd": "drop_replay", "fraction": f, "seed": seed})
}

// StallReplay leaves replay requests unserviced for d.
func (p *Pub) StallReplay(d time.Duration) {
	p.t.Helper()
	p.Call(map[string]any{"cmd": "stall_replay", "seconds": d.Seconds()})
}

// State is the answer to {"cmd":"state"}.
type State struct {
	Seq        uint64    `json:"seq"`      // next seq
	Buffered   *[2]int64 `json:"buffered"` // first, last buffered seq
	Replays    int       `json:"replays"`  // requests serviced
	LastReplay *struct {
		Identity string `json:"identity"` // hex routing id libzmq saw
		Start    uint64 `json:"start"`
		Sent     int    `json:"sent"` // messages handed to libzmq, end included
		Dropped  int    `json:"dropped"`
		EndSent  bool   `json:"end_sent"`
	} `json:"last_replay"`
}

func (p *Pub) State() State {
	p.t.Helper()
	resp := p.Call(map[string]any{"cmd": "state"})
	raw, _ := json.Marshal(resp)
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		p.t.Fatal(err)
	}
	return st
}

// WaitReplays polls state until n replay requests have been serviced.
func (p *Pub) WaitReplays(n int) State {
	p.t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		st := p.State()
		if st.Replays >= n {
			return st
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("pypub serviced %d replay requests, want %d", st.Replays, n)
		}
	}
}

// Quit asks pypub to exit and waits for it.
func (p *Pub) Quit() {
	p.t.Helper()
	p.Call(map[string]any{"cmd": "quit"})
	p.stdin.Close()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-p.lines:
			if ok {
				continue
			}
			if err := p.cmd.Wait(); err != nil {
				p.t.Fatalf("pypub exit: %v; stderr:\n%s", err, p.stderr)
			}
			p.exited = true
			return
		case <-timer.C:
			p.t.Fatalf("pypub did not exit after quit")
		}
	}
}

// Event is pypub's event object for op, as a single-group vLLM engine on
// the GPU sends it (lora_name nil; no salt, no KV-cache group).
func Event(op indexer.Op) map[string]any {
	switch op.Kind {
	case indexer.OpStore:
		s := op.Store
		var parent any
		if s.HasParent {
			parent = s.Parent
		}
		return map[string]any{"type": "BlockStored", "block_hashes": s.Hashes, "parent_block_hash": parent,
			"token_ids": s.Tokens, "block_size": s.BlockSize, "medium": "GPU"}
	case indexer.OpRemove:
		return map[string]any{"type": "BlockRemoved", "block_hashes": op.Remove.Hashes, "medium": "GPU"}
	}
	return map[string]any{"type": "AllBlocksCleared"}
}
