// Package runclock gives tests timeouts counted in time this process ran
// rather than wall-clock time. A CI sandbox can be frozen for minutes (a
// cgroup freezer, a paused virtual machine) while the wall clock goes on;
// a test waiting five minutes for a launcher would then fail at the thaw
// although nothing of it ran late. A real hang still times out: running
// time advances whenever the process runs.
//
// Running time is sampled every 100 ms; a gap between two samples counts
// at most 2 s, so a freeze of any length counts as 2 s, and an overloaded
// machine (whose timers fire late by far less) as the time it took.
package runclock

import (
	"context"
	"sync"
	"time"
)

const (
	sample  = 100 * time.Millisecond
	maxStep = 2 * time.Second
)

// After returns a channel closed once d of running time has passed, and a
// function that stops the clock (idempotent; call it when done waiting).
func After(d time.Duration) (<-chan struct{}, func()) {
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		t := time.NewTicker(sample)
		defer t.Stop()
		last := time.Now()
		var ran time.Duration
		for {
			select {
			case <-t.C:
				now := time.Now()
				ran += min(now.Sub(last), maxStep)
				last = now
				if ran >= d {
					close(done)
					return
				}
			case <-stop:
				return
			}
		}
	}()
	var once sync.Once
	return done, func() { once.Do(func() { close(stop) }) }
}

// WithTimeout is context.WithTimeout in running time: the context is
// cancelled once d of running time has passed, with context.Cause
// context.DeadlineExceeded (its Err is context.Canceled).
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	done, stop := After(d)
	go func() {
		select {
		case <-done:
			cancel(context.DeadlineExceeded)
		case <-ctx.Done():
		}
		stop()
	}()
	return ctx, func() { cancel(context.Canceled); stop() }
}
