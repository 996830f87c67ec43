package cli

import (
	"runtime/debug"
	"testing"
)

func TestVersionText(t *testing.T) {
	stamped := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/prefixd/prefixd", Version: "v0.0.0-20260102030405-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	devel := &debug.BuildInfo{Main: debug.Module{Path: "github.com/prefixd/prefixd", Version: "(devel)"}}

	tests := []struct {
		name    string
		version string
		bi      *debug.BuildInfo
		want    string
	}{
		{
			name:    "ldflags version wins over module version",
			version: "v1.2.3",
			bi:      stamped,
			want: "prefixd v1.2.3\ngo: go1.26.8\n" +
				"revision: 0123456789abcdef0123456789abcdef01234567 (2026-01-02T03:04:05Z, modified)\n",
		},
		{
			name:    "dev falls back to module version",
			version: "dev",
			bi:      stamped,
			want: "prefixd v0.0.0-20260102030405-0123456789ab+dirty\ngo: go1.26.8\n" +
				"revision: 0123456789abcdef0123456789abcdef01234567 (2026-01-02T03:04:05Z, modified)\n",
		},
		{
			name:    "no vcs information",
			version: "dev",
			bi:      devel,
			want:    "prefixd dev\ngo: go1.26.8\nrevision: unknown\n",
		},
		{
			name:    "no build info",
			version: "dev",
			bi:      nil,
			want:    "prefixd dev\ngo: go1.26.8\nrevision: unknown\n",
		},
		{
			name:    "revision without time or modification",
			version: "v1.0.0",
			bi: &debug.BuildInfo{Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "abc"},
				{Key: "vcs.modified", Value: "false"},
			}},
			want: "prefixd v1.0.0\ngo: go1.26.8\nrevision: abc\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := VersionText("prefixd", tt.version, "go1.26.8", tt.bi); got != tt.want {
				t.Errorf("VersionText() =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	// The first line names the program: prefixd-bench prints its own.
	if got, want := VersionText("prefixd-bench", "v1.0.0", "go1.26.8", nil), "prefixd-bench v1.0.0\ngo: go1.26.8\nrevision: unknown\n"; got != want {
		t.Errorf("VersionText(prefixd-bench) =\n%s\nwant\n%s", got, want)
	}
}
