package prewarm

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
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

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
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
//
// This file holds the Learner (the kept lists and their state file) and
// the selection; the Starter's side (the hook, autoState, the reports and
// learning from them) is in auto.go.

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
