package pytrace

import (
	"bytes"
	"sort"
	"unicode/utf8"
)

// Traceback is one uncaught exception as Python's traceback module prints it.
type Traceback struct {
	Type      string  // "RuntimeError", "torch.distributed.DistBackendError", "KeyboardInterrupt", as printed
	Message   string  // the text after "Type: " (may span several lines, at most 2 KiB); "" when none
	Frames    []Frame // outermost first, as printed
	Chained   int     // how many earlier exceptions were chained before this one ("During handling of the above exception..." / "The above exception was the direct cause...")
	Prefix    string  // the constant per-line prefix the traceback was printed with ("[default0]:", "[rank3]: "); "" when none
	Truncated bool    // more than 1,000 frames were printed; only the innermost 1,000 are kept
}

// UserFrame returns the innermost frame of the traceback that is in the
// user's code (see IsLibrary).
func (t Traceback) UserFrame() (Frame, bool) { return UserFrame(t.Frames) }

const (
	tbHeader        = "Traceback (most recent call last):"
	groupWord       = "Exception Group "
	markerContext   = "During handling of the above exception, another exception occurred:"
	markerCause     = "The above exception was the direct cause of the following exception:"
	maxMessageBytes = 2048
	maxMessageLines = 200 // message lines consumed (kept while under maxMessageBytes)
	maxJunkLines    = 64  // unexpected lines tolerated among a traceback's frames
	maxBlocks       = 16  // tracebacks parsed at once (one per prefix)
	maxChains       = 64  // prefixes whose chain markers are tracked
	maxTracebacks   = 1024
	maxPeekLines    = 16 // lines looked at after a header to confirm it
)

// LastTraceback finds the last complete traceback in text (e.g. the last
// 64 KiB of a rank's stderr), which may contain other output, progress bars
// redrawn with \r, ANSI colours, and lines with a constant prefix such as
// "[default0]:" or "[rank3]: ". With chained exceptions it returns the final
// (outermost raised) one, whose Chained counts the earlier ones. "Last" is by
// the position of the exception line. false when there is none.
func LastTraceback(text []byte) (Traceback, bool) {
	var last Traceback
	lastLine, found := -1, false
	scanTracebacks(text, func(tb Traceback, line int) {
		if line >= lastLine {
			last, lastLine, found = tb, line, true
		}
	})
	return last, found
}

// Tracebacks returns every complete traceback in text in the order of their
// exception lines (at most the last 1,024). Each exception of a chain is
// returned, the earlier ones first; Chained tells how many came before.
func Tracebacks(text []byte) []Traceback {
	type item struct {
		tb   Traceback
		line int
	}
	var all []item
	scanTracebacks(text, func(tb Traceback, line int) {
		if len(all) >= 2*maxTracebacks {
			n := copy(all, all[len(all)-maxTracebacks+1:])
			clear(all[n:])
			all = all[:n]
		}
		all = append(all, item{tb, line})
	})
	sort.SliceStable(all, func(i, j int) bool { return all[i].line < all[j].line })
	if len(all) > maxTracebacks {
		all = all[len(all)-maxTracebacks:]
	}
	out := make([]Traceback, len(all))
	for i := range all {
		out[i] = all[i].tb
	}
	return out
}

type tbState int

const (
	stFrames  tbState = iota // reading frames
	stMessage                // after the exception line: message continuation lines
	stRegion                 // after an exception group: skipping its sub-exceptions
)

type tbBlock struct {
	outer    []byte // the block owns lines starting with outer
	pfx      []byte // content prefix: outer, or outer + "  | " inside an exception group
	group    bool
	state    tbState
	tb       Traceback
	msg      []byte
	msgLines int
	junk     int
	excLine  int
}

type chainState struct {
	prefix      []byte
	markers     int  // chain markers since the last unchained traceback header
	afterMarker bool // the last non-blank line outside tracebacks was a marker
}

type tbScanner struct {
	ls     lines
	blocks []*tbBlock
	chains []*chainState
	emit   func(Traceback, int)
}

