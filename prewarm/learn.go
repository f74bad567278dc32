package prewarm

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// --prewarm auto: the standbys import what the ranks of the previous cycle
// imported. Each rank runs with a small hook first on its PYTHONPATH
// (hook/sitecustomize.py, which chains to the sitecustomize it shadows,
// and hook/_ftl_learn.py) that writes the names of the modules the rank
// imported to a file the launcher names (ReportEnv): once the imports go
// quiet (an audited event or a collection 0.5 s after the last import, so
// that a rank that then crashes without atexit has reported), at most every
// 5 s while the rank imports (not during its start-up), and at exit. At the
// next cycle's start the launcher takes the files of the ranks that ended
// aside; its refill, after the refill delay, reads them, selects
// (selectModules) and keeps the list per command line (Learner), in memory
// and in a state file shared by the jobs of a user; the standbys it starts
// then import the list with auto's checks (standby.py: a module that cannot be
// imported is skipped, one that creates a CUDA context or starts a thread
// or a process is dropped for good).

//go:embed hook/sitecustomize.py hook/_ftl_learn.py
var hookFiles embed.FS

// ReportEnv names the file a rank reports its imports to.
const ReportEnv = "FT_LAUNCHER_PREWARM_REPORT"

// MaxLearned bounds a learned list; MaxCommands the command lines a state
// file keeps (the least recently used go first).
const (
	MaxLearned  = 64
	MaxCommands = 32
)

// DefaultAutoModules is what the standbys of a command line import before
// anything was learned for it: torch and, on torch 2.x, the compiler stack
// its training calls import lazily (measured on torch 2.11: docs/prewarm.md).
// Those that are not installed are skipped.
var DefaultAutoModules = []string{"torch", "torch.distributed", "torch._dynamo", "torch._inductor",
	"torch._functorch", "torch._decomp", "torch._higher_order_ops", "torch.fx", "torch.nn", "torch.optim",
	"torch.compiler", "torch.cuda", "torch.utils", "torch._numpy", "torch.onnx", "torch.testing"}

// Learned is one command line's learned modules.
type Learned struct {
	Argv []string `json:"argv"`
	Dir  string   `json:"dir,omitempty"`
	// Modules, in import order: the top-level packages by weight, each
	// followed by its sub-packages by weight. Weight is how many of the
	// imported modules a name covers (a proxy of its import cost).
	Modules []Weighted `json:"modules"`
	// Unsafe are modules a standby must not import (a CUDA context, a
	// thread or a process at import); Failed those a standby could not.
	Unsafe  []string  `json:"unsafe,omitempty"`
	Failed  []string  `json:"failed,omitempty"`
	Cycles  int       `json:"cycles"` // reports learned from
	Updated time.Time `json:"updated"`
}

// Weighted is a module and its weight.
type Weighted struct {
	Name   string `json:"name"`
	Weight int    `json:"weight"`
}

// learned reports whether l holds a list learned from the ranks (else the
// built-in one applies).
func (l *Learned) learned() bool { return l != nil && l.Cycles > 0 }

// Names lists the modules of l in order; nil l: none.
func (l *Learned) Names() []string {
	if l == nil {
		return nil
	}
	out := make([]string, len(l.Modules))
	for i, m := range l.Modules {
		out[i] = m.Name
	}
	return out
}

type stateFile struct {
	Version  int                 `json:"version"`
	Commands map[string]*Learned `json:"commands"`
}

const learnStateVersion = 1

// Learner keeps the learned lists, keyed by CommandKey, and persists them
// to a state file ("" keeps them in memory only).
type Learner struct {
	path string
	mu   sync.Mutex
	cmds map[string]*Learned
}

