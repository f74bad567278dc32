// Package k8s tests ft-launcher on Kubernetes end to end: the real
// `ft-resumer appwrapper-controller` binary against a real kube-apiserver and
// kube-controller-manager (package k8stest), and the real ft-launcher binary
// run in the environment of the pods the controller created, its
// termination message handed to the pod status.
//
// What cannot run here is a kubelet with a container runtime: k8stest's
// stand-in kubelet binds the pods and writes their status, and the test runs
// each pod's container command (ft-launcher) itself, with the pod's env.
package k8s

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
	"github.com/ftlauncher/ft-launcher/verdict"
)

var (
	env  *k8stest.Env
	bins struct{ dir, launcher, resumer string }
)

const debianPython = "/usr/bin/python3"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips: no binaries, no control plane
	}
	dir, err := os.MkdirTemp("", "ftl-k8s-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.dir = dir
	bins.launcher, bins.resumer = filepath.Join(dir, "ft-launcher"), filepath.Join(dir, "ft-resumer")
	cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/ft-launcher", "../../cmd/ft-launcher-etcd", "../../cmd/ft-resumer", "../../cmd/ft-appwrapper-controller")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := k8stest.Run(m, &env)
	os.RemoveAll(dir) // os.Exit skips deferred calls: each run left its binaries behind
	os.Exit(code)
}

// controller runs `ft-resumer appwrapper-controller` as a cluster admin
// against the test API server until the end of t, with the given extra
// flags.
func controller(t *testing.T, args ...string) {
	t.Helper()
	kc, err := env.Kubeconfig(t.TempDir(), "appwrapper-controller")
	if err != nil {
		t.Fatal(err)
	}
	runController(t, kc, nil, args...)
}

// runController runs `ft-resumer appwrapper-controller --kubeconfig kc`
// until the end of t; once it has stopped, check (if any) reads its log.
// The webhook is on by default: unless args name them, it serves on a
// free port with its certificate Secret in a namespace of its own (no
// webhook configuration points at it).
func runController(t *testing.T, kc string, check func(log string), args ...string) {
	t.Helper()
	if !slices.Contains(args, "--webhook-namespace") {
		args = append(args, "--webhook-namespace", env.Namespace(t))
	}
	if !slices.Contains(args, "--webhook-port") {
		args = append(args, "--webhook-port", strconv.Itoa(listenPort(t)))
	}
	if !slices.Contains(args, "--webhook-cert-dir") {
		args = append(args, "--webhook-cert-dir", t.TempDir())
	}
	var out bytes.Buffer
	cmd := exec.Command(bins.resumer, append([]string{"appwrapper-controller", "--kubeconfig", kc,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("the controller did not stop within 30s of SIGTERM")
		}
		if check != nil {
			check(out.String())
		}
		if t.Failed() {
			t.Logf("controller log:\n%s", out.String())
		}
	})
}

// apply creates the object of a YAML document in ns, as `kubectl create`
// would: the document is not edited.
func apply(t *testing.T, ns string, doc []byte) *unstructured.Unstructured {
	t.Helper()
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
		t.Fatalf("YAML: %v", err)
	}
	obj.SetNamespace(ns)
	if err := env.Client.Create(context.Background(), &obj); err != nil {
		t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	return &obj
}

func getAW(t *testing.T, ns, name string) *v1beta2.AppWrapper {
	t.Helper()
	var aw v1beta2.AppWrapper
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &aw); err != nil {
		t.Fatalf("get AppWrapper %s/%s: %v", ns, name, err)
	}
	return &aw
}

// waitPhase waits for the AppWrapper to reach phase.
func waitPhase(t *testing.T, ns, name string, phase v1beta2.AppWrapperPhase) *v1beta2.AppWrapper {
	t.Helper()
	var aw *v1beta2.AppWrapper
	waitFor(t, fmt.Sprintf("AppWrapper %s phase %s", name, phase), func() bool {
		aw = getAW(t, ns, name)
		return aw.Status.Phase == phase
	}, func() string { return fmt.Sprintf("phase %q, conditions %+v", aw.Status.Phase, aw.Status.Conditions) })
	return aw
}

