// Package lockedbuf is a byte buffer that one goroutine may read while
// others write to it: a test's view of log output or of a child process's
// output that is still being copied in.
package lockedbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer guarded by a mutex. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count is the number of non-overlapping occurrences of sub so far.
func (l *Buffer) Count(sub string) int {
	return strings.Count(l.String(), sub)
}
