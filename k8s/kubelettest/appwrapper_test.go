package kubelettest_test

// This file is long on purpose: it is one test, TestRealAppWrapper, whose
// scenarios share one real cluster (kube-apiserver, scheduler, kubelets,
// containerd) that takes minutes to start; each scenario is a subtest,
// and the lane helpers they share sit below them.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
	"github.com/ftlauncher/ft-launcher/k8s/kubelettest"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// benchEnv, when set to a number of rounds, makes TestRealAppWrapper also
// measure the recovery times of docs/benchmarks.md ("Kubernetes workload
// reset"): that many pod-failure resets, and dead-node recoveries under
// our settings and under upstream's. Nothing is asserted about speed.
const benchEnv = "FTL_BENCH_REAL_APPWRAPPER"

// awController is a running `ft-resumer appwrapper-controller`.
type awController struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// stop sends SIGTERM and waits (SIGKILL after 30 s).
func (c *awController) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		t.Errorf("the controller did not stop within 30 s of SIGTERM")
	}
	if t.Failed() {
		b, _ := os.ReadFile(c.log)
		if len(b) > 20000 {
			b = b[len(b)-20000:]
		}
		t.Logf("controller log:\n%s", b)
	}
}

// lane is what TestRealAppWrapper's scenarios share: one cluster of two
// real nodes, the controller binary and the test's namespace.
type lane struct {
	c        *kubelettest.Cluster
	ns       string
	resumer  string
	kc       string
	dir      string // host folder mounted in the pods at /ckpt
	whPort   int
	certDir  string
	ctl      *awController
	ctlStart int
	// resetPod is the failed pod of scenario 3, for scenario 4.
	resetPod string
}

// startController runs the controller binary as the service account of
// deploy/k8s/rbac.yaml (RBAC decides) with the webhook enabled and the
// given extra config lines. The previous one, if any, is stopped first.
func (l *lane) startController(t *testing.T, extraConfig string) {
	t.Helper()
	if l.ctl != nil {
		l.ctl.stop(t)
		l.ctl = nil
	}
	l.ctlStart++
	cfg := filepath.Join(l.certDir, fmt.Sprintf("config-%d.yaml", l.ctlStart))
	if err := os.WriteFile(cfg, []byte("webhooksEnabled: true\nreevaluatePeriod: 30s\n"+extraConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(l.certDir, fmt.Sprintf("controller-%d.log", l.ctlStart))
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(l.resumer, "appwrapper-controller", "--kubeconfig", l.kc, "--config", cfg,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--webhook-port", strconv.Itoa(l.whPort), "--webhook-namespace", "ft-launcher-system",
		"--webhook-cert-dir", filepath.Join(l.certDir, "certs"), "--webhook-cert-hosts", "127.0.0.1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the controller: %v", err)
	}
	ctl := &awController{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); close(ctl.done) }()
	l.ctl = ctl
	// Serving once a dry-run create passes both webhooks (failurePolicy
	// Fail refuses admissions until the server listens).
	probe := appWrapper(l.ns, "probe", nil, l.job("probe", 1, 0, false, "code", "0"))
	var perr error
	poll(t, 90*time.Second, "the controller's webhook server", func() bool {
		perr = env.Client.Create(context.Background(), probe.DeepCopy(), client.DryRunAll)
		return perr == nil
	}, func() string { return fmt.Sprintf("last error: %v", perr) })
}

// applyManifest creates every object of a deploy/k8s manifest.
func applyManifest(t *testing.T, file string) {
	t.Helper()
	applyFile(t, env, filepath.Join("..", "..", "deploy", "k8s", file))
}

// applyFile creates every object of the YAML file path in e's cluster,
// as `kubectl apply -f` does for objects that do not exist yet.
func applyFile(t *testing.T, e *k8stest.Env, path string) {
	t.Helper()
	file := filepath.Base(path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		// AlreadyExists: an earlier run of the test (-count) on the same
		// control plane applied it.
		if err := e.Client.Create(context.Background(), &obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %s %s: %v", file, obj.GetKind(), obj.GetName(), err)
		}
	}
}

// webhookConfigs creates deploy/k8s/webhook.yaml's configurations, reaching
// the controller by URL on 127.0.0.1:port (no Service routing here) and
// only for namespace ns; they are deleted at the end of t.
func webhookConfigs(t *testing.T, ns string, port int) {
	t.Helper()
	vwc, mwc, err := k8stest.WebhookManifests()
	if err != nil {
		t.Fatal(err)
	}
	if len(vwc.Webhooks) != 1 || len(mwc.Webhooks) != 1 {
		t.Fatalf("webhook.yaml: want one validating and one mutating webhook")
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	for i, cc := range []*admissionregv1.WebhookClientConfig{&vwc.Webhooks[0].ClientConfig, &mwc.Webhooks[0].ClientConfig} {
		if cc.Service == nil || cc.Service.Path == nil {
			t.Fatalf("webhook.yaml: webhook %d has no Service path", i)
		}
		u := fmt.Sprintf("https://127.0.0.1:%d%s", port, *cc.Service.Path)
		cc.URL, cc.Service = &u, nil
	}
	vwc.Webhooks[0].NamespaceSelector = sel
	mwc.Webhooks[0].NamespaceSelector = sel
	for _, o := range []client.Object{vwc, mwc} {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), vwc)
		_ = env.Client.Delete(context.Background(), mwc)
	})
}

