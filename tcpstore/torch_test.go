package tcpstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// python is Debian's interpreter, the one with torch 1.13 (python3-torch).
const python = "/usr/bin/python3"

// requireTorch fails (never skips) when torch cannot be imported: these
// tests are the proof that the server speaks torch's protocol.
func requireTorch(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import torch, torch.distributed as d; print(torch.__version__, d.is_available())").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "True") {
		t.Fatalf("torch with torch.distributed is needed for this test (%s -c 'import torch'): %v\n%s\n"+
			"install Debian's python3-torch", python, err, out)
	}
	t.Logf("torch %s", strings.Fields(string(out))[0])
}

// runPython runs a script to completion, killing it if the test ends first.
func runPython(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// TestTorch113Client: torch 1.13's own TCPStore client, every query its
// Python API has (set, get, add, compare_set, wait with and without a
// timeout, num_keys, delete_key) plus PrefixStore. 1.13's Python API has no
// check(); the wire-client tests cover CHECK.
func TestTorch113Client(t *testing.T) {
	testenv.SkipShort(t, "runs torch 1.13 clients")
	requireTorch(t)
	s := startServer(t, Limits{})
	out, err := runPython(t, nil, "testdata/torch_client.py", "127.0.0.1", fmt.Sprint(s.Addr().Port))
	if err != nil || !strings.Contains(out, "CLIENT OK") {
		t.Fatalf("torch client script: %v\n%s", err, out)
	}
	st := s.Stats()
	if st.Refused != 0 {
		t.Fatalf("the torch client was refused %d times", st.Refused)
	}
	// The script's keys stay until Reset: /n /cas /later init/
	// /worker/attempt_3/x.
	if st.Keys != 5 {
		t.Fatalf("keys held after the script = %d, want 5", st.Keys)
	}
	// Its clients have exited: their connections (and the timed-out wait)
	// are gone.
	eventually(t, "the script's connections close", func() bool {
		st := s.Stats()
		return st.Conns == 0 && st.Waiters == 0
	})
}

// TestTorch113Gloo: two torch 1.13 ranks initialise a gloo process group the
// way ranks under an agent store do (env://, TORCHELASTIC_USE_AGENT_STORE,
// keys under /worker/attempt_N) and all_reduce; then a second attempt after
// Reset, as the launcher runs it after a restart.
func TestTorch113Gloo(t *testing.T) {
	testenv.SkipShort(t, "runs torch 1.13 clients")
	requireTorch(t)
	s := startServer(t, Limits{})
	for attempt := range 2 {
		if attempt > 0 {
			s.Reset()
		}
		var wg sync.WaitGroup
		outs := make([]string, 2)
		errs := make([]error, 2)
		for rank := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[rank], errs[rank] = runPython(t, []string{
					"TORCHELASTIC_USE_AGENT_STORE=True",
					fmt.Sprintf("TORCHELASTIC_RESTART_COUNT=%d", attempt),
					"MASTER_ADDR=127.0.0.1",
					fmt.Sprintf("MASTER_PORT=%d", s.Addr().Port),
					fmt.Sprintf("RANK=%d", rank),
					"WORLD_SIZE=2",
					"LOCAL_RANK=0",
				}, "testdata/torch_rank.py")
			}()
		}
		wg.Wait()
		for rank := range 2 {
			want := fmt.Sprintf("rank %d attempt %d all_reduce 3", rank, attempt)
			if errs[rank] != nil || !strings.Contains(outs[rank], want) {
				t.Fatalf("attempt %d rank %d: %v\n%s", attempt, rank, errs[rank], outs[rank])
			}
		}
		st := s.Stats()
		if st.Refused != 0 {
			t.Fatalf("attempt %d: ranks were refused %d times", attempt, st.Refused)
		}
		if st.Keys == 0 {
			t.Fatalf("attempt %d: the ranks stored no keys", attempt)
		}
		t.Logf("attempt %d: %d keys, %d bytes held after the ranks exited", attempt, st.Keys, st.Bytes)
	}
}