func scanTracebacks(text []byte, emit func(Traceback, int)) {
	s := tbScanner{ls: lines{b: text}, emit: emit}
	for {
		raw, ok := s.ls.next()
		if !ok {
			break
		}
		l := clean(raw)
		if s.region(l) || s.header(l) {
			continue
		}
		if b := s.route(l); b != nil && s.feed(b, l) {
			continue
		}
		s.outside(l)
	}
	// At the end of the text, a traceback whose exception line was seen is
	// complete; one still reading frames is not.
	for _, b := range s.blocks {
		if b.state == stMessage {
			s.complete(b)
		}
	}
	s.blocks = nil
}

// region consumes the sub-exception lines of an exception group ("  +-+---",
// "    | ...") and ends the region at the first other line of its prefix.
func (s *tbScanner) region(l []byte) bool {
	for _, b := range s.blocks {
		if b.state != stRegion || !bytes.HasPrefix(l, b.outer) {
			continue
		}
		c := l[len(b.outer):]
		t := bytes.TrimLeft(c, " ")
		if len(t) < len(c) && len(t) > 0 && (t[0] == '|' || t[0] == '+') {
			return true
		}
		s.remove(b)
		return false
	}
	return false
}

// header starts a new block if l is a confirmed traceback header.
func (s *tbScanner) header(l []byte) bool {
	t := trimRightSpace(l)
	if !bytes.HasSuffix(t, []byte(tbHeader)) {
		return false
	}
	p0 := t[:len(t)-len(tbHeader)]
	b := &tbBlock{}
	if bytes.HasSuffix(p0, []byte(groupWord)) {
		// "  + Exception Group Traceback (most recent call last):", whose own
		// lines read "  |   File ...", "  | ExceptionGroup: ...".
		p0 = p0[:len(p0)-len(groupWord)]
		if !bytes.HasSuffix(p0, []byte("+ ")) {
			return false
		}
		base := p0[:len(p0)-2]
		b.group = true
		b.pfx = append(append([]byte(nil), base...), "| "...)
		b.outer = append([]byte(nil), trimRightSpace(base)...)
		if !s.confirm(b.pfx) {
			return false
		}
	} else {
		p, ok := s.confirmPrefix(p0)
		if !ok {
			return false
		}
		b.outer = append([]byte(nil), p...)
		b.pfx = b.outer
	}
	for i := 0; i < len(s.blocks); i++ {
		if o := s.blocks[i]; bytes.Equal(o.outer, b.outer) {
			if o.state == stMessage {
				s.complete(o)
			}
			s.remove(o)
			i--
		}
	}
	cs := s.chain(b.outer)
	if cs.afterMarker {
		b.tb.Chained = cs.markers
	} else {
		cs.markers = 0
	}
	cs.afterMarker = false
	b.tb.Prefix = string(b.outer)
	if len(s.blocks) >= maxBlocks {
		s.remove(s.blocks[0])
	}
	s.blocks = append(s.blocks, b)
	return true
}

// confirmPrefix decides the per-line prefix of a traceback whose header line
// had p0 before "Traceback": p0 itself if one of the next lines is a frame
// line with that prefix, or, when p0 is junk such as a progress bar or
// "Original ", the prefix of the frame line right after the header.
func (s *tbScanner) confirmPrefix(p0 []byte) ([]byte, bool) {
	off := s.ls.off
	for k := 0; k < maxPeekLines; k++ {
		raw, next, ok := s.ls.peekAt(off)
		if !ok {
			return nil, false
		}
		off = next
		l := clean(raw)
		if bytes.HasPrefix(l, p0) && bytes.HasPrefix(l[len(p0):], []byte(`  File `)) {
			return p0, true
		}
		if k == 0 && !bytes.HasPrefix(l, p0) {
			if j := bytes.Index(l, []byte(`  File `)); j >= 0 && bytes.HasPrefix(p0, l[:j]) {
				return l[:j], true
			}
		}
	}
	return nil, false
}

