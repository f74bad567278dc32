package kubelettest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
	"github.com/ftlauncher/ft-launcher/k8s/kubelettest"
)

// The host address of TestShippedInstall's cluster services: the API
// server listens and is advertised there (the "kubernetes" Service's
// endpoint), and CoreDNS answers there. The loopback interface holds it,
// so it is reachable from the pods through their gateway and from nowhere
// outside the machine.
const (
	installAddr  = "10.243.0.1"
	installLabel = "lo:ftlsvc"
)

// TestShippedInstall runs docs/kubernetes.md's install as a user runs it,
// on two real kubelets with a pod network, Services (a real kube-proxy)
// and cluster DNS (a real CoreDNS), against an API server with service
// accounts: the project's image built with scripts/image.sh under the name
// controller.yaml gives and imported into each node's containerd as the
// docs say; then deploy/k8s/crd, rbac.yaml, webhook.yaml and
// controller.yaml applied unmodified, in the documented order. The
// Deployment's two replicas must become ready as shipped (in-cluster
// configuration, the webhook behind its Service, leader election). Then
// deploy/examples/appwrapper.yaml is submitted with only its image set to
// a training image built FROM the project's with Python and a train.py
// (the example tells the user to point image: at theirs): both pods run,
// their launchers find each other through the headless Service's DNS
// names and start ranks 0 and 1 of a world of 2; one pod's container is
// killed; the controller resets the AppWrapper exactly once and both pods
// run again, their ranks told that one reset happened.
func TestShippedInstall(t *testing.T) {
	k8stest.Need(t, env)
	if err := kubelettest.Check(); err != nil {
		testenv.Missing(t, testenv.RealContainers, err.Error())
	}
	testenv.Require(t, testenv.Buildah)
	remove, err := kubelettest.AddHostAddress(installLabel, installAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	})
	e, err := k8stest.StartWith(k8stest.Options{Address: installAddr, Cluster: true, NoCRDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	dir := t.TempDir()
	c := startInstallCluster(t, e, dir)
	ctx := context.Background()

	// The image, named as controller.yaml names it.
	dep, _ := shippedController(t)
	ref := dep.Spec.Template.Spec.Containers[0].Image
	repo, _, ok := strings.Cut(ref, ":")
	if !ok || !strings.HasPrefix(ref, "localhost/ft-launcher:") {
		t.Fatalf("controller.yaml's image is %q, want localhost/ft-launcher:VERSION (scripts/image.sh's name)", ref)
	}
	launcher := launcherImage(t, dir, ref)
	train := pythonTrainImage(t, dir, launcher)
	for _, img := range []struct{ archive, base string }{{launcher, repo}, {train, "localhost/ftl-train-py"}} {
		if err := c.ImportImage(ctx, img.archive, img.base); err != nil {
			t.Fatal(err)
		}
	}

	// docs/kubernetes.md, "Install": crd/, rbac.yaml, webhook.yaml,
	// controller.yaml, as they are.
	installStart := time.Now()
	crds, err := filepath.Glob(filepath.Join("..", "..", "deploy", "k8s", "crd", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("deploy/k8s/crd: no CRDs (%v)", err)
	}
	for _, f := range crds {
		applyFile(t, e, f)
	}
	waitCRDsEstablished(t, e)
	for _, f := range []string{"rbac.yaml", "webhook.yaml", "controller.yaml"} {
		applyFile(t, e, filepath.Join("..", "..", "deploy", "k8s", f))
	}
	t.Cleanup(func() {
		if t.Failed() {
			logControllerPods(t, e, c)
		}
	})
	poll(t, 5*time.Minute, "controller.yaml's Deployment to be available", func() bool {
		var d appsv1.Deployment
		err := e.Client.Get(ctx, types.NamespacedName{Namespace: dep.Namespace, Name: dep.Name}, &d)
		return err == nil && d.Status.ReadyReplicas == *dep.Spec.Replicas && d.Status.UpdatedReplicas == *dep.Spec.Replicas
	}, func() string { return podsOf(e, dep.Namespace, dep.Spec.Selector.MatchLabels) })
	t.Logf("install applied; %d controller replicas ready %v later", *dep.Spec.Replicas, time.Since(installStart).Round(time.Millisecond))

	// The example, with the image the user is told to set.
	ns := e.Namespace(t)
	aw := exampleAppWrapper(t, ns, "localhost/ftl-train-py:1")
	// The webhook admits it once the controller has written the
	// configurations' caBundle (within seconds of its start); the test
	// retries only while the webhook cannot be called yet, and says how long.
	created := time.Now()
	var cerr error
	poll(t, 2*time.Minute, "the example AppWrapper to be admitted", func() bool {
		cerr = e.Client.Create(ctx, aw.DeepCopy())
		if cerr != nil && !strings.Contains(cerr.Error(), "failed calling webhook") {
			t.Fatalf("create the example AppWrapper: %v", cerr)
		}
		return cerr == nil
	}, func() string { return fmt.Sprintf("last error: %v", cerr) })
	t.Logf("example admitted %v after the Deployment was ready", time.Since(created).Round(time.Millisecond))
	t.Cleanup(func() { deleteAppWrapper(t, e, ns, aw.Name) })

	first := waitTraining(t, e, c, ns, aw.Name, nil, 0)
	// A pod fails: its launcher, the container's process, is killed.
	victim := first[0]
	if err := c.KillContainer(ctx, &victim, "trainer"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	old := map[types.UID]bool{}
	for _, p := range first {
		old[p.UID] = true
	}
	var got *v1beta2.AppWrapper
	decided := poll(t, 3*time.Minute, "the reset after the pod failure", func() bool {
		got = getAWIn(t, e, ns, aw.Name)
		return got.Status.Retries > 0
	}, func() string { return fmt.Sprintf("phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions) })
	second := waitTraining(t, e, c, ns, aw.Name, old, 1)
	running := time.Now()
	got = getAWIn(t, e, ns, aw.Name)
	if got.Status.Retries != 1 || got.Status.Phase != v1beta2.AppWrapperRunning {
		t.Errorf("after the reset: phase %s, resettingCount %d; want Running and 1", got.Status.Phase, got.Status.Retries)
	}
	t.Logf("pod %s killed on %s; reset decided %v later, both pods training again %v later (%s)", victim.Name, victim.Spec.NodeName,
		decided.Sub(killed).Round(time.Millisecond), running.Sub(killed).Round(time.Millisecond), podStates(second))
	// The controller replicas ran through it: none restarted.
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(dep.Namespace), client.MatchingLabels(dep.Spec.Selector.MatchLabels)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount != 0 {
				t.Errorf("controller pod %s restarted %d times", p.Name, s.RestartCount)
			}
		}
	}

	// Relays in pods (docs/rendezvous.md, "Relays"): the example again, in
	// another namespace, with --rdzv-conf relay_group=2 and the job secret
	// mounted from a Secret. Pod 0 is the relay; pod 1 finds it by its name
	// under the subdomain and registers through it. The first example goes
	// first: the two nodes hold one example's pods (a CPU each).
	deleteAppWrapper(t, e, ns, aw.Name)
	ns2 := e.Namespace(t)
	if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "job-secret", Namespace: ns2},
		StringData: map[string]string{"job": "relay-test-secret-0123456789abcdef"}}); err != nil {
		t.Fatal(err)
	}
	relayed := exampleAppWrapper(t, ns2, "localhost/ftl-train-py:1")
	withRelays(t, relayed, "job-secret")
	if err := e.Client.Create(ctx, relayed); err != nil {
		t.Fatalf("create the AppWrapper with relays: %v", err)
	}
	t.Cleanup(func() { deleteAppWrapper(t, e, ns2, relayed.Name) })
	var relayLog, memberLog string
	for _, p := range waitTraining(t, e, c, ns2, relayed.Name, nil, 0) {
		log, err := c.PodLog(&p, "trainer")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(log, "relay for its group") {
			relayLog = log
		} else {
			memberLog = log
		}
	}
	if relayLog == "" || !strings.Contains(relayLog, "name=relay network=tcp") {
		t.Errorf("no pod listens as the relay (\"relay for its group\", the listeners record):\n%s\n---\n%s", relayLog, memberLog)
	}
	if i := strings.Index(memberLog, "registered_by_relay="); i < 0 {
		t.Errorf("pod 1 did not register through pod 0's relay:\n%s", memberLog)
	} else {
		t.Logf("pod 1 registered through pod 0's relay: %s", strings.SplitN(memberLog[i:], "\n", 2)[0])
	}
}

// withRelays turns on the two-level join in aw's Job: --rdzv-conf
// relay_group=2 and --job-secret-file from Secret secret (key "job"),
// mounted read-only as docs/kubernetes.md says.
func withRelays(t *testing.T, aw *v1beta2.AppWrapper, secret string) {
	t.Helper()
	editJobs(t, aw, func(spec map[string]any) {
		c := spec["containers"].([]any)[0].(map[string]any)
		cmd := c["command"].([]any)
		last := cmd[len(cmd)-1]
		cmd = append(append(cmd[:len(cmd)-1:len(cmd)-1], "--rdzv-conf", "relay_group=2", "--job-secret-file", "/run/ftl/job"), last)
		c["command"] = cmd
		c["volumeMounts"] = []any{map[string]any{"name": "job-secret", "mountPath": "/run/ftl", "readOnly": true}}
		spec["volumes"] = []any{map[string]any{"name": "job-secret", "secret": map[string]any{"secretName": secret, "defaultMode": int64(0o440),
			"items": []any{map[string]any{"key": "job", "path": "job"}}}}}
		// The image's user (65532) reads the Secret through the pod's
		// fsGroup: root:65532, mode 0440.
		spec["securityContext"] = map[string]any{"fsGroup": int64(65532)}
	})
}

// editJobs hands the pod spec of each Job component of aw to edit and
// writes back what it changed.
func editJobs(t *testing.T, aw *v1beta2.AppWrapper, edit func(podSpec map[string]any)) {
	t.Helper()
	for i, comp := range aw.Spec.Components {
		var obj unstructured.Unstructured
		if err := obj.UnmarshalJSON(comp.Template.Raw); err != nil {
			t.Fatalf("component %d: %v", i, err)
		}
		if obj.GetKind() != "Job" {
			continue
		}
		spec, _, err := unstructured.NestedMap(obj.Object, "spec", "template", "spec")
		if err != nil {
			t.Fatalf("component %d: %v", i, err)
		}
		edit(spec)
		if err := unstructured.SetNestedMap(obj.Object, spec, "spec", "template", "spec"); err != nil {
			t.Fatal(err)
		}
		raw, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		aw.Spec.Components[i].Template.Raw = raw
	}
}

// startInstallCluster starts two real nodes with a pod network, Services
// and cluster DNS for e's control plane.
func startInstallCluster(t *testing.T, e *k8stest.Env, dir string) *kubelettest.Cluster {
	t.Helper()
	box := filepath.Join(dir, "box")
	buildStatic(t, box, "./testdata/box")
	return startNodes(t, e, 2, []kubelettest.Image{pauseImage(box)},
		kubelettest.Options{PodNetwork: true, ServiceAddress: installAddr})
}

// pythonTrainImage builds the user's training image of docs/kubernetes.md
// ("The image"): FROM the project's image, with a Python (this machine's
// interpreter, its standard library and the libraries it links) and
// testdata/install/train.py in /workspace, the working folder.
func pythonTrainImage(t *testing.T, dir, launcher string) string {
	t.Helper()
	ctx := filepath.Join(dir, "train-py")
	root := filepath.Join(ctx, "rootfs")
	copies := map[string]string{
		"/usr/bin/python3.11":                 "usr/bin/python3",
		"/lib64/ld-linux-x86-64.so.2":         "lib64/ld-linux-x86-64.so.2",
		"testdata/install/train.py":           "workspace/train.py",
		"/usr/lib/python3.11":                 "usr/lib/python3.11",
		"/lib/x86_64-linux-gnu/libc.so.6":     "lib/x86_64-linux-gnu/libc.so.6",
		"/lib/x86_64-linux-gnu/libm.so.6":     "lib/x86_64-linux-gnu/libm.so.6",
		"/lib/x86_64-linux-gnu/libz.so.1":     "lib/x86_64-linux-gnu/libz.so.1",
		"/lib/x86_64-linux-gnu/libexpat.so.1": "lib/x86_64-linux-gnu/libexpat.so.1",
	}
	for from, to := range copies {
		dst := filepath.Join(root, to)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		// cp -rL: the files behind Debian's links; the standard library
		// without its tests, Tk, and the static libpython.
		args := []string{"-rL", from, dst}
		if out, err := exec.Command("cp", args...).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", from, err, out)
		}
	}
	for _, d := range []string{"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "config-3.11-x86_64-linux-gnu", "dist-packages"} {
		if err := os.RemoveAll(filepath.Join(root, "usr/lib/python3.11", d)); err != nil {
			t.Fatal(err)
		}
	}
	writeTmpLayer(t, ctx)
	containerfile := "FROM oci-archive:" + launcher + "\nCOPY rootfs/ /\nADD tmp.tar /\nENV PATH=/usr/local/bin:/usr/bin\nWORKDIR /workspace\n"
	return buildahImage(t, dir, ctx, containerfile, "localhost/ftl-train-py:1")
}

