package ranklogs

import (
	"github.com/ftlauncher/ft-launcher/eventlog"

	"io"
	"os"
	"strings"
)

// Hint is advice for a rank failure whose own message does not say what
// to do: a known cause recognised in the rank's error file or stderr.
type Hint struct {
	Kind eventlog.HintCause // stable name, for the event log
	Text string
}

// libuvMissing is what torch >= 2.4 raises when a TCPStore asks for the
// libuv backend (the default) and torch was built without it (Debian's
// torch 2.6, some Windows wheels): c10d's TCPStore.cpp, verbatim.
const libuvMissing = "use_libuv was requested but PyTorch was build without libuv support"

// HintKindNoLibuv: the rank's torch has no libuv TCPStore backend.
const HintKindNoLibuv = eventlog.HintNoLibuv

// FailureHint recognises a known cause in text (an error file's message
// and traceback, the tail of the rank's stderr). agentStore is whether the
// ranks ran under the launcher's agent store (--agent-store on).
func FailureHint(text string, agentStore bool) (Hint, bool) {
	if !strings.Contains(text, libuvMissing) {
		return Hint{}, false
	}
	h := Hint{Kind: HintKindNoLibuv}
	if agentStore {
		h.Text = "the ranks' torch is built without libuv, and under the agent store (--agent-store on, the default) " +
			"torch builds each rank's TCPStore client asking for libuv (USE_LIBUV=0 does not reach it there): " +
			"run with --agent-store off and USE_LIBUV=0 in the launcher's environment, or wrap TCPStore to pass use_libuv=False " +
			"(docs/agentstore.md, \"torch without libuv\")"
	} else {
		h.Text = "the ranks' torch is built without libuv and its TCPStore asks for libuv: set USE_LIBUV=0 in the launcher's " +
			"environment (the ranks inherit it), or wrap TCPStore to pass use_libuv=False (docs/agentstore.md, \"torch without libuv\")"
	}
	return h, true
}

// hintTail bounds how much of a rank's stderr log FailureText reads.
const hintTail = 64 << 10

// FailureText is what FailureHint looks at for failure f: its error file's
// message and traceback and the last 64 KiB of stderrPath ("" or
// unreadable: none; a rank's stderr is only in a file with --redirects or
// --tee).
func FailureText(f Failure, stderrPath string) string {
	var b strings.Builder
	if f.Record != nil {
		b.WriteString(f.Record.Message)
		b.WriteByte('\n')
		b.WriteString(f.Record.Traceback)
		b.WriteByte('\n')
	}
	b.Write(Tail(stderrPath, hintTail))
	return b.String()
}

// Tail is the last n bytes of the file at path: nil when path is "" or
// unreadable.
func Tail(path string, n int64) []byte {
	if path == "" {
		return nil
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer fh.Close()
	if st, err := fh.Stat(); err == nil && st.Size() > n {
		if _, err := fh.Seek(st.Size()-n, io.SeekStart); err != nil {
			return nil
		}
	}
	b, _ := io.ReadAll(io.LimitReader(fh, n))
	return b
}
