// Package ranklogs lays out and captures the logs of the rank processes of
// one node in torchrun's layout:
//
//	<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
//
// It decides per rank and per stream whether output is inherited, written to
// a file (-r/--redirects), written to a file and copied to the console with a
// "[<role><local_rank>]:" prefix (-t/--tee), or discarded (ranks left out by
// --local-ranks-filter). It also reads torch error files and renders
// torchrun's failure summary (errors.go).
//
// Two deliberate improvements over torchrun:
//   - An existing attempt directory is never wiped. torchrun rmtree's
//     attempt_<n> when n repeats (e.g. after a membership change, which does
//     not bump the restart count); here the next free name attempt_<n>.1,
//     attempt_<n>.2, ... is used instead.
//   - Tee reads the rank's output from a pipe instead of polling the log file
//     every 0.1 s, so no tail line is lost when a rank crashes, and lines of
//     different ranks are never interleaved mid-line.
package ranklogs

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/metrics"
)

// DefaultPrefixTemplate is torchrun's console prefix for teed lines.
const DefaultPrefixTemplate = "[${role_name}${local_rank}]:"

// drainBound bounds how long Close waits for tee readers after the ranks
// exited: a leftover grandchild holding the pipe open must not hang it.
const drainBound = 5 * time.Second

// maxLine caps a buffered console line; longer lines are emitted in pieces.
const maxLine = 64 << 10

// Options configure the logs of one launcher.
type Options struct {
	// LogDir is the root log directory. "" creates one with
	// os.MkdirTemp("", "torchelastic_"); os.DevNull turns files off
	// (redirected output is discarded, teed output goes to the console only,
	// and there is no error file).
	LogDir string
	RunID  string
	Role   string // default "default"
	// Redirects and Tee are the -r/--redirects and -t/--tee masks. Tee
	// implies a redirect to the file.
	Redirects, Tee configs.StdSpec
	// LocalRanksFilter lists the local ranks shown on the console; nil shows
	// every rank.
	LocalRanksFilter []int
	// PrefixTemplate is TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: a Python
	// string.Template with ${role_name}, ${rank} (global) and ${local_rank}.
	// "" means DefaultPrefixTemplate.
	PrefixTemplate string
	Console        io.Writer // teed stdout goes here; nil: os.Stdout
	ConsoleErr     io.Writer // teed stderr goes here; nil: os.Stderr
	Log            *slog.Logger
	// KeepAttempts keeps only the newest KeepAttempts attempt_<n> dirs of
	// this launcher's run dir, removing older ones as new cycles start;
	// 0 keeps all (as torchrun).
	KeepAttempts int
	// Metrics counts failed log writes; nil records nothing.
	Metrics *metrics.Metrics
}

// RankInfo identifies one rank of an attempt.
type RankInfo struct {
	LocalRank, GlobalRank int
}

// Logs are the logs of one launcher process.
type Logs struct {
	opts   Options
	runDir string // "" when files are off
	// consoleMu serialises whole-line writes to both console writers, which
	// are often the same terminal.
	consoleMu sync.Mutex

	mu       sync.Mutex
	attempts []string // attempt dirs this launcher created, oldest first

	lost *outputLoss // rank output that could not be written, every attempt
}

// outputLoss counts rank output dropped because its log file could not be
// written (a full file system), over every attempt of a launcher; the
// first loss is logged once.
type outputLoss struct {
	bytes    atomic.Int64
	reported atomic.Bool
}

