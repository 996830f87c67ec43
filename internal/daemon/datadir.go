package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// dataDirLock is an exclusive lock on a data directory, held for the
// daemon's lifetime, so a second prefixd on the same directory fails at
// once instead of waiting forever on the embedded etcd's own file lock
// (which also ignores signals while it waits).
type dataDirLock struct{ f *os.File }

// lockDataDir takes dir's lock file (prefixd.lock, holding the owner's
// pid). An error says which process holds it.
func lockDataDir(dir string) (*dataDirLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "prefixd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			owner := "unknown pid"
			var buf [32]byte
			if n, _ := f.ReadAt(buf[:], 0); n > 0 {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n]))); err == nil {
					owner = "pid " + strconv.Itoa(pid)
				}
			}
			return nil, fmt.Errorf("data dir %s is in use by another prefixd (%s); stop it, or give this one another --data-dir", dir, owner)
		}
		return nil, fmt.Errorf("data dir %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataDirLock{f: f}, nil
}

// Close releases the lock.
func (l *dataDirLock) Close() error { return l.f.Close() }