// waitCRDsEstablished waits until AppWrappers can be listed: the CRD is
// established (kubectl wait --for condition=established).
func waitCRDsEstablished(t *testing.T, e *k8stest.Env) {
	t.Helper()
	var err error
	poll(t, time.Minute, "the AppWrapper CRD to be established", func() bool {
		err = e.Client.List(context.Background(), &v1beta2.AppWrapperList{})
		return err == nil
	}, func() string { return fmt.Sprint(err) })
}

// exampleAppWrapper reads deploy/examples/appwrapper.yaml and sets what
// its comment tells the user to set: the trainer's image (and the
// namespace, as kubectl -n does).
func exampleAppWrapper(t *testing.T, ns, image string) *v1beta2.AppWrapper {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "appwrapper.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var aw v1beta2.AppWrapper
	if err := yaml.UnmarshalStrict(b, &aw); err != nil {
		t.Fatalf("deploy/examples/appwrapper.yaml: %v", err)
	}
	aw.Namespace = ns
	set := 0
	editJobs(t, &aw, func(spec map[string]any) {
		for _, c := range spec["containers"].([]any) {
			c.(map[string]any)["image"] = image
			set++
		}
	})
	if set != 1 {
		t.Fatalf("deploy/examples/appwrapper.yaml: %d Job containers, want 1", set)
	}
	return &aw
}

