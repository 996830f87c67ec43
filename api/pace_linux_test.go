package api

import (
	"syscall"
	"time"
)

// sleepUntil sleeps until t in nanosleep(2), which on Linux wakes within
// tens of µs (the calling thread's timer slack, which preciseTimers
// lowers): Go's own timers wake no finer than 1 ms there, the netpoller
// waiting with epoll_wait's millisecond timeout.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		syscall.Nanosleep(&ts, nil) // EINTR: loop and sleep the rest
	}
}

// preciseTimers sets the calling thread's timer slack to 1 ns (it is
// 50 µs by default); the caller has locked its goroutine to the thread.
func preciseTimers() {
	const prSetTimerslack = 29
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerslack, 1, 0)
}
