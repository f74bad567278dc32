package prewarm

import (
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/lockdir"
	"github.com/ftlauncher/ft-launcher/spawn"
)

//go:embed hook/sitecustomize.py hook/_ftl_learn.py
var hookFiles embed.FS

// ReportEnv names the file a rank reports its imports to.
const ReportEnv = "FT_LAUNCHER_PREWARM_REPORT"

// autoState is a Starter's --prewarm auto part: the hook directory, where
// the ranks report, and the Learner.
type autoState struct {
	dir     string   // temporary: hook/ and reports/
	lock    *os.File // holds dir's owner lock (lockdir) while the launcher runs
	hookDir string
	learner *Learner
	ignore  []string // the launcher's other hooks on PYTHONPATH (Options.HookDirs)
	// current is the key of the last cycle's command line; seq counts
	// the cycles (names the reports taken); pending are the reports
	// taken and not learned yet. Under Starter.mu.
	current string
	seq     int
	pending []pendingReports
}

// autoDirPrefix names --prewarm auto's directories under $TMPDIR.
const autoDirPrefix = "ft-launcher-prewarm-"

// newAutoState makes the hook's directory, locked while this launcher
// runs; those of launchers that died without removing theirs (SIGKILL)
// are removed first (package lockdir).
func newAutoState(l *Learner, ignore []string) (*autoState, error) {
	lockdir.RemoveStale(os.TempDir(), autoDirPrefix, nil)
	dir, lock, err := lockdir.Make(os.TempDir(), autoDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("prewarm: auto: %w", err)
	}
	a := &autoState{dir: dir, lock: lock, hookDir: filepath.Join(dir, "hook"), learner: l, ignore: ignore}
	for _, d := range []string{a.hookDir, filepath.Join(dir, "reports")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			a.remove()
			return nil, fmt.Errorf("prewarm: auto: %w", err)
		}
	}
	for _, name := range []string{"sitecustomize.py", "_ftl_learn.py"} {
		b, err := hookFiles.ReadFile("hook/" + name)
		if err == nil {
			err = os.WriteFile(filepath.Join(a.hookDir, name), b, 0o644)
		}
		if err != nil {
			a.remove()
			return nil, fmt.Errorf("prewarm: auto: write the import hook: %w", err)
		}
	}
	return a, nil
}

// remove removes the directory and gives up its lock.
func (a *autoState) remove() {
	os.RemoveAll(a.dir)
	a.lock.Close()
}

func (a *autoState) report(localRank int) string {
	return filepath.Join(a.dir, "reports", fmt.Sprintf("rank%d", localRank))
}

// keyOf is the command key of a rank's spec, with or without the hook.
func (a *autoState) keyOf(sp spawn.Spec) string {
	env := sp.Env
	if env == nil {
		env = os.Environ()
	}
	pp := filepath.SplitList(envOf(env, "PYTHONPATH"))
	for len(pp) > 0 && (pp[0] == a.hookDir || slices.Contains(a.ignore, pp[0])) {
		pp = pp[1:]
	}
	return CommandKey(sp.Argv, RankDir(sp.Dir), strings.Join(pp, string(os.PathListSeparator)))
}

// RankDir is the working directory a rank gets for dir ("": the
// launcher's).
func RankDir(dir string) string {
	if dir == "" {
		if wd, err := os.Getwd(); err == nil {
			return wd
		}
	}
	return dir
}

// withHook returns sp with the hook first on its PYTHONPATH and its report
// file named (sp.Env is not modified).
func (a *autoState) withHook(sp spawn.Spec) spawn.Spec {
	env := sp.Env
	if env == nil {
		env = os.Environ()
	}
	pp := a.hookDir
	if old, ok := lookupEnv(env, "PYTHONPATH"); ok {
		pp += string(os.PathListSeparator) + old
	}
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PYTHONPATH=") && !strings.HasPrefix(kv, ReportEnv+"=") {
			out = append(out, kv)
		}
	}
	sp.Env = append(out, "PYTHONPATH="+pp, ReportEnv+"="+a.report(sp.LocalRank))
	return sp
}

