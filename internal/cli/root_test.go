package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestNewRoot: output goes where it was sent, an error comes back once
// without the usage text, a flag error points at --help, and there is no
// completion subcommand.
func TestNewRoot(t *testing.T) {
	var out, errOut bytes.Buffer
	root := NewRoot("tool", "a tool", "a tool, at length", &out, &errOut)
	failed := errors.New("it failed")
	root.AddCommand(&cobra.Command{Use: "fail", RunE: func(*cobra.Command, []string) error { return failed }})
	root.AddCommand(&cobra.Command{Use: "hello", RunE: func(c *cobra.Command, _ []string) error {
		c.Println("hello")
		return nil
	}})

	run := func(args ...string) error {
		out.Reset()
		errOut.Reset()
		root.SetArgs(args)
		return root.Execute()
	}
	if err := run("hello"); err != nil || out.String() != "hello\n" {
		t.Errorf("hello: %v, stdout %q", err, out.String())
	}
	if err := run("fail"); !errors.Is(err, failed) || out.Len()+errOut.Len() != 0 {
		t.Errorf("fail: %v; printed %q and %q, want the error returned and nothing printed", err, out.String(), errOut.String())
	}
	if err := run("hello", "--no-such-flag"); err == nil || !strings.Contains(err.Error(), "Run 'tool hello --help' for usage") {
		t.Errorf("unknown flag: %v, want one pointing at 'tool hello --help'", err)
	}
	if err := run("completion", "bash"); err == nil {
		t.Error("completion bash: no error, want no such subcommand")
	}
}
