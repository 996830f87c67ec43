//go:build !linux

package api

import "time"

func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

func preciseTimers() {}