func waitFor(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 90s waiting for %s; %s", what, state())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runningPods waits for n Running pods of the AppWrapper that are not in
// old (pod UIDs), and returns them.
func runningPods(t *testing.T, ns, aw string, n int, old map[types.UID]bool) []corev1.Pod {
	t.Helper()
	var got []corev1.Pod
	waitFor(t, fmt.Sprintf("%d new running pods of %s", n, aw), func() bool {
		var pods corev1.PodList
		if err := env.Client.List(context.Background(), &pods, client.InNamespace(ns),
			client.MatchingLabels{v1beta2.AppWrapperLabel: aw}); err != nil {
			return false
		}
		got = got[:0]
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && !old[p.UID] {
				got = append(got, p)
			}
		}
		return len(got) == n
	}, func() string { return fmt.Sprintf("%d found", len(got)) })
	return got
}

// TestSeedSamplesRunUnchanged: the MLBatch user guide's sample AppWrappers
// (a Job; a Job with a PodGroup), applied unchanged, reach Running under
// the real controller binary, then Succeeded when their pods complete.
// Pods are run by the stand-in kubelet; the Job controller is real.
func TestSeedSamplesRunUnchanged(t *testing.T) {
	testenv.SkipShort(t, "end-to-end on a real Kubernetes control plane")
	k8stest.Need(t, env)
	controller(t)
	for _, tc := range []struct {
		file string
		pods int
	}{
		{"job.yaml", 1},
		{"job-with-podgroup.yaml", 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ctx := context.Background()
			doc, err := os.ReadFile(filepath.Join("..", "..", "k8s", "appwrapper", "testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			ns := env.Namespace(t)
			kl := env.NewKubelet(t, ns, "seed-node-a", "seed-node-b")
			obj := apply(t, ns, doc)
			waitPhase(t, ns, obj.GetName(), v1beta2.AppWrapperRunning)
			pods := runningPods(t, ns, obj.GetName(), tc.pods, nil)
			for _, p := range pods {
				if err := kl.Succeed(ctx, p.Name); err != nil {
					t.Fatal(err)
				}
			}
			aw := waitPhase(t, ns, obj.GetName(), v1beta2.AppWrapperSucceeded)
			if aw.Status.Retries != 0 {
				t.Errorf("resettingCount %d, want 0", aw.Status.Retries)
			}
		})
	}
}

// trainingAW is an AppWrapper of an Indexed Job of two pods whose container
// command is the minimal launch line of docs/kubernetes.md.
func trainingAW(name string, annotations map[string]string) []byte {
	var ann strings.Builder
	for k, v := range annotations {
		fmt.Fprintf(&ann, "    %s: %q\n", k, v)
	}
	return []byte(fmt.Sprintf(`apiVersion: workload.codeflare.dev/v1beta2
kind: AppWrapper
metadata:
  name: %s
  annotations:
%sspec:
  components:
  - template:
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: %s
      spec:
        completionMode: Indexed
        parallelism: 2
        completions: 2
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: trainer
              image: example.com/trainer:latest
              command: ["ft-launcher", "--nproc-per-node", "2", "train.py"]
`, name, ann.String(), name))
}

// runContainer runs the pod's container command (ft-launcher) as the
// kubelet would, with the pod's env (what the controller injected) and a
// termination log, and returns the termination message and exit code.
// Only the training script is the test's: the nvrx-instrumented worker of
// the integration tests, in mode.
func runContainer(t *testing.T, pod corev1.Pod, mode string, extra ...string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	termLog := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(termLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	worker, _ := filepath.Abs(filepath.Join("..", "testdata", "nvrx_worker.py"))
	args := append([]string{"--nproc-per-node", "2", "--termination-log", termLog,
		"--log-dir", filepath.Join(dir, "logs")}, extra...)
	cmd := exec.Command(bins.launcher, append(args, worker, mode)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + dir, "PYTHON_EXEC=" + debianPython,
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "HOSTNAME=" + pod.Spec.Hostname}
	if idx, ok := pod.Annotations["batch.kubernetes.io/job-completion-index"]; ok {
		cmd.Env = append(cmd.Env, "JOB_COMPLETION_INDEX="+idx)
	}
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
			}
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) == 0 {
		t.Fatalf("ft-launcher left no termination message\n%s", out)
	}
	return string(msg), cmd.ProcessState.ExitCode()
}

