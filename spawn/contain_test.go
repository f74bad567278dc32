package spawn

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// containHelper is a launcher: it contains itself, starts a rank that
// leaves a child in its process group, a setsid'd child and a double-forked
// daemon, prints the cgroup and every pid, and blocks until killed.
func containHelper() {
	var c *Containment
	var err error
	if root := os.Getenv("CONTAIN_ROOT"); root != "" {
		c, err = containUnder(root)
	} else {
		c, err = Contain(nil)
	}
	if err != nil {
		fmt.Println("nocgroup", err)
		select {}
	}
	r, err := NewReaper(nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	script := `sleep 1000 & echo $!
setsid sleep 1000 & echo $!
sh -c 'sleep 1000 & echo $!' 
exec sleep 1000`
	pr, pw, _ := os.Pipe()
	g, err := r.StartGroup([]Spec{{LocalRank: 0, Argv: []string{"sh", "-c", script}, Stdout: pw}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	pw.Close()
	sc := bufio.NewScanner(pr)
	pids := []string{strconv.Itoa(g.PIDs()[0])}
	for len(pids) < 4 && sc.Scan() {
		pids = append(pids, strings.TrimSpace(sc.Text()))
	}
	fmt.Println(c.Dir, c.Guardian, strings.Join(pids, " "))
	select {}
}

// TestContainSIGKILLedLauncherLeavesNothing: after SIGKILL of a contained
// launcher, its rank, a child in the rank's process group, a setsid child
// and a double-forked daemon are all gone, and so is the cgroup.
func TestContainSIGKILLedLauncherLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, testenv.Cgroups, fmt.Sprintf("running as uid %d: cgroups are writable only by root here", os.Geteuid()))
	}
	for _, root := range []string{"", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"} {
		t.Run("root="+root, func(t *testing.T) {
			if root != "" && !fileExists(root) {
				testenv.Missing(t, testenv.Cgroups, "no "+root+" on this machine (this subtest drives that hierarchy)")
			}
			testContain(t, root)
		})
	}
}

func testContain(t *testing.T, root string) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=contain", "CONTAIN_ROOT="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
			// Orphans may have been reparented to this (subreaper) process.
			_, _ = syscall.Wait4(p, nil, syscall.WNOHANG, nil)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper output %q: %v", line, err)
	}
	f := strings.Fields(line)
	if len(f) > 0 && f[0] == "nocgroup" {
		testenv.Missing(t, testenv.Cgroups, "no writable cgroup (v2 cgroup.kill or v1 freezer) on this machine: "+strings.TrimSpace(line))
	}
	if len(f) != 6 {
		t.Fatalf("helper said %q", line)
	}
	dir := f[0]
	for _, s := range f[1:] {
		p, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("helper said %q", line)
		}
		pids = append(pids, p)
	}
	for _, p := range pids[1:] {
		if s := pidState(p); s == 0 || s == 'Z' {
			t.Fatalf("process %d not running before the launcher's death (state %q)", p, s)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	guardian, ranks := pids[0], pids[1:]
	for _, p := range ranks {
		waitDead(t, p, "descendant of a SIGKILLed contained launcher")
	}
	waitDead(t, guardian, "guardian")
	deadline := time.Now().Add(20 * time.Second)
	for fileExists(dir) {
		if time.Now().After(deadline) {
			t.Fatalf("cgroup %s left behind", dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOwnerPID(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"ftl-123", 123, true}, {"ftl-123-abc", 123, true}, {"ftl-", 0, false}, {"ftl-x", 0, false}, {"other-1", 0, false},
	}
	for _, tc := range tests {
		pid, ok := ownerPID(tc.name, "ftl-")
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("ownerPID(%q) = %d %v, want %d %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

// waitDead waits until pid is gone or a zombie (dead, not yet reaped: this
// test process may be the subreaper its orphans were reparented to).
func waitDead(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if s := pidState(pid); s == 0 || s == 'Z' {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s (pid %d) still alive, state %q", what, pid, pidState(pid))
}
