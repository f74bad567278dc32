package appwrapper

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// TestComponentFate: only batch Jobs and PyTorchJobs are read for a
// Failed=True condition, and Jobs for FailureTarget=True too (failing,
// assess.go, rung 4); other kinds never fail.
func TestComponentFate(t *testing.T) {
	obj := func(apiVersion, kind, cond, status string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
		if status != "" {
			u.Object["status"] = map[string]any{"conditions": []any{
				map[string]any{"type": "Complete", "status": "False"},
				map[string]any{"type": cond, "status": status},
			}}
		}
		return u
	}
	for _, tc := range []struct {
		obj  *unstructured.Unstructured
		want fate
	}{
		{obj("batch/v1", "Job", "Failed", "True"), fateFailed},
		{obj("batch/v1", "Job", "FailureTarget", "True"), fateFailing},
		{obj("batch/v1", "Job", "Failed", "False"), fateNone},
		{obj("batch/v1", "Job", "FailureTarget", "False"), fateNone},
		{obj("batch/v1", "Job", "SuccessCriteriaMet", "True"), fateNone},
		{obj("batch/v1", "Job", "", ""), fateNone},
		{obj("kubeflow.org/v1", "PyTorchJob", "Failed", "True"), fateFailed},
		{obj("kubeflow.org/v1", "PyTorchJob", "FailureTarget", "True"), fateNone},
		{obj("kubeflow.org/v1", "PyTorchJob", "Failed", "False"), fateNone},
		{obj("ray.io/v1", "RayJob", "Failed", "True"), fateNone},
		{obj("apps/v1", "Deployment", "Failed", "True"), fateNone},
	} {
		if got := componentFate(tc.obj); got != tc.want {
			t.Errorf("%s %v: fate = %v, want %v", tc.obj.GetKind(), tc.obj.Object["status"], got, tc.want)
		}
	}
}

// TestStatusOnlyComponents: an AppWrapper update that changed only
// status.componentStatus queues nothing; any other change does.
func TestStatusOnlyComponents(t *testing.T) {
	base := &v1beta2.AppWrapper{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Generation: 1, ResourceVersion: "1", Labels: map[string]string{"l": "1"},
			Annotations: map[string]string{"a": "1"}, Finalizers: []string{v1beta2.Finalizer}},
		Status: v1beta2.AppWrapperStatus{Phase: v1beta2.AppWrapperResuming,
			ComponentStatus: []v1beta2.AppWrapperComponentStatus{{Name: "j", Kind: "Job", APIVersion: "batch/v1"}}},
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		edit func(*v1beta2.AppWrapper)
		want bool
	}{
		{"component condition", func(a *v1beta2.AppWrapper) {
			a.Status.ComponentStatus[0].Conditions = []metav1.Condition{{Type: "ResourcesDeployed", Status: "False", Reason: ReasonComponentCreationErrored}}
		}, true},
		{"component name", func(a *v1beta2.AppWrapper) { a.Status.ComponentStatus[0].Name = "j-x7k2p" }, true},
		{"nothing but the resourceVersion", func(*v1beta2.AppWrapper) {}, false},
		{"phase", func(a *v1beta2.AppWrapper) { a.Status.Phase = v1beta2.AppWrapperRunning }, false},
		{"a condition", func(a *v1beta2.AppWrapper) {
			a.Status.Conditions = []metav1.Condition{{Type: string(v1beta2.Unhealthy), Status: "True", Reason: ReasonCreateFailed}}
		}, false},
		{"retries", func(a *v1beta2.AppWrapper) { a.Status.Retries = 1 }, false},
		{"generation (spec)", func(a *v1beta2.AppWrapper) { a.Generation = 2 }, false},
		{"annotation", func(a *v1beta2.AppWrapper) { a.Annotations["a"] = "2" }, false},
		{"label", func(a *v1beta2.AppWrapper) { a.Labels["l"] = "2" }, false},
		{"finalizer", func(a *v1beta2.AppWrapper) { a.Finalizers = nil }, false},
		{"deletion", func(a *v1beta2.AppWrapper) { a.DeletionTimestamp = &now }, false},
		{"component status and phase", func(a *v1beta2.AppWrapper) {
			a.Status.ComponentStatus[0].Name = "k"
			a.Status.Phase = v1beta2.AppWrapperRunning
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base.DeepCopy()
			n.ResourceVersion = "2"
			tc.edit(n)
			if got := statusOnlyComponents(base, n); got != tc.want {
				t.Errorf("statusOnlyComponents = %v, want %v", got, tc.want)
			}
		})
	}
}