func podEnv(p corev1.Pod, name string) string {
	for _, c := range p.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// TestLauncherVerdictDrivesReset: the verdicts of real launchers decide
// what the real controller does. A launcher that used up its restarts
// (restart_budget_exhausted, exit 1) gets the workload reset: new pods,
// resettingCount 1, and the launcher in a new pod takes the run id
// "<name>-r1" from the env the controller injected. A launcher whose rank
// asked ShutdownWorkload (no_restart, exit 93) fails the workload at once,
// with retries left.
func TestLauncherVerdictDrivesReset(t *testing.T) {
	testenv.SkipShort(t, "end-to-end on a real Kubernetes control plane")
	k8stest.Need(t, env)
	ctx := context.Background()
	controller(t)
	ns := env.Namespace(t)
	kl := env.NewKubelet(t, ns, "train-node-a", "train-node-b")
	apply(t, ns, trainingAW("train", map[string]string{
		v1beta2.RetryLimitAnnotation:                 "3",
		v1beta2.FailureGracePeriodDurationAnnotation: "0s",
		v1beta2.RetryPausePeriodDurationAnnotation:   "0s",
	}))
	waitPhase(t, ns, "train", v1beta2.AppWrapperRunning)
	first := runningPods(t, ns, "train", 2, nil)
	for _, p := range first {
		if got := podEnv(p, "FTL_WORKLOAD"); got != ns+"/train" {
			t.Fatalf("pod %s FTL_WORKLOAD=%q, want %q", p.Name, got, ns+"/train")
		}
	}

	// Round 1: a rank crashes with no restart left.
	msg, code := runContainer(t, first[0], "hang", "--max-restarts", "0", "--ft-rank-heartbeat-timeout", "1")
	v, err := verdict.Parse([]byte(msg))
	if err != nil || v.Kind != verdict.RestartBudgetExhausted || code != 1 {
		t.Fatalf("launcher exit %d, verdict %+v (%v); want 1, restart_budget_exhausted", code, v, err)
	}
	if v.RunID != "train-r0" {
		t.Errorf("run id %q in the first pods, want train-r0 (from FTL_WORKLOAD and FTL_WORKLOAD_RESETS)", v.RunID)
	}
	if err := kl.Fail(ctx, first[0].Name, int32(code), msg); err != nil {
		t.Fatal(err)
	}
	old := map[types.UID]bool{first[0].UID: true, first[1].UID: true}
	second := runningPods(t, ns, "train", 2, old)
	aw := waitPhase(t, ns, "train", v1beta2.AppWrapperRunning)
	if aw.Status.Retries != 1 {
		t.Fatalf("resettingCount %d after one reset, want 1", aw.Status.Retries)
	}

	// Round 2: a rank asks for the workload to be shut down.
	msg, code = runContainer(t, second[0], "shutdown", "--max-restarts", "3")
	v, err = verdict.Parse([]byte(msg))
	if err != nil || v.Kind != verdict.NoRestart || code != 93 {
		t.Fatalf("launcher exit %d, verdict %+v (%v); want 93, no_restart", code, v, err)
	}
	if v.RunID != "train-r1" {
		t.Errorf("run id %q after one reset, want train-r1", v.RunID)
	}
	if err := kl.Fail(ctx, second[0].Name, int32(code), msg); err != nil {
		t.Fatal(err)
	}
	aw = waitPhase(t, ns, "train", v1beta2.AppWrapperFailed)
	if aw.Status.Retries != 1 {
		t.Errorf("resettingCount %d, want 1: a no_restart verdict spends no retry", aw.Status.Retries)
	}
	var unhealthy string
	for _, c := range aw.Status.Conditions {
		if c.Type == string(v1beta2.Unhealthy) {
			unhealthy = c.Reason + ": " + c.Message
		}
	}
	if !strings.HasPrefix(unhealthy, "NoRestartVerdict") || !strings.Contains(unhealthy, "ShutdownWorkload") {
		t.Errorf("Unhealthy %q, want reason NoRestartVerdict naming the rank's ShutdownWorkload", unhealthy)
	}
}

// TestBadConfigRefused: a malformed operator config stops the command
// before it talks to the cluster, with exit 2 and the key named.
func TestBadConfigRefused(t *testing.T) {
	testenv.SkipShort(t, "end-to-end on a real Kubernetes control plane")
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "faultTolerance:\n  failureGracePeriodd: 1m\n", "failureGracePeriodd"},
		{"bad duration", "faultTolerance:\n  failureGracePeriod: soon\n", "failureGracePeriod"},
		{"above the ceiling", "faultTolerance:\n  warmupGracePeriod: 48h\n", "warmupGracePeriod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bins.resumer, "appwrapper-controller", "--config", path, "--kubeconfig", "/nonexistent")
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("exit %d, output %q; want 2 naming %q", code, out, tc.want)
			}
		})
	}
}

