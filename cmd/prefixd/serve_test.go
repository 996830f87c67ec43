package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestServeRejectsBadFlagsAndEnv(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"serve", "--index-max-entries", "-2"}, nil, "--index-max-entries"},
		{[]string{"serve", "--ready-timeout", "0s"}, nil, "--ready-timeout"},
		{[]string{"serve", "--log-level", "loud"}, nil, "--log-level"},
		{[]string{"serve", "--etcd-endpoints", "10.0.0.1:2379"}, nil, "not an http(s) or unix URL"},
		{[]string{"serve", "--etcd-cert", "c.pem"}, nil, "--etcd-cert and --etcd-key"},
		{[]string{"serve"}, map[string]string{"PREFIXD_INDEX_MAX_ENTRIES": "lots"}, "PREFIXD_INDEX_MAX_ENTRIES"},
		{[]string{"serve", "--disagg-order", "sideways"}, nil, "--disagg-order"},
		{[]string{"serve", "--prefill-failure", "retry"}, nil, "--prefill-failure"},
		{[]string{"serve", "--disagg-policy", "always"}, nil, "--disagg-policy"},
		{[]string{"serve", "--disagg-policy", "isl_bounding", "--bypass-max-eff-isl-ratio", "2"}, nil, "--bypass-max-eff-isl-ratio"},
		{[]string{"serve", "--temperature", "-1"}, nil, "--temperature"},
		{[]string{"serve", "--overlap-weight", "-1"}, nil, "--overlap-weight"},
		{[]string{"serve", "--overlap-weight", "NaN"}, nil, "--overlap-weight"},
		{[]string{"serve", "--predicted-ttl", "-1s"}, nil, "--predicted-ttl"},
		{[]string{"serve", "--embedded-etcd-url", "127.0.0.1:2379"}, nil, "--embedded-etcd-url"},
		{[]string{"serve", "--peers", "prefixd-0:8090"}, nil, "--peers"},
		{[]string{"serve", "--probe-interval", "10ms"}, nil, "--probe-interval"},
		{[]string{"serve", "--max-message-bytes", "100"}, nil, "--max-message-bytes"},
		{[]string{"serve", "--handshake-timeout", "0s"}, nil, "--handshake-timeout"},
		{[]string{"serve", "--max-ranks", "-1"}, nil, "--max-ranks"},
		{[]string{"serve", "--catalog-write-timeout", "0s"}, nil, "--catalog-write-timeout"},
		{[]string{"serve", "--dump-progress-timeout", "0s"}, nil, "--dump-progress-timeout"},
		{[]string{"serve", "--epp-body-mode", "streamed"}, nil, "--epp-body-mode"},
		{[]string{"serve", "--epp-fallbacks", "-1"}, nil, "--epp-fallbacks"},
		{[]string{"serve", "--epp-fallbacks", "17"}, nil, "--epp-fallbacks 17: want 0 to 16"},
		{[]string{"serve", "--epp-max-body-bytes", "0"}, nil, "--epp-max-body-bytes"},
		{[]string{"serve", "--epp-max-body-bytes", "1073741824"}, nil, "--epp-max-body-bytes"},
		{[]string{"serve", "--epp-body-timeout", "0s"}, nil, "--epp-body-timeout"},
		{[]string{"serve", "--epp-objective-priority", "premium=1,batch"}, nil, `--epp-objective-priority "batch": want name=N`},
		{[]string{"serve", "--epp-objective-priority", "=1"}, nil, `--epp-objective-priority "=1": want name=N`},
		{[]string{"serve", "--epp-objective-priority", "a=x"}, nil, `--epp-objective-priority "a=x": want name=N`},
		{[]string{"serve", "--epp-objective-priority", "a=1001"}, nil, `--epp-objective-priority "a=1001": priority 1001, want -1000 to 1000`},
		{[]string{"serve", "--epp-objective-priority", "a=1,a=2"}, nil, `--epp-objective-priority "a=2": objective "a" given twice`},
		{[]string{"serve", "--replica-sync-listen", "8092"}, nil, "--replica-sync-listen \"8092\": want host:port or off"},
		{[]string{"serve", "--replica-sync-listen", ":8092"}, nil, "listens on every interface: set --replica-advertise"},
		{[]string{"serve", "--replica-sync-listen", "0.0.0.0:8092"}, nil, "set --replica-advertise"},
		{[]string{"serve", "--replica-sync-listen", ":8092", "--replica-advertise", "10.0.0.1"}, nil, "--replica-advertise \"10.0.0.1\": want host:port"},
		{[]string{"serve", "--replica-lease-ttl", "100ms"}, nil, "--replica-lease-ttl"},
		{[]string{"serve", "--no-fast-lane"}, nil, "--no-fast-lane: the fast lane was removed"},
		{[]string{"serve"}, map[string]string{"PREFIXD_NO_FAST_LANE": "true"}, "--no-fast-lane: the fast lane was removed"},
		{[]string{"serve", "--peers", "dns+prefixd-peers"}, nil, "--peers"},
		{[]string{"serve"}, map[string]string{"PREFIXD_DISAGG_POLICY": "never"}, "--disagg-policy"},
		{[]string{"serve"}, map[string]string{"PREFIXD_ETCD_ENDPOINTS": "localhost:2379"}, "not an http(s) or unix URL"},
		{[]string{"serve", "--queue-threshold", "-0.5"}, nil, "--queue-threshold -0.5: want 0 (no queue) to 100"},
		{[]string{"serve", "--queue-threshold", "NaN"}, nil, "--queue-threshold"},
		{[]string{"serve", "--queue-order", "lifo"}, nil, "--queue-order"},
		{[]string{"serve", "--queue-aging", "0s"}, nil, "--queue-aging 0s"},
		{[]string{"serve", "--queue-max-len", "0"}, nil, "--queue-max-len 0: want 1 to 1048576"},
		{[]string{"serve", "--queue-max-wait", "2h"}, nil, "--queue-max-wait 2h0m0s"},
		{[]string{"serve"}, map[string]string{"PREFIXD_QUEUE_MAX_WAIT": "-1s"}, "--queue-max-wait"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { checkServeError(t, tc.args, tc.env, tc.want) })
	}
}

func checkServeError(t *testing.T, args []string, env map[string]string, want string) {
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	cmd := newRootCommand(&out, &errOut)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%v %v: error %v, want one mentioning %q", args, env, err, want)
	}
}

// TestEPPObjectivePriorities: --epp-objective-priority's entries become
// the picker's map, spaces trimmed; none is an empty map.
func TestEPPObjectivePriorities(t *testing.T) {
	f := eppFlags{priorities: []string{"premium=10", " batch = -5", "x=0"}}
	got, err := f.objectivePriorities()
	if err != nil || len(got) != 3 || got["premium"] != 10 || got["batch"] != -5 || got["x"] != 0 {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := (&eppFlags{}).objectivePriorities(); err != nil || len(got) != 0 {
		t.Fatalf("none: %v %v", got, err)
	}
}