// confirm reports whether one of the next lines is a frame line with prefix pfx.
func (s *tbScanner) confirm(pfx []byte) bool {
	off := s.ls.off
	for k := 0; k < maxPeekLines; k++ {
		raw, next, ok := s.ls.peekAt(off)
		if !ok {
			return false
		}
		off = next
		l := clean(raw)
		if bytes.HasPrefix(l, pfx) && bytes.HasPrefix(l[len(pfx):], []byte(`  File `)) {
			return true
		}
	}
	return false
}

// route returns the active block with the longest prefix that l starts with.
func (s *tbScanner) route(l []byte) *tbBlock {
	var best *tbBlock
	for _, b := range s.blocks {
		if b.state == stRegion || !bytes.HasPrefix(l, b.outer) {
			continue
		}
		if best == nil || len(b.outer) > len(best.outer) {
			best = b
		}
	}
	return best
}

// feed gives l to block b; false when the line is not part of it.
func (s *tbScanner) feed(b *tbBlock, l []byte) bool {
	if !bytes.HasPrefix(l, b.pfx) {
		// Only in an exception group: its own lines are "  | ..."; the first
		// other line ("  +-+---- 1 ----") starts the sub-exceptions.
		if b.state == stMessage {
			s.complete(b)
			b.state = stRegion
			return s.region(l)
		}
		s.remove(b)
		return false
	}
	c := l[len(b.pfx):]
	switch b.state {
	case stFrames:
		if f, ok := parseFrameLine(c); ok {
			b.addFrame(f)
			return true
		}
		if bytes.HasPrefix(c, []byte("    ")) || bytes.HasPrefix(c, []byte("  [Previous line repeated")) {
			return true // source line, caret line, recursion summary
		}
		if typ, msg, ok := parseExceptionLine(c); ok {
			b.tb.Type = string(typ)
			b.msg = append(b.msg[:0], msg...)
			b.excLine = s.ls.n
			if len(msg) == 0 {
				// str(exc) is empty: there are no continuation lines.
				s.complete(b)
				s.remove(b)
				return true
			}
			b.state = stMessage
			return true
		}
		if !isBlank(c) {
			b.junk++
			if b.junk > maxJunkLines {
				s.remove(b)
			}
		}
		return false
	case stMessage:
		if b.msgLines >= maxMessageLines || endsMessage(c) {
			s.complete(b)
			if b.group {
				b.state = stRegion
			} else {
				s.remove(b)
			}
			return false
		}
		b.msgLines++
		if len(b.msg) < maxMessageBytes {
			b.msg = append(b.msg, '\n')
			b.msg = append(b.msg, c...)
		}
		return true
	}
	return false
}

func (b *tbBlock) addFrame(f Frame) {
	if len(b.tb.Frames) >= 2*maxFrames {
		// Keep the innermost frames; amortized O(1) per frame.
		n := copy(b.tb.Frames, b.tb.Frames[len(b.tb.Frames)-maxFrames:])
		b.tb.Frames = b.tb.Frames[:n]
		b.tb.Truncated = true
	}
	b.tb.Frames = append(b.tb.Frames, f)
}

// complete emits b's traceback.
func (s *tbScanner) complete(b *tbBlock) {
	tb := b.tb
	if len(tb.Frames) > maxFrames {
		tb.Frames = tb.Frames[len(tb.Frames)-maxFrames:]
		tb.Truncated = true
	}
	tb.Frames = append([]Frame(nil), tb.Frames...)
	m := b.msg
	if len(m) > maxMessageBytes {
		m = m[:maxMessageBytes]
		// Drop a rune split at the limit.
		for k := 0; k < utf8.UTFMax-1 && len(m) > 0; k++ {
			if r, size := utf8.DecodeLastRune(m); r != utf8.RuneError || size != 1 {
				break
			}
			m = m[:len(m)-1]
		}
	}
	tb.Message = string(trimRightSpace(m))
	s.chain(b.outer).afterMarker = false
	s.emit(tb, b.excLine)
}

