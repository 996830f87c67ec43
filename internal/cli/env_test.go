package cli

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestFromEnv: a flag not given takes PREFIXD_<FLAG>, dashes as
// underscores; a flag given keeps its value; an empty variable is ignored.
func TestFromEnv(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	every := fs.Duration("churn-every", time.Minute, "")
	rate := fs.Float64("rate", 200, "")
	csv := fs.String("csv", "", "")
	if err := fs.Parse([]string{"--rate", "50"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PREFIXD_CHURN_EVERY", "5s")
	t.Setenv("PREFIXD_RATE", "7")
	t.Setenv("PREFIXD_CSV", "")
	if err := FromEnv(fs); err != nil {
		t.Fatal(err)
	}
	if *every != 5*time.Second || *rate != 50 || *csv != "" {
		t.Errorf("churn-every %v, rate %v, csv %q; want 5s from the environment, 50 from the command line, empty", *every, *rate, *csv)
	}
}

// TestPrepare: a value a flag refuses is an error naming its variable,
// and Validate runs only after the environment is read.
func TestPrepare(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	rate := fs.Float64("rate", 200, "")
	t.Setenv("PREFIXD_RATE", "lots")
	err := Prepare(fs, validator(func() error { return nil }))
	if err == nil || !strings.Contains(err.Error(), `PREFIXD_RATE="lots"`) {
		t.Errorf("Prepare with PREFIXD_RATE=lots: %v, want an error naming the variable", err)
	}

	t.Setenv("PREFIXD_RATE", "0")
	bad := errors.New("--rate must be positive")
	err = Prepare(fs, validator(func() error {
		if *rate <= 0 {
			return bad
		}
		return nil
	}))
	if !errors.Is(err, bad) {
		t.Errorf("Prepare with PREFIXD_RATE=0: %v, want Validate's %v", err, bad)
	}
}

type validator func() error

func (v validator) Validate() error { return v() }