// job is an Indexed Job of n pods, each running the real ft-launcher
// (static, in the box image) with one rank, the box program, given args:
// independent single-node launchers (--nnodes 1), each pod's checkpoint
// folder on the host folder mounted at /ckpt.
func (l *lane) job(name string, n int, maxRestarts int, spread bool, rank ...string) []byte {
	no := false
	zero := int32(0)
	parallel := int32(n)
	indexed := batchv1.IndexedCompletion
	hostDir := corev1.HostPathDirectory
	grace := int64(1)
	pod := corev1.PodSpec{
		HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
		TerminationGracePeriodSeconds: &grace,
		Volumes: []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: l.dir, Type: &hostDir}}}},
		Containers: []corev1.Container{{
			Name: "trainer", Image: "ftl.local/box:1", ImagePullPolicy: corev1.PullNever,
			Command: append([]string{"/ft-launcher", "--nnodes", "1", "--nproc-per-node", "1",
				"--max-restarts", strconv.Itoa(maxRestarts), "--termination-log", "/dev/termination-log",
				"--log-dir", "/tmp/logs", "--no-python", "/box"}, rank...),
			Env:          []corev1.EnvVar{{Name: "TMPDIR", Value: "/tmp"}},
			VolumeMounts: []corev1.VolumeMount{{Name: "ckpt", MountPath: "/ckpt"}},
		}},
	}
	if spread {
		// One pod per node while both are up; both on the survivor later.
		pod.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100,
				PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname,
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ftl-job": name}}}}}}}
	}
	j := batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{CompletionMode: &indexed, Parallelism: &parallel, Completions: &parallel, BackoffLimit: &zero,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"ftl-job": name}}, Spec: pod}},
	}
	b, _ := json.Marshal(j)
	return b
}

// appWrapper wraps templates (JSON) with the given annotations.
func appWrapper(ns, name string, ann map[string]string, templates ...[]byte) *v1beta2.AppWrapper {
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann}}
	aw.APIVersion, aw.Kind = v1beta2.GroupVersion.String(), "AppWrapper"
	for _, tpl := range templates {
		aw.Spec.Components = append(aw.Spec.Components, v1beta2.AppWrapperComponent{Template: runtime.RawExtension{Raw: tpl}})
	}
	return aw
}

// fastAnn are annotations with no waits, so what is timed is detection,
// the reset and the real kubelet.
func fastAnn(retries int) map[string]string {
	return map[string]string{
		v1beta2.RetryLimitAnnotation:                 strconv.Itoa(retries),
		v1beta2.FailureGracePeriodDurationAnnotation: "0s",
		v1beta2.RetryPausePeriodDurationAnnotation:   "0s",
	}
}

func getAW(t *testing.T, ns, name string) *v1beta2.AppWrapper {
	t.Helper()
	return getAWIn(t, env, ns, name)
}

// poll calls cond every 20 ms until it holds, failing t after timeout.
func poll(t *testing.T, timeout time.Duration, what string, cond func() bool, state func() string) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; %s", timeout, what, state())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Now()
}

func (l *lane) waitPhase(t *testing.T, name string, phase v1beta2.AppWrapperPhase) (*v1beta2.AppWrapper, time.Time) {
	t.Helper()
	var aw *v1beta2.AppWrapper
	at := poll(t, 2*time.Minute, fmt.Sprintf("AppWrapper %s %s", name, phase), func() bool {
		aw = getAW(t, l.ns, name)
		return aw.Status.Phase == phase
	}, func() string { return fmt.Sprintf("phase %s, conditions %+v", aw.Status.Phase, aw.Status.Conditions) })
	return aw, at
}

// pods lists the AppWrapper's pods.
func (l *lane) pods(t *testing.T, aw string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := env.Client.List(context.Background(), &pods, client.InNamespace(l.ns), client.MatchingLabels{v1beta2.AppWrapperLabel: aw}); err != nil {
		t.Fatalf("list pods: %v", err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items
}

// running waits for n Running pods of the AppWrapper not in old.
func (l *lane) running(t *testing.T, aw string, n int, old map[types.UID]bool) ([]corev1.Pod, time.Time) {
	t.Helper()
	var got []corev1.Pod
	at := poll(t, 2*time.Minute, fmt.Sprintf("%d new Running pods of %s", n, aw), func() bool {
		got = got[:0]
		for _, p := range l.pods(t, aw) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && !old[p.UID] {
				got = append(got, p)
			}
		}
		return len(got) == n
	}, func() string { return fmt.Sprintf("%d found: %s", len(got), podStates(l.pods(t, aw))) })
	return got, at
}

func podStates(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		st := fmt.Sprintf("%s %s on %s", p.Name, p.Status.Phase, p.Spec.NodeName)
		if p.Status.PodIP != "" && !p.Spec.HostNetwork {
			st += " (" + p.Status.PodIP + ")"
		}
		if p.DeletionTimestamp != nil {
			st += " (terminating)"
		}
		s = append(s, st)
	}
	return strings.Join(s, "; ")
}

