package pytrace

import (
	"bytes"
	"strings"
)

// Thread is one thread of a faulthandler dump.
type Thread struct {
	ID        string  // "0x00007f..." as printed; "" for a "Stack (most recent call first):" dump
	Name      string  // thread name printed by CPython 3.14+ ("Thread 0x... [name] ..."); "" when none
	Current   bool    // "Current thread 0x..." rather than "Thread 0x..." (also true for a "Stack" dump)
	Frames    []Frame // outermost first (faulthandler prints most recent call first), so Frames[len-1] is the innermost
	Truncated bool    // faulthandler printed "  ..." (more than 100 frames) or a "  <truncated ...>" marker, or more than 1,000 frames were printed and only the innermost 1,000 kept
}

// Dump is one faulthandler dump: all threads printed by one
// faulthandler.dump_traceback(all_threads=True), by a handler registered with
// faulthandler.register(sig, all_threads=True), by dump_traceback_later, or by
// the fatal-error handler ("Fatal Python error: Segmentation fault" + threads).
type Dump struct {
	Fatal     string   // for a fatal error: the text after "Fatal Python error: " (e.g. "Segmentation fault", "Aborted", "Bus error", "Floating point exception"), or after "Windows fatal exception: "; "" for a plain dump
	Timeout   string   // for dump_traceback_later: the timeout as printed in "Timeout (0:05:00)!", e.g. "0:05:00"; "" otherwise
	Threads   []Thread // in the order printed (CPython prints the newest thread first, so the main thread usually comes last)
	Truncated bool     // faulthandler printed "..." after 100 threads, or more than 256 threads were printed and only the first 256 kept
}

const (
	maxThreads      = 256  // threads kept per dump
	maxDumps        = 4096 // dumps kept per ParseDumps call (the newest)
	maxPreamble     = 256  // lines tolerated between a fatal header and its first thread
	maxForeignLines = 256  // consecutive lines without the dump's prefix before the dump is abandoned
)

const (
	recentFirst = "(most recent call first):"
	stackHeader = "Stack (most recent call first):"
	cStackHdr   = "Current thread's C stack trace (most recent call first):"
	fatalPy     = "Fatal Python error: "
	fatalWin    = "Windows fatal exception: "
)

// ParseDumps returns every faulthandler dump in b, oldest first (a file that
// several dumps were appended to holds several). Text that is not part of a
// dump is skipped. Work is linear in len(b).
func ParseDumps(b []byte) []Dump {
	p := dumpParser{}
	ls := lines{b: b}
	for {
		raw, ok := ls.next()
		if !ok {
			break
		}
		p.line(clean(raw))
	}
	p.endDump()
	if len(p.dumps) > maxDumps {
		p.dumps = p.dumps[len(p.dumps)-maxDumps:]
	}
	return p.dumps
}

type dumpParser struct {
	dumps []Dump

	in            bool // inside a dump
	cur           Dump
	thr           *Thread // thread being filled, frames innermost first; nil between threads
	discard       bool    // thr is over the thread cap: parse its lines, keep nothing
	prefix        []byte  // per-line prefix of the current dump
	prefixPending bool    // prefix came from the header line and is checked on the next line
	afterBlank    bool    // the previous dump line was blank
	inCStack      bool    // inside "Current thread's C stack trace"
	preamble      int     // lines since a fatal header while no thread has been seen
	foreign       int     // consecutive lines without the prefix
	ids           map[string]bool
	hasCurrent    bool
}