// DefaultStateFile is $XDG_STATE_HOME/ft-launcher/prewarm-auto.json, or
// under ~/.local/state; "" when neither is known.
func DefaultStateFile(getenv func(string) string) string {
	dir := getenv("XDG_STATE_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "ft-launcher", "prewarm-auto.json")
}

// NewLearner loads the state file at path (missing: empty; unreadable or
// of another version: an error, and the Learner starts empty and will
// overwrite it).
func NewLearner(path string) (*Learner, error) {
	l := &Learner{path: path, cmds: map[string]*Learned{}}
	if path == "" {
		return l, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("prewarm: read the learned modules: %w", err)
	}
	var sf stateFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return l, fmt.Errorf("prewarm: parse the learned modules %s: %w", path, err)
	}
	if sf.Version != learnStateVersion {
		return l, fmt.Errorf("prewarm: learned modules %s: version %d, want %d", path, sf.Version, learnStateVersion)
	}
	for k, c := range sf.Commands {
		if c == nil || slices.ContainsFunc(c.Modules, func(w Weighted) bool { return !ValidModule(w.Name) }) {
			continue
		}
		if len(c.Modules) > MaxLearned {
			c.Modules = c.Modules[:MaxLearned]
		}
		l.cmds[k] = c
	}
	return l, nil
}

// Path is the state file ("" none).
func (l *Learner) Path() string { return l.path }

