package lockedbuf

import (
	"sync"
	"testing"
)

func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				_, _ = b.Write([]byte("x;"))
				_ = b.Count("x")
			}
		}()
	}
	wg.Wait()
	if n := b.Count("x;"); n != 800 {
		t.Fatalf("Count = %d, want 800", n)
	}
	if len(b.String()) != 1600 {
		t.Fatalf("len(String()) = %d, want 1600", len(b.String()))
	}
}