// standbyEnv is the environment of a standby started from a hooked spec:
// the hook stays on PYTHONPATH (the standby installs it at the handover),
// without a report file (the standby's own imports are not a rank's).
func standbyEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, ReportEnv+"=") })
}

func envOf(env []string, k string) string {
	v, _ := lookupEnv(env, k)
	return v
}

func lookupEnv(env []string, k string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], k+"="); ok {
			return v, true
		}
	}
	return "", false
}

// takeReports moves the reports of the ranks of specs (the previous
// cycle's, which have ended) out of the way of the new ranks' (a rename)
// and queues them: the refill learns from them after its delay, before it
// starts the new standbys, so that reading, choosing and saving (an fsync)
// stay off the restart's path and its first steps. Called at a cycle's
// start, before its ranks start.
func (st *Starter) takeReports(specs []spawn.Spec) {
	a := st.auto
	st.mu.Lock()
	defer st.mu.Unlock()
	a.seq++
	taken := map[int]string{}
	for _, sp := range specs {
		path := a.report(sp.LocalRank)
		done := fmt.Sprintf("%s.cycle%d", path, a.seq)
		if err := os.Rename(path, done); err == nil {
			taken[sp.LocalRank] = done
		}
	}
	a.pending = append(a.pending, pendingReports{specs: slices.Clone(specs), taken: taken})
}

// pendingReports are one cycle's reports, taken, not learned yet.
type pendingReports struct {
	specs []spawn.Spec
	taken map[int]string // local rank -> report
}

// learnPending learns from the reports queued by takeReports.
func (st *Starter) learnPending() {
	st.mu.Lock()
	pending := st.auto.pending
	st.auto.pending = nil
	st.mu.Unlock()
	for _, p := range pending {
		st.learn(p.specs, p.taken)
	}
}

// learn learns from the reports taken (local rank -> file) of the ranks
// of specs and saves the Learner.
func (st *Starter) learn(specs []spawn.Spec, taken map[int]string) {
	a := st.auto
	byKey := map[string][][]string{}
	var keys []string
	first := map[string]spawn.Spec{}
	for _, sp := range specs {
		k := a.keyOf(sp)
		if _, ok := first[k]; !ok {
			first[k] = sp
			keys = append(keys, k)
		}
		path, ok := taken[sp.LocalRank]
		if !ok {
			continue // none yet (the first cycle), or the rank never got to report
		}
		names, err := readReport(path)
		os.Remove(path)
		if err != nil {
			continue
		}
		byKey[k] = append(byKey[k], names)
	}
	st.mu.Lock()
	current := a.current
	st.mu.Unlock()
	for _, k := range keys {
		sp := first[k]
		if reports := byKey[k]; len(reports) > 0 {
			st.learnFor(k, sp.Argv, sp.Dir, reports)
			continue
		}
		if current != k {
			c := a.learner.Get(k)
			if !c.learned() {
				st.log.Info("prewarm auto: nothing learned for this command line yet: the standbys import the built-in list",
					"command", k, "modules", strings.Join(a.learner.Modules(k), ","), "state_file", a.learner.Path())
			} else {
				st.log.Info("prewarm auto: the standbys import what this command line's ranks imported before",
					"command", k, "modules", strings.Join(a.learner.Modules(k), ","), "cycles", c.Cycles, "state_file", a.learner.Path())
			}
		}
	}
	if len(keys) > 0 {
		st.mu.Lock()
		a.current = keys[0]
		st.mu.Unlock()
	}
}

// learnFor learns key's reports, saves and says what changed.
func (st *Starter) learnFor(key string, argv []string, dir string, reports [][]string) {
	a := st.auto
	c, changed := a.learner.Learn(key, argv, dir, reports)
	st.save()
	if !changed {
		st.log.Debug("prewarm auto: the ranks imported nothing new", "command", key, "ranks", len(reports))
		return
	}
	mods := a.learner.Modules(key)
	st.log.Info("prewarm auto: learned the modules the ranks import; new standbys import them",
		"command", key, "modules", strings.Join(mods, ","), "ranks", len(reports), "cycles", c.Cycles, "state_file", a.learner.Path())
	st.event(eventlog.PrewarmLearnedEvent{Command: key, Modules: mods, Ranks: len(reports),
		Cycles: c.Cycles, StateFile: a.learner.Path()})
}

