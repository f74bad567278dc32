package spawn

import (
	"os"
	"regexp"
	"strconv"
	"strings"
)

var nvidiaDev = regexp.MustCompile(`^nvidia[0-9]+$`)

// GPUCount counts the NVIDIA GPUs visible to ranks without Python or NVML:
// it counts the /dev/nvidia<N> device nodes the driver creates (one per GPU;
// MIG instances are not counted there), then applies CUDA_VISIBLE_DEVICES
// like the CUDA runtime does (see VisibleGPUs). It returns 0 on a machine
// without the NVIDIA driver.
func GPUCount() int {
	visible, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return VisibleGPUs(CountGPUDevices("/dev"), visible, set)
}

// CountGPUDevices counts entries named nvidia<N> in devDir.
func CountGPUDevices(devDir string) int {
	entries, err := os.ReadDir(devDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if nvidiaDev.MatchString(e.Name()) {
			n++
		}
	}
	return n
}

// VisibleGPUs applies CUDA_VISIBLE_DEVICES to a physical GPU count, as
// torch.cuda.device_count() would see it: when set, entries are read left to
// right and parsing stops at the first invalid one (an index out of range, a
// duplicate, or garbage); GPU-/MIG- UUIDs count as one device each. An empty
// value hides every GPU.
func VisibleGPUs(physical int, cudaVisible string, set bool) int {
	if !set {
		return physical
	}
	if strings.TrimSpace(cudaVisible) == "" {
		return 0
	}
	seen := make(map[string]bool)
	n := 0
	for _, item := range strings.Split(cudaVisible, ",") {
		item = strings.TrimSpace(item)
		if strings.HasPrefix(item, "GPU-") || strings.HasPrefix(item, "MIG-") {
			if seen[item] {
				return n
			}
			seen[item] = true
			n++
			continue
		}
		i, err := strconv.Atoi(item)
		if err != nil || i < 0 || i >= physical {
			return n
		}
		key := strconv.Itoa(i)
		if seen[key] {
			return n
		}
		seen[key] = true
		n++
	}
	return n
}