// New creates <log_dir>/<run_id>_<rand>/ (once per launcher).
func New(opts Options) (*Logs, error) {
	if opts.Role == "" {
		opts.Role = "default"
	}
	if opts.Console == nil {
		opts.Console = os.Stdout
	}
	if opts.ConsoleErr == nil {
		opts.ConsoleErr = os.Stderr
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.PrefixTemplate == "" {
		opts.PrefixTemplate = DefaultPrefixTemplate
	}
	l := &Logs{opts: opts, lost: &outputLoss{}}
	if opts.LogDir == os.DevNull {
		return l, nil
	}
	root := opts.LogDir
	if root == "" {
		var err error
		if root, err = os.MkdirTemp("", "torchelastic_"); err != nil {
			return nil, fmt.Errorf("ranklogs: create log dir: %w", err)
		}
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("ranklogs: create log dir: %w", err)
	}
	// configs refuses run ids that are not one safe path element; this
	// keeps a caller that did not check from escaping the log dir.
	dir, err := os.MkdirTemp(root, strings.NewReplacer("/", "_", "\x00", "_").Replace(opts.RunID)+"_")
	if err != nil {
		return nil, fmt.Errorf("ranklogs: create run log dir: %w", err)
	}
	l.runDir = dir
	return l, nil
}

// Dir is the run's log directory, "" when files are off.
func (l *Logs) Dir() string { return l.runDir }

// LostBytes is how much rank output, over every attempt so far, could not
// be written to its log file; 0 for nil Logs.
func (l *Logs) LostBytes() int64 {
	if l == nil {
		return 0
	}
	return l.lost.bytes.Load()
}

func (l *Logs) shown(localRank int) bool {
	return l.opts.LocalRanksFilter == nil || slices.Contains(l.opts.LocalRanksFilter, localRank)
}

// Prefix is the console prefix of one rank's teed lines.
func (l *Logs) Prefix(r RankInfo) string {
	return expandTemplate(l.opts.PrefixTemplate, map[string]string{
		"role_name":  l.opts.Role,
		"rank":       strconv.Itoa(r.GlobalRank),
		"local_rank": strconv.Itoa(r.LocalRank),
	})
}

// Attempt holds the log files and tee pipes of one restart cycle.
type Attempt struct {
	dir   string // "" when files are off
	ranks map[int]*rankFiles
	log   *slog.Logger
	met   *metrics.Metrics
	lost  *outputLoss

	parentEnds []*os.File // pipe write ends kept open until the ranks exited
	readers    []*os.File // pipe read ends, owned by tee goroutines
	owned      []*os.File // log files and /dev/null, closed last
	tees       sync.WaitGroup

	parentOnce sync.Once
	closeOnce  sync.Once
	closeErr   error
}

type rankFiles struct {
	stdout, stderr         *os.File
	stdoutPath, stderrPath string
	errorFile              string
	// stderrCopied is closed once everything the rank wrote to stderr
	// is in its log file (the copier saw EOF); nil when stderr is not
	// copied (inherited, or the file given to the rank directly).
	stderrCopied chan struct{}
}

// Attempt prepares attempt_<n>/<local_rank>/ for one cycle and the files to
// give each rank as stdout and stderr. An existing attempt_<n> is never
// reused: attempt_<n>.1, attempt_<n>.2, ... are tried in turn.
func (l *Logs) Attempt(n int, ranks []RankInfo) (*Attempt, error) {
	a := &Attempt{ranks: make(map[int]*rankFiles, len(ranks)), log: l.opts.Log, met: l.opts.Metrics, lost: l.lost}
	if l.runDir != "" {
		dir, err := claimDir(l.runDir, "attempt_"+strconv.Itoa(n))
		if err != nil {
			return nil, err
		}
		a.dir = dir
		l.retain(dir)
	}
	var devNull *os.File
	nullFile := func() (*os.File, error) {
		if devNull == nil {
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return nil, fmt.Errorf("ranklogs: open %s: %w", os.DevNull, err)
			}
			devNull = f
			a.owned = append(a.owned, f)
		}
		return devNull, nil
	}

	for _, r := range ranks {
		rf := &rankFiles{}
		if a.dir != "" {
			rdir := filepath.Join(a.dir, strconv.Itoa(r.LocalRank))
			if err := os.Mkdir(rdir, 0o755); err != nil {
				a.abort()
				return nil, fmt.Errorf("ranklogs: %w", err)
			}
			rf.errorFile = filepath.Join(rdir, "error.json")
			rf.stdoutPath = filepath.Join(rdir, "stdout.log")
			rf.stderrPath = filepath.Join(rdir, "stderr.log")
		}
		streams := []struct {
			bit     configs.Std
			path    string
			console io.Writer
			dst     **os.File
		}{
			{configs.StdOut, rf.stdoutPath, l.opts.Console, &rf.stdout},
			{configs.StdErr, rf.stderrPath, l.opts.ConsoleErr, &rf.stderr},
		}
		shown := l.shown(r.LocalRank)
		for _, s := range streams {
			var copied chan struct{}
			if s.dst == &rf.stderr {
				copied = make(chan struct{})
			}
			redirect := l.opts.Redirects.For(r.LocalRank)&s.bit != 0
			tee := l.opts.Tee.For(r.LocalRank)&s.bit != 0
			var file *os.File
			if (redirect || tee) && s.path != "" {
				f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
				if err != nil {
					a.abort()
					return nil, fmt.Errorf("ranklogs: %w", err)
				}
				a.owned = append(a.owned, f)
				file = f
			}
			switch {
			case tee && shown:
				w, err := a.startTee(file, s.console, l.Prefix(r), &l.consoleMu, copied)
				if err != nil {
					a.abort()
					return nil, err
				}
				*s.dst = w
				if copied != nil {
					rf.stderrCopied = copied
				}
			case file != nil:
				// Through a pipe, not the file itself: a write error (a
				// full disk) is then seen here and reported, not lost.
				w, err := a.startTee(file, nil, "", nil, copied)
				if err != nil {
					a.abort()
					return nil, err
				}
				*s.dst = w
				if copied != nil {
					rf.stderrCopied = copied
				}
			case redirect || tee || !shown:
				f, err := nullFile()
				if err != nil {
					a.abort()
					return nil, err
				}
				*s.dst = f
			default:
				*s.dst = nil // inherit the launcher's stream, unprefixed like torchrun
			}
		}
		a.ranks[r.LocalRank] = rf
	}
	return a, nil
}

