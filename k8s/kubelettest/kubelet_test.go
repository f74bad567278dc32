package kubelettest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
	"github.com/ftlauncher/ft-launcher/k8s/kubelettest"
	"github.com/ftlauncher/ft-launcher/verdict"
)

var env *k8stest.Env

func TestMain(m *testing.M) { k8stest.Main(m, &env) }

// startCluster builds the box program and its images and starts one real
// node (or reports the lane missing: a skip, or a failure under CI).
func startCluster(t *testing.T, nodes int) *kubelettest.Cluster {
	t.Helper()
	k8stest.Need(t, env)
	if err := kubelettest.Check(); err != nil {
		testenv.Missing(t, testenv.RealContainers, err.Error())
	}
	dir := t.TempDir()
	box, launcher := filepath.Join(dir, "box"), filepath.Join(dir, "ft-launcher")
	buildStatic(t, box, "./testdata/box")
	buildStatic(t, launcher, "../../cmd/ft-launcher")
	images := []kubelettest.Image{pauseImage(box),
		{Ref: "ftl.local/box:1", Files: map[string]string{"/box": box, "/ft-launcher": launcher}, Entrypoint: []string{"/box"}},
	}
	return startNodes(t, env, nodes, images, kubelettest.Options{})
}

// buildStatic builds the Go package pkg into out, statically (the images
// have no libc).
func buildStatic(t *testing.T, out, pkg string) {
	t.Helper()
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
}

// pauseImage is the sandbox image, the box program's pause.
func pauseImage(box string) kubelettest.Image {
	return kubelettest.Image{Ref: kubelettest.PauseImage, Files: map[string]string{"/box": box}, Entrypoint: []string{"/box", "pause"}}
}

// startNodes starts nodes real nodes for e's control plane with images
// and opts, and stops them at the end of t (logging theirs and the
// services' logs when t failed).
func startNodes(t *testing.T, e *k8stest.Env, nodes int, images []kubelettest.Image, opts kubelettest.Options) *kubelettest.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := kubelettest.StartWith(ctx, e, nodes, images, opts)
	if err != nil {
		t.Fatalf("start real nodes: %v", err)
	}
	t.Logf("%d real node(s) Ready in %v", nodes, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Log(n.Logs())
			}
			t.Log(c.ServiceLogs())
		}
		start := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("stop real nodes: %v", err)
		}
		t.Logf("real nodes stopped in %v", time.Since(start).Round(time.Millisecond))
	})
	return c
}

// A pod with a locally built image runs to completion in a real container
// on a real kubelet, placed by the real scheduler; its exit code and
// termination message are read back from the API.
func TestRealPodTerminationMessage(t *testing.T) {
	c := startCluster(t, 1)
	ns := env.Namespace(t)
	cases := []struct {
		name  string
		code  int32
		phase corev1.PodPhase
	}{
		{"succeeded", 0, corev1.PodSucceeded},
		{"failed", 3, corev1.PodFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			msg := "ftl termination message " + tc.name
			no := false
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "box-" + tc.name, Namespace: ns},
				Spec: corev1.PodSpec{
					HostNetwork:                  true,
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: &no,
					Containers: []corev1.Container{{
						Name: "box", Image: "ftl.local/box:1", ImagePullPolicy: corev1.PullNever,
						Args: []string{"exit", itoa(tc.code), msg},
					}},
				},
			}
			start := time.Now()
			if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod: %v", err)
			}
			var got *corev1.Pod
			for {
				p, err := env.Clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("pod %s: %v (last seen %+v)", pod.Name, err, got)
				}
				got = p
				if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Logf("pod %s %s on %s in %v", pod.Name, got.Status.Phase, got.Spec.NodeName, time.Since(start).Round(time.Millisecond))
			if got.Status.Phase != tc.phase {
				t.Errorf("phase %s, want %s (status %+v)", got.Status.Phase, tc.phase, got.Status)
			}
			if got.Spec.NodeName != c.Nodes[0].Name {
				t.Errorf("node %q, want %q (the scheduler binds it)", got.Spec.NodeName, c.Nodes[0].Name)
			}
			if len(got.Status.ContainerStatuses) != 1 || got.Status.ContainerStatuses[0].State.Terminated == nil {
				t.Fatalf("container status %+v, want one terminated container", got.Status.ContainerStatuses)
			}
			term := got.Status.ContainerStatuses[0].State.Terminated
			if term.ExitCode != tc.code || term.Message != msg {
				t.Errorf("terminated exit code %d message %q, want %d %q", term.ExitCode, term.Message, tc.code, msg)
			}
		})
	}
}

func itoa(n int32) string { return fmt.Sprint(n) }

