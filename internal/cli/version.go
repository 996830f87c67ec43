package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// NewVersionCommand returns the version subcommand of the command named
// program, which prints VersionText. version is the release version main
// holds (its package variable, which release builds set with
// -ldflags "-X main.version=v1.2.3"), "dev" when unset.
func NewVersionCommand(program, version string) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the " + program + " version, Go version and VCS revision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi, _ := debug.ReadBuildInfo()
			_, err := fmt.Fprint(cmd.OutOrStdout(), VersionText(program, version, runtime.Version(), bi))
			return err
		},
	}
}

// VersionText formats the output of "<program> version":
//
//	prefixd v1.2.3
//	go: go1.26.8
//	revision: 0123abcd… (2026-01-02T03:04:05Z, modified)
//
// bi may be nil (binary built without module support). When v is "dev" and the
// toolchain recorded a module version (go install m@v, or a build stamped from
// VCS), that version is shown instead. The revision line reads "unknown" when
// the build carried no VCS information (go run, -buildvcs=false).
func VersionText(program, v, goVersion string, bi *debug.BuildInfo) string {
	var rev, when string
	var modified bool
	if bi != nil {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", program, v)
	fmt.Fprintf(&b, "go: %s\n", goVersion)
	if rev == "" {
		b.WriteString("revision: unknown\n")
		return b.String()
	}
	var notes []string
	if when != "" {
		notes = append(notes, when)
	}
	if modified {
		notes = append(notes, "modified")
	}
	fmt.Fprintf(&b, "revision: %s", rev)
	if len(notes) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(notes, ", "))
	}
	b.WriteString("\n")
	return b.String()
}
