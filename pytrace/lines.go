package pytrace

import "bytes"

// lines iterates over the lines of a byte slice without allocating.
type lines struct {
	b   []byte
	off int
	n   int // number of lines returned so far
}

// next returns the next line without its "\n" and false at the end.
func (l *lines) next() ([]byte, bool) {
	if l.off >= len(l.b) {
		return nil, false
	}
	rest := l.b[l.off:]
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		l.off = len(l.b)
		l.n++
		return rest, true
	}
	l.off += i + 1
	l.n++
	return rest[:i], true
}

// peek returns the line after the current position without consuming it.
func (l *lines) peekAt(off int) (line []byte, next int, ok bool) {
	if off >= len(l.b) {
		return nil, off, false
	}
	rest := l.b[off:]
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		return rest, len(l.b), true
	}
	return rest[:i], off + i + 1, true
}

// clean returns what a terminal would show for one line: trailing "\r"s
// (CRLF endings) dropped, only the text after the last remaining "\r" (a
// progress bar redrawing itself) and ANSI escape sequences removed. The
// result aliases line unless escapes had to be removed.
func clean(line []byte) []byte {
	for len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if i := bytes.LastIndexByte(line, '\r'); i >= 0 {
		line = line[i+1:]
	}
	if bytes.IndexByte(line, 0x1b) < 0 {
		return line
	}
	out := make([]byte, 0, len(line))
	for i := 0; i < len(line); i++ {
		c := line[i]
		if c != 0x1b {
			out = append(out, c)
			continue
		}
		if i+1 < len(line) && line[i+1] == '[' {
			// CSI: ESC [ parameters/intermediates, then a final byte 0x40-0x7e.
			j := i + 2
			for j < len(line) && (line[j] < 0x40 || line[j] > 0x7e) {
				j++
			}
			i = j // skips the final byte too (the loop's i++)
			continue
		}
		i++ // ESC + one character
	}
	return out
}

// isBlank reports whether b holds only spaces and tabs.
func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' {
			return false
		}
	}
	return true
}

func trimRightSpace(b []byte) []byte {
	return bytes.TrimRight(b, " \t")
}
