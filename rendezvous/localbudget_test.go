package rendezvous

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestLocalRestartBudget: the single-node rendezvous applies the job's
// restart window and delay (policy.RestartBudget): a restart waits the
// delay (the decision says so), restarts within the window count, and
// restarts older than the window no longer do.
func TestLocalRestartBudget(t *testing.T) {
	ctx := context.Background()
	fail := func(t *testing.T, l *Local) Decision {
		t.Helper()
		a, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Fail(ctx, a.Round, policy.RankCrash, "rank 0 exited with code 1")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("within the window: the budget closes the job", func(t *testing.T) {
		l := NewLocal("job", 1, 1, "127.0.0.1", 29500).WithRestartBudget(time.Hour, 2*time.Second)
		if d := fail(t, l); !d.Restart || d.Delay != 2*time.Second || d.RestartsUsed != 1 {
			t.Fatalf("first failure: %+v, want a restart after 2 s", d)
		}
		d := fail(t, l)
		if d.Restart || d.Close != verdict.RestartBudgetExhausted || !strings.Contains(d.Reason, "1 of 1 restarts used within 1h0m0s") {
			t.Fatalf("second failure within the hour: %+v, want the budget exhausted", d)
		}
	})
	t.Run("an old restart leaves the window", func(t *testing.T) {
		const window = 300 * time.Millisecond
		l := NewLocal("job", 1, 1, "127.0.0.1", 29500).WithRestartBudget(window, 0)
		if d := fail(t, l); !d.Restart || d.Delay != 0 {
			t.Fatalf("first failure: %+v, want a restart at once", d)
		}
		time.Sleep(window + 100*time.Millisecond) // the first restart leaves the window
		if d := fail(t, l); !d.Restart || d.RestartsUsed != 2 {
			t.Fatalf("a failure after the window: %+v, want a restart (2 spent in all)", d)
		}
	})
	t.Run("no window: every restart counts", func(t *testing.T) {
		l := NewLocal("job", 1, 1, "127.0.0.1", 29500)
		fail(t, l)
		if d := fail(t, l); d.Restart || d.Close != verdict.RestartBudgetExhausted {
			t.Fatalf("second failure: %+v, want the budget exhausted", d)
		}
	})
}
