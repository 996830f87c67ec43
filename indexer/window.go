package indexer

import (
	"runtime"
	"sync/atomic"
)

// window lets matchers read a shard's tree while the writer that holds
// its write lock only reads the tree: while it rebuilds one of its rank's
// lookup sub-tables (lookup.makeRoom, run by storeMain before the block
// whose insert needs it), which matchers never read, it opens the window, and a matcher that finds the write lock held reads through the
// window instead of waiting for the rebuild.
//
// A matcher enters by counting itself in readers and then seeing open;
// the writer closes the window and then waits until readers is 0, so it
// writes the tree again only once no matcher that entered reads it. The
// atomics are sequentially consistent: either the matcher sees the window
// closed and backs out, or the writer sees it counted and waits.
type window struct {
	open    atomic.Bool
	readers atomic.Int32
	opened  uint64 // times run opened it (the writer's, under the write lock)
}

// enter reports whether the window was open, and if so the caller reads
// the tree and then calls leave.
func (w *window) enter() bool {
	w.readers.Add(1)
	if w.open.Load() {
		return true
	}
	w.readers.Add(-1)
	return false
}

func (w *window) leave() { w.readers.Add(-1) }

// run runs f with the window open. f must not modify what matchers read
// (the tree's nodes, edges, holders and children): only the writer's own
// state, such as a lookup. The caller holds the write lock.
func (w *window) run(f func()) {
	w.opened++
	w.open.Store(true)
	f()
	w.open.Store(false)
	for w.readers.Load() > 0 {
		runtime.Gosched()
	}
}
