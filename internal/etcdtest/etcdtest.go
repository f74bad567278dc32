// Package etcdtest starts Debian's real etcd server (package etcd-server)
// for tests, on free loopback ports with its own data directory, and stops
// it when the test ends.
package etcdtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// Binary is where Debian installs etcd.
const Binary = "/usr/bin/etcd"

// Server is one running etcd.
type Server struct {
	ClientURL string
	cmd       *exec.Cmd
	done      chan struct{}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Start runs etcd until the test ends; the test fails if etcd is missing
// or does not serve within 30 s.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("%s is required (Debian package etcd-server): %v", Binary, err)
	}
	client := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	cmd := exec.Command(Binary, "--name", "t", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "t="+peer,
		"--log-level", "error")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	s := &Server{ClientURL: "http://" + client, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(s.Stop)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", client, 200*time.Millisecond); err == nil {
			c.Close()
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("etcd did not listen on %s", client)
	return nil
}

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Signal sends sig to the server (SIGSTOP and SIGCONT freeze and resume
// it: a member that holds its connections open and answers nothing).
func (s *Server) Signal(sig os.Signal) error {
	return s.cmd.Process.Signal(sig)
}

// Freeze stops the server (SIGSTOP) and returns once every one of its
// threads is stopped. kill returns when the signal is queued, not when it
// has taken effect: a thread busy on another CPU runs on until it next
// enters the kernel, long enough on a loaded machine to answer a request
// sent after the kill (seen in CI: answered in 0.7 ms).
func (s *Server) Freeze(t testing.TB) {
	t.Helper()
	pid := s.cmd.Process.Pid
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze etcd: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, err := runningThreads(pid)
		if err != nil {
			t.Fatalf("freeze etcd: %v", err)
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("freeze etcd: %d threads still running 10 s after SIGSTOP", running)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of pid that are not stopped.
func runningThreads(pid int) (int, error) {
	tids, err := procfs.Threads(pid)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, tid := range tids {
		st, err := procfs.Read(tid)
		if err != nil {
			continue // the thread ended
		}
		if !st.Stopped() {
			n++
		}
	}
	return n, nil
}