// create creates aw, retrying while the webhook server is not yet up
// (failurePolicy Fail refuses the first admissions).
func (l *lane) create(t *testing.T, aw *v1beta2.AppWrapper) {
	t.Helper()
	var err error
	poll(t, 90*time.Second, "the webhook to admit AppWrapper "+aw.Name, func() bool {
		err = env.Client.Create(context.Background(), aw.DeepCopy())
		return err == nil
	}, func() string { return fmt.Sprintf("last error: %v", err) })
}

func readNanos(t *testing.T, path string) time.Time {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return time.Unix(0, n)
}

func history(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "history"))
	if err != nil {
		t.Fatalf("the rank's history: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// termination returns the verdict in the terminated container of pod.
func termination(t *testing.T, p corev1.Pod) (int32, verdict.Verdict) {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Terminated == nil {
		t.Fatalf("pod %s: container statuses %+v, want one terminated", p.Name, p.Status.ContainerStatuses)
	}
	term := p.Status.ContainerStatuses[0].State.Terminated
	v, err := verdict.Parse([]byte(term.Message))
	if err != nil {
		t.Fatalf("pod %s: termination message %q: %v", p.Name, term.Message, err)
	}
	return term.ExitCode, v
}

// TestRealAppWrapper runs the AppWrapper scenarios on real
// nodes: one cluster of two real kubelets, the real
// `ft-resumer appwrapper-controller` binary as the service account of
// deploy/k8s/rbac.yaml (RBAC decides) serving the webhook of
// deploy/k8s/webhook.yaml, and pods that run the real static ft-launcher
// with the box program as their rank, checkpointing to a host folder. The
// scenarios run in order on the same cluster; the dead node is the last.
func TestRealAppWrapper(t *testing.T) {
	c := startCluster(t, 2)
	ctrllog.SetLogger(logr.Discard()) // the test's clients log nothing
	l := &lane{c: c, ns: env.Namespace(t), dir: t.TempDir(), certDir: t.TempDir()}
	l.resumer = filepath.Join(l.certDir, "ft-resumer")
	// ft-resumer runs the controller's program from its own directory.
	build := exec.Command("go", "build", "-o", l.certDir+"/", "../../cmd/ft-resumer", "../../cmd/ft-appwrapper-controller")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ft-resumer: %v\n%s", err, out)
	}
	applyManifest(t, "rbac.yaml")
	kc, err := env.KubeconfigAs(l.certDir, "system:serviceaccount:ft-launcher-system:appwrapper-controller", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	l.kc = kc
	l.whPort = listenPort(t)
	webhookConfigs(t, l.ns, l.whPort)
	// Ours: a dead node's pods are forced 2 s after it turned NotReady.
	l.startController(t, "deadNodeGracePeriod: 2s\n")
	t.Cleanup(func() {
		if l.ctl != nil {
			l.ctl.stop(t)
			if b, err := os.ReadFile(l.ctl.log); err == nil && bytes.Contains(b, []byte("forbidden")) {
				t.Errorf("the controller was refused something (rbac.yaml misses a rule)")
			}
		}
	})

	t.Run("RankCrashAbsorbedInPod", l.rankCrashAbsorbed)
	t.Run("PodFailureResetResumesFromCheckpoint", l.podFailureReset)
	t.Run("TerminationMessageReadByController", l.terminationMessage)
	t.Run("ImageControllerRunsGeneratedAppWrapper", l.imageScenario)
	t.Run("WebhookRefuses", l.webhookRefuses)
	t.Run("DeadNodeRecreatedOnOtherNode", func(t *testing.T) { l.deadNode(t, "ours", "dead") })
	if n, _ := strconv.Atoi(os.Getenv(benchEnv)); n > 0 {
		t.Run("Bench", func(t *testing.T) { l.bench(t, n) })
	}
}

// Scenarios 1 and 2: an AppWrapper whose pod runs the real ft-launcher;
// its rank crashes once and the launcher restarts it inside the pod: the
// rank resumes from its checkpoint, the AppWrapper succeeds, no reset, no
// retry spent, the same pod throughout.
func (l *lane) rankCrashAbsorbed(t *testing.T) {
	dir := filepath.Join(l.dir, "absorb")
	l.create(t, appWrapper(l.ns, "absorb", fastAnn(2), l.job("absorb", 1, 2, false, "train", "/ckpt/absorb", "20", "5", "1")))
	aw, _ := l.waitPhase(t, "absorb", v1beta2.AppWrapperSucceeded)
	if aw.Status.Retries != 0 {
		t.Errorf("resettingCount %d, want 0: the launcher absorbed the crash", aw.Status.Retries)
	}
	pods := l.pods(t, "absorb")
	if len(pods) != 1 || pods[0].Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pods: %s; want one pod, Succeeded", podStates(pods))
	}
	code, v := termination(t, pods[0])
	if code != 0 || v.Kind != verdict.Succeeded {
		t.Errorf("exit %d verdict %q, want 0 and %q", code, v.Kind, verdict.Succeeded)
	}
	h := history(t, dir)
	want := []string{"start 0 restart=0 resets=0", "start 5 restart=1 resets=0"}
	if !slices.Equal(h, want) {
		t.Errorf("rank history %q, want %q (crash at step 5, restarted in the pod, resumed from the checkpoint)", h, want)
	}
	t.Logf("pod %s on %s: %q, verdict %s", pods[0].Name, pods[0].Spec.NodeName, h, v.Kind)
}

// Scenario 3: the rank crashes with no launcher restart left: the pod
// fails, the controller resets the workload, the recreated pod's rank
// resumes from the checkpoint on the host folder. Returns the times from
// the crash to the reset decision and to the new pod Running.
func (l *lane) podFailureReset(t *testing.T) {
	var decided, running time.Duration
	l.resetPod, decided, running = l.resetOnce(t, "reset")
	t.Logf("crash -> reset decided %v, -> new pod Running %v", decided.Round(time.Millisecond), running.Round(time.Millisecond))
}

func (l *lane) resetOnce(t *testing.T, name string) (firstPod string, decided, running time.Duration) {
	return l.resetOnceOf(t, appWrapper(l.ns, name, fastAnn(2), l.job(name, 1, 0, false, "train", "/ckpt/"+name, "40", "20", "1")))
}

// resetOnceOf runs resetOnce's scenario with aw, whose one pod's rank
// trains 40 steps in /ckpt/<name>, checkpointing every 20, and crashes at
// step 20 with no launcher restart left.
func (l *lane) resetOnceOf(t *testing.T, aw *v1beta2.AppWrapper) (firstPod string, decided, running time.Duration) {
	name := aw.Name
	dir := filepath.Join(l.dir, name)
	l.create(t, aw)
	first, _ := l.running(t, name, 1, nil)
	leftRunning := poll(t, 2*time.Minute, "the reset of "+name, func() bool {
		aw = getAW(t, l.ns, name)
		return aw.Status.Phase == v1beta2.AppWrapperResetting || aw.Status.Retries > 0
	}, func() string { return fmt.Sprintf("phase %s, conditions %+v", aw.Status.Phase, aw.Status.Conditions) })
	second, runAt := l.running(t, name, 1, map[types.UID]bool{first[0].UID: true})
	crash := readNanos(t, filepath.Join(dir, "crashed"))
	aw, _ = l.waitPhase(t, name, v1beta2.AppWrapperSucceeded)
	if aw.Status.Retries != 1 {
		t.Errorf("resettingCount %d, want 1", aw.Status.Retries)
	}
	h := history(t, dir)
	want := []string{"start 0 restart=0 resets=0", "start 20 restart=0 resets=1"}
	if !slices.Equal(h, want) {
		t.Errorf("rank history %q, want %q (the recreated pod resumes from step 20)", h, want)
	}
	var unhealthy string
	for _, c := range aw.Status.Conditions {
		if c.Type == string(v1beta2.Unhealthy) {
			unhealthy = c.Reason
		}
	}
	t.Logf("pods %s then %s (on %s); rank history %q; last Unhealthy reason %s", first[0].Name, second[0].Name, second[0].Spec.NodeName, h, unhealthy)
	return first[0].Name, leftRunning.Sub(crash), runAt.Sub(crash)
}

// imageScenario: the project's image (deploy/image/Containerfile, built
// by scripts/image.sh) runs the controller in a pod, with the shipped
// Deployment's command and security settings (non-root, read-only root
// file system, no capabilities), instead of the host process the other
// scenarios use; under it, an AppWrapper written by `ft-resumer appwrapper
// generate` runs in a training image built FROM the project's, is reset
// once and resumes (generated). Then the host controller is back for the
// scenarios that follow.
func (l *lane) imageScenario(t *testing.T) {
	launcher, train := l.images(t)
	stop := l.controllerPod(t, launcher)
	l.generated(t, train)
	stop()
	l.startController(t, "deadNodeGracePeriod: 2s\n")
}

// controllerPod stops the host controller and runs the controller from
// image in a pod with the ConfigMap's configuration of controller.yaml as
// shipped, on the host network (the lane has no Service routing:
// the API server and the webhook's URL are on 127.0.0.1), as the
// kubeconfig identity the host controller had. It waits until the pod
// serves the webhook; the returned func deletes the pod.
func (l *lane) controllerPod(t *testing.T, image string) func() {
	t.Helper()
	if l.ctl != nil {
		l.ctl.stop(t)
		l.ctl = nil
	}
	dep, cm := shippedController(t)
	// The shipped operator configuration, as the Deployment mounts it
	// (the webhook on by default).
	shippedConfig := cm.Data["config.yaml"]
	if shippedConfig == "" {
		t.Fatal("controller.yaml has no ConfigMap with config.yaml")
	}
	shipped := dep.Spec.Template.Spec
	if len(shipped.Containers) != 1 || shipped.SecurityContext == nil {
		t.Fatalf("controller.yaml's Deployment: want one container and a pod security context")
	}
	// The files the pod reads, readable by the image's user.
	cfgDir := filepath.Join(t.TempDir(), "cfg")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(l.kc)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"kubeconfig": kc, "config.yaml": []byte(shippedConfig)} {
		if err := os.WriteFile(filepath.Join(cfgDir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := shipped.Containers[0]
	no := false
	hostDir := corev1.HostPathDirectory
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "controller-image", Namespace: l.ns},
		Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
			SecurityContext: shipped.SecurityContext,
			Containers: []corev1.Container{{
				Name: "controller", Image: image, ImagePullPolicy: corev1.PullNever,
				// The shipped command's binary and subcommand; the lane's
				// flags (its kubeconfig, ports and webhook URL) after them.
				Command: []string{c.Command[0], c.Command[1], "--kubeconfig=/cfg/kubeconfig", "--config=/cfg/config.yaml",
					"--metrics-bind-address=0", "--health-probe-bind-address=0", "--webhook-port=" + strconv.Itoa(l.whPort),
					"--webhook-namespace=ft-launcher-system", "--webhook-cert-dir=/certs", "--webhook-cert-hosts=127.0.0.1"},
				SecurityContext: c.SecurityContext,
				VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg", ReadOnly: true},
					{Name: "certs", MountPath: "/certs"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "cfg", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: cfgDir, Type: &hostDir}}},
				{Name: "certs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		}}
	if c.Command[0] != "/usr/local/bin/ft-resumer" || c.Command[1] != "appwrapper-controller" {
		t.Fatalf("controller.yaml runs %q, want /usr/local/bin/ft-resumer appwrapper-controller (the image's layout)", c.Command)
	}
	ctx := context.Background()
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create the controller pod: %v", err)
	}
	probe := appWrapper(l.ns, "probe", nil, l.job("probe", 1, 0, false, "code", "0"))
	var perr error
	poll(t, 2*time.Minute, "the controller pod's webhook server", func() bool {
		perr = env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return perr == nil
	}, func() string {
		var p corev1.Pod
		_ = env.Client.Get(ctx, types.NamespacedName{Namespace: l.ns, Name: pod.Name}, &p)
		return fmt.Sprintf("last error: %v; pod %s, %+v", perr, p.Status.Phase, p.Status.ContainerStatuses)
	})
	return func() {
		// A graceful deletion: the object goes only once the kubelet has
		// stopped the container (SIGTERM), so no second controller is left
		// running beside the host's (a grace of 0 removes the object at
		// once, before the process is gone).
		grace := int64(20)
		if err := env.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			t.Errorf("delete the controller pod: %v", err)
		}
		poll(t, 2*time.Minute, "the controller pod to go", func() bool {
			var p corev1.Pod
			return apierrors.IsNotFound(env.Client.Get(ctx, types.NamespacedName{Namespace: l.ns, Name: pod.Name}, &p))
		}, func() string { return "" })
	}
}

// shippedController returns controller.yaml's Deployment and ConfigMap.
func shippedController(t *testing.T) (dep appsv1.Deployment, cm corev1.ConfigMap) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "k8s", "controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "kind: Deployment") {
			if err := yaml.UnmarshalStrict([]byte(doc), &dep); err != nil {
				t.Fatalf("controller.yaml's Deployment: %v", err)
			}
		}
		if strings.Contains(doc, "kind: ConfigMap") {
			if err := yaml.UnmarshalStrict([]byte(doc), &cm); err != nil {
				t.Fatalf("controller.yaml's ConfigMap: %v", err)
			}
		}
	}
	return dep, cm
}