// learnLast learns from every report left (the last cycle's ranks), at
// Close.
func (st *Starter) learnLast() {
	a := st.auto
	st.learnPending() // a refill that did not come to learn
	entries, err := os.ReadDir(filepath.Join(a.dir, "reports"))
	if err != nil {
		return
	}
	var reports [][]string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") || strings.Contains(e.Name(), ".cycle") {
			continue
		}
		if names, err := readReport(filepath.Join(a.dir, "reports", e.Name())); err == nil {
			reports = append(reports, names)
		}
	}
	st.mu.Lock()
	key := a.current
	st.mu.Unlock()
	if key == "" || len(reports) == 0 {
		return
	}
	c := a.learner.Get(key)
	var argv []string
	dir := ""
	if c != nil {
		argv, dir = c.Argv, c.Dir
	}
	st.learnFor(key, argv, dir, reports)
}

func (st *Starter) save() {
	if err := st.auto.learner.Save(); err != nil {
		st.log.Warn("prewarm auto: could not keep the learned modules for the next job", "err", err)
	}
}

// skipped drops the modules a ready standby could not import from its
// command line's list.
func (st *Starter) skipped(s *standby) {
	if st.auto == nil || len(s.skipped) == 0 {
		return
	}
	key := st.auto.keyOf(s.spec)
	var dropped []string
	for _, m := range s.skipped {
		if ValidModule(m) && st.auto.learner.Drop(key, s.spec.Argv, s.spec.Dir, m, false) {
			dropped = append(dropped, m)
		}
	}
	if len(dropped) > 0 {
		st.log.Info("prewarm auto: modules not installed or not importable in a standby are left out",
			"command", key, "modules", strings.Join(dropped, ","), "output", s.diag.String())
		st.save()
	}
}

// unsafe drops the module that made standby s unsafe (a CUDA context, a
// thread or a process at import) for good and starts the rank's standby
// again without it.
func (st *Starter) unsafe(s *standby) {
	key := st.auto.keyOf(s.spec)
	st.auto.learner.Drop(key, s.spec.Argv, s.spec.Dir, s.unsafe, true)
	st.save()
	st.log.Warn("prewarm auto: a module is not safe to import in a standby and is left out; its standby starts again without it",
		"command", key, "module", s.unsafe, "reason", s.unsafeWhy, "local_rank", s.localRank)
	st.event(eventlog.PrewarmUnsafeEvent{Command: key, Module: s.unsafe, Reason: s.unsafeWhy, LocalRank: s.localRank})
	st.mu.Lock()
	if st.standby[s.localRank] == s {
		delete(st.standby, s.localRank)
	}
	st.mu.Unlock()
	st.startOne(s.spec)
}

// AutoSummary is what --prewarm auto learned for the last cycle's command
// line (nil: not auto, or no cycle yet): for the verdict.
func (st *Starter) AutoSummary() *AutoSummary {
	if st.auto == nil {
		return nil
	}
	st.mu.Lock()
	key := st.auto.current
	st.mu.Unlock()
	if key == "" {
		return nil
	}
	c := st.auto.learner.Get(key)
	sum := &AutoSummary{Command: key, Modules: st.auto.learner.Modules(key), StateFile: st.auto.learner.Path()}
	if c != nil {
		sum.Cycles, sum.Unsafe, sum.Failed = c.Cycles, c.Unsafe, c.Failed
	}
	sum.Default = !c.learned()
	return sum
}

// AutoSummary: see Starter.AutoSummary.
type AutoSummary struct {
	Command   string   `json:"command"`           // CommandKey
	Modules   []string `json:"modules"`           // what the next standby imports
	Default   bool     `json:"default,omitempty"` // nothing learned: the built-in list
	Cycles    int      `json:"cycles"`            // reports learned from, over jobs
	Unsafe    []string `json:"unsafe,omitempty"`
	Failed    []string `json:"failed,omitempty"`
	StateFile string   `json:"state_file,omitempty"`
}
