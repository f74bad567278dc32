// Command box is the tiny static program the real-container tests run in
// their images: the pod sandbox ("pause": wait for SIGTERM) and a worker
// ("exit CODE MESSAGE": write MESSAGE to the termination log, exit CODE;
// "code CODE": exit CODE, as a rank under ft-launcher).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
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
	default:
		fmt.Fprintf(os.Stderr, "box: unknown mode %q (allowed: pause, code, exit)\n", os.Args[1])
		os.Exit(2)
	}
}
