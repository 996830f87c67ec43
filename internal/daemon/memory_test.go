package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	write := func(root, path, body string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	meminfo := "MemTotal:       25165824 kB\nMemFree:         1000 kB\n" // 24 GiB
	for _, tc := range []struct {
		name   string
		files  map[string]string
		want   int64
		source string
	}{
		{"machine only", map[string]string{"proc/meminfo": meminfo}, 24 << 30, "MemTotal"},
		{"cgroup v2 limit", map[string]string{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": "4294967296\n"}, 4 << 30, "cgroup memory.max"},
		{"cgroup v2 unlimited", map[string]string{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": "max\n"}, 24 << 30, "MemTotal"},
		{"cgroup v1 limit", map[string]string{"proc/meminfo": meminfo, "sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648"}, 2 << 30, "cgroup memory.limit_in_bytes"},
		{"cgroup v1 unlimited", map[string]string{"proc/meminfo": meminfo, "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, 24 << 30, "MemTotal"},
		{"nothing readable", nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, body := range tc.files {
				write(root, p, body)
			}
			got, source := memoryLimit(root)
			if got != tc.want || source != tc.source {
				t.Fatalf("memoryLimit = %d (%s), want %d (%s)", got, source, tc.want, tc.source)
			}
		})
	}
}
