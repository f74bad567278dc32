// Package reporttest holds the checks the end-to-end tests make on
// ft-resumer report's output: the account (its phases and its badput
// categories) adds up, and the HTML loads in headless Chromium (Debian's
// chromium package; used by tests only, never at run time) with one
// timeline lane per rank.
package reporttest

import (
	"bytes"
	"context"
	"math"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/report"
)

// CheckAccount: the phases add up to the wall time within 1%, and every
// restart appears, followed by the round it started.
func CheckAccount(t testing.TB, r report.Report, restarts int) {
	t.Helper()
	sum := 0.0
	for p, v := range r.PhasesS {
		if v < 0 {
			t.Errorf("phase %s is negative: %v", p, v)
		}
		sum += v
	}
	if r.WallS <= 0 || math.Abs(sum-r.WallS) > 0.01*r.WallS {
		t.Errorf("phases add up to %.3fs, wall time %.3fs: more than 1%% apart (%v)", sum, r.WallS, r.PhasesS)
	}
	if len(r.Restarts) != restarts {
		t.Errorf("%d restarts in the report, want %d: %+v", len(r.Restarts), restarts, r.Restarts)
	}
	for _, rs := range r.Restarts {
		found := false
		for _, rd := range r.Rounds {
			found = found || (rd.Job == rs.Job && rd.Round > rs.AfterRound)
		}
		if !found {
			t.Errorf("restart after round %d is followed by no round in the report", rs.AfterRound)
		}
	}
	if r.PhasesS[report.Productive] <= 0 || r.Goodput <= 0 || r.Goodput >= 1 {
		t.Errorf("productive %.3fs, goodput %.3f: want some training and some badput", r.PhasesS[report.Productive], r.Goodput)
	}
	CheckCategories(t, r)
}

// CheckCategories: the badput categories (ml-goodput-measurement's) and
// their productive time add up to the wall time within 1%, none is
// negative, and each unknown (null) one says where its time is counted.
func CheckCategories(t testing.TB, r report.Report) {
	t.Helper()
	c := r.Categories
	sum := c.ProductiveS
	for _, cat := range report.CategoryOrder {
		v, ok := c.BadputS[cat]
		switch {
		case !ok:
			t.Errorf("badput category %s is missing: %v", cat, c.BadputS)
		case v == nil && c.CountedIn[cat] == "":
			t.Errorf("badput category %s is unknown but counted nowhere (counted_in %v)", cat, c.CountedIn)
		case v != nil && *v < -1e-9:
			t.Errorf("badput category %s is negative: %v", cat, *v)
		case v != nil:
			sum += *v
		}
	}
	if r.WallS <= 0 || c.ProductiveS < 0 || math.Abs(sum-r.WallS) > 0.01*r.WallS {
		t.Errorf("productive %.3fs and the badput categories add up to %.3fs, wall time %.3fs: more than 1%% apart (%+v)", c.ProductiveS, sum, r.WallS, c)
	}
}

// CheckHTMLInChromium loads the report in headless Chromium (Debian's
// chromium package) and checks that it loads without console errors and
// that its timeline has one lane per rank.
func CheckHTMLInChromium(t testing.TB, html string, ranks int) {
	t.Helper()
	testenv.Require(t, testenv.Chromium)
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--no-first-run", "--user-data-dir="+t.TempDir(), "--enable-logging=stderr", "--v=0",
		"--dump-dom", "file://"+html)
	// Chromium forks helpers: its own process group, killed afterwards.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", html, err, stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "CONSOLE") || strings.Contains(line, "Uncaught") || strings.Contains(line, "net::ERR") {
			t.Errorf("the report logged in the browser: %s", line)
		}
	}
	dom := stdout.String()
	if !strings.Contains(dom, "<svg") || !strings.Contains(dom, "Goodput") {
		t.Fatalf("chromium's DOM of the report has no timeline or no goodput table:\n%.2000s", dom)
	}
	if n := strings.Count(dom, `class="lane-rank"`); n != ranks {
		t.Errorf("the timeline has %d rank lanes, want %d", n, ranks)
	}
}