// retain records dir as the newest attempt and removes the oldest ones
// beyond KeepAttempts. Only dirs this launcher created are ever removed.
func (l *Logs) retain(dir string) {
	if l.opts.KeepAttempts <= 0 {
		return // nothing to remember: no per-cycle growth
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts = append(l.attempts, dir)
	for len(l.attempts) > l.opts.KeepAttempts {
		old := l.attempts[0]
		l.attempts = l.attempts[1:]
		if err := os.RemoveAll(old); err != nil {
			l.opts.Log.Warn("ranklogs: remove old attempt dir", "dir", old, "err", err)
		}
	}
}

// claimDir creates parent/name, or parent/name.1, parent/name.2, ... when it
// exists. Mkdir (not MkdirAll) makes the claim atomic.
func claimDir(parent, name string) (string, error) {
	for i := 0; ; i++ {
		candidate := name
		if i > 0 {
			candidate = name + "." + strconv.Itoa(i)
		}
		dir := filepath.Join(parent, candidate)
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("ranklogs: create attempt dir: %w", err)
		}
	}
}

// startTee returns the write end of a pipe whose reader copies everything to
// file (when non-nil) and whole prefixed lines to console; done (when
// non-nil) is closed when the reader has copied everything (EOF).
func (a *Attempt) startTee(file *os.File, console io.Writer, prefix string, mu *sync.Mutex, done chan struct{}) (*os.File, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("ranklogs: pipe: %w", err)
	}
	a.parentEnds = append(a.parentEnds, pw)
	a.readers = append(a.readers, pr)
	var lw *lineWriter
	if console != nil {
		lw = &lineWriter{prefix: []byte(prefix), w: console, mu: mu}
	}
	a.tees.Add(1)
	go func() {
		defer a.tees.Done()
		if done != nil {
			defer close(done)
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				if file != nil {
					// The rank is never held up: what cannot be written
					// is dropped and counted, the first loss of the
					// launcher logged. Later writes are still tried:
					// space may come back.
					if w, werr := file.Write(buf[:n]); werr != nil {
						a.met.RankLogWriteError()
						total := a.lost.bytes.Add(int64(n - w))
						if a.lost.reported.CompareAndSwap(false, true) {
							a.log.Error("ranklogs: rank output lost: cannot write its log file (further failures only counted; the totals go into the verdict's records_lost)",
								"file", file.Name(), "err", werr, "bytes_lost", total)
						}
					}
				}
				lw.write(buf[:n])
			}
			if err != nil {
				lw.flush()
				return
			}
		}
	}()
	return pw, nil
}

// Dir is the attempt directory, "" when files are off.
func (a *Attempt) Dir() string { return a.dir }

// Files returns the stdout and stderr to hand to the rank's spawn.Spec: the
// log file when redirected, a tee pipe when teed and shown, /dev/null when
// discarded, nil (inherit) otherwise and for an unknown rank.
func (a *Attempt) Files(localRank int) (stdout, stderr *os.File) {
	rf := a.ranks[localRank]
	if rf == nil {
		return nil, nil
	}
	return rf.stdout, rf.stderr
}

// WaitStderr waits, at most bound, until everything local rank
// localRank wrote to its stderr is in its stderr.log: the copier has seen
// the pipe's end, which comes once the rank and every process that
// inherited its stderr exited. Read the log for a failure's cause only
// after it: a rank's last lines (a faulthandler dump written as it died)
// may still be in the pipe when its exit is seen. It reports whether the
// copy is complete (true too when stderr is not copied).
func (a *Attempt) WaitStderr(localRank int, bound time.Duration) bool {
	if a == nil {
		return true
	}
	rf := a.ranks[localRank]
	if rf == nil || rf.stderrCopied == nil {
		return true
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-rf.stderrCopied:
		return true
	case <-t.C:
		return false
	}
}

// LogPaths returns the paths of the rank's stdout.log and stderr.log ("" when
// files are off). The files exist only for redirected or teed streams.
func (a *Attempt) LogPaths(localRank int) (stdout, stderr string) {
	rf := a.ranks[localRank]
	if rf == nil {
		return "", ""
	}
	return rf.stdoutPath, rf.stderrPath
}

