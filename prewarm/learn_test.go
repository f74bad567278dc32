package prewarm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/spawn"
)

func names(ws []Weighted) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.Name
	}
	return out
}

// TestSelectModules: what a standby must name is the top-most ancestor a
// rank imported itself (a cold rank: the top-level packages; a warm one:
// what its standby did not import), heaviest first, parents before their
// sub-packages, the previous list kept, dropped modules and their
// sub-modules left out, within the bound.
func TestSelectModules(t *testing.T) {
	cold := []string{"torch", "torch.nn", "torch.nn.functional", "torch.optim", "numpy", "numpy.core", "yaml"}
	warm := []string{"=torch", "=torch.nn", "=torch.utils", "torch.utils.benchmark", "torch.utils.benchmark.utils", "=numpy", "lightning", "lightning.fabric"}
	for _, tc := range []struct {
		name    string
		reports [][]string
		prev    []Weighted
		drop    []string
		max     int
		want    []string
	}{
		{"cold rank", [][]string{cold}, nil, nil, 64, []string{"torch", "numpy", "yaml"}},
		{"warm rank adds what its standby lacked", [][]string{warm}, []Weighted{{"torch", 4}, {"numpy", 3}},
			nil, 64, []string{"torch", "torch.utils.benchmark", "numpy", "lightning"}},
		{"previous list kept, ranks merged", [][]string{{"yaml"}, {"six"}}, []Weighted{{"torch", 9}, {"torch._dynamo", 0}},
			nil, 64, []string{"torch", "torch._dynamo", "six", "yaml"}},
		{"dropped with sub-modules", [][]string{warm}, []Weighted{{"torch", 4}, {"lightning.fabric", 1}},
			[]string{"lightning", "torch.utils.benchmark"}, 64, []string{"torch"}},
		{"bound: top-level first, then heaviest", [][]string{warm}, []Weighted{{"torch", 4}, {"torch._dynamo", 0}, {"numpy", 3}},
			nil, 3, []string{"torch", "numpy", "lightning"}},
		{"a sub-package only with its package", [][]string{{"=torch", "torch.utils.benchmark"}}, nil, nil, 64, nil},
		{"bad names ignored", [][]string{{"1x", "a-b", "ok"}}, []Weighted{{"bad name", 1}}, nil, 64, []string{"ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := names(selectModules(tc.reports, tc.prev, tc.drop, tc.max))
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLearnerKeyedBoundedPersisted: lists are kept per command line (argv,
// directory, PYTHONPATH), at most MaxLearned modules each and MaxCommands
// command lines (the least recently updated go), across Learners through
// the state file; a command line with nothing learned gets the built-in
// list, without what was dropped.
func TestLearnerKeyedBoundedPersisted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "prewarm-auto.json")
	l, err := NewLearner(path)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}
	k := CommandKey(argv, "/w", "")
	for _, other := range []string{
		CommandKey([]string{"/usr/bin/python3", "-u", "train.py", "--lr", "0.2"}, "/w", ""),
		CommandKey(argv, "/elsewhere", ""),
		CommandKey(argv, "/w", "/lib"),
	} {
		if other == k {
			t.Fatalf("a different command line has the same key %s", k)
		}
	}
	if got := l.Modules(k); !slices.Equal(got, DefaultAutoModules) {
		t.Errorf("nothing learned: %v, want the built-in list", got)
	}
	var many []string
	for i := range 100 {
		many = append(many, fmt.Sprintf("pkg%03d", i))
	}
	c, changed := l.Learn(k, argv, "/w", [][]string{many, {"torch", "torch.nn"}})
	if !changed || len(c.Modules) != MaxLearned || c.Names()[0] != "torch" {
		t.Fatalf("learned %d modules (changed %v), first %q; want %d, torch first", len(c.Modules), changed, c.Names()[0], MaxLearned)
	}
	if !l.Drop(k, argv, "/w", "torch", true) || l.Drop(k, argv, "/w", "torch", true) {
		t.Error("Drop: want a change the first time only")
	}
	if err := l.Save(); err != nil {
		t.Fatal(err)
	}
	l2, err := NewLearner(path)
	if err != nil {
		t.Fatal(err)
	}
	got := l2.Modules(k)
	if len(got) != MaxLearned-1 || slices.Contains(got, "torch") {
		t.Errorf("reloaded list %d modules, torch in it %v; want %d without torch", len(got), slices.Contains(got, "torch"), MaxLearned-1)
	}
	if _, changed := l2.Learn(k, argv, "/w", [][]string{{"torch"}}); changed {
		t.Error("an unsafe module was learned again")
	}
	if d := l2.Describe(k); !strings.Contains(d, "unsafe in a standby: torch") || !strings.Contains(d, "pkg000") {
		t.Errorf("Describe: %s", d)
	}
	if got := l2.Modules(CommandKey(argv, "/w", "/lib")); !slices.Equal(got, DefaultAutoModules) {
		t.Errorf("another command line: %v, want the built-in list", got)
	}
	for i := range MaxCommands + 5 {
		l2.Learn(CommandKey([]string{fmt.Sprint(i)}, "", ""), nil, "", [][]string{{"yaml"}})
	}
	if err := l2.Save(); err != nil {
		t.Fatal(err)
	}
	l3, err := NewLearner(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(l3.cmds); n != MaxCommands {
		t.Errorf("%d command lines kept, want %d", n, MaxCommands)
	}
	if l3.Get(k) != nil {
		t.Error("the least recently updated command line was kept")
	}
	if err := os.WriteFile(path, []byte("{broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	if l4, err := NewLearner(path); err == nil || l4 == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a broken state file: %v, want an error naming it and an empty Learner", err)
	}
}

// TestKeyOfLeavesHooksOut: the command key a rank is learned under does
// not hold the launcher's hook directories, which are temporary and so
// differ from one launcher to the next.
func TestKeyOfLeavesHooksOut(t *testing.T) {
	a := &autoState{hookDir: "/tmp/pw-1/hook", ignore: []string{"/tmp/st-1/hook"}}
	b := &autoState{hookDir: "/tmp/pw-2/hook", ignore: []string{"/tmp/st-2/hook"}}
	argv := []string{"/usr/bin/python3", "-u", "train.py"}
	for _, tc := range []struct{ a, b string }{
		{"/tmp/pw-1/hook:/tmp/st-1/hook:/u", "/tmp/pw-2/hook:/tmp/st-2/hook:/u"},
		{"/tmp/st-1/hook:/u", "/u"},
		{"/tmp/pw-1/hook", ""},
	} {
		ka := a.keyOf(spawn.Spec{Argv: argv, Dir: "/w", Env: []string{"PYTHONPATH=" + tc.a}})
		kb := b.keyOf(spawn.Spec{Argv: argv, Dir: "/w", Env: []string{"PYTHONPATH=" + tc.b}})
		if ka != kb {
			t.Errorf("PYTHONPATH %q and %q: keys differ", tc.a, tc.b)
		}
	}
	if a.keyOf(spawn.Spec{Argv: argv, Dir: "/w", Env: []string{"PYTHONPATH=/u"}}) == a.keyOf(spawn.Spec{Argv: argv, Dir: "/w", Env: []string{"PYTHONPATH=/v"}}) {
		t.Error("the user's PYTHONPATH must stay in the key")
	}
}

// TestAutoDirOfADeadLauncherRemoved: the hook directory of a launcher
// that died without removing it (SIGKILL) goes when the next one starts;
// a live one's stays.
func TestAutoDirOfADeadLauncherRemoved(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	live, err := newAutoState(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.remove()
	dead, err := newAutoState(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dead.lock.Close() // what the kernel does when its launcher dies
	next, err := newAutoState(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer next.remove()
	if _, err := os.Stat(dead.dir); !os.IsNotExist(err) {
		t.Errorf("the dead launcher's dir is still there: %v", err)
	}
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("the live launcher's dir was removed: %v", err)
	}
}
