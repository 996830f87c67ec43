package testsupport

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for a writer (a logger, a server's
// output) and a reader at once. The zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
