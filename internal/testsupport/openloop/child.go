package openloop

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The environment through which a benchmark tells its generator process
// (the test binary re-executed by Child) what to send.
const (
	envBody   = "PREFIXD_OPENLOOP_BODY" // a file holding the request body
	envRate   = "PREFIXD_OPENLOOP_RATE"
	envWindow = "PREFIXD_OPENLOOP_WINDOW"
)

// Child returns the generator's process: the test binary re-executed
// with no test to run (its TestMain sees env and runs the generator),
// behind prefix (e.g. taskset and its arguments) if any. It gets the
// parent's environment but the Go runtime's tuning (GOGC, GOMEMLIMIT,
// GOMAXPROCS, GODEBUG), which is the server's, and the body file, rate
// and window ReadArgs gives back, then env.
func Child(prefix []string, bodyFile string, rate int, window time.Duration, env ...string) *exec.Cmd {
	args := append(slices.Clone(prefix), os.Args[0], "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains([]string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG"}, k) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envBody+"="+bodyFile, envRate+"="+strconv.Itoa(rate), envWindow+"="+window.String())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// ReadArgs returns, in the generator's process, the body, rate and
// window its Child was given.
func ReadArgs() (body []byte, rate int, window time.Duration, err error) {
	body, err = os.ReadFile(os.Getenv(envBody))
	rate, rerr := strconv.Atoi(os.Getenv(envRate))
	window, werr := time.ParseDuration(os.Getenv(envWindow))
	if err = errors.Join(err, rerr, werr); err == nil && rate <= 0 {
		err = fmt.Errorf("%s=%d: want a positive rate", envRate, rate)
	}
	return body, rate, window, err
}
