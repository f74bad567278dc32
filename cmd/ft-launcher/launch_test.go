package main

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestSetupGuard: the first signal during the set-up cancels it and is
// kept; once the watch ends, later signals stay in the channel for the
// agent.
func TestSetupGuard(t *testing.T) {
	tests := []struct {
		name       string
		before     []os.Signal // sent while the guard watches
		after      []os.Signal // sent once it ended
		wantSig    os.Signal
		wantCancel bool
		wantLeft   int // signals left for the agent
	}{
		{"quiet set-up", nil, []os.Signal{syscall.SIGTERM}, nil, false, 1},
		{"signal during set-up", []os.Signal{syscall.SIGINT}, nil, syscall.SIGINT, true, 0},
		{"two signals during set-up", []os.Signal{syscall.SIGTERM, syscall.SIGTERM}, nil, syscall.SIGTERM, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sigs := make(chan os.Signal, 4)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := guardSetup(sigs, cancel)
			for _, s := range tt.before {
				sigs <- s
			}
			if tt.wantCancel {
				select {
				case <-ctx.Done():
				case <-time.After(60 * time.Second):
					t.Fatal("the signal did not cancel the set-up")
				}
				if g.caught() != tt.wantSig {
					t.Errorf("caught() = %v, want %v", g.caught(), tt.wantSig)
				}
			}
			if got := g.end(); got != tt.wantSig {
				t.Errorf("end() = %v, want %v", got, tt.wantSig)
			}
			if got := g.end(); got != tt.wantSig { // idempotent
				t.Errorf("second end() = %v, want %v", got, tt.wantSig)
			}
			for _, s := range tt.after {
				sigs <- s
			}
			if got := len(sigs); got != tt.wantLeft {
				t.Errorf("%d signals left for the agent, want %d", got, tt.wantLeft)
			}
			if !tt.wantCancel && ctx.Err() != nil {
				t.Error("the set-up was cancelled without a signal")
			}
		})
	}
}