func (p *dumpParser) line(l []byte) {
	if !p.in {
		p.startIfHeader(l)
		return
	}
	if p.prefixPending {
		p.prefixPending = false
		if !bytes.HasPrefix(l, p.prefix) {
			// The header's prefix was junk (a progress bar before it), not a
			// per-line prefix.
			p.prefix = nil
		}
	}
	if !bytes.HasPrefix(l, p.prefix) {
		p.foreign++
		if p.foreign > maxForeignLines {
			p.endDump()
		}
		// Lines of other writers (other ranks' prefixes) are skipped, but a new
		// dump may start in them.
		if !p.in {
			p.startIfHeader(l)
		}
		return
	}
	p.foreign = 0
	c := l[len(p.prefix):]

	if isBlank(c) {
		p.endThread()
		p.afterBlank = true
		p.inCStack = false
		return
	}
	blank := p.afterBlank
	p.afterBlank = false

	// A new fatal error or timeout always starts a new dump.
	if bytes.HasPrefix(c, []byte(fatalPy)) || bytes.HasPrefix(c, []byte(fatalWin)) ||
		isTimeoutHeader(c) {
		p.endDump()
		p.startIfHeader(l)
		return
	}
	if th, ok := parseThreadHeader(c); ok {
		if p.acceptsThread(th, blank) {
			p.addThread(th)
			return
		}
		p.endDump()
		p.startIfHeader(l)
		return
	}
	if bytes.Equal(trimRightSpace(c), []byte(stackHeader)) {
		if len(p.cur.Threads) == 0 && p.thr == nil {
			p.addThread(Thread{Current: true})
			return
		}
		p.endDump()
		p.startIfHeader(l)
		return
	}
	if bytes.HasPrefix(c, []byte(cStackHdr)) {
		p.endThread()
		p.inCStack = true
		return
	}
	if p.inCStack && bytes.HasPrefix(c, []byte("  ")) {
		return // "  Binary file ...", "  <truncated rest of calls>"
	}
	p.inCStack = false
	if p.thr != nil && !blank {
		if f, ok := parseFrameLine(c); ok {
			p.addFrame(f)
			return
		}
		t := trimRightSpace(c)
		switch {
		case bytes.Equal(t, []byte("  ...")):
			if !p.discard {
				p.thr.Truncated = true
			}
			return
		case bytes.HasPrefix(t, []byte("  <")) && bytes.HasSuffix(t, []byte(">")):
			// "  <no Python frame>", "  <tstate is freed>", "  <truncated>"
			if bytes.Contains(t, []byte("truncated")) && !p.discard {
				p.thr.Truncated = true
			}
			return
		case bytes.Equal(t, []byte("  Garbage-collecting")):
			return
		}
	}
	t := trimRightSpace(c)
	switch {
	case bytes.Equal(t, []byte("...")) && p.thr == nil && len(p.cur.Threads) > 0:
		p.cur.Truncated = true // more than 100 threads
		return
	case bytes.HasPrefix(t, []byte("Extension modules:")):
		p.endDump()
		return
	case bytes.HasPrefix(t, []byte("<Cannot show all threads")):
		return
	}
	if len(p.cur.Threads) == 0 && p.thr == nil && p.preamble < maxPreamble &&
		(p.cur.Fatal != "" || p.cur.Timeout != "") {
		// "Python runtime state: initialized", an exception printed by
		// Py_FatalError, an error message from faulthandler...
		p.preamble++
		return
	}
	p.endDump()
	p.startIfHeader(l)
}

// acceptsThread reports whether a thread header continues the current dump.
func (p *dumpParser) acceptsThread(th Thread, afterBlank bool) bool {
	if len(p.cur.Threads) == 0 && p.thr == nil {
		return true // first thread after a "Fatal ..." or "Timeout ..." header
	}
	if !afterBlank {
		return false // right after a frame: the next dump in the same file
	}
	if th.Current && p.hasCurrent {
		return false
	}
	return th.ID == "" || !p.ids[th.ID]
}

// startIfHeader starts a dump if l holds a dump header, possibly after junk
// or a per-line prefix.
func (p *dumpParser) startIfHeader(l []byte) {
	if i := bytes.Index(l, []byte(fatalPy)); i >= 0 {
		p.begin(l[:i])
		p.cur.Fatal = string(trimRightSpace(l[i+len(fatalPy):]))
		return
	}
	if i := bytes.Index(l, []byte(fatalWin)); i >= 0 {
		p.begin(l[:i])
		p.cur.Fatal = string(trimRightSpace(l[i+len(fatalWin):]))
		return
	}
	t := trimRightSpace(l)
	if i := bytes.Index(t, []byte("Timeout (")); i >= 0 && isTimeoutHeader(t[i:]) {
		p.begin(l[:i])
		p.cur.Timeout = string(t[i+len("Timeout (") : len(t)-len(")!")])
		return
	}
	if !bytes.HasSuffix(t, []byte(recentFirst)) {
		return
	}
	if bytes.HasSuffix(t, []byte(stackHeader)) {
		p.begin(l[:len(t)-len(stackHeader)])
		p.addThread(Thread{Current: true})
		return
	}
	// "Current thread 0x..." or "Thread 0x...", possibly after a prefix.
	start := -1
	if i := bytes.LastIndex(t, []byte("Current thread ")); i >= 0 {
		start = i
	}
	if i := bytes.LastIndex(t, []byte("Thread ")); i > start {
		start = i
	}
	if start < 0 {
		return
	}
	th, ok := parseThreadHeader(t[start:])
	if !ok {
		return
	}
	p.begin(l[:start])
	p.addThread(th)
}

func isTimeoutHeader(c []byte) bool {
	c = trimRightSpace(c)
	if !bytes.HasPrefix(c, []byte("Timeout (")) || !bytes.HasSuffix(c, []byte(")!")) {
		return false
	}
	in := c[len("Timeout (") : len(c)-len(")!")]
	if len(in) == 0 || len(in) > 32 {
		return false
	}
	for _, ch := range in {
		if (ch < '0' || ch > '9') && ch != ':' && ch != '.' {
			return false
		}
	}
	return true
}

func (p *dumpParser) begin(prefix []byte) {
	p.endDump()
	p.in = true
	p.cur = Dump{}
	p.thr = nil
	p.discard = false
	p.prefix = append(p.prefix[:0], prefix...)
	p.prefixPending = len(prefix) > 0
	p.afterBlank = false
	p.inCStack = false
	p.preamble = 0
	p.foreign = 0
	p.hasCurrent = false
	if p.ids == nil {
		p.ids = make(map[string]bool)
	} else {
		clear(p.ids)
	}
}

