package ranklogs

import (
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/pytrace"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Evidence is what a failed rank left behind that may say why it failed.
type Evidence struct {
	// Record is its torch error file (TORCHELASTIC_ERROR_FILE), if any.
	Record *ErrorRecord
	// Exception is the traceback the launcher's hook wrote at its
	// uncaught exception (stacks.Collector.Exception).
	Exception []byte
	// Output is the tail of its stderr log (with --redirects or --tee).
	Output []byte
	// Fatal is what faulthandler wrote when a fatal signal killed it
	// (stacks.Collector.Fatal), and Signal that signal (0: none).
	Fatal  []byte
	Signal syscall.Signal
}

// fatalSignals are the signals faulthandler writes a stack for.
var fatalSignals = map[syscall.Signal]bool{syscall.SIGSEGV: true, syscall.SIGABRT: true, syscall.SIGBUS: true,
	syscall.SIGFPE: true, syscall.SIGILL: true}

// Explain reads why a rank failed from ev, the most direct source first:
// for a death by a fatal signal, faulthandler's stack; else the error
// file, the hook's traceback, the last traceback of its output. false
// when none says anything (a SIGKILL, a rank that printed no traceback).
func Explain(ev Evidence) (verdict.FailureCause, bool) {
	if ev.Signal != 0 && fatalSignals[ev.Signal] {
		// The hook's file, else the output: a program that enabled
		// faulthandler itself (PYTHONFAULTHANDLER) writes it to stderr.
		for _, src := range []struct {
			b    []byte
			name string
		}{{ev.Fatal, "faulthandler"}, {ev.Output, "output"}} {
			if w := fatalWhere(src.b); w != "" {
				return verdict.FailureCause{Signal: unix.SignalName(ev.Signal), Where: w, Source: src.name}, true
			}
		}
	}
	if r := ev.Record; r != nil {
		if tb, ok := pytrace.LastTraceback([]byte(r.Traceback + "\n" + r.Message + "\n")); ok {
			return cause(tb, "error_file"), true
		}
		if r.Message != "" {
			typ, msg, _ := strings.Cut(r.Message, ": ")
			return verdict.FailureCause{Exception: typ, Message: firstLine(msg), Source: "error_file"}, true
		}
	}
	if tb, ok := pytrace.LastTraceback(ev.Exception); ok {
		return cause(tb, "excepthook"), true
	}
	if tb, ok := pytrace.LastTraceback(ev.Output); ok {
		return cause(tb, "output"), true
	}
	return verdict.FailureCause{}, false
}

// fatalWhere is where the main thread was in the last fatal-error dump
// of b ("" when none).
func fatalWhere(b []byte) string {
	w := ""
	for _, d := range pytrace.ParseDumps(b) {
		if d.Fatal == "" {
			continue
		}
		if th, ok := d.MainThread(); ok && len(th.Frames) > 0 {
			w = where(th.Frames)
		}
	}
	return w
}

func cause(tb pytrace.Traceback, source string) verdict.FailureCause {
	c := verdict.FailureCause{Exception: tb.Type, Message: firstLine(tb.Message), Source: source}
	if len(tb.Frames) > 0 {
		c.Where = where(tb.Frames)
	}
	return c
}

// where is the deepest frame in the user's code, else the innermost.
func where(frames []pytrace.Frame) string {
	if f, ok := pytrace.UserFrame(frames); ok {
		return f.String()
	}
	return frames[len(frames)-1].String()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > verdict.MaxCauseMessage {
		s = s[:verdict.MaxCauseMessage]
		for !utf8.ValidString(s) { // cut in the middle of a character
			s = s[:len(s)-1]
		}
	}
	return s
}
