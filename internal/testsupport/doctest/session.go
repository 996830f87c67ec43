package doctest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prefixd/prefixd/internal/testsupport"
)

// Session is one bash, in a network namespace of its own when the machine
// allows it (unshare -rn: a loopback of its own, so the addresses the
// documents write, localhost:8090 and the like, are free and no two
// sessions meet), running one command at a time. What a command starts in
// the background lives until Close. Not safe for concurrent use.
type Session struct {
	dir   string // where each command's output goes
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader // the shell's stdout: only the end marks
	mark  string
	n     int
	ran   []ran         // every command and its output file, in order
	done  chan struct{} // closed when the shell has exited
	exit  error
	Netns bool // whether the session has a network namespace of its own
	// Settle overrides the package's Settle for this session's commands
	// when positive.
	Settle time.Duration
	killed bool                // Run killed the session: its commands are gone
	stderr *testsupport.Buffer // the shell's own complaints
}

// Options say where and how a session runs.
type Options struct {
	Dir  string   // the commands' working directory
	Temp string   // a directory of the session's own, for outputs and TMPDIR
	Env  []string // the environment, besides TMPDIR
}

// NetnsSupported reports whether this machine lets a session have a network
// namespace of its own, and if not, why.
func NetnsSupported() error {
	out, err := exec.Command("unshare", "-rn", "sh", "-c", "ip link set lo up").CombinedOutput()
	if err != nil {
		return fmt.Errorf("unshare -rn: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Start starts a session's shell.
func Start(o Options) (*Session, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s := &Session{dir: o.Temp, mark: "doctest-end-" + hex.EncodeToString(b[:]), done: make(chan struct{}), stderr: &testsupport.Buffer{}}
	// pipefail: a pipeline fails when any of its commands does. Background
	// jobs keep a non-interactive shell's process group, so Close reaches
	// them all.
	const shell = "exec bash --noprofile --norc -o pipefail"
	if NetnsSupported() == nil {
		s.Netns = true
		s.cmd = exec.Command("unshare", "-rn", "bash", "-c", "ip link set lo up && "+shell)
	} else {
		s.cmd = exec.Command("bash", "-c", shell)
	}
	s.cmd.Dir = o.Dir
	s.cmd.Env = append(append([]string{}, o.Env...), "TMPDIR="+o.Temp)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.cmd.Stderr = s.stderr
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s.out = bufio.NewReader(stdout)
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		// Drain the marks' pipe to its end before Wait closes it.
		s.exit = s.cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// Result is what a command did.
type Result struct {
	Output string // stdout and stderr, as a terminal would show them
	Status int    // the exit status; a background command's is 0
}

// Run runs one command (a background one is started, not waited for) and
// returns what it printed. Past ctx's deadline it kills the session.
func (s *Session) Run(ctx context.Context, command string) (Result, error) {
	s.n++
	outFile := filepath.Join(s.dir, fmt.Sprintf("out.%d", s.n))
	s.ran = append(s.ran, ran{command, outFile})
	// The command's output, and its background jobs' for their life, goes
	// to a file of its own; its stdin is empty, as the shell's carries the
	// commands. The braces keep cd, export and jobs in the shell.
	script := fmt.Sprintf("{\n%s\n} >%s 2>&1 </dev/null\necho %s $?\n", command, shellQuote(outFile), s.mark)
	if _, err := io.WriteString(s.stdin, script); err != nil {
		return Result{}, fmt.Errorf("write to the session's shell: %w (%s)", err, s.stderr.String())
	}
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		l, err := s.out.ReadString('\n')
		got <- line{l, err}
	}()
	var l line
	select {
	case l = <-got:
	case <-ctx.Done():
		s.kill()
		s.killed = true
		<-got
		out, _ := os.ReadFile(outFile)
		return Result{Output: string(out)}, fmt.Errorf("not done in time: %w", ctx.Err())
	}
	out, _ := os.ReadFile(outFile)
	if l.err != nil {
		return Result{Output: string(out)}, fmt.Errorf("the session's shell ended: %v (%s)", l.err, s.stderr.String())
	}
	f := strings.Fields(l.s)
	if len(f) != 2 || f[0] != s.mark {
		return Result{Output: string(out)}, fmt.Errorf("the session's shell printed %q", l.s)
	}
	status, err := strconv.Atoi(f[1])
	if err != nil {
		return Result{}, err
	}
	return Result{Output: string(out), Status: status}, nil
}

// StopTimeout bounds how long Close waits for the session's processes to
// exit once asked.
const StopTimeout = 20 * time.Second

// Close stops what the session started: SIGTERM to each background job in
// turn, the last started first, waiting for each to exit, as a reader
// would stop them; then the shell exits.
// Past StopTimeout it kills the session's process group and says so.
func (s *Session) Close() error {
	// Last started, first stopped: a sidecar or a mocker deregisters while
	// the daemon's etcd still answers.
	_, _ = io.WriteString(s.stdin, "for p in $(jobs -p | tac); do kill $p 2>/dev/null; wait $p; done; exit 0\n")
	_ = s.stdin.Close()
	t := time.NewTimer(StopTimeout)
	defer t.Stop()
	select {
	case <-s.done:
		if s.killed {
			return nil // Run said why
		}
		return s.exit
	case <-t.C:
		s.kill()
		<-s.done
		return errors.New("the session's processes did not stop within " + StopTimeout.String() + " of SIGTERM; killed")
	}
}

func (s *Session) kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

type ran struct{ command, out string }

// Background returns what the session's background commands (the
// daemons) have printed so far, the end of each, for a failure's report.
func (s *Session) Background() string {
	var b strings.Builder
	for _, r := range s.ran {
		if !background(r.command) {
			continue
		}
		out, _ := os.ReadFile(r.out)
		fmt.Fprintf(&b, "--- %s\n%s\n", r.command, clip(string(out)))
	}
	return b.String()
}