func (s *tbScanner) remove(b *tbBlock) {
	for i, o := range s.blocks {
		if o == b {
			s.blocks = append(s.blocks[:i], s.blocks[i+1:]...)
			return
		}
	}
}

func (s *tbScanner) chain(prefix []byte) *chainState {
	for _, c := range s.chains {
		if bytes.Equal(c.prefix, prefix) {
			return c
		}
	}
	if len(s.chains) >= maxChains {
		s.chains = s.chains[1:]
	}
	c := &chainState{prefix: append([]byte(nil), prefix...)}
	s.chains = append(s.chains, c)
	return c
}

// outside handles a line that belongs to no traceback: it only matters for
// chained exceptions.
func (s *tbScanner) outside(l []byte) {
	t := trimRightSpace(l)
	for _, m := range [...]string{markerContext, markerCause} {
		if bytes.HasSuffix(t, []byte(m)) {
			cs := s.chain(t[:len(t)-len(m)])
			cs.markers++
			cs.afterMarker = true
			return
		}
	}
	for _, cs := range s.chains {
		if bytes.HasPrefix(l, cs.prefix) && !isBlank(l[len(cs.prefix):]) {
			cs.afterMarker = false
		}
	}
}

// parseExceptionLine parses the last line of a traceback: "Type" or
// "Type: message", Type being a possibly dotted (qualified) name.
func parseExceptionLine(c []byte) (typ, msg []byte, ok bool) {
	i := 0
	for i < len(c) {
		ch := c[i]
		if ch == '_' || 'A' <= ch && ch <= 'Z' || 'a' <= ch && ch <= 'z' || ch >= 0x80 ||
			i > 0 && ('0' <= ch && ch <= '9' || ch == '.' || ch == '<' || ch == '>') {
			i++
			continue
		}
		break
	}
	if i == 0 || c[i-1] == '.' || bytes.Contains(c[:i], []byte("..")) {
		return nil, nil, false
	}
	typ, rest := c[:i], c[i:]
	switch {
	case isBlank(rest):
		return typ, nil, true
	case rest[0] != ':':
		return nil, nil, false
	case len(rest) == 1 || isBlank(rest[1:]):
		return typ, nil, true
	case rest[1] == ' ':
		return typ, rest[2:], true
	}
	return nil, nil, false
}

// endsMessage reports whether a line after an exception line cannot be part
// of its message.
func endsMessage(c []byte) bool {
	if isBlank(c) {
		return true
	}
	t := trimRightSpace(c)
	switch {
	case bytes.HasPrefix(c, []byte(`  File "`)),
		bytes.HasSuffix(t, []byte(tbHeader)),
		bytes.HasSuffix(t, []byte(markerContext)),
		bytes.HasSuffix(t, []byte(markerCause)),
		bytes.HasPrefix(c, []byte(fatalPy)),
		bytes.HasPrefix(c, []byte("Thread 0x")),
		bytes.HasPrefix(c, []byte("Current thread 0x")):
		return true
	}
	return looksLikeLogLine(c)
}

// looksLikeLogLine recognizes lines other code commonly writes to stderr
// right after a traceback: torch's C++ log lines ("[W socket.cpp:601] ...",
// "[E1015 10:00:00 ...]"), glog lines ("E1015 10:00:00.123 ..."), and Python
// logging's default format ("WARNING:torch.distributed...:...").
func looksLikeLogLine(c []byte) bool {
	if len(c) >= 3 && c[0] == '[' && bytes.IndexByte([]byte("WEIF"), c[1]) >= 0 &&
		(c[2] == ' ' || '0' <= c[2] && c[2] <= '9') {
		return true
	}
	if len(c) >= 6 && bytes.IndexByte([]byte("WEIF"), c[0]) >= 0 && allDigits(string(c[1:5])) && c[5] == ' ' {
		return true
	}
	for _, lv := range [...]string{"DEBUG:", "INFO:", "WARNING:", "ERROR:", "CRITICAL:"} {
		if bytes.HasPrefix(c, []byte(lv)) {
			return true
		}
	}
	return false
}
