package zmtp

// Interop with real libzmq (pyzmq, testdata/libzmq_peer.py): a libzmq PUB
// publishing to a guarded go-zeromq SUB (the subscriber's path), and a
// libzmq SUB connecting to a guarded go-zeromq PUB (the listen path, whose
// prefetch must fit libzmq's greeting, sent in steps). The peer needs
// /usr/bin/python3 with the Debian package python3-zmq; without it these
// tests fail, never skip: `make test` installs it.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

const (
	libzmqPython = "/usr/bin/python3"
	libzmqScript = "testdata/libzmq_peer.py"
)

// interopSizes are the payload sizes messages cycle through; the script
// has the same list.
var interopSizes = []int{0, 1, 255, 256, 2048, 70000, 1 << 20}

// interopMsg returns message i as the script builds it.
func interopMsg(i uint64) [][]byte {
	return [][]byte{[]byte("kv@w1@m"), seq(i), payload(i, int64(interopSizes[i%uint64(len(interopSizes))]))}
}

// interopDigest is the script's digest of frames.
func interopDigest(frames [][]byte) string {
	h := sha256.New()
	for _, f := range frames {
		_ = binary.Write(h, binary.BigEndian, uint64(len(f)))
		h.Write(f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// libzmqPeer is one run of the script.
type libzmqPeer struct {
	stdin io.WriteCloser
	lines chan string // stdout lines; closed at EOF
}

// startLibzmq runs the script with args, stopped at cleanup.
func startLibzmq(t *testing.T, args ...string) *libzmqPeer {
	t.Helper()
	if out, err := exec.Command(libzmqPython, "-c", "import zmq").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import zmq (%v: %s). Install the Debian package python3-zmq "+
			"(`make test` does, through scripts/test-deps.sh; or `apt-get install -y python3-zmq`). "+
			"The test runs %s itself, not a pyenv or venv python that cannot see Debian packages.",
			libzmqPython, err, bytes.TrimSpace(out), libzmqPython)
	}
	cmd := exec.Command(libzmqPython, append([]string{libzmqScript}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &libzmqPeer{stdin: stdin, lines: make(chan string, 1024)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // the test stopped reading; keep draining
			}
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close() // the script exits when stdin closes
		exited := make(chan error, 1)
		go func() { wg.Wait(); exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s %v: %v\n%s", libzmqScript, args, err, stderr.String())
			}
		case <-time.After(wait):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s %v did not exit when its stdin closed", libzmqScript, args)
		}
	})
	return p
}

// TestLibzmqPubToGuardedSub: a guarded go-zeromq SUB receives a libzmq
// PUB's messages of every size byte-identical.
func TestLibzmqPubToGuardedSub(t *testing.T) {
	t.Parallel()
	py := startLibzmq(t, "pub")
	var ep string
	select {
	case ep = <-py.lines:
	case <-time.After(wait):
		t.Fatal("the libzmq PUB printed no endpoint")
	}
	sub := newSocket(t, t.Context(), zmq4.Sub, Limits{MaxMessageBytes: 2 << 20})
	if err := sub.Dial(guarded(ep)); err != nil {
		t.Fatalf("Dial %s: %v", ep, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	deadline := time.Now().Add(3 * wait)
	for len(seen) < len(interopSizes) {
		if time.Now().After(deadline) {
			t.Fatalf("received sizes %v, want all of %v", seen, interopSizes)
		}
		r := within(t, wait, "Recv", recvAsync(sub))
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.msg.Frames) != 3 || len(r.msg.Frames[1]) != 8 {
			t.Fatalf("message of %d frames", len(r.msg.Frames))
		}
		i := binary.BigEndian.Uint64(r.msg.Frames[1])
		if !sameFrames(r.msg.Frames, interopMsg(i)) {
			t.Fatalf("message %d differs from what the libzmq PUB sent", i)
		}
		seen[len(r.msg.Frames[2])] = true
	}
}

// TestLibzmqSubToGuardedPub: a libzmq SUB connects to a guarded go-zeromq
// PUB and receives its messages of every size byte-identical.
func TestLibzmqSubToGuardedPub(t *testing.T) {
	t.Parallel()
	pub := newSocket(t, t.Context(), zmq4.Pub, Limits{})
	listenGuarded(t, pub)
	py := startLibzmq(t, "sub", "tcp://"+pub.Addr().String())
	subscribed(t, pub)
	seen := map[int]bool{}
	tick := time.NewTicker(5 * time.Millisecond) // publishing pace, not synchronisation
	defer tick.Stop()
	deadline := time.After(3 * wait)
	for i := uint64(0); len(seen) < len(interopSizes); {
		select {
		case <-tick.C:
			if err := pub.Send(zmq4.NewMsgFrom(interopMsg(i)...)); err != nil {
				t.Fatal(err)
			}
			i++
		case l, ok := <-py.lines:
			if !ok {
				t.Fatalf("%s exited", libzmqScript)
			}
			n, digest, _ := strings.Cut(l, " ")
			got, err := strconv.ParseUint(n, 10, 64)
			if err != nil {
				t.Fatalf("bad line %q from the libzmq SUB", l)
			}
			msg := interopMsg(got)
			if want := interopDigest(msg); digest != want {
				t.Fatalf("libzmq SUB got message %d with digest %s, want %s", got, digest, want)
			}
			seen[len(msg[2])] = true
		case <-deadline:
			t.Fatalf("the libzmq SUB received sizes %v, want all of %v", fmt.Sprint(seen), interopSizes)
		}
	}
}
