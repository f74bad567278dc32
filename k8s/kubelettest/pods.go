package kubelettest

// What a test reads from or does to a pod's containers on their node, as
// an administrator on the node would: the container log the kubelet
// wrote, and a container killed under the kubelet.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

func (c *Cluster) node(name string) (*Node, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("kubelettest: no node %q in the cluster", name)
}

// PodLog returns what the container wrote, from the log files the kubelet
// keeps on the pod's node (every restart of the container, in order).
func (c *Cluster) PodLog(pod *corev1.Pod, container string) (string, error) {
	n, err := c.node(pod.Spec.NodeName)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(n.dir, "pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("kubelettest: %w", err)
		}
		b.Write(data)
	}
	return b.String(), nil
}

// KillContainer sends SIGKILL to the container's main process through its
// node's containerd, as the kernel's OOM killer or a crash would end it.
func (c *Cluster) KillContainer(ctx context.Context, pod *corev1.Pod, container string) error {
	n, err := c.node(pod.Spec.NodeName)
	if err != nil {
		return err
	}
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == container {
			id = strings.TrimPrefix(s.ContainerID, "containerd://")
		}
	}
	if id == "" {
		return fmt.Errorf("kubelettest: pod %s/%s has no container %q running", pod.Namespace, pod.Name, container)
	}
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.sock(), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id).CombinedOutput(); err != nil {
		return fmt.Errorf("kubelettest: ctr tasks kill %s: %v: %s", id, err, out)
	}
	return nil
}