// CommandKey identifies a command line: the rank's argv, working directory
// and the PYTHONPATH it was given (what decides which modules it imports).
func CommandKey(argv []string, dir, pythonPath string) string {
	h := sha256.New()
	for _, a := range argv {
		h.Write([]byte(a))
		h.Write([]byte{0})
	}
	h.Write([]byte{1})
	h.Write([]byte(dir))
	h.Write([]byte{0})
	h.Write([]byte(pythonPath))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// Get returns a copy of what was learned for key (nil: nothing).
func (l *Learner) Get(key string) *Learned {
	l.mu.Lock()
	defer l.mu.Unlock()
	return clone(l.cmds[key])
}

func clone(c *Learned) *Learned {
	if c == nil {
		return nil
	}
	d := *c
	d.Argv = slices.Clone(c.Argv)
	d.Modules = slices.Clone(c.Modules)
	d.Unsafe = slices.Clone(c.Unsafe)
	d.Failed = slices.Clone(c.Failed)
	return &d
}

// Modules is the list a standby of key imports: the learned one, else
// DefaultAutoModules; without the unsafe and failed modules either way.
func (l *Learner) Modules(key string) []string {
	c := l.Get(key)
	mods := DefaultAutoModules
	if c.learned() {
		mods = c.Names()
	}
	var drop []string
	if c != nil {
		drop = append(c.Unsafe, c.Failed...)
	}
	return slices.DeleteFunc(slices.Clone(mods), func(m string) bool { return covered(m, drop) })
}

// Learn merges one cycle's reports (the module names each rank wrote) into
// key's list and returns the new list and whether it changed.
func (l *Learner) Learn(key string, argv []string, dir string, reports [][]string) (*Learned, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.cmds[key]
	if c == nil {
		c = &Learned{Argv: slices.Clone(argv), Dir: dir}
	}
	prev := c.Modules
	if !c.learned() {
		prev = defaultFor(reports)
	}
	sel := selectModules(reports, prev, append(slices.Clone(c.Unsafe), c.Failed...), MaxLearned)
	changed := !slices.Equal(sel, c.Modules)
	c.Modules = sel
	c.Cycles++
	c.Updated = time.Now().UTC()
	l.cmds[key] = c
	l.trimLocked()
	return clone(c), changed
}

// Drop records that a standby must not import module (unsafe) or could not
// (failed); the module and its sub-modules leave key's list. It reports
// whether the list changed.
func (l *Learner) Drop(key string, argv []string, dir, module string, unsafe bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.cmds[key]
	if c == nil {
		c = &Learned{Argv: slices.Clone(argv), Dir: dir}
		l.cmds[key] = c
	}
	list := &c.Failed
	if unsafe {
		list = &c.Unsafe
	}
	if slices.Contains(*list, module) {
		return false
	}
	*list = append(*list, module)
	if len(*list) > MaxLearned {
		*list = (*list)[len(*list)-MaxLearned:]
	}
	c.Modules = slices.DeleteFunc(c.Modules, func(w Weighted) bool { return covered(w.Name, []string{module}) })
	c.Updated = time.Now().UTC()
	l.trimLocked()
	return true
}

// trimLocked keeps the MaxCommands most recently updated command lines.
func (l *Learner) trimLocked() {
	for len(l.cmds) > MaxCommands {
		var oldest string
		for k, c := range l.cmds {
			if oldest == "" || c.Updated.Before(l.cmds[oldest].Updated) {
				oldest = k
			}
		}
		delete(l.cmds, oldest)
	}
}

// Save writes the state file atomically (last writer wins between jobs
// sharing it: each only adds what it learned).
func (l *Learner) Save() error {
	if l.path == "" {
		return nil
	}
	l.mu.Lock()
	b, err := json.MarshalIndent(stateFile{Version: learnStateVersion, Commands: l.cmds}, "", "  ")
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("prewarm: encode the learned modules: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
		return fmt.Errorf("prewarm: save the learned modules: %w", err)
	}
	if err := atomicfile.Write(l.path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("prewarm: save the learned modules: %w", err)
	}
	return nil
}

// covered reports whether m is one of mods or a sub-module of one.
func covered(m string, mods []string) bool {
	for _, u := range mods {
		if m == u || strings.HasPrefix(m, u+".") {
			return true
		}
	}
	return false
}

// selectModules turns a cycle's reports (the ranks' module names: "name"
// imported by the rank, "=name" there when it started, from its standby)
// and the previous list into the new one. Each module the rank imported
// itself counts for its top-most ancestor it also imported itself: what a
// standby must name to import it ("torch" for a cold rank; for a warm one
// a package its standby's imports did not pull in, like
// torch.utils.benchmark, or torch._dynamo under torch 2.x). The count
// (modules covered) is the name's weight, a proxy of its import cost. The
// previous list's names stay (a cycle that ended before its imports
// forgets nothing). Within the bound, top-level packages come first, then
// the cycle's other names by weight, then the previous list's; none
// covered by drop. The list is ordered by top-level package weight, each
// followed by its sub-packages, heaviest (then shallowest) first.
func selectModules(reports [][]string, prev []Weighted, drop []string, max int) []Weighted {
	weight := map[string]int{}
	for _, r := range reports {
		pre := map[string]bool{}
		for _, n := range r {
			if m, ok := strings.CutPrefix(n, "="); ok {
				pre[m] = true
			}
		}
		for _, n := range r {
			if strings.HasPrefix(n, "=") || !ValidModule(n) || covered(n, drop) {
				continue
			}
			parts := strings.Split(n, ".")
			for i := 1; i <= len(parts); i++ {
				if anc := strings.Join(parts[:i], "."); !pre[anc] {
					weight[anc]++
					break
				}
			}
		}
	}
	depth := func(n string) int { return strings.Count(n, ".") }
	byWeight := func(ws []Weighted) {
		slices.SortStableFunc(ws, func(a, b Weighted) int {
			return cmp.Or(cmp.Compare(b.Weight, a.Weight), cmp.Compare(depth(a.Name), depth(b.Name)), cmp.Compare(a.Name, b.Name))
		})
	}
	var tops, subs []Weighted
	for n, w := range weight {
		if strings.Contains(n, ".") {
			subs = append(subs, Weighted{n, w})
		} else {
			tops = append(tops, Weighted{n, w})
		}
	}
	byWeight(tops)
	byWeight(subs)
	for _, p := range prev { // what earlier cycles learned, in their order
		if _, ok := weight[p.Name]; ok || !ValidModule(p.Name) || covered(p.Name, drop) {
			continue
		}
		if strings.Contains(p.Name, ".") {
			subs = append(subs, p)
		} else {
			tops = append(tops, p)
		}
	}
	// Keep the first max, a sub-package only with its top-level package
	// (which it imports anyway: the list stays readable).
	var kept []Weighted
	in := map[string]bool{}
	for _, w := range append(tops, subs...) {
		if len(kept) == max {
			break
		}
		if top, _, sub := strings.Cut(w.Name, "."); (sub && !in[top]) || in[w.Name] {
			continue
		}
		kept = append(kept, w)
		in[w.Name] = true
	}
	var keptTops []Weighted
	for _, t := range kept {
		if !strings.Contains(t.Name, ".") {
			keptTops = append(keptTops, t)
		}
	}
	byWeight(keptTops)
	var out []Weighted
	for _, t := range keptTops {
		out = append(out, t)
		var mine []Weighted
		for _, s := range kept {
			if strings.HasPrefix(s.Name, t.Name+".") {
				mine = append(mine, s)
			}
		}
		byWeight(mine)
		out = append(out, mine...)
	}
	return out
}

// defaultFor is the part of DefaultAutoModules a command line whose ranks
// imported reports' modules keeps when it first learns: the entries of the
// top-level packages the ranks imported (torch's, if they imported torch).
func defaultFor(reports [][]string) []Weighted {
	tops := map[string]bool{}
	for _, r := range reports {
		for _, n := range r {
			top, _, _ := strings.Cut(strings.TrimPrefix(n, "="), ".")
			tops[top] = true
		}
	}
	var out []Weighted
	for _, m := range DefaultAutoModules {
		if top, _, _ := strings.Cut(m, "."); tops[top] {
			out = append(out, Weighted{Name: m})
		}
	}
	return out
}

// readReport reads a rank's report: one module name a line.
func readReport(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); ValidModule(strings.TrimPrefix(n, "=")) {
			out = append(out, n)
		}
	}
	return out, sc.Err()
}

