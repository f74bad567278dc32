package k8stest

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var env *Env

func TestMain(m *testing.M) { Main(m, &env) }

// TestJobPodsRunAndAreCollected checks the harness itself: the real Job
// controller creates a Job's pods, the stand-in kubelet runs them on a node
// its affinity allows, and the real garbage collector removes them when the
// Job is deleted in the background.
func TestJobPodsRunAndAreCollected(t *testing.T) {
	Need(t, env)
	ctx := context.Background()
	ns := env.Namespace(t)
	k := env.NewKubelet(t, ns, "harness-a", "harness-b")
	two := int32(2)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: ns},
		Spec: batchv1.JobSpec{
			Parallelism: &two, Completions: &two,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "j"}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "c", Image: "busybox"}},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
							MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"harness-b"}}},
						}}},
					}},
				},
			},
		},
	}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	waitFor(t, "two running pods", func() bool {
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "j"}); err != nil {
			return false
		}
		n := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n == 2
	})
	for _, p := range pods.Items {
		if p.Spec.NodeName != "harness-a" {
			t.Errorf("pod %s on %q: its affinity allows only harness-a", p.Name, p.Spec.NodeName)
		}
	}
	if err := k.Succeed(ctx, pods.Items[0].Name); err != nil {
		t.Fatal(err)
	}
	bg := metav1.DeletePropagationBackground
	if err := env.Client.Delete(ctx, job, &client.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Job's pods collected", func() bool {
		err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "j"})
		return err == nil && len(pods.Items) == 0
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