// ErrorFile is <attempt>/<local_rank>/error.json, the rank's
// TORCHELASTIC_ERROR_FILE; "" when files are off.
func (a *Attempt) ErrorFile(localRank int) string {
	rf := a.ranks[localRank]
	if rf == nil {
		return ""
	}
	return rf.errorFile
}

// CloseParentEnds closes the launcher's copies of the tee pipes' write ends.
// Call it once the ranks are started so tee readers see EOF as soon as the
// ranks (and their descendants) exit; Close calls it too.
func (a *Attempt) CloseParentEnds() {
	a.parentOnce.Do(func() {
		for _, f := range a.parentEnds {
			_ = f.Close()
		}
	})
}

// Close is called after the ranks exited: it closes the parent pipe ends,
// drains the tee readers fully (no tail line is lost), then closes the log
// files. If a leftover descendant keeps a pipe open, Close stops waiting
// after a bound and reports it.
func (a *Attempt) Close() error {
	a.closeOnce.Do(func() {
		a.CloseParentEnds()
		done := make(chan struct{})
		go func() {
			a.tees.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(drainBound):
			a.closeErr = errors.New("ranklogs: tee pipes still open after the ranks exited (leftover descendant?); output cut")
			for _, r := range a.readers {
				_ = r.Close() // unblocks the readers
			}
			<-done
		}
		for _, r := range a.readers {
			_ = r.Close()
		}
		for _, f := range a.owned {
			if err := f.Close(); err != nil && a.closeErr == nil {
				a.closeErr = fmt.Errorf("ranklogs: close %s: %w", f.Name(), err)
			}
		}
	})
	return a.closeErr
}

// abort releases everything after a failed Attempt.
func (a *Attempt) abort() {
	a.CloseParentEnds()
	a.tees.Wait() // readers see EOF: nobody else holds the write ends yet
	for _, r := range a.readers {
		_ = r.Close()
	}
	for _, f := range a.owned {
		_ = f.Close()
	}
}

// lineWriter turns a byte stream into whole prefixed lines written under a
// shared lock, so lines of different ranks never mix.
type lineWriter struct {
	prefix []byte
	w      io.Writer
	mu     *sync.Mutex
	buf    []byte // incomplete last line
	out    []byte // scratch
}

func (lw *lineWriter) write(p []byte) {
	if lw == nil {
		return
	}
	lw.buf = append(lw.buf, p...)
	lw.out = lw.out[:0]
	start := 0
	for i, c := range lw.buf {
		if c == '\n' {
			lw.out = append(lw.out, lw.prefix...)
			lw.out = append(lw.out, lw.buf[start:i+1]...)
			start = i + 1
		} else if i+1-start >= maxLine {
			lw.out = append(lw.out, lw.prefix...)
			lw.out = append(lw.out, lw.buf[start:i+1]...)
			lw.out = append(lw.out, '\n')
			start = i + 1
		}
	}
	lw.buf = append(lw.buf[:0], lw.buf[start:]...)
	lw.emit()
}

// flush emits a last line that had no newline.
func (lw *lineWriter) flush() {
	if lw == nil {
		return
	}
	lw.out = lw.out[:0]
	if len(lw.buf) > 0 {
		lw.out = append(lw.out, lw.prefix...)
		lw.out = append(lw.out, lw.buf...)
		lw.out = append(lw.out, '\n')
		lw.buf = lw.buf[:0]
	}
	lw.emit()
}

func (lw *lineWriter) emit() {
	if len(lw.out) == 0 {
		return
	}
	lw.mu.Lock()
	_, _ = lw.w.Write(lw.out)
	lw.mu.Unlock()
}

// expandTemplate implements Python's string.Template.safe_substitute: $$ is a
// literal $, ${name} and $name are replaced when known and kept otherwise.
func expandTemplate(tmpl string, vars map[string]string) string {
	var out []byte
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		if c != '$' || i+1 >= len(tmpl) {
			out = append(out, c)
			continue
		}
		next := tmpl[i+1]
		switch {
		case next == '$':
			out = append(out, '$')
			i++
		case next == '{':
			end := i + 2
			for end < len(tmpl) && isIdent(tmpl[end], end == i+2) {
				end++
			}
			if end < len(tmpl) && tmpl[end] == '}' && end > i+2 {
				if v, ok := vars[tmpl[i+2:end]]; ok {
					out = append(out, v...)
					i = end
					continue
				}
			}
			out = append(out, c)
		case isIdent(next, true):
			end := i + 1
			for end < len(tmpl) && isIdent(tmpl[end], end == i+1) {
				end++
			}
			if v, ok := vars[tmpl[i+1:end]]; ok {
				out = append(out, v...)
				i = end - 1
				continue
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

func isIdent(c byte, first bool) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
}