func getAWIn(t *testing.T, e *k8stest.Env, ns, name string) *v1beta2.AppWrapper {
	t.Helper()
	var aw v1beta2.AppWrapper
	if err := e.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &aw); err != nil {
		t.Fatalf("get AppWrapper %s/%s: %v", ns, name, err)
	}
	return &aw
}

// awPods lists the pods of AppWrapper name that are not being deleted.
func awPods(t *testing.T, e *k8stest.Env, ns, name string) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	if err := e.Client.List(context.Background(), &l, client.InNamespace(ns), client.MatchingLabels{v1beta2.AppWrapperLabel: name}); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// waitTraining waits until the AppWrapper is Running with two Running
// pods, none of them in old, whose ranks 0 and 1 of a world of 2 say they
// train after resets resets.
func waitTraining(t *testing.T, e *k8stest.Env, c *kubelettest.Cluster, ns, name string, old map[types.UID]bool, resets int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	var state string
	// The last lines each pod logged, for the failure message: a pod that
	// fails is gone (the AppWrapper resets) before the wait ends.
	tails := map[string]string{}
	poll(t, 5*time.Minute, fmt.Sprintf("AppWrapper %s Running with 2 training pods (resets %d)", name, resets), func() bool {
		aw := getAWIn(t, e, ns, name)
		pods = awPods(t, e, ns, name)
		state = fmt.Sprintf("phase %s, conditions %+v; pods: %s", aw.Status.Phase, aw.Status.Conditions, podStates(pods))
		for _, p := range pods {
			if log, err := c.PodLog(&p, "trainer"); err == nil && log != "" {
				tails[p.Name] = log[max(0, len(log)-3000):]
			}
		}
		for n, tail := range tails {
			state += fmt.Sprintf("\n--- %s's log (end):\n%s", n, tail)
		}
		if aw.Status.Phase != v1beta2.AppWrapperRunning || len(pods) != 2 {
			return false
		}
		seen := map[string]bool{}
		for _, p := range pods {
			if old[p.UID] || p.Status.Phase != corev1.PodRunning {
				return false
			}
			log, err := c.PodLog(&p, "trainer")
			if err != nil {
				state += "; " + err.Error()
				return false
			}
			for _, r := range []string{"0", "1"} {
				if strings.Contains(log, fmt.Sprintf("train.py: rank %s of 2 resets %d step 2", r, resets)) {
					seen[r] = true
				}
			}
		}
		if len(seen) < 2 {
			state += fmt.Sprintf("; ranks training: %v", seen)
			return false
		}
		return true
	}, func() string { return state })
	return pods
}