// autoState is a Starter's --prewarm auto part: the hook directory, where
// the ranks report, and the Learner.
type autoState struct {
	dir     string // temporary: hook/ and reports/
	hookDir string
	learner *Learner
	// current is the key of the last cycle's command line; seq counts
	// the cycles (names the reports taken); pending are the reports
	// taken and not learned yet. Under Starter.mu.
	current string
	seq     int
	pending []pendingReports
}

func newAutoState(l *Learner) (*autoState, error) {
	dir, err := os.MkdirTemp("", "ft-launcher-prewarm-")
	if err != nil {
		return nil, fmt.Errorf("prewarm: auto: %w", err)
	}
	a := &autoState{dir: dir, hookDir: filepath.Join(dir, "hook"), learner: l}
	for _, d := range []string{a.hookDir, filepath.Join(dir, "reports")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("prewarm: auto: %w", err)
		}
	}
	for _, name := range []string{"sitecustomize.py", "_ftl_learn.py"} {
		b, err := hookFiles.ReadFile("hook/" + name)
		if err == nil {
			err = os.WriteFile(filepath.Join(a.hookDir, name), b, 0o644)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("prewarm: auto: write the import hook: %w", err)
		}
	}
	return a, nil
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
	pp := envOf(env, "PYTHONPATH")
	if pp == a.hookDir {
		pp = ""
	}
	pp = strings.TrimPrefix(pp, a.hookDir+string(os.PathListSeparator))
	return CommandKey(sp.Argv, RankDir(sp.Dir), pp)
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

// Describe renders what a command line would import under --prewarm auto,
// as YAML comments for --print-config.
func (l *Learner) Describe(key string) string {
	var b strings.Builder
	c := l.Get(key)
	fmt.Fprintf(&b, "# prewarm auto: command line %s, state file %s\n", key, cmp.Or(l.Path(), "(none: $XDG_STATE_HOME and $HOME unset)"))
	switch {
	case !c.learned():
		fmt.Fprintf(&b, "#   nothing learned yet; the standbys import the built-in list: %s\n", strings.Join(l.Modules(key), ","))
	default:
		fmt.Fprintf(&b, "#   learned from %d rank reports (last %s): %s\n", c.Cycles, c.Updated.Format(time.RFC3339), strings.Join(l.Modules(key), ","))
	}
	if c != nil && len(c.Unsafe) > 0 {
		fmt.Fprintf(&b, "#   left out, unsafe in a standby: %s\n", strings.Join(c.Unsafe, ","))
	}
	if c != nil && len(c.Failed) > 0 {
		fmt.Fprintf(&b, "#   left out, could not be imported in a standby: %s\n", strings.Join(c.Failed, ","))
	}
	return b.String()
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
