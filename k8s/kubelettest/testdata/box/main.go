// Command box is the tiny static program the real-container tests run in
// their images: the pod sandbox ("pause": wait for SIGTERM) and a worker
// ("exit CODE MESSAGE": write MESSAGE to the termination log, exit CODE;
// "code CODE": exit CODE, as a rank under ft-launcher; "train" and
// "peers": the Python-free training ranks of the AppWrapper tests, below).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: box pause | box exit CODE MESSAGE")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
	case "code":
		code, err := strconv.Atoi(os.Args[len(os.Args)-1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "box: exit code %q: %v\n", os.Args[len(os.Args)-1], err)
			os.Exit(2)
		}
		fmt.Println("box: rank exiting with", code)
		os.Exit(code)
	case "exit":
		if len(os.Args) != 4 {
			fmt.Fprintln(os.Stderr, "usage: box exit CODE MESSAGE")
			os.Exit(2)
		}
		code, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintf(os.Stderr, "box: exit code %q: %v\n", os.Args[2], err)
			os.Exit(2)
		}
		if err := os.WriteFile("/dev/termination-log", []byte(os.Args[3]), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "box:", err)
			os.Exit(3)
		}
		fmt.Println("box: exiting with", code)
		os.Exit(code)
	case "train":
		if len(os.Args) != 6 {
			fmt.Fprintln(os.Stderr, "usage: box train DIR STEPS CRASH_AT CRASH_CODE")
			os.Exit(2)
		}
		os.Exit(train(os.Args[2], atoi(os.Args[3]), atoi(os.Args[4]), atoi(os.Args[5])))
	case "peers":
		if len(os.Args) != 5 {
			fmt.Fprintln(os.Stderr, "usage: box peers DIR INDEX N")
			os.Exit(2)
		}
		os.Exit(peers(os.Args[2], atoi(os.Args[3]), atoi(os.Args[4])))
	default:
		fmt.Fprintf(os.Stderr, "box: unknown mode %q (allowed: pause, code, exit, train, peers)\n", os.Args[1])
		os.Exit(2)
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "box: %q: want an integer\n", s)
		os.Exit(2)
	}
	return n
}

// train is a rank that checkpoints: it resumes from the step in DIR/step,
// records each start in DIR/history ("start STEP restart=R resets=N", R
// and N from the launcher's and the controller's variables), takes a step
// every 50 ms, checkpoints it, and ends with 0 at steps. The first time
// it reaches crashAt (0: never) it writes the wall time in nanoseconds to
// DIR/crashed and exits with code: the crash happens once per DIR.
func train(dir string, steps, crashAt, code int) int {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "box:", err)
		return 4
	}
	step := 0
	if b, err := os.ReadFile(filepath.Join(dir, "step")); err == nil {
		step, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	line := fmt.Sprintf("start %d restart=%s resets=%s\n", step, os.Getenv("TORCHELASTIC_RESTART_COUNT"), os.Getenv("FTL_WORKLOAD_RESETS"))
	if err := appendFile(filepath.Join(dir, "history"), line); err != nil {
		fmt.Fprintln(os.Stderr, "box:", err)
		return 4
	}
	fmt.Print("box: ", line)
	for step < steps {
		time.Sleep(50 * time.Millisecond)
		step++
		if err := writeAtomic(filepath.Join(dir, "step"), strconv.Itoa(step)); err != nil {
			fmt.Fprintln(os.Stderr, "box: checkpoint:", err)
			return 4
		}
		if step == crashAt {
			marker := filepath.Join(dir, "crashed")
			if _, err := os.Stat(marker); os.IsNotExist(err) {
				if err := writeAtomic(marker, strconv.FormatInt(time.Now().UnixNano(), 10)); err != nil {
					fmt.Fprintln(os.Stderr, "box:", err)
					return 4
				}
				fmt.Printf("box: crashing at step %d with %d\n", step, code)
				return code
			}
		}
	}
	fmt.Printf("box: done at step %d\n", step)
	return 0
}

// peers is one of N ranks in different pods that watch each other, as a
// collective would: each touches DIR/hb-INDEX every 100 ms, and once it
// has seen a peer's heartbeat it exits 3 when that heartbeat is 2 s old,
// writing the wall time in nanoseconds to DIR/lost-INDEX first. It runs
// until then (or a signal).
func peers(dir string, index, n int) int {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "box:", err)
		return 4
	}
	start := time.Now()
	seen := make([]bool, n)
	for {
		if err := writeAtomic(filepath.Join(dir, fmt.Sprintf("hb-%d", index)), start.String()); err != nil {
			fmt.Fprintln(os.Stderr, "box: heartbeat:", err)
			return 4
		}
		for j := 0; j < n; j++ {
			if j == index {
				continue
			}
			st, err := os.Stat(filepath.Join(dir, fmt.Sprintf("hb-%d", j)))
			if err != nil || st.ModTime().Before(start) {
				continue
			}
			if !seen[j] {
				seen[j] = true
				fmt.Printf("box: rank %d sees rank %d\n", index, j)
			}
			if age := time.Since(st.ModTime()); age > 2*time.Second {
				_ = writeAtomic(filepath.Join(dir, fmt.Sprintf("lost-%d", index)), strconv.FormatInt(time.Now().UnixNano(), 10))
				fmt.Printf("box: rank %d lost rank %d (heartbeat %v old)\n", index, j, age)
				return 3
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeAtomic(path, s string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
