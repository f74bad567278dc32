// Package earlysig catches ft-launcher's terminating signals from the
// launcher's first instant, before its configuration says which signals it
// handles, so that a SIGTERM in the first milliseconds is handled instead of
// killing the launcher by its default action.
//
// Go initialises packages in dependency order, ties broken by import path;
// this package imports nothing but the standard signal plumbing, so its
// init runs right after os/signal's, before the launcher's heavier
// dependencies (logging, gRPC, the etcd client) and long before main.
package earlysig

import (
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

// Catchable are the signals caught from the start: the ones a Go program
// exits on by default (SIGHUP, SIGINT, SIGTERM; SIGQUIT, SIGABRT and
// SIGSTKFLT with a stack dump) and the user, timer, resource and I/O
// signals it ignores, so that any of them named in --signals-to-handle is
// honoured however early it comes. Signals whose default action is to
// ignore or stop (SIGCHLD, SIGCONT, SIGWINCH, SIGURG, SIGTSTP, ...), those
// the kernel raises for a fault or a broken pipe (SIGSEGV, SIGPIPE, ...)
// and SIGPROF (the runtime's) are left alone until the configuration is
// known: catching those early would change what the runtime or the kernel
// does with them.
func Catchable() []syscall.Signal {
	return []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGABRT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGTERM, syscall.SIGSTKFLT,
		syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGIO, syscall.SIGPWR}
}

// Catcher holds the signals caught since the process started.
type Catcher struct {
	ch chan os.Signal
	// ignoredAtStart are the Catchable signals the runtime found ignored
	// at start and left so (SIGHUP under nohup, SIGINT in a shell's
	// background job): released, they are ignored again.
	ignoredAtStart map[syscall.Signal]bool
	held           []os.Signal // taken off ch by During, for Handle
}

// caught is the one Catcher of the process. Package state, exceptionally:
// only a package variable's initialiser runs early enough, and it is
// written once, here, and read only through Take.
var caught = catch()

func catch() *Catcher {
	c := &Catcher{ch: make(chan os.Signal, 32), ignoredAtStart: map[syscall.Signal]bool{}}
	sigs := make([]os.Signal, 0, len(Catchable()))
	for _, s := range Catchable() {
		if signal.Ignored(s) {
			c.ignoredAtStart[s] = true
		}
		sigs = append(sigs, s)
	}
	signal.Notify(c.ch, sigs...)
	return c
}

// Take returns the process's Catcher.
func Take() *Catcher { return caught }

// During runs f (the configuration parsing) while watching for signals.
// A signal that arrives is held for Handle, which honours it once the
// handled set is known. If f has not returned within patience of the first
// such signal, f is stuck (reading a FIFO nobody writes, say): the signal
// then takes the action it would have had without this package, at once.
func (c *Catcher) During(f func(), patience time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	var deadline <-chan time.Time
	for {
		select {
		case <-done:
			return
		case s := <-c.ch:
			c.held = append(c.held, s)
			if deadline == nil {
				deadline = time.After(patience)
			}
		case <-deadline:
			c.release(Catchable(), nil)
			for _, s := range c.held {
				raise(s) // default action: usually the end of the process
			}
			c.held = nil
			deadline = nil // ignored at start: keep waiting for f
		}
	}
}

// Handle switches from catching every Catchable signal to handling exactly
// handled, and returns the channel that delivers them. The Catchable
// signals outside handled get their start-up disposition back (default, or
// ignored when they were ignored at start). A signal that arrived before
// now is delivered when it is in handled, else it takes that disposition's
// action now, as if it had never been caught. Handle may be called again
// (tests do) to switch to another set.
func (c *Catcher) Handle(handled []syscall.Signal) <-chan os.Signal {
	sigs := make([]os.Signal, len(handled))
	for i, s := range handled {
		sigs[i] = s
	}
	signal.Notify(c.ch, sigs...)
	c.release(Catchable(), handled)

	// Take what arrived before, then deliver the handled ones again and
	// give the others their action. The channel keeps receiving meanwhile;
	// the order between signals that raced is of no consequence.
	pending := c.held
	c.held = nil
	for n := len(c.ch); n > 0; n-- {
		pending = append(pending, <-c.ch)
	}
	for _, s := range pending {
		if ss, ok := s.(syscall.Signal); ok && slices.Contains(handled, ss) {
			select {
			case c.ch <- s:
			default: // full: a flood of the same signals, one more changes nothing
			}
			continue
		}
		raise(s)
	}
	return c.ch
}

// release gives every signal of sigs not in keep its start-up disposition.
func (c *Catcher) release(sigs, keep []syscall.Signal) {
	for _, s := range sigs {
		if slices.Contains(keep, s) {
			continue
		}
		if c.ignoredAtStart[s] {
			signal.Ignore(s)
		} else {
			signal.Reset(s)
		}
	}
}

// raise sends s to this process again, once its own disposition applies.
func raise(s os.Signal) {
	if ss, ok := s.(syscall.Signal); ok {
		_ = syscall.Kill(os.Getpid(), ss)
	}
}