// runPod creates pod and waits until it has ended (Succeeded or Failed).
func runPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	no := false
	pod.Spec.HostNetwork = true
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.AutomountServiceAccountToken = &no
	start := time.Now()
	if _, err := env.Clientset.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	for {
		p, err := env.Clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", pod.Name, err)
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			t.Logf("pod %s %s on %s in %v", pod.Name, p.Status.Phase, p.Spec.NodeName, time.Since(start).Round(time.Millisecond))
			return p
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The real ft-launcher runs as a pod's container command in a real
// container, its rank a tiny static program that fails: the launcher's
// verdict is the pod's termination message, as the AppWrapper controller
// reads it.
func TestRealPodRunsFTLauncher(t *testing.T) {
	startCluster(t, 1)
	ns := env.Namespace(t)
	pod := runPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "launcher", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "launcher", Image: "ftl.local/box:1", ImagePullPolicy: corev1.PullNever,
			Command: []string{"/ft-launcher", "--termination-log", "/dev/termination-log", "--log-dir", "/tmp/logs",
				"--nproc-per-node", "1", "--max-restarts", "1", "--no-python", "/box", "code", "3"},
			Env: []corev1.EnvVar{{Name: "JOB_COMPLETION_INDEX", Value: "0"}, {Name: "TMPDIR", Value: "/tmp"}},
		}}},
	})
	if pod.Status.Phase != corev1.PodFailed || len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Terminated == nil {
		t.Fatalf("pod %s, statuses %+v: want Failed with a terminated container", pod.Status.Phase, pod.Status.ContainerStatuses)
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	v, err := verdict.Parse([]byte(term.Message))
	if err != nil {
		t.Fatalf("termination message %q (exit %d): %v", term.Message, term.ExitCode, err)
	}
	t.Logf("exit %d, verdict %+v", term.ExitCode, v)
	if term.ExitCode != 1 || v.Kind != verdict.RestartBudgetExhausted {
		t.Errorf("exit %d verdict kind %q, want exit 1 and %q (message %q)", term.ExitCode, v.Kind, verdict.RestartBudgetExhausted, term.Message)
	}
}

// Two kubelets on one machine, each with its own containerd, root folder,
// ports and cgroups: the scheduler places a pod on each.
func TestRealTwoNodes(t *testing.T) {
	c := startCluster(t, 2)
	ns := env.Namespace(t)
	for _, n := range c.Nodes {
		pod := runPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "on-" + n.Name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name},
				Containers: []corev1.Container{{Name: "box", Image: "ftl.local/box:1", ImagePullPolicy: corev1.PullNever,
					Args: []string{"exit", "0", "ran on " + n.Name}}},
			},
		})
		if pod.Status.Phase != corev1.PodSucceeded || pod.Spec.NodeName != n.Name {
			t.Errorf("pod %s: %s on %q, want Succeeded on %q", pod.Name, pod.Status.Phase, pod.Spec.NodeName, n.Name)
		}
	}
}

// A node whose kubelet is killed turns NotReady after the node monitor
// grace; a pod on it that is deleted gracefully stays Terminating (nothing
// runs its shutdown) until it is force-deleted. Its container is still
// running, and Stop cleans it up.
func TestRealDeadNode(t *testing.T) {
	c := startCluster(t, 2)
	ns := env.Namespace(t)
	dead := c.Nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: ns},
		Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
			NodeSelector: map[string]string{"kubernetes.io/hostname": dead.Name},
			Containers: []corev1.Container{{Name: "box", Image: "ftl.local/box:1", ImagePullPolicy: corev1.PullNever,
				Args: []string{"pause"}}},
		},
	}
	pods := env.Clientset.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	waitPod(ctx, t, ns, pod.Name, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	killed := time.Now()
	dead.StopKubelet()
	for {
		n, err := env.Clientset.CoreV1().Nodes().Get(ctx, dead.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("node %s: %v", dead.Name, err)
		}
		ready := corev1.ConditionTrue
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status
			}
		}
		if ready != corev1.ConditionTrue {
			t.Logf("node %s Ready=%s %v after its kubelet was killed (grace %v)", dead.Name, ready, time.Since(killed).Round(time.Millisecond), kubelettest.NodeMonitorGracePeriod)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	time.Sleep(5 * time.Second)
	p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("pod of the dead node 5 s after a graceful delete: %v, %+v; want it Terminating", err, p)
	}
	zero := int64(0)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("force delete: %v", err)
	}
	if _, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("pod still there after a forced delete")
	}
}

// waitPod polls pod ns/name until cond holds.
func waitPod(ctx context.Context, t *testing.T, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	for {
		p, err := env.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s (waiting for %s): %v", name, what, err)
		}
		if cond(p) {
			return p
		}
		time.Sleep(200 * time.Millisecond)
	}
}