// generated: the AppWrapper that `ft-resumer appwrapper generate` writes
// from a values file (docs/kubernetes.md, "Generating an AppWrapper"),
// submitted as it is written (only its namespace set, as kubectl -n
// would), in the training image train (its pod runs as the image's user,
// not root): the pod runs, the rank's crash with no launcher restart left
// fails the pod, the controller resets the workload once, and the new pod
// resumes from the checkpoint. The rank is the static box program (this
// lane has no Python); its pods use the host network, as every pod of
// this lane does.
func (l *lane) generated(t *testing.T, train string) {
	// The pod runs as the image's user, not root: the checkpoint folder
	// must be writable by it, as a volume for such pods is.
	if err := os.Chmod(l.dir, 0o777); err != nil {
		t.Fatal(err)
	}
	values := filepath.Join(l.certDir, "values.yaml")
	if err := os.WriteFile(values, []byte(`name: gen
image: `+train+`
imagePullPolicy: Never
nodes: 1
maxRestarts: 0
launcherArgs: [--no-python, --log-dir, /tmp/logs]
command: [/box, train, /ckpt/gen, "40", "20", "1"]
env: {TMPDIR: /tmp}
checkpoint: {hostPath: `+l.dir+`, mountPath: /ckpt}
hostNetwork: true
retryLimit: 2
failureGracePeriod: 0s
retryPausePeriod: 0s
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(l.certDir, "gen.yaml")
	if b, err := exec.Command(l.resumer, "appwrapper", "generate", values, "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("ft-resumer appwrapper generate: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var aw v1beta2.AppWrapper
	if err := yaml.UnmarshalStrict(b, &aw); err != nil {
		t.Fatalf("the generated AppWrapper does not parse: %v\n%s", err, b)
	}
	aw.Namespace = l.ns
	_, decided, running := l.resetOnceOf(t, &aw)
	pods := l.pods(t, "gen")
	for _, p := range pods {
		if p.Spec.Containers[0].Image != train {
			t.Errorf("pod %s runs %s, want %s", p.Name, p.Spec.Containers[0].Image, train)
		}
	}
	t.Logf("generated AppWrapper: crash -> reset decided %v, -> new pod Running %v", decided.Round(time.Millisecond), running.Round(time.Millisecond))
}

// images builds the ft-launcher image with scripts/image.sh from static
// binaries of this tree, then a training image FROM it that adds the box
// program as its rank and a /tmp, imports both into every node and
// returns their names.
func (l *lane) images(t *testing.T) (launcherRef, trainRef string) {
	t.Helper()
	testenv.Require(t, testenv.Buildah)
	dir := t.TempDir()
	launcher := launcherImage(t, dir, "localhost/ft-launcher:test")
	// The user's training image: FROM the launcher's, plus the program.
	ctx := filepath.Join(dir, "train")
	if err := os.MkdirAll(ctx, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTmpLayer(t, ctx)
	build := exec.Command("go", "build", "-o", filepath.Join(ctx, "box"), "./testdata/box")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build box: %v\n%s", err, out)
	}
	containerfile := "FROM oci-archive:" + launcher + "\nCOPY box /box\nADD tmp.tar /\n"
	train := buildahImage(t, dir, ctx, containerfile, "localhost/ftl-train:1")
	ctxT, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, img := range []struct{ archive, base string }{{launcher, "localhost/ft-launcher"}, {train, "localhost/ftl-train"}} {
		if err := l.c.ImportImage(ctxT, img.archive, img.base); err != nil {
			t.Fatal(err)
		}
	}
	return "localhost/ft-launcher:test", "localhost/ftl-train:1"
}

// launcherImage builds the project's image as docs/kubernetes.md says
// (scripts/image.sh on static release builds of the four commands),
// named tag, into an OCI archive under dir, and returns the archive.
func launcherImage(t *testing.T, dir, tag string) string {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	for _, c := range []string{"ft-launcher", "ft-launcher-etcd", "ft-resumer", "ft-appwrapper-controller"} {
		build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, c), "../../cmd/"+c)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
	}
	launcher := filepath.Join(dir, "ft-launcher.oci.tar")
	if out, err := exec.Command("../../scripts/image.sh", "--bin-dir", bin, "--tag", tag,
		"--out", launcher).CombinedOutput(); err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, out)
	}
	return launcher
}

// writeTmpLayer writes tmp.tar into the build context ctx: a /tmp
// writable by every user, as images with a distribution have (a tar
// layer keeps the directory's mode; COPY --chmod does not apply to a
// directory's own mode).
func writeTmpLayer(t *testing.T, ctx string) {
	t.Helper()
	var tmp bytes.Buffer
	tw := tar.NewWriter(&tmp)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctx, "tmp.tar"), tmp.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// buildahImage builds containerfile in the context ctx with buildah
// (daemonless, its storage under dir), named tag, and returns its OCI
// archive under dir.
func buildahImage(t *testing.T, dir, ctx, containerfile, tag string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(ctx, "Containerfile"), []byte(containerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	train := filepath.Join(dir, filepath.Base(ctx)+".oci.tar")
	store := filepath.Join(dir, "store-"+filepath.Base(ctx))
	b := []string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"), "--storage-driver", "vfs"}
	t.Cleanup(func() { _ = exec.Command("buildah", append(b, "rmi", "--all")...).Run() })
	for _, args := range [][]string{
		{"bud", "--quiet", "--isolation", "chroot", "-t", tag, "-f", filepath.Join(ctx, "Containerfile"), ctx},
		{"push", "--quiet", tag, "oci-archive:" + train + ":" + tag},
	} {
		if out, err := exec.Command("buildah", append(b, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("buildah %s: %v\n%s", args[0], err, out)
		}
	}
	return train
}

// Scenario 4: ft-launcher's verdict, written to the termination log in
// the container, is read by the controller from the pod status: the
// Resetting Event of scenario 3's reset says what the launcher said
// (restart_budget_exhausted, the rank's exit code), which only the
// termination message carries.
func (l *lane) terminationMessage(t *testing.T) {
	if l.resetPod == "" {
		t.Fatal("scenario 3 (PodFailureResetResumesFromCheckpoint) did not run or failed before its reset")
	}
	var evs corev1.EventList
	if err := env.Client.List(context.Background(), &evs, client.InNamespace(l.ns)); err != nil {
		t.Fatal(err)
	}
	want := []string{"attempt 1 of 2", "ft-launcher: pod " + l.resetPod, string(verdict.RestartBudgetExhausted), "exited with code 1"}
	var notes []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != "reset" || e.Reason != "Resetting" {
			continue
		}
		notes = append(notes, e.Message)
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(e.Message, w)
		}
		if ok {
			t.Logf("Resetting Event: %s", e.Message)
			return
		}
	}
	t.Errorf("no Resetting Event of AppWrapper reset naming %q; Resetting Events: %q", want, notes)
}

// Scenario 6: the webhook served by the controller binary refuses a
// nested AppWrapper, and a component its user may not create (a Secret,
// for a user who may create AppWrappers and Jobs only).
func (l *lane) webhookRefuses(t *testing.T) {
	ctx := context.Background()
	user := "alice-" + l.ns
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: "aw-user"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1beta2.GroupVersion.Group}, Resources: []string{"appwrappers"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create"}},
	}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: "aw-user"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "aw-user"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := env.KubeconfigAs(t.TempDir(), user)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	alice, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	secret, _ := json.Marshal(corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "stolen"}, StringData: map[string]string{"k": "v"}})
	nested, _ := json.Marshal(appWrapper("", "inner", nil, l.job("inner", 1, 0, false, "code", "0")))
	job := l.job("wh", 1, 0, false, "code", "0")
	for _, tc := range []struct {
		name string
		as   client.Client
		aw   *v1beta2.AppWrapper
		want string
	}{
		{"nested AppWrapper", env.Client, appWrapper(l.ns, "outer", nil, job, nested), "nested AppWrappers are forbidden"},
		{"Secret the user may not create", alice, appWrapper(l.ns, "sec", nil, job, secret), "may not create secrets in namespace"},
	} {
		err := tc.as.Create(ctx, tc.aw, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused: %s", tc.name, err, tc.want)
		}
	}
	// The same user may create one with a Job only (dry run).
	if err := alice.Create(ctx, appWrapper(l.ns, "ok", nil, job), client.DryRunAll); err != nil {
		t.Fatalf("an AppWrapper of a Job by its user: %v, want admitted", err)
	}
	// The cost per admission, logged: dry-run creates through both
	// webhooks (one SubjectAccessReview each) against the same in a
	// namespace the webhooks do not select.
	fast := rest.CopyConfig(env.Config)
	fast.QPS, fast.Burst = 1000, 1000 // the server's latency, not client-go's rate limiter
	admin, err := client.New(fast, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	other := env.Namespace(t)
	for _, ns := range []string{l.ns, other} {
		var took []time.Duration
		for range 20 {
			start := time.Now()
			if err := admin.Create(ctx, appWrapper(ns, "ok", nil, job), client.DryRunAll); err != nil {
				t.Fatalf("dry-run create in %s: %v", ns, err)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		t.Logf("dry-run create of an AppWrapper (webhooks: %v), p50 of 20 %v, max %v", ns == l.ns,
			took[len(took)/2].Round(10*time.Microsecond), took[len(took)-1].Round(10*time.Microsecond))
	}
}

// Scenario 5: two pods, one per node, whose ranks watch each other's
// heartbeat (as a collective would). The node of one of them loses power
// (kubelet and containers killed): the rank on the other node loses its
// peer and exits, its launcher has no restart left, the pod fails, the
// controller resets. The dead node's pod stays Terminating (no kubelet)
// until the controller forces it (deadNodeGracePeriod after the node
// turned NotReady, or forcefulDeletionGracePeriod under upstream's
// rules); then both pods are recreated on the surviving node.
func (l *lane) deadNode(t *testing.T, rules, name string) map[string]time.Duration {
	ctx := context.Background()
	dir := filepath.Join(l.dir, name)
	ann := fastAnn(3)
	ann[v1beta2.ForcefulDeletionGracePeriodAnnotation] = "20s"
	l.create(t, appWrapper(l.ns, name, ann, l.job(name, 2, 0, true, "peers", "/ckpt/"+name+"/r$(FTL_WORKLOAD_RESETS)", "$(JOB_COMPLETION_INDEX)", "2")))
	first, _ := l.running(t, name, 2, nil)
	if first[0].Spec.NodeName == first[1].Spec.NodeName {
		t.Fatalf("both pods on %s despite the anti-affinity; the scenario needs one per node", first[0].Spec.NodeName)
	}
	// Both ranks see each other before the node dies.
	poll(t, time.Minute, "both heartbeats", func() bool {
		for i := 0; i < 2; i++ {
			if _, err := os.Stat(filepath.Join(dir, "r0", fmt.Sprintf("hb-%d", i))); err != nil {
				return false
			}
		}
		return true
	}, func() string { return "missing" })
	time.Sleep(500 * time.Millisecond)
	victim := first[1]
	var dead, live *kubelettest.Node
	for _, n := range l.c.Nodes {
		if n.Name == victim.Spec.NodeName {
			dead = n
		} else {
			live = n
		}
	}
	old := map[types.UID]bool{first[0].UID: true, first[1].UID: true}
	off := time.Now()
	dead.PowerOff()
	times := map[string]time.Duration{}
	var notReadyAt, forcedAt, decidedAt time.Time
	var newPods []corev1.Pod
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not run again within 3 min of the power loss; pods: %s", podStates(l.pods(t, name)))
		}
		now := time.Now()
		if notReadyAt.IsZero() {
			node, err := env.Clientset.CoreV1().Nodes().Get(ctx, dead.Name, metav1.GetOptions{})
			if err == nil {
				for _, c := range node.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
						notReadyAt = now
					}
				}
			}
		}
		if decidedAt.IsZero() && getAW(t, l.ns, name).Status.Phase != v1beta2.AppWrapperRunning {
			decidedAt = now
		}
		pods := l.pods(t, name)
		if forcedAt.IsZero() && !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.UID == victim.UID }) {
			forcedAt = now
		}
		newPods = newPods[:0]
		for _, p := range pods {
			if !old[p.UID] && p.Status.Phase == corev1.PodRunning {
				newPods = append(newPods, p)
			}
		}
		if len(newPods) == 2 {
			times["running"] = now.Sub(off)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	lost := readNanos(t, filepath.Join(dir, "r0", "lost-0"))
	times["peer lost"] = lost.Sub(off)
	times["NotReady"] = notReadyAt.Sub(off)
	times["reset decided"] = decidedAt.Sub(off)
	times["dead pod forced"] = forcedAt.Sub(off)
	for _, p := range newPods {
		if p.Spec.NodeName != live.Name {
			t.Errorf("recreated pod %s on %s, want %s (the live node)", p.Name, p.Spec.NodeName, live.Name)
		}
	}
	if notReadyAt.IsZero() || notReadyAt.After(forcedAt) {
		t.Errorf("dead pod forced at %v, node NotReady seen at %v: want NotReady first", forcedAt.Sub(off), notReadyAt.Sub(off))
	}
	aw := getAW(t, l.ns, name)
	if aw.Status.Retries != 1 {
		t.Errorf("resettingCount %d, want 1", aw.Status.Retries)
	}
	if rules == "ours" && forcedAt.Sub(off) > notReadyAt.Sub(off)+15*time.Second {
		t.Errorf("dead pod forced %v after the power loss, NotReady at %v: want it within deadNodeGracePeriod (2 s) plus slack of NotReady, not after forcefulDeletionGracePeriod (20 s)", forcedAt.Sub(off), notReadyAt.Sub(off))
	}
	// Our Events are events.k8s.io/v1; the core API lists them too, the
	// note as the message.
	var forcedEvent bool
	var evs corev1.EventList
	if err := env.Client.List(ctx, &evs, client.InNamespace(l.ns)); err == nil {
		for _, e := range evs.Items {
			if e.Reason == "LostPodsForced" && strings.Contains(e.Message, victim.Name) {
				forcedEvent = true
			}
		}
	}
	if rules == "ours" && !forcedEvent {
		t.Errorf("no LostPodsForced Event naming %s", victim.Name)
	}
	t.Logf("%s rules: power off %s -> %v", rules, dead.Name, fmtTimes(times))
	return times
}

func fmtTimes(m map[string]time.Duration) string {
	var parts []string
	for _, k := range []string{"peer lost", "reset decided", "NotReady", "dead pod forced", "running"} {
		parts = append(parts, fmt.Sprintf("%s %v", k, m[k].Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// bench measures (benchEnv rounds): pod failure -> reset -> new pod
// Running; and the dead node under our settings and upstream's (the
// controller restarted with deadNodeGracePeriod above the annotation's
// forcefulDeletionGracePeriod of 20 s, so only that forces the pod).
func (l *lane) bench(t *testing.T, rounds int) {
	dead := func() *kubelettest.Node {
		for _, n := range l.c.Nodes {
			node, err := env.Clientset.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
					return n
				}
			}
		}
		return nil
	}
	revive := func() {
		n := dead()
		if n == nil {
			return
		}
		if err := n.StartKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := n.WaitReady(context.Background(), env, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < rounds; i++ {
		_, d, r := l.resetOnce(t, fmt.Sprintf("bench-reset-%d", i))
		t.Logf("BENCH reset round %d: crash -> reset decided %v -> new pod Running %v", i, d.Round(time.Millisecond), r.Round(time.Millisecond))
	}
	for _, rules := range []string{"ours", "upstream"} {
		if rules == "upstream" {
			l.startController(t, "deadNodeGracePeriod: 1h\n")
		} else {
			l.startController(t, "deadNodeGracePeriod: 2s\n")
		}
		for i := 0; i < rounds; i++ {
			revive()
			name := fmt.Sprintf("bench-%s-%d", rules, i)
			times := l.deadNode(t, rules, name)
			t.Logf("BENCH dead node %s round %d: %s", rules, i, fmtTimes(times))
			// Its ranks run until stopped: delete it, not to load the
			// next rounds.
			if err := env.Client.Delete(context.Background(), getAW(t, l.ns, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// listenPort is a free port for the controller's webhook server, taken
// below the ephemeral range: a port the kernel picked (127.0.0.1:0) can be
// handed to one of the many outgoing connections before the binary binds
// it (as in integration/k8s).
func listenPort(t *testing.T) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	span := max(low-10000, 1)
	start := int(time.Now().UnixNano() % int64(span))
	for i := range 200 {
		p := 10000 + (start+i)%span
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err == nil {
			ln.Close()
			return p
		}
	}
	t.Fatalf("no free port in [10000, %d)", low)
	return 0
}
