package catalog

import "testing"

func TestOffsetEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		base string
		rank uint32
		want string
		ok   bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", true},
		{"tcp://*:5557", 1, "tcp://*:5558", true},
		{"tcp://10.0.0.7:5657", 3, "tcp://10.0.0.7:5660", true},
		{"tcp://[::1]:5557", 2, "tcp://[::1]:5559", true},
		{"inproc://kv", 2, "inproc://kv_dp2", true},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv", true},
		{"ipc:///tmp/kv", 1, "", false},
		{"tcp://host", 1, "", false},
		{"tcp://host:65535", 1, "", false},
	} {
		got, err := OffsetEndpoint(tc.base, tc.rank)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q ok=%v", tc.base, tc.rank, got, err, tc.want, tc.ok)
		}
	}
}
