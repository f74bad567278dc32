package filler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// RunFunc runs a helper command to completion (spawn.Reaper.Run in
// production) and returns its output; a non-zero exit is an error.
type RunFunc func(ctx context.Context, argv []string) ([]byte, error)

// NvidiaSMICheck is a GPUCheck that asks nvidia-smi: the GPUs are free when
// no process holds a compute context and every GPU uses at most
// toleranceMB of memory.
func NvidiaSMICheck(run RunFunc, toleranceMB float64) GPUCheck {
	return func(ctx context.Context) (bool, string, error) {
		apps, err := run(ctx, []string{"nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"})
		if err != nil {
			return false, "", fmt.Errorf("nvidia-smi --query-compute-apps: %w", err)
		}
		if pids := nonEmptyLines(apps); len(pids) > 0 {
			return false, "processes hold a GPU context: " + strings.Join(pids, "; "), nil
		}
		mem, err := run(ctx, []string{"nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"})
		if err != nil {
			return false, "", fmt.Errorf("nvidia-smi --query-gpu: %w", err)
		}
		for _, l := range nonEmptyLines(mem) {
			idx, used, ok := strings.Cut(l, ",")
			if !ok {
				return false, "", fmt.Errorf("nvidia-smi --query-gpu: unexpected line %q", l)
			}
			mb, err := strconv.ParseFloat(strings.TrimSpace(used), 64)
			if err != nil {
				return false, "", fmt.Errorf("nvidia-smi --query-gpu: memory %q: %w", used, err)
			}
			if mb > toleranceMB {
				return false, fmt.Sprintf("GPU %s uses %.0f MiB (tolerance %.0f MiB)", strings.TrimSpace(idx), mb, toleranceMB), nil
			}
		}
		return true, "", nil
	}
}

func nonEmptyLines(b []byte) []string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "No running") {
			out = append(out, l)
		}
	}
	return out
}