// TestShippedManifests: deploy/k8s applies to a real API server, its
// ConfigMap is a valid operator config, and the controller run with the
// Deployment's flags as the service account the manifests bind (RBAC
// decides, no admin rights) takes the seeds' sample to Succeeded.
func TestShippedManifests(t *testing.T) {
	testenv.SkipShort(t, "end-to-end on a real Kubernetes control plane")
	k8stest.Need(t, env)
	ctx := context.Background()
	dir := t.TempDir()
	var config string
	for _, f := range []string{"rbac.yaml", "controller.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "k8s", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var obj unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if obj.GetKind() == "ConfigMap" {
				data, _, _ := unstructured.NestedStringMap(obj.Object, "data")
				config = data["config.yaml"]
			}
			if err := env.Client.Create(ctx, &obj); err != nil {
				t.Fatalf("%s: %s %s: %v", f, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	if config == "" {
		t.Fatal("controller.yaml has no appwrapper-operator-config ConfigMap with config.yaml")
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	kc, err := env.KubeconfigAs(dir, "system:serviceaccount:ft-launcher-system:appwrapper-controller", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	runController(t, kc, func(log string) {
		if strings.Contains(log, "forbidden") {
			t.Errorf("the controller was refused something (rbac.yaml misses a rule):\n%s", log)
		}
	}, "--config", cfgPath, "--leader-elect", "--leader-election-namespace=ft-launcher-system",
		// The shipped config serves the webhook; its Secret goes where the
		// Deployment's would (rbac.yaml's Role). webhook.yaml is not
		// applied: the controller starts without its configurations.
		"--webhook-namespace", "ft-launcher-system")

	doc, err := os.ReadFile(filepath.Join("..", "..", "k8s", "appwrapper", "testdata", "job-with-podgroup.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	kl := env.NewKubelet(t, ns, "rbac-node-a", "rbac-node-b")
	obj := apply(t, ns, doc)
	waitPhase(t, ns, obj.GetName(), v1beta2.AppWrapperRunning)
	for _, p := range runningPods(t, ns, obj.GetName(), 2, nil) {
		if err := kl.Succeed(ctx, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	waitPhase(t, ns, obj.GetName(), v1beta2.AppWrapperSucceeded)

	// The documented example (docs/kubernetes.md includes the file
	// verbatim, TestDocsIncludeExample), submitted as kubectl -n would:
	// Running, then a failed pod resets it once and its pods run again.
	doc, err = os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "appwrapper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ex := apply(t, ns, doc)
	waitPhase(t, ns, ex.GetName(), v1beta2.AppWrapperRunning)
	first := runningPods(t, ns, ex.GetName(), 2, nil)
	old := map[types.UID]bool{}
	for _, p := range first {
		old[p.UID] = true
	}
	if err := kl.Fail(ctx, first[0].Name, 1, "rank 0 exited with code 1"); err != nil {
		t.Fatal(err)
	}
	runningPods(t, ns, ex.GetName(), 2, old)
	aw := waitPhase(t, ns, ex.GetName(), v1beta2.AppWrapperRunning)
	if aw.Status.Retries != 1 {
		t.Errorf("the example after one failed pod: retries %d, want 1", aw.Status.Retries)
	}
}

// TestDocsIncludeExample: docs/kubernetes.md shows deploy/examples/appwrapper.yaml
// as it is, so the example the tests submit is the one the docs show.
func TestDocsIncludeExample(t *testing.T) {
	ex, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "appwrapper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(docs, []byte("```yaml\n"+string(ex)+"```\n")) {
		t.Errorf("docs/kubernetes.md does not include deploy/examples/appwrapper.yaml verbatim in a yaml block")
	}
}
