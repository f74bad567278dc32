package procfs

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// Catches reports whether process pid has a handler installed for sig
// (SigCgt of /proc/<pid>/status). A signal whose default action kills
// the process must only be sent to one that catches it.
func Catches(pid int, sig syscall.Signal) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	return caught(b, sig)
}

func caught(status []byte, sig syscall.Signal) bool {
	if sig < 1 || sig > 64 {
		return false
	}
	for line := range bytes.SplitSeq(status, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(k) != "SigCgt" {
			continue
		}
		mask, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
		return err == nil && mask&(1<<(uint(sig)-1)) != 0
	}
	return false
}
