package pytrace

import (
	"bytes"
	"strconv"
	"strings"
)

// Frame is one Python frame.
type Frame struct {
	File string // as printed, e.g. "/home/u/train.py" or "<frozen importlib._bootstrap>"
	Line int    // 0 when unknown ("???")
	Func string // function name, "<module>" for module level; "" when not printed
}

// String formats f as "train.py:88 in step": the base name of File, the line
// ("???" when unknown) and the function ("train.py:88" when Func is "").
func (f Frame) String() string {
	var b strings.Builder
	b.WriteString(baseName(f.File))
	b.WriteByte(':')
	if f.Line > 0 {
		b.WriteString(strconv.Itoa(f.Line))
	} else {
		b.WriteString("???")
	}
	if f.Func != "" {
		b.WriteString(" in ")
		b.WriteString(f.Func)
	}
	return b.String()
}

// baseName returns the last element of a '/' or '\' separated path; names in
// angle brackets ("<frozen importlib._bootstrap>", "<string>") are returned
// whole.
func baseName(file string) string {
	if strings.HasPrefix(file, "<") {
		return file
	}
	if i := strings.LastIndexAny(file, `/\`); i >= 0 && i+1 < len(file) {
		return file[i+1:]
	}
	return file
}

const (
	maxFrames     = 1000 // frames kept per thread / traceback
	maxLineNumber = 1 << 30
)

// parseFrameLine parses one frame line of either format:
//
//	faulthandler: `  File "/x.py", line 12 in func`  (file or line may be ???)
//	traceback:    `  File "/x.py", line 12, in func`
//	SyntaxError:  `  File "/x.py", line 12`
//
// The line may also be "None" (traceback module, unknown line).
func parseFrameLine(c []byte) (Frame, bool) {
	const lead = "  File "
	if !bytes.HasPrefix(c, []byte(lead)) {
		return Frame{}, false
	}
	rest := c[len(lead):]
	var file []byte
	switch {
	case len(rest) > 0 && rest[0] == '"':
		const sep = `", line `
		k := bytes.LastIndex(rest, []byte(sep))
		if k < 1 {
			return Frame{}, false
		}
		file = rest[1:k]
		rest = rest[k+len(sep):]
	case bytes.HasPrefix(rest, []byte("???, line ")):
		file = []byte("???")
		rest = rest[len("???, line "):]
	default:
		return Frame{}, false
	}
	line, j := 0, 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		if line < maxLineNumber {
			line = line*10 + int(rest[j]-'0')
		}
		j++
	}
	if line >= maxLineNumber {
		line = 0
	}
	if j == 0 {
		switch {
		case bytes.HasPrefix(rest, []byte("???")):
			j = 3
		case bytes.HasPrefix(rest, []byte("None")):
			j = 4
		default:
			return Frame{}, false
		}
	}
	rest = bytes.TrimRight(rest[j:], " \t")
	var fn []byte
	switch {
	case len(rest) == 0:
	case bytes.HasPrefix(rest, []byte(", in ")):
		fn = rest[len(", in "):]
	case bytes.HasPrefix(rest, []byte(" in ")):
		fn = rest[len(" in "):]
	default:
		return Frame{}, false
	}
	return Frame{File: string(file), Line: line, Func: string(fn)}, true
}

// IsLibrary reports whether file is library code rather than the user's:
// anything under a site-packages or dist-packages directory, the standard
// library (a pythonX.Y directory such as /usr/lib/python3.11/ or
// .../lib/python3.12/, pythonXY.zip, or Windows' PythonXY\Lib\), frozen
// modules ("<frozen runpy>"), and torch's own files wherever torch is
// installed from. "<string>", "<stdin>" and other pseudo-files are the
// user's.
func IsLibrary(file string) bool {
	if strings.HasPrefix(file, "<") {
		return strings.HasPrefix(file, "<frozen") || file == "<__array_function__ internals>"
	}
	p := file
	if strings.IndexByte(p, '\\') >= 0 {
		p = strings.ReplaceAll(p, `\`, "/")
	}
	if strings.Contains(p, "/site-packages/") || strings.Contains(p, "/dist-packages/") ||
		strings.HasPrefix(p, "site-packages/") || strings.HasPrefix(p, "dist-packages/") {
		return true
	}
	segs := strings.Split(p, "/")
	// The last segment is the file itself; only directories count.
	for i := 0; i < len(segs)-1; i++ {
		s := segs[i]
		if isStdlibDir(s) {
			return true
		}
		if s == "Lib" && i > 0 && strings.HasPrefix(strings.ToLower(segs[i-1]), "python") {
			return true // C:\Python311\Lib\threading.py
		}
		if s == "torch" && isTorchChild(segs[i+1]) {
			return true
		}
	}
	return false
}

// isStdlibDir reports whether a directory name is a CPython standard library
// directory: "python3.11", "python3.13t", "python2.7", "python311.zip".
func isStdlibDir(s string) bool {
	if !strings.HasPrefix(s, "python") {
		return false
	}
	s = s[len("python"):]
	if strings.HasSuffix(s, ".zip") {
		s = strings.TrimSuffix(s, ".zip")
		return s != "" && allDigits(s)
	}
	dot := strings.IndexByte(s, '.')
	if dot <= 0 || !allDigits(s[:dot]) {
		return false
	}
	minor := s[dot+1:]
	// optional ABI flags: 3.13t (free-threaded), 3.11d (debug), 3.7m
	minor = strings.TrimRight(minor, "tdm")
	return minor != "" && allDigits(minor)
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// torchChildren are entries of the torch package directory; a "torch"
// directory followed by one of them (or by a private "_x" entry) is torch
// itself, e.g. a source checkout installed with pip install -e.
var torchChildren = map[string]bool{
	"__init__.py": true, "amp": true, "ao": true, "autograd": true, "backends": true,
	"compiler": true, "contrib": true, "cpu": true, "cuda": true, "distributed": true,
	"distributions": true, "export": true, "fft": true, "func": true, "functional.py": true,
	"futures": true, "fx": true, "hub.py": true, "jit": true, "library.py": true,
	"linalg": true, "masked": true, "monitor": true, "mps": true, "multiprocessing": true,
	"nested": true, "nn": true, "onnx": true, "optim": true, "overrides.py": true,
	"package": true, "profiler": true, "quantization": true, "quasirandom.py": true,
	"random.py": true, "return_types.py": true, "serialization.py": true, "signal": true,
	"sparse": true, "special": true, "storage.py": true, "testing": true, "types.py": true,
	"utils": true, "xpu": true,
}

func isTorchChild(s string) bool {
	return torchChildren[s] || (strings.HasPrefix(s, "_") && len(s) > 1)
}

// UserFrame returns the innermost frame of frames (outermost first) that is
// not library code: the deepest frame in the user's code.
func UserFrame(frames []Frame) (Frame, bool) {
	for i := len(frames) - 1; i >= 0; i-- {
		if !IsLibrary(frames[i].File) {
			return frames[i], true
		}
	}
	return Frame{}, false
}
