// Package hangdump describes processes that did not exit when a test
// expected them to, in the few lines a CI log keeps of a failure: each
// process's state and wait channels, the tracebacks of its Python threads
// and a summary of the launcher's goroutines. Tests only.
package hangdump

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// Env is what a test adds to the environment of the launchers it starts so
// that Abort makes them print their stacks: every goroutine for Go
// (GOTRACEBACK=all on SIGABRT), every thread's traceback for Python ranks
// (faulthandler on SIGABRT).
var Env = []string{"GOTRACEBACK=all", "PYTHONFAULTHANDLER=1"}

// Describe lists pid, parent, state, wait channels (the main thread's, then
// the other threads' with their counts) and the start of the command line
// of each pid: a prewarm standby's command line is a whole program. The
// zombie children of pids are listed too (their environment cannot be
// read, so a search by environment misses them): a zombie left unreaped by
// a launcher is an exit the launcher has not seen.
func Describe(pids []int) string {
	var b strings.Builder
	pids = append(slices.Clone(pids), zombieChildren(pids)...)
	for _, pid := range pids {
		main, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		others := map[string]int{}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			if task.Name() == strconv.Itoa(pid) {
				continue
			}
			w, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, task.Name()))
			others[string(w)]++
		}
		var ts []string
		for w, n := range others {
			ts = append(ts, fmt.Sprintf("%s×%d", w, n))
		}
		slices.Sort(ts)
		cmd := Cmdline(pid)
		if len(cmd) > 160 {
			cmd = fmt.Sprintf("%s… (%d bytes)", cmd[:160], len(cmd))
		}
		st, err := procfs.Read(pid)
		state, cpu, nice := "?", "?", "?"
		if err == nil {
			state, cpu, nice = string(st.State), (time.Duration(st.CPUTicks) * procfs.ClockTick).String(), strconv.Itoa(st.Nice)
		}
		fmt.Fprintf(&b, "  %d ppid=%d %s cpu=%s nice=%s wchan=%s threads=[%s] %s\n", pid, st.PPID, state, cpu, nice, main,
			strings.Join(ts, " "), strings.ReplaceAll(cmd, "\n", `\n`))
	}
	return b.String()
}

// zombieChildren are the zombies whose parent is one of pids.
func zombieChildren(pids []int) []int {
	procs, _ := procfs.List()
	var zs []int
	for _, p := range procs {
		if p.State == 'Z' && slices.Contains(pids, p.PPID) && !slices.Contains(pids, p.PID) {
			zs = append(zs, p.PID)
		}
	}
	return zs
}

// Cmdline is pid's command line, arguments separated by spaces.
func Cmdline(pid int) string {
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(bytes.TrimSpace(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
}

// Abort makes the Python processes and the ft-launcher processes among
// pids print their stacks and exit. The launchers are stopped first
// (SIGSTOP) so that they do not act on the ranks' deaths before their own
// dump: their goroutines are dumped as they were while the job hung. Then
// the Python processes get SIGABRT and a second to print their tracebacks,
// then the launchers SIGABRT and SIGCONT. Other processes (a batch script,
// srun, the embedded etcd) are left alone. No core file is written: the
// stacks are what is wanted, and a core would land in the job's directory.
func Abort(pids []int) {
	abort := func(pid int) {
		_ = unix.Prlimit(pid, unix.RLIMIT_CORE, &unix.Rlimit{}, nil)
		_ = syscall.Kill(pid, syscall.SIGABRT)
	}
	var launchers []int
	for _, pid := range pids {
		argv0, _, _ := strings.Cut(Cmdline(pid), " ")
		if filepath.Base(argv0) == "ft-launcher" {
			launchers = append(launchers, pid)
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
	}
	for _, pid := range pids {
		argv0, _, _ := strings.Cut(Cmdline(pid), " ")
		if strings.Contains(filepath.Base(argv0), "python") {
			abort(pid)
		}
	}
	time.Sleep(time.Second)
	for _, pid := range launchers {
		abort(pid)
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// PIDs lists the live processes (not zombies) whose environment holds kv,
// this process excepted.
func PIDs(kv string) []int {
	want := []byte(kv + "\x00")
	return Matching(func(environ []byte) bool { return bytes.Contains(environ, want) })
}

// Matching lists the live processes (not zombies) whose environment
// (/proc/PID/environ, NUL-separated) satisfies match, this process excepted.
func Matching(match func(environ []byte) bool) []int {
	procs, _ := procfs.List()
	var pids []int
	for _, p := range procs {
		if p.PID == os.Getpid() || p.Dead() {
			continue
		}
		if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID)); err == nil && match(env) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// Goroutines summarizes the goroutine dumps in out (a Go program's stderr
// after SIGABRT with GOTRACEBACK=all; several programs' dumps may be
// interleaved line by line): one line per distinct wait state and first
// frame in this module (or a main package), with a count, sorted by state.
func Goroutines(out string) string {
	const module = "github.com/ftlauncher/ft-launcher/"
	type key struct{ state, frame string }
	counts := map[key]int{}
	var cur *key
	flush := func() {
		if cur != nil {
			counts[*cur]++
			cur = nil
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "goroutine ") && strings.HasSuffix(line, "]:") {
			flush()
			state := line[strings.IndexByte(line, '[')+1 : len(line)-2]
			// "chan receive, 3 minutes": the duration says how long.
			cur = &key{state: state}
			continue
		}
		if cur == nil || cur.frame != "" || strings.HasPrefix(line, "\t") {
			continue
		}
		if strings.HasPrefix(line, module) || strings.HasPrefix(line, "main.") {
			cur.frame = strings.TrimPrefix(line, module)
			if i := strings.LastIndexByte(cur.frame, '('); i > 0 {
				cur.frame = cur.frame[:i]
			}
		}
	}
	flush()
	var lines []string
	for k, n := range counts {
		if k.frame == "" {
			continue // runtime and library goroutines
		}
		lines = append(lines, fmt.Sprintf("  %3d× [%s] %s", n, k.state, k.frame))
	}
	slices.SortFunc(lines, func(a, b string) int {
		return strings.Compare(a[strings.IndexByte(a, '['):], b[strings.IndexByte(b, '['):])
	})
	if len(lines) == 0 {
		return "  (no goroutine dump of this module found)\n"
	}
	return strings.Join(lines, "\n") + "\n"
}

// Python is the tracebacks faulthandler printed in out ("Thread 0x...",
// "Current thread 0x..." blocks), the innermost frame of each thread first
// as Python prints them.
func Python(out string) string {
	var b strings.Builder
	in, blank := false, false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "Fatal Python error: Aborted"):
			in, blank = true, false
			b.WriteString(line + "\n")
		case in && line == "":
			if !blank {
				b.WriteString("\n")
			}
			blank = true
		case in && (strings.HasPrefix(line, "Thread 0x") || strings.HasPrefix(line, "Current thread 0x") ||
			strings.HasPrefix(line, "  File ")):
			blank = false
			b.WriteString(line + "\n")
		default:
			in = false // "Extension modules: ...", or another program's line
		}
	}
	if b.Len() == 0 {
		return "  (no Python traceback found)\n"
	}
	return b.String()
}