func (p *dumpParser) addThread(th Thread) {
	p.endThread()
	if len(p.cur.Threads) >= maxThreads {
		p.cur.Truncated = true
		p.discard = true
		p.thr = &Thread{}
		return
	}
	p.discard = false
	if th.ID != "" {
		p.ids[th.ID] = true
	}
	if th.Current {
		p.hasCurrent = true
	}
	p.thr = &th
}

func (p *dumpParser) addFrame(f Frame) {
	if p.discard {
		return
	}
	if len(p.thr.Frames) >= maxFrames {
		p.thr.Truncated = true // faulthandler prints the innermost first: keep those
		return
	}
	p.thr.Frames = append(p.thr.Frames, f)
}

func (p *dumpParser) endThread() {
	if p.thr == nil {
		return
	}
	if !p.discard {
		th := *p.thr
		fs := th.Frames
		for i, j := 0, len(fs)-1; i < j; i, j = i+1, j-1 {
			fs[i], fs[j] = fs[j], fs[i]
		}
		p.cur.Threads = append(p.cur.Threads, th)
	}
	p.thr = nil
	p.discard = false
}

func (p *dumpParser) endDump() {
	if !p.in {
		return
	}
	p.endThread()
	p.in = false
	d := p.cur
	p.cur = Dump{}
	if len(d.Threads) == 0 && d.Fatal == "" {
		return
	}
	if len(p.dumps) >= 2*maxDumps {
		// Keep the newest; amortized O(1) per dump.
		n := copy(p.dumps, p.dumps[len(p.dumps)-maxDumps+1:])
		clear(p.dumps[n:])
		p.dumps = p.dumps[:n]
	}
	p.dumps = append(p.dumps, d)
}

// parseThreadHeader parses "Thread 0x00007f... (most recent call first):" and
// "Current thread 0x... [name] (most recent call first):".
func parseThreadHeader(c []byte) (Thread, bool) {
	var th Thread
	var rest []byte
	switch {
	case bytes.HasPrefix(c, []byte("Current thread ")):
		th.Current = true
		rest = c[len("Current thread "):]
	case bytes.HasPrefix(c, []byte("Thread ")):
		rest = c[len("Thread "):]
	default:
		return th, false
	}
	rest = trimRightSpace(rest)
	if !bytes.HasSuffix(rest, []byte(recentFirst)) {
		return th, false
	}
	rest = bytes.TrimRight(rest[:len(rest)-len(recentFirst)], " ")
	id := rest
	var name []byte
	if sp := bytes.IndexByte(rest, ' '); sp >= 0 {
		id, name = rest[:sp], bytes.TrimSpace(rest[sp+1:])
	}
	if !isThreadID(id) {
		return th, false
	}
	if len(name) >= 2 && (name[0] == '[' && name[len(name)-1] == ']' || name[0] == '<' && name[len(name)-1] == '>') {
		name = name[1 : len(name)-1]
	}
	th.ID = string(id)
	th.Name = string(name)
	return th, true
}

func isThreadID(id []byte) bool {
	if bytes.HasPrefix(id, []byte("0x")) || bytes.HasPrefix(id, []byte("0X")) {
		id = id[2:]
	}
	if len(id) == 0 || len(id) > 32 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// MainThread returns the thread that runs the script: the one whose outermost
// frame that is not library code (skipping e.g. runpy's frames under
// python -m) is a module-level frame ("<module>"), else the Current thread,
// else the first. false when the dump has no threads.
func (d Dump) MainThread() (Thread, bool) {
	for _, t := range d.Threads {
		for _, f := range t.Frames {
			if IsLibrary(f.File) {
				continue
			}
			if f.Func == "<module>" {
				return t, true
			}
			break
		}
	}
	for _, t := range d.Threads {
		if t.Current {
			return t, true
		}
	}
	if len(d.Threads) > 0 {
		return d.Threads[0], true
	}
	return Thread{}, false
}

// Innermost returns the innermost frame of t.
func (t Thread) Innermost() (Frame, bool) {
	if len(t.Frames) == 0 {
		return Frame{}, false
	}
	return t.Frames[len(t.Frames)-1], true
}

// String formats t as its header line followed by its frames, innermost
// first, the way faulthandler prints it.
func (t Thread) String() string {
	var b strings.Builder
	if t.ID == "" {
		b.WriteString("Stack")
	} else {
		if t.Current {
			b.WriteString("Current thread ")
		} else {
			b.WriteString("Thread ")
		}
		b.WriteString(t.ID)
		if t.Name != "" {
			b.WriteString(" [" + t.Name + "]")
		}
	}
	b.WriteString(" (most recent call first):\n")
	for i := len(t.Frames) - 1; i >= 0; i-- {
		b.WriteString("  ")
		b.WriteString(t.Frames[i].String())
		b.WriteByte('\n')
	}
	if t.Truncated {
		b.WriteString("  ...\n")
	}
	return b.String()
}