func podsOf(e *k8stest.Env, ns string, labels map[string]string) string {
	var l corev1.PodList
	if err := e.Client.List(context.Background(), &l, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
		return err.Error()
	}
	var s []string
	for _, p := range l.Items {
		st := fmt.Sprintf("%s %s on %s", p.Name, p.Status.Phase, p.Spec.NodeName)
		for _, cs := range p.Status.ContainerStatuses {
			st += fmt.Sprintf(" ready=%v restarts=%d", cs.Ready, cs.RestartCount)
			if cs.State.Waiting != nil {
				st += " waiting: " + cs.State.Waiting.Reason + " " + cs.State.Waiting.Message
			}
			if cs.LastTerminationState.Terminated != nil {
				st += " last: " + cs.LastTerminationState.Terminated.Reason + " " + cs.LastTerminationState.Terminated.Message
			}
		}
		s = append(s, st)
	}
	return strings.Join(s, "; ")
}

// logControllerPods logs what the controller pods wrote.
func logControllerPods(t *testing.T, e *k8stest.Env, c *kubelettest.Cluster) {
	var l corev1.PodList
	if err := e.Client.List(context.Background(), &l, client.InNamespace("ft-launcher-system")); err != nil {
		t.Log(err)
		return
	}
	for _, p := range l.Items {
		log, err := c.PodLog(&p, "controller")
		if len(log) > 8000 {
			log = log[len(log)-8000:]
		}
		t.Logf("controller pod %s (%v):\n%s", p.Name, err, log)
	}
}

// deleteAppWrapper deletes the AppWrapper and waits until its pods are
// gone, so the nodes stop with nothing of it running.
func deleteAppWrapper(t *testing.T, e *k8stest.Env, ns, name string) {
	ctx := context.Background()
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := e.Client.Delete(ctx, aw); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete AppWrapper %s: %v", name, err)
		return
	}
	poll(t, 3*time.Minute, "the example's pods to go", func() bool {
		var l corev1.PodList
		if err := e.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false
		}
		return len(l.Items) == 0
	}, func() string { return "" })
}
