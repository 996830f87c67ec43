package daemon

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimit returns the memory this process may use and where that
// figure comes from: the smallest of the cgroup limit (v2 memory.max, v1
// memory.limit_in_bytes), GOMEMLIMIT and the machine's MemTotal. root is
// "/" except in tests. It returns 0 if none can be read.
func memoryLimit(root string) (int64, string) {
	best, source := int64(0), ""
	consider := func(v int64, from string) {
		if v > 0 && (best == 0 || v < best) {
			best, source = v, from
		}
	}
	if v, ok := readLimit(filepath.Join(root, "sys/fs/cgroup/memory.max")); ok {
		consider(v, "cgroup memory.max")
	}
	if v, ok := readLimit(filepath.Join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes")); ok && v < 1<<60 {
		consider(v, "cgroup memory.limit_in_bytes")
	}
	if v := debug.SetMemoryLimit(-1); v != math.MaxInt64 {
		consider(v, "GOMEMLIMIT")
	}
	if v, ok := memTotal(filepath.Join(root, "proc/meminfo")); ok {
		consider(v, "MemTotal")
	}
	return best, source
}

// readLimit reads a cgroup limit file: a byte count, or "max".
func readLimit(path string) (int64, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	return v, err == nil && v > 0
}

// memTotal reads MemTotal (kB) from /proc/meminfo.
func memTotal(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		return kb << 10, err == nil && kb > 0
	}
	return 0, false
}
