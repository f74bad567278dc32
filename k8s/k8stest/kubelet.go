package k8stest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// JobTrackingFinalizer is the finalizer the Job controller puts on its pods;
// the stand-in kubelet finalises pods carrying only that one, as a kubelet
// would, and leaves pods with any other finalizer terminating ("stuck").
const JobTrackingFinalizer = "batch.kubernetes.io/job-tracking"

// Kubelet stands in for the kubelets of a few nodes, which cannot run here
// (no container runtime): it creates the Node objects, binds the pods of one
// namespace to them (honouring required node affinity, so anti-affinity the
// controller injects is obeyed), marks bound pods Running and Ready, and
// deletes terminating pods with grace 0 once nothing but the Job
// controller's finalizer holds them. Tests decide failures and successes
// with Fail and Succeed.
type Kubelet struct {
	env   *Env
	ns    string
	nodes []string

	mu     sync.Mutex
	paused bool
	dead   map[string]bool // nodes whose kubelet is stopped (StopNode)
	next   int
	cancel context.CancelFunc
	done   chan struct{}
}

// NodeGPUs is the nvidia.com/gpu capacity each stand-in node reports.
const NodeGPUs = 8

// NewKubelet creates the nodes (if absent) and starts serving the pods of
// namespace ns; it stops at the end of t.
func (e *Env) NewKubelet(t testing.TB, ns string, nodes ...string) *Kubelet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &Kubelet{env: e, ns: ns, nodes: nodes, cancel: cancel, done: make(chan struct{})}
	for _, n := range nodes {
		if err := e.ensureNode(ctx, n); err != nil {
			cancel()
			t.Fatalf("node %s: %v", n, err)
		}
	}
	go k.loop(ctx)
	t.Cleanup(func() {
		cancel()
		<-k.done
	})
	return k
}

func (e *Env) ensureNode(ctx context.Context, name string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
	}
	created, err := e.Clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create node: %w", err)
	}
	gpus := resource.MustParse(fmt.Sprint(NodeGPUs))
	created.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"nvidia.com/gpu": gpus, corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourcePods: resource.MustParse("110")},
		Allocatable: corev1.ResourceList{"nvidia.com/gpu": gpus, corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourcePods: resource.MustParse("110")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if _, err := e.Clientset.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node status: %w", err)
	}
	return nil
}

// Pause stops binding and starting new pods (pods already running stay so).
func (k *Kubelet) Pause() { k.mu.Lock(); k.paused = true; k.mu.Unlock() }

// Resume undoes Pause.
func (k *Kubelet) Resume() { k.mu.Lock(); k.paused = false; k.mu.Unlock() }

// StopNode makes node's kubelet dead: its pods are no longer started or
// finalised (a deleted one stays Terminating, as on a node that lost
// power), and no new pod is bound to it. The Node object is left as it is:
// the test marks it NotReady as the node controller would.
func (k *Kubelet) StopNode(node string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead == nil {
		k.dead = map[string]bool{}
	}
	k.dead[node] = true
}

// loop polls the namespace's pods. A poll (25 ms) rather than a watch keeps
// the stand-in simple; the controller under test is event-driven either way.
func (k *Kubelet) loop(ctx context.Context) {
	defer close(k.done)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		k.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (k *Kubelet) sync(ctx context.Context) {
	pods, err := k.env.Clientset.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	k.mu.Lock()
	paused := k.paused
	dead := maps.Clone(k.dead)
	k.mu.Unlock()
	for i := range pods.Items {
		p := &pods.Items[i]
		switch {
		case dead[p.Spec.NodeName]:
		case p.DeletionTimestamp != nil:
			if onlyJobTracking(p.Finalizers) {
				zero := int64(0)
				_ = k.env.Clientset.CoreV1().Pods(k.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}
		case paused:
		case p.Spec.NodeName == "":
			if node := k.pick(ctx, p); node != "" {
				b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: k.ns}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}
				_ = k.env.Clientset.CoreV1().Pods(k.ns).Bind(ctx, b, metav1.CreateOptions{})
			}
		case p.Status.Phase == corev1.PodPending || p.Status.Phase == "":
			_ = k.setStatus(ctx, p.Name, func(p *corev1.Pod) { running(p) })
		}
	}
}

func onlyJobTracking(fs []string) bool {
	for _, f := range fs {
		if f != JobTrackingFinalizer {
			return false
		}
	}
	return true
}

// pick chooses a node for p round-robin among the nodes its required node
// affinity allows; "" when none does.
func (k *Kubelet) pick(ctx context.Context, p *corev1.Pod) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := 0; i < len(k.nodes); i++ {
		name := k.nodes[(k.next+i)%len(k.nodes)]
		if k.dead[name] {
			continue
		}
		node, err := k.env.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || !Allows(p, node) {
			continue
		}
		k.next = (k.next + i + 1) % len(k.nodes)
		return name
	}
	return ""
}

// Allows reports whether p's nodeSelector and required node affinity admit
// node (In, NotIn, Exists, DoesNotExist on labels: what the controller
// injects and the tests use).
func Allows(p *corev1.Pod, node *corev1.Node) bool {
	for k, v := range p.Spec.NodeSelector {
		if node.Labels[k] != v {
			return false
		}
	}
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return true
	}
	for _, t := range terms { // terms are ORed, expressions ANDed
		ok := true
		for _, ex := range t.MatchExpressions {
			v, has := node.Labels[ex.Key]
			switch ex.Operator {
			case corev1.NodeSelectorOpIn:
				ok = has && slices.Contains(ex.Values, v)
			case corev1.NodeSelectorOpNotIn:
				ok = !has || !slices.Contains(ex.Values, v)
			case corev1.NodeSelectorOpExists:
				ok = has
			case corev1.NodeSelectorOpDoesNotExist:
				ok = !has
			default:
				ok = false
			}
			if !ok {
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func running(p *corev1.Pod) {
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

func ptr[T any](v T) *T { return &v }

// terminated ends every container of p with code and message.
func terminated(p *corev1.Pod, phase corev1.PodPhase, code int32, message string) {
	now := metav1.Now()
	p.Status.Phase = phase
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: code, Reason: reason, Message: message, StartedAt: now, FinishedAt: now,
			}},
		})
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
			p.Status.Conditions[i].Status = corev1.ConditionFalse
			p.Status.Conditions[i].LastTransitionTime = now
		}
	}
}

func (k *Kubelet) setStatus(ctx context.Context, name string, f func(*corev1.Pod)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := k.env.Clientset.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(p)
		_, err = k.env.Clientset.CoreV1().Pods(k.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// Fail ends pod name: phase Failed, every container terminated with
// exitCode and message (the termination message ft-launcher writes).
func (k *Kubelet) Fail(ctx context.Context, name string, exitCode int32, message string) error {
	if err := k.setStatus(ctx, name, func(p *corev1.Pod) { terminated(p, corev1.PodFailed, exitCode, message) }); err != nil {
		return fmt.Errorf("fail pod %s/%s: %w", k.ns, name, err)
	}
	return nil
}

// Succeed ends pod name: phase Succeeded, every container exited 0.
func (k *Kubelet) Succeed(ctx context.Context, name string) error {
	if err := k.setStatus(ctx, name, func(p *corev1.Pod) { terminated(p, corev1.PodSucceeded, 0, "") }); err != nil {
		return fmt.Errorf("succeed pod %s/%s: %w", k.ns, name, err)
	}
	return nil
}
