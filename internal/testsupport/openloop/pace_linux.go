package openloop

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// A waker sleeps a goroutine until a given time by reading a timerfd(2)
// through the netpoller: the read returns within tens of µs of the
// time, where Go's timers wake no finer than 1 ms on Linux (the
// netpoller waits with epoll_wait's millisecond timeout), and the
// goroutine holds neither a thread nor a P while it waits, as it would
// in nanosleep(2) — the in-process benchmark's pacer shares the server's
// two Ps.
type waker struct {
	fd  uintptr
	f   *os.File // fd, non-blocking: read through the netpoller
	buf [8]byte
}

func newWaker() (*waker, error) {
	const clockMonotonic = 1
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, os.NewSyscallError("timerfd_create", errno)
	}
	return &waker{fd: fd, f: os.NewFile(fd, "timerfd")}, nil
}

// sleepUntil returns at t, or at once if t has passed.
func (w *waker) sleepUntil(t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	its := struct{ interval, value syscall.Timespec }{value: syscall.NsecToTimespec(d.Nanoseconds())}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, w.fd, 0, uintptr(unsafe.Pointer(&its)), 0, 0, 0); errno != 0 {
		return os.NewSyscallError("timerfd_settime", errno)
	}
	_, err := w.f.Read(w.buf[:]) // the expirations since: 1
	return err
}

func (w *waker) close() { w.f.Close() }
