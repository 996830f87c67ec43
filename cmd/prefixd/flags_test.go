package main

import (
	"strings"
	"testing"
)

// TestEnumFlagsListTheirValues: a flag that takes one of a few names
// shows them in --help where a type would be ("--policy kv|random"), and
// each name listed is one the flag accepts.
func TestEnumFlagsListTheirValues(t *testing.T) {
	for _, tc := range []struct {
		command, flag string
		values        []string
	}{
		{"proxy", "policy", []string{"kv", "random"}},
		{"proxy", "disagg-order", []string{"decode-first", "prefill-first"}},
		{"proxy", "disagg-policy", []string{"off", "isl_bounding", "prefill_load", "isl_or_load"}},
		{"proxy", "prefill-failure", []string{"free_decode", "bypass_on_decode"}},
		{"proxy", "log-level", []string{"debug", "info", "warn", "error"}},
		{"serve", "disagg-order", []string{"decode-first", "prefill-first"}},
		{"serve", "disagg-policy", []string{"off", "isl_bounding", "prefill_load", "isl_or_load"}},
		{"serve", "prefill-failure", []string{"free_decode", "bypass_on_decode"}},
		{"serve", "epp-body-mode", []string{"full-duplex", "buffered"}},
		{"serve", "log-level", []string{"debug", "info", "warn", "error"}},
		{"mocker", "role", []string{"aggregated", "prefill", "decode"}},
		{"mocker", "era", []string{"map", "array"}},
		{"mocker", "replay-layout", []string{"topic", "legacy"}},
		{"mocker", "flavor", []string{"vllm", "sglang"}},
		{"sidecar", "role", []string{"aggregated", "prefill", "decode", "encoder"}},
		{"sidecar", "kv-transfer-enforcement", []string{"required", "preferred"}},
	} {
		t.Run(tc.command+" --"+tc.flag, func(t *testing.T) {
			help, _, err := run(t, tc.command, "--help")
			if err != nil {
				t.Fatal(err)
			}
			want := "--" + tc.flag + " " + strings.Join(tc.values, "|") + " "
			if !strings.Contains(help, want) {
				t.Fatalf("%s --help lacks %q:\n%s", tc.command, want, help)
			}
			for _, v := range tc.values {
				cmd := newRootCommand(&strings.Builder{}, &strings.Builder{})
				sub, _, err := cmd.Find([]string{tc.command})
				if err != nil {
					t.Fatal(err)
				}
				if err := sub.Flags().Set(tc.flag, v); err != nil {
					t.Errorf("--%s %s: %v", tc.flag, v, err)
				}
			}
		})
	}
}

// TestDisaggPolicyHelp: --disagg-policy's help says what the default
// does and which policy the demo uses.
func TestDisaggPolicyHelp(t *testing.T) {
	for _, command := range []string{"serve", "proxy"} {
		help, _, err := run(t, command, "--help")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"off (the default) never does, so every plan prefills remotely", "prefixd demo uses it at 256 tokens", "(default off)"} {
			if !strings.Contains(strings.Join(strings.Fields(help), " "), want) {
				t.Errorf("%s --help: --disagg-policy lacks %q", command, want)
			}
		}
	}
}
